# A logical-replication cut-over when the sequences are replicated too
# (PostgreSQL 19: a publication FOR ALL SEQUENCES).  19 copies a
# publisher's sequence positions when the subscription is created and at
# each ALTER SUBSCRIPTION ... REFRESH SEQUENCES, never in between, so the
# new writer's sequences are neither fresh (the catch-up of 052 that
# watches young sequences does not see them) nor current:
#  - without a refresh at the cut-over, green's sequences are where the
#    subscription's first copy left them, below everything blue drew
#    since: a new key's generation and a staged event's id on green must
#    still be above every replicated one;
#  - a refresh after green started writing moves green's sequences back to
#    blue's positions (below what green handed out), under backends that
#    had checked already: their next generation and id must still be above
#    everything green handed out;
#  - a refresh after writes stopped on blue makes both sequences exact (the
#    documented cut-over): no catch-up, no jump.
# Skipped before 19, where sequences are not replicated (052 covers that).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my @conf = (
	"wal_level = logical",
	"shared_preload_libraries = 'pg_idem'",
	"idem.cleanup_worker = off");
my $blue = PostgreSQL::Test::Cluster->new('seqcut_blue');
$blue->init(allows_streaming => 'logical');
plan skip_all => 'sequences are replicated from PostgreSQL 19 on (052 covers the cut-over without them)'
  if $blue->pg_version->major < 19;
$blue->append_conf('postgresql.conf', join("\n", @conf) . "\n");
$blue->start;
my $green = PostgreSQL::Test::Cluster->new('seqcut_green');
$green->init(allows_streaming => 'logical');
$green->append_conf('postgresql.conf', join("\n", @conf) . "\n");
$green->start;

my $functions = q{
	CREATE FUNCTION k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE
		AS $$ SELECT idem_key('tap', 'POST', '/seqcut', name) $$;
};
$_->safe_psql('postgres', "CREATE EXTENSION pg_idem; $functions") for ($blue, $green);

# Blue: history above green's fresh sequences, published with its sequences.
$blue->safe_psql('postgres', q{
	SELECT setval('idem_generation_seq', 9200);
	SELECT setval('idem_outbox_id_seq', 5000);
	SELECT idem_claim(k('before'), sha256('b'));
	SELECT idem_outbox_stage('orders', '{"n": 1}'::jsonb);
	CREATE PUBLICATION idem_pub FOR TABLE idem_keys, idem_outbox_queue, idem_outbox_claimed;
	CREATE PUBLICATION idem_seq FOR ALL SEQUENCES;
});
my $blue_connstr = $blue->connstr . ' dbname=postgres';
$green->safe_psql('postgres',
	"CREATE SUBSCRIPTION idem_sub CONNECTION '$blue_connstr' PUBLICATION idem_pub, idem_seq");
$green->wait_for_subscription_sync($blue, 'idem_sub');

# The subscription copies the sequences once, when it is created: every
# sequence of the publication (the extension has more than these two, the
# redrive log's id among them) is ready.
my $sequences = q{SELECT (SELECT last_value FROM idem_generation_seq) || '|' ||
	(SELECT last_value FROM idem_outbox_id_seq)};
