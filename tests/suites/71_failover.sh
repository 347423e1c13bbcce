# Suite of tests/run.sh: failover on streaming replication (tests/failover):
# a primary and standbys of their own, started by the TAP scripts.
# Sourced; uses run_prove_suite (70_scaleout.sh).
suite_failover() {
    run_prove_suite failover 'tests/failover/t/*.pl' \
        IDEM_FAILOVER_STORM="$(scaleout_client_binary idem_failover_storm)"
}
