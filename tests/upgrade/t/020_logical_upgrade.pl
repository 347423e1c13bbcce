# A PostgreSQL major-version upgrade by logical replication, with a
# cut-over under load (issue 25): Debian's 15 (IDEM_OLD_INSTALL) publishes
# pg_idem's tables while a service claims and finalizes on it; the server
# under test subscribes (initial copy, then streaming), the writes stop,
# the subscriber catches up, and the service moves to it.  There every
# key, outbox event and inbox message is as it was on the old writer, the
# service's role still owns its keys (roles differ in OID between the
# clusters), a take-over's generation is above the replicated one, and a
# new outbox event's id is above every id of the queue and the archive.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $old_install = $ENV{IDEM_OLD_INSTALL};
plan skip_all => 'IDEM_OLD_INSTALL (the old major with pg_idem) is not set'
  unless $old_install;

my $hash = "'\\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea";
my $tables = 'idem_keys, idem_outbox_queue, idem_outbox_claimed, idem_inbox';

my $old = PostgreSQL::Test::Cluster->new('logical_old', install_path => $old_install);
# (Not allows_streaming: the new major's test module would write settings
# the old server does not know.)
$old->init;
$old->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_idem'
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10");
$old->start;
my $new = PostgreSQL::Test::Cluster->new('logical_new');
$new->init;
$new->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_idem'");
$new->start;

# The same roles on both sides, created in a different order so that
# their OIDs differ: a scope must follow the role, not its number.
$old->safe_psql('postgres', 'CREATE EXTENSION pg_idem; CREATE ROLE svc LOGIN IN ROLE idem_client');
$new->safe_psql('postgres', 'CREATE ROLE filler; CREATE EXTENSION pg_idem; CREATE ROLE svc LOGIN IN ROLE idem_client');
isnt($old->safe_psql('postgres', "SELECT 'svc'::regrole::oid"),
	$new->safe_psql('postgres', "SELECT 'svc'::regrole::oid"), 'the service role has another OID on the new cluster');

# History on the old writer: keys that went through several owners (high
# generations), a pending key, outbox events staged and archived.
my $svc_old = sub { return $old->safe_psql('postgres', "SET ROLE svc; $_[0]"); };
$svc_old->(q{DO $$ BEGIN FOR i IN 1..50 LOOP
	PERFORM idem_release(idem_key('a', 'POST', '/p', 'busy'),
	                     (SELECT claim_id FROM idem_claim(idem_key('a', 'POST', '/p', 'busy'), }
	  . $hash . q{)));
	END LOOP; END $$});
my $pending = $svc_old->("SELECT claim_id FROM idem_claim(idem_key('a', 'POST', '/p', 'busy'), $hash, '1 hour')");
$svc_old->("SELECT idem_outbox_stage('orders', jsonb_build_object('n', i)) FROM generate_series(1, 20) i");
$svc_old->("WITH c AS (SELECT claim_token, array_agg(id) AS ids FROM idem_outbox_claim(20) GROUP BY 1)
             SELECT idem_outbox_ack(claim_token, ids) FROM c");
$svc_old->("SELECT idem_outbox_stage('orders', '{\"n\": 21}'::jsonb)");

$old->safe_psql('postgres', "CREATE PUBLICATION idem_upgrade FOR TABLE $tables");
# Load on the old writer during the copy and the streaming: new keys
# claimed and finalized by two sessions until told to stop.
my $load_sql = q{
DO $$
DECLARE c uuid; k bytea;
BEGIN
  FOR i IN 1..400 LOOP
    k := idem_key('a', 'POST', '/load', i::text);
    c := (SELECT claim_id FROM idem_claim(k, } . $hash . q{));
    PERFORM idem_finalize(k, c, 200, '{}', convert_to('load ' || i, 'UTF8'));
    COMMIT;
  END LOOP;
END $$;};
my @load;
for my $n (1 .. 2)
{
	my $sql = $load_sql;
	$sql =~ s/'\/load'/'\/load$n'/;
	push @load, IPC::Run::start([ $old->installed_command('psql'), '-X', '-q', '-v', 'ON_ERROR_STOP=1',
			'-h', $old->host, '-p', $old->port, '-d', 'postgres', '-c', 'SET ROLE svc', '-c', $sql ],
		'>', \my $out, '2>', \my $err);
}
$new->safe_psql('postgres',
	"CREATE SUBSCRIPTION idem_upgrade CONNECTION 'host=" . $old->host . ' port=' . $old->port
	  . " dbname=postgres' PUBLICATION idem_upgrade");
$_->finish for @load;
is(scalar(grep { $_->result != 0 } @load), 0, 'the load ran on the old writer to its end');

# Cut-over: the writes have stopped; the subscriber catches up.
$new->wait_for_subscription_sync($old, 'idem_upgrade');
$old->wait_for_catchup('idem_upgrade');
my $rows = "SELECT t, r FROM (
	SELECT 'key' AS t, (cache_key, scope::regrole::text, state, request_hash, claim_id, generation,
	        response_status, response_body)::text AS r FROM idem_keys
	UNION ALL SELECT 'queue', (id, topic, payload, state)::text FROM idem_outbox_queue
	UNION ALL SELECT 'claimed', (id, topic, payload, state)::text FROM idem_outbox_claimed) x ORDER BY 1, 2";
is($new->safe_psql('postgres', $rows), $old->safe_psql('postgres', $rows),
	'every key, queued, claimed and published event reached the new writer, each under its role');
is($new->safe_psql('postgres', "SELECT count(*) FROM idem_keys WHERE convert_from(response_body, 'UTF8') LIKE 'load %'"),
	'800', 'the 800 keys finalized under load are there');
$new->safe_psql('postgres', 'ALTER SUBSCRIPTION idem_upgrade DISABLE');
$old->stop;

my $svc_new = sub { return $new->safe_psql('postgres', "SET ROLE svc; $_[0]"); };
is($svc_new->("SELECT outcome || ' ' || convert_from(response_body, 'UTF8')
               FROM idem_claim(idem_key('a', 'POST', '/load1', '7'), $hash)"),
	'replay load 7', 'the service replays, on the new writer, a response stored on the old one');
my $replicated = $new->safe_psql('postgres',
	"SELECT generation FROM idem_keys WHERE cache_key = idem_key('a', 'POST', '/p', 'busy')");
cmp_ok($replicated, '>=', 51, "the busy key came with its generation ($replicated)");
is($svc_new->("SELECT idem_release(idem_key('a', 'POST', '/p', 'busy'), '$pending')"), 't',
	'the pending claim of the old writer is released on the new one by its claim id');
my $taken = $svc_new->("SELECT generation FROM idem_claim(idem_key('a', 'POST', '/p', 'busy'), $hash)");
cmp_ok($taken, '>', $replicated, "a take-over on the new writer gets a higher generation ($taken > $replicated)");
my $max_id = $new->safe_psql('postgres',
	'SELECT max(id) FROM idem_outbox');
my $staged = $svc_new->("SELECT idem_outbox_stage('orders', '{\"n\": 22}'::jsonb)");
cmp_ok($staged, '>', $max_id, "a new outbox event's id ($staged) is above every replicated id ($max_id)");
is($svc_new->("SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM idem_outbox_claim(10)"), '21,22',
	'the drainer on the new writer gets the replicated event and the new one, in order');
done_testing();