my $copied = $blue->safe_psql('postgres', $sequences);
$green->poll_query_until('postgres',
	"SELECT count(*) FILTER (WHERE c.relname IN ('idem_generation_seq', 'idem_outbox_id_seq')) = 2
	        AND bool_and(r.srsubstate = 'r')
	   FROM pg_subscription_rel r JOIN pg_class c ON c.oid = r.srrelid
	  WHERE c.relkind = 'S'")
  or die 'the sequences were not copied';
is($green->safe_psql('postgres', $sequences), $copied,
	"green's sequences are blue's when the subscription started ($copied)");

# Blue goes on far past that copy; writes stop; green has every row.
$blue->safe_psql('postgres', q{
	SELECT setval('idem_generation_seq', 9900);
	SELECT setval('idem_outbox_id_seq', 5900);
	SELECT idem_claim(k('after'), sha256('b'));
	SELECT idem_outbox_stage('orders', '{"n": 2}'::jsonb);
});
$blue->wait_for_catchup('idem_sub');
my $highest_generation = $blue->safe_psql('postgres', 'SELECT max(generation) FROM idem_keys');
my $highest_id = $blue->safe_psql('postgres', 'SELECT max(id) FROM idem_outbox_queue');
is($green->safe_psql('postgres', 'SELECT max(generation) FROM idem_keys'),
	$highest_generation, "green has blue's last key ($highest_generation)");

# The cut-over without a refresh of the sequences: clients move to green
# (the subscription, disabled, still lists the sequences).
$green->safe_psql('postgres', 'ALTER SUBSCRIPTION idem_sub DISABLE');
my $session = $green->background_psql('postgres');
my $generation = $session->query_safe(q{SELECT generation FROM idem_claim(k('green 1'), sha256('b'))});
cmp_ok($generation, '>', $highest_generation,
	"no refresh: a new key's generation on green ($generation) is above every replicated one ($highest_generation)");
my $id = $session->query_safe(q{SELECT idem_outbox_stage('orders', '{"n": 3}'::jsonb)});
cmp_ok($id, '>', $highest_id, "no refresh: a staged event's id on green ($id) is above blue's ($highest_id)");

# A refresh now, with green writing: 19 sets green's sequences back to
# blue's positions.  (The session claims and stages after the ENABLE, so
# that only the refresh changes a subscription under it: ENABLE changes
# pg_subscription, the copy only pg_subscription_rel.)
$green->safe_psql('postgres', 'ALTER SUBSCRIPTION idem_sub ENABLE');
$generation = $session->query_safe(q{SELECT generation FROM idem_claim(k('green 1b'), sha256('b'))});
$id = $session->query_safe(q{SELECT idem_outbox_stage('orders', '{"n": 3.5}'::jsonb)});
$green->safe_psql('postgres', 'ALTER SUBSCRIPTION idem_sub REFRESH SEQUENCES');
my $blue_now = $blue->safe_psql('postgres', $sequences);
$green->poll_query_until('postgres', "SELECT ($sequences) = '$blue_now'")
  or die 'the refresh did not copy the sequences';
ok(1, "a late refresh set green's sequences back to blue's ($blue_now)");
my $later_generation =
  $session->query_safe(q{SELECT generation FROM idem_claim(k('green 2'), sha256('b'))});
cmp_ok($later_generation, '>', $generation,
	"late refresh: the same backend's next generation ($later_generation) is above its previous ($generation)");
my $later_id = $session->query_safe(q{SELECT idem_outbox_stage('orders', '{"n": 4}'::jsonb)});
cmp_ok($later_id, '>', $id, "late refresh: the same backend's next id ($later_id) is above its previous ($id)");
is( $green->safe_psql('postgres', q{
		SELECT count(*) FROM idem_outbox_claim(10) c,
		       LATERAL idem_outbox_ack(c.claim_token, ARRAY[c.id]) acked}),
	'5', 'green: every event, replicated or staged on green, is claimed and acked (no id twice)');
$session->quit;
$green->safe_psql('postgres', 'DROP SUBSCRIPTION idem_sub');

# The documented cut-over, to a third cluster: writes stop on blue, the
# sequences are refreshed, and then the clients move.  Exact: nothing to
# catch up.
my $teal = PostgreSQL::Test::Cluster->new('seqcut_teal');
$teal->init(allows_streaming => 'logical');
$teal->append_conf('postgresql.conf', join("\n", @conf) . "\n");
$teal->start;
$teal->safe_psql('postgres', "CREATE EXTENSION pg_idem; $functions");
$teal->safe_psql('postgres',
	"CREATE SUBSCRIPTION teal_sub CONNECTION '$blue_connstr' PUBLICATION idem_pub, idem_seq");
$teal->wait_for_subscription_sync($blue, 'teal_sub');
$blue->safe_psql('postgres', q{SELECT idem_claim(k('last on blue'), sha256('b'))});
$blue->wait_for_catchup('teal_sub');
$teal->safe_psql('postgres', 'ALTER SUBSCRIPTION teal_sub REFRESH SEQUENCES');
$blue_now = $blue->safe_psql('postgres', $sequences);
$teal->poll_query_until('postgres', "SELECT ($sequences) = '$blue_now'")
  or die 'the refresh did not copy the sequences';
$teal->safe_psql('postgres', 'DROP SUBSCRIPTION teal_sub');
my ($blue_generation) = split /\|/, $blue_now;
my $log_offset = -s $teal->logfile;
is($teal->safe_psql('postgres', q{SELECT generation FROM idem_claim(k('teal 1'), sha256('b'))}),
	$blue_generation + 1, 'refreshed: the new writer continues where blue stopped');
ok(!$teal->log_contains('pg_idem advanced sequence', $log_offset),
	'refreshed: pg_idem had nothing to catch up');

$_->stop for ($teal, $green, $blue);
done_testing();
