# Suite of tests/run.sh: the isolation specs (tests/isolation).  Sourced; uses count, say, as_run_user, $WORK, $PG_BIN.
suite_isolation() { run_pg_regress_suite "isolation" REGRESS= TAP_TESTS=; }
