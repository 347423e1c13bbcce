# A PostgreSQL major-version upgrade by pg_upgrade, copy and --link, with
# claims in flight (issue 25): a cluster of the old major (Debian's 15,
# IDEM_OLD_INSTALL) holds completed, pending, failed, expired and
# in-transaction keys, outbox events (waiting and leased) and inbox
# messages (done, failed) of a service role; it stops, pg_upgrade moves it
# to the server under test, and there every acknowledged row is as it was,
# a pending claim finishes with its claim id, generations keep growing,
# the outbox and the inbox carry on, and the extension needs no update.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old_install = $ENV{IDEM_OLD_INSTALL};
plan skip_all => 'IDEM_OLD_INSTALL (the old major with pg_idem) is not set'
  unless $old_install;

my $hash = "'\\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9'::bytea";
sub k { my ($name) = @_; return "idem_key('alice', 'POST', '/pay', '$name')"; }

# Every row of the state tables, as text: what must come through unchanged.
my $rows_query = q{
SELECT 'key ' || k::text FROM (SELECT * FROM idem_keys ORDER BY cache_key, scope) k
UNION ALL SELECT 'outbox ' || o::text FROM (SELECT * FROM idem_outbox_queue ORDER BY id) o
UNION ALL SELECT 'archive ' || a::text FROM (SELECT * FROM idem_outbox_archive ORDER BY id) a
UNION ALL SELECT 'inbox ' || i::text FROM (SELECT * FROM idem_inbox ORDER BY 1) i
};

# The recipe's preparation of a Debian 15.20 cluster (see below).
my $strip_attver = q{
UPDATE pg_catalog.pg_attribute
   SET attoptions = (SELECT pg_catalog.array_agg(o) FROM pg_catalog.unnest(attoptions) o
                      WHERE o NOT LIKE 'pg\_attver=%')
 WHERE attoptions::text LIKE '%pg\_attver=%'};

