# Statistics under load and across a restart, and the cleanup worker:
# it deletes expired keys, survives an error in one pass, reloads its
# interval on SIGHUP and stops with the server.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('stats_worker');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pg_idem'
idem.cleanup_interval = '1d'
idem.ttl = '1s'
idem.tombstone_ttl = 0
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pg_idem');

# The cleanup launcher is up and shows in pg_stat_activity (its
# short-lived per-database workers are tested in 041_cleanup_launcher.pl).
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'pg_idem launcher'"),
	'cleanup launcher shows in pg_stat_activity');

# --- Counters move under a pgbench load, and only for committed work.
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
$node->pgbench(
	'--no-vacuum --client=4 --transactions=50 --protocol=prepared',
	0,
	[qr{processed: 200/200}],
	[qr{^$}],
	'pgbench claim/finalize cycles',
	{
		'idem_cycle' => q{
\set k random(1, 1000000000)
SELECT claim_id FROM idem_claim(idem_key('bench', 'POST', '/x', :k::text || ':' || :client_id), sha256('b')) \gset
SELECT idem_finalize(idem_key('bench', 'POST', '/x', :k::text || ':' || :client_id), :claim_id, 200, NULL, 'ok');
BEGIN;
SELECT outcome FROM idem_claim(idem_key('bench', 'POST', '/aborted', :k::text || ':' || :client_id), sha256('b'));
ROLLBACK;
}
	});
my $claimed = $node->safe_psql('postgres', "SELECT value FROM idem_stats WHERE counter = 'claimed'");
my $finalized = $node->safe_psql('postgres', "SELECT value FROM idem_stats WHERE counter = 'finalized'");
# Random keys may collide (a replay): at most a handful.
cmp_ok($claimed, '>=', 195, 'committed claims are counted');
cmp_ok($claimed, '<=', 200, 'aborted claims are not counted');
is($finalized, $claimed, 'one finalize per committed claim');

# --- Counters live in shared memory: a restart starts them from zero.
$node->restart;
is($node->safe_psql('postgres', "SELECT sum(value) FROM idem_stats"),
	'0', 'counters start from zero after a restart');

# --- The worker deletes expired keys once its interval allows it.
$node->safe_psql('postgres',
	"SELECT count(*) FROM idem_keys");
my $rows = $node->safe_psql('postgres', 'SELECT count(*) FROM idem_keys');
cmp_ok($rows, '>=', 195, 'finished keys are there before the worker runs');
sleep 2;    # past idem.ttl
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_keys'),
	$rows, 'interval of one day: the worker has not run');

# Reloading a short interval makes the worker run soon.
$node->append_conf('postgresql.conf', "idem.cleanup_interval = '1s'");
$node->reload;
ok( $node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idem_keys'),
	'after reload with a 1s interval the worker deleted the expired keys');
ok( $node->poll_query_until(
		'postgres', "SELECT value > 0 FROM idem_stats WHERE counter = 'cleanup_deleted'"),
	'worker deletions are counted');

# A pending key is never deleted by the worker.
$node->safe_psql('postgres',
	"SELECT idem_claim(idem_key('w', 'POST', '/p', 'pending'), sha256('b'), '1 hour')");

# --- An error in one pass does not stop the worker.
my $log_offset = -s $node->logfile;
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN RAISE EXCEPTION 'forced cleanup failure'; END$$;
CREATE TRIGGER refuse_delete BEFORE DELETE ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION refuse_delete();
});
$node->safe_psql('postgres',
	"SELECT idem_finalize(idem_key('w', 'POST', '/done', 'k'), claim_id, 200, NULL, 'x')
	   FROM idem_claim(idem_key('w', 'POST', '/done', 'k'), sha256('b'))");
$node->wait_for_log(qr/forced cleanup failure/, $log_offset);
ok(1, 'the forced error was reported by the worker');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_idem launcher'"),
	'1', 'the launcher is still running after the error');
$node->safe_psql('postgres', 'DROP TRIGGER refuse_delete ON idem_keys');
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 0 FROM idem_keys WHERE cache_key = idem_key('w', 'POST', '/done', 'k')"),
	'the next pass deletes the expired key');
is( $node->safe_psql(
		'postgres',
		"SELECT state FROM idem_keys WHERE cache_key = idem_key('w', 'POST', '/p', 'pending')"),
	'pending', 'the pending key survived every pass');

# --- Turning the worker off pauses it.
$node->append_conf('postgresql.conf', "idem.cleanup_worker = off");
$node->reload;
sleep 1;
$node->safe_psql('postgres',
	"SELECT idem_finalize(idem_key('w', 'POST', '/off', 'k'), claim_id, 200, NULL, 'x')
	   FROM idem_claim(idem_key('w', 'POST', '/off', 'k'), sha256('b'))");
sleep 3;
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM idem_keys WHERE cache_key = idem_key('w', 'POST', '/off', 'k')"),
	'1', 'idem.cleanup_worker = off: nothing is deleted');

# --- The launcher stops with the server.
my $worker_pid = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_idem launcher'");
$node->stop('fast');
ok(!kill(0, $worker_pid), 'the launcher exited with the server');

# --- Without the preload every function works and the view says why it is empty.
$node->adjust_conf('postgresql.conf', 'shared_preload_libraries', "''");
$node->start;
is( $node->safe_psql(
		'postgres',
		"SELECT outcome FROM idem_claim(idem_key('np', 'POST', '/p', 'k'), sha256('b'))"),
	'claimed', 'claims work without the preload');
my ($ret, $stdout, $stderr) = $node->psql('postgres', 'SELECT * FROM idem_stats');
like($stderr, qr/must be loaded via shared_preload_libraries/,
	'idem_stats without the preload gives a clear error');
$node->stop;

done_testing();