sub upgrade_with
{
	my ($mode) = @_;
	my $tag = substr($mode, 2);
	my $old = PostgreSQL::Test::Cluster->new("old_$tag", install_path => $old_install);
	$old->init;
	$old->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_idem'");
	$old->start;
	my $old_version = $old->safe_psql('postgres', 'SHOW server_version_num');

	# The service's state, written by a role of its own, as a service would.
	# (idem_keys is not readable by idem_client: the claim ids travel in psql variables.)
	my $svc = sub { my ($sql) = @_; return $old->safe_psql('postgres', "SET ROLE svc; $sql"); };
	$old->safe_psql('postgres', 'CREATE EXTENSION pg_idem; CREATE ROLE svc LOGIN IN ROLE idem_client');
	my $done = $svc->("SELECT claim_id FROM idem_claim(@{[k('done')]}, $hash)");
	$svc->("SELECT idem_finalize(@{[k('done')]}, '$done', 201, '{\"content-type\": \"application/json\"}', '{\"paid\": true}')");
	my $pending = $svc->("SELECT claim_id FROM idem_claim(@{[k('pending')]}, $hash, '1 hour')");
	my $failed = $svc->("SELECT claim_id FROM idem_claim(@{[k('failed')]}, $hash)");
	$svc->("SELECT idem_fail(@{[k('failed')]}, '$failed', '1 hour')");
	# An in-transaction request: the claim and its response commit together.
	my $in_tx = $svc->("BEGIN; SELECT claim_id FROM idem_begin(@{[k('in_tx')]}, $hash) \\gset
	        SELECT idem_finalize(@{[k('in_tx')]}, :'claim_id', 200, '{}', 'in transaction');
	        COMMIT; SELECT :'claim_id'");
	# The outbox: three events of one key, the first leased by a drainer.
	$svc->("SELECT idem_outbox_stage('orders', '{\"n\": $_}'::jsonb, 'order-1')") for 1 .. 3;
	my ($token, $leased) = split / /, $svc->("SELECT claim_token || ' ' || id FROM idem_outbox_claim(10, '1 hour')");
	# The inbox: one message handled, one that failed once.
	$svc->("BEGIN; SELECT idem_inbox_begin('billing', 'm-done', sha256('a'));
	        SELECT idem_inbox_done('billing', 'm-done'); COMMIT");
	$svc->("BEGIN; SELECT idem_inbox_begin('billing', 'm-failed', sha256('b')); ROLLBACK");
	$svc->("SELECT idem_inbox_fail('billing', 'm-failed', 'broker down')");
	# What a redelivery is told, probed in a transaction that rolls back
	# (it changes nothing), before and after.
	my $probe = q{BEGIN; SELECT idem_inbox_begin('billing', 'm-done', sha256('a'))
	                      || ' ' || idem_inbox_begin('billing', 'm-failed', sha256('b')); ROLLBACK};
	my $probe_before = $svc->($probe);
	# Debian 12's 15.20-0+deb12u1 stamps every column it creates with an
	# attribute option "pg_attver" that no other PostgreSQL accepts (18.6's
	# restore of the schema fails on the first table, anyone's), and RESET
	# does not remove it: docs/guides/upgrading.md's recipe strips it from
	# the catalog before pg_upgrade, in every database, as here.  Nothing
	# else of attoptions is touched.
	foreach my $db ('postgres', 'template1')
	{
		$old->safe_psql($db, $strip_attver);
	}
	is($old->safe_psql('postgres', "SELECT count(*) FROM pg_attribute WHERE attoptions::text LIKE '%pg_attver=%'"),
		'0', 'no column of the old cluster carries the stray attribute option');
	my $generation_before = $old->safe_psql('postgres', 'SELECT max(generation) FROM idem_keys');
	my $rows_before = $old->safe_psql('postgres', $rows_query);
	$old->stop;

	my $new = PostgreSQL::Test::Cluster->new("new_$tag");
	# 18's initdb enables data checksums by default, 15's did not, and
	# pg_upgrade refuses to change that: the new cluster matches the old.
	$new->init(extra => [ $new->pg_version >= 18 ? '--no-data-checksums' : () ]);
	$new->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_idem'");
	# pg_upgrade writes its reports into the new data directory; it runs from
	# the test's own directory, which it may write.
	my $ran = run_log([
			'pg_upgrade', '--no-sync',
			'-d', $old->data_dir, '-D', $new->data_dir,
			'-b', $old->config_data('--bindir'), '-B', $new->config_data('--bindir'),
			'-s', $new->host, '-p', $old->port, '-P', $new->port, $mode ]);
	ok($ran, "pg_upgrade $mode from $old_version");
	if (!$ran)
	{
		foreach my $log (glob($new->data_dir . '/pg_upgrade_output.d/*/log/*.log'))
		{
			diag("$log:\n" . slurp_file($log));
		}
		return;
	}
	$new->start;
	my $new_svc = sub { my ($sql) = @_; return $new->safe_psql('postgres', "SET ROLE svc; $sql"); };

	isnt($new->safe_psql('postgres', 'SHOW server_version_num'), $old_version,
		'the cluster runs on the new major');
	is($new->safe_psql('postgres', $rows_query), $rows_before,
		'every key, outbox event, archived event and inbox message is as it was');
	is($new->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'pg_idem'"),
		$new->safe_psql('postgres', "SELECT default_version FROM pg_available_extensions WHERE name = 'pg_idem'"),
		'the extension is at the version the new server has: no ALTER EXTENSION needed');

	# The service goes on where it stopped.
	is($new_svc->("SELECT outcome || ' ' || response_status || ' ' || convert_from(response_body, 'UTF8')
	               FROM idem_claim(@{[k('done')]}, $hash)"),
		'replay 201 {"paid": true}', 'a completed key replays its response');
	is($new_svc->("SELECT outcome FROM idem_claim(@{[k('in_tx')]}, $hash)"), 'replay',
		'an in-transaction key replays');
	is($new_svc->("SELECT outcome FROM idem_claim(@{[k('failed')]}, $hash)"), 'cooldown',
		'a failed key is still in its cooldown');
	is($new_svc->("SELECT outcome FROM idem_claim(@{[k('pending')]}, $hash)"), 'in_progress',
		'a pending claim is still owned by its request');
	is($new_svc->("SELECT idem_finalize(@{[k('pending')]}, '$pending', 200, '{}', 'late', true)"), 't',
		'the pending claim finishes with its claim id');
	is($new_svc->("SELECT outcome FROM idem_claim(@{[k('pending')]}, $hash)"), 'replay',
		'and is replayed from then on');
	my $new_claim = $new_svc->("SELECT generation FROM idem_claim(@{[k('after')]}, $hash)");
	cmp_ok($new_claim, '>', $generation_before,
		"a new claim's generation ($new_claim) is above every generation before the upgrade ($generation_before)");

	# The outbox: the leased event is acked with its token; the rest is
	# claimed and acked by a new drainer, in key order.
	is($new_svc->("SELECT idem_outbox_ack('$token', ARRAY[$leased]::bigint[])"), '1',
		"the drainer's lease taken before the upgrade acks");
	is($new_svc->("SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM idem_outbox_claim(10)"), '2',
		'the next event of the key is claimable, one at a time per key');
	# The inbox: a done message is a duplicate, the failed one may retry.
	my $probe_after = $new_svc->($probe);
	like($probe_after, qr/^duplicate /, 'a handled inbox message stays handled');
	is($probe_after, $probe_before, 'both inbox messages are answered as before the upgrade');
	my $check = $new->safe_psql('postgres', q{
		CREATE EXTENSION amcheck;
		SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		  JOIN pg_am am ON am.oid = c.relam AND am.amname = 'btree',
		       LATERAL bt_index_check(i.indexrelid, true)
		 WHERE i.indrelid IN ('idem_keys'::regclass, 'idem_outbox_queue'::regclass, 'idem_inbox'::regclass)});
	cmp_ok($check, '>', 0, 'amcheck finds the upgraded indexes consistent with their tables');
	$new->stop;
}

upgrade_with('--copy');
upgrade_with('--link');
done_testing();
