# After a logical-replication cut-over (blue/green, or a major-version
# upgrade by logical replication) the new writer's generations and outbox
# ids continue above the replicated ones (issue 24, item 9).
#
# Sequences are not replicated: on the subscriber idem_generation_seq and
# idem_outbox_id_seq start at 1 while the replicated rows carry the
# publisher's values.  A real subscription here (publication on "blue",
# subscription on "green"), writes stopped on blue, the subscription
# dropped, and then on green:
#  - a take-over of a key replicated at a high generation gets a higher one
#    (downstream fences accept the new owner, refuse the stale one);
#  - a new key's generation is above every replicated generation (a fence
#    shared by several keys, such as a ledger row, accepts it);
#  - a staged event's id is above every id in the queue and the archive,
#    and its ack archives it (no 23505).
# Then a cut back: blue subscribes to green, green stages, blue takes over
# again, and a blue backend that had staged before the cut-over (so had
# checked its sequence already) stages above green's ids.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my @conf = (
	"wal_level = logical",
	"shared_preload_libraries = 'pg_idem'",
	"idem.cleanup_worker = off");
my $blue = PostgreSQL::Test::Cluster->new('cutover_blue');
$blue->init(allows_streaming => 'logical');
$blue->append_conf('postgresql.conf', join("\n", @conf) . "\n");
$blue->start;
my $green = PostgreSQL::Test::Cluster->new('cutover_green');
$green->init(allows_streaming => 'logical');
$green->append_conf('postgresql.conf', join("\n", @conf) . "\n");
$green->start;

my $functions = q{
	CREATE FUNCTION k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE
		AS $$ SELECT idem_key('tap', 'POST', '/cutover', name) $$;
};
$blue->safe_psql('postgres', "CREATE EXTENSION pg_idem; $functions");
$green->safe_psql('postgres', "CREATE EXTENSION pg_idem; $functions");

# Blue's history: generations and ids far above where green's fresh
# sequences start.  'stale' is abandoned by its owner (a 1 ms lease) at a
# high generation; 'done' finished; events published (archived) and pending.
$blue->safe_psql('postgres', q{
	SELECT setval('idem_generation_seq', 9200);
	SELECT setval('idem_outbox_id_seq', 5000);
	SELECT idem_finalize(k('done'), claim_id, 201, NULL, 'ok')
	  FROM idem_claim(k('done'), sha256('b'));
	SELECT idem_claim(k('stale'), sha256('b'), '1 ms');
	SELECT idem_outbox_stage('orders', jsonb_build_object('n', n)) FROM generate_series(1, 5) n;
	SELECT idem_outbox_ack(claim_token, array_agg(id)) FROM idem_outbox_claim(3) GROUP BY claim_token;
	CREATE PUBLICATION idem_pub FOR TABLE idem_keys, idem_outbox_queue, idem_outbox_claimed;
});
# A blue backend that stays connected through both cut-overs; it stages.
my $blue_session = $blue->background_psql('postgres');
$blue_session->query_safe(q{SELECT idem_outbox_stage('orders', '{"n": 6}'::jsonb)});
my $stale_generation = $blue->safe_psql('postgres',
	q{SELECT generation FROM idem_keys WHERE cache_key = k('stale')});
my $highest_generation = $blue->safe_psql('postgres', 'SELECT max(generation) FROM idem_keys');
my ($queue_max, $archive_max) = split /\|/, $blue->safe_psql('postgres', q{
	SELECT (SELECT max(id) FROM idem_outbox_queue), (SELECT max(id) FROM idem_outbox_archive)});
cmp_ok($archive_max, '>', 5000, "blue archived events up to id $archive_max");

my $blue_connstr = $blue->connstr . ' dbname=postgres';
$green->safe_psql('postgres',
	"CREATE SUBSCRIPTION idem_sub CONNECTION '$blue_connstr' PUBLICATION idem_pub");
$green->wait_for_subscription_sync($blue, 'idem_sub');

# Writes stopped on blue; green has everything; the cut-over.
$blue->wait_for_catchup('idem_sub');
is( $green->safe_psql('postgres', q{
		SELECT (SELECT count(*) FROM idem_keys), (SELECT count(*) FROM idem_outbox_queue),
		       (SELECT count(*) FROM idem_outbox_archive)}),
	'2|3|3', 'green has the replicated keys, queue and archive');
$green->safe_psql('postgres', 'DROP SUBSCRIPTION idem_sub');

# A take-over of the abandoned key on green.
my ($outcome, $taken_over) = split /\|/, $green->safe_psql('postgres',
	q{SELECT outcome, generation FROM idem_claim(k('stale'), sha256('b'))});
is($outcome, 'recovered_abandoned', 'green: the abandoned key is taken over');
cmp_ok($taken_over, '>', $stale_generation,
	"green: the take-over's generation ($taken_over) is above the replicated one ($stale_generation)");

# A new key on green.
my $new_generation = $green->safe_psql('postgres',
	q{SELECT generation FROM idem_claim(k('new'), sha256('b'))});
cmp_ok($new_generation, '>', $highest_generation,
	"green: a new key's generation ($new_generation) is above every replicated one ($highest_generation)");

# A stage on green, in a new backend, and its ack.
my $id = $green->safe_psql('postgres', q{SELECT idem_outbox_stage('orders', '{"n": 7}'::jsonb)});
cmp_ok($id, '>', $archive_max, "green: a staged event's id ($id) is above the archive's ($archive_max)");
cmp_ok($id, '>', $queue_max, "green: and above the queue's ($queue_max)");
is( $green->safe_psql('postgres', q{
		SELECT count(*) FROM idem_outbox_claim(10) c,
		       LATERAL idem_outbox_ack(c.claim_token, ARRAY[c.id]) acked}),
	'4', 'green: every pending event, replicated or new, is claimed and acked');
is( $green->safe_psql('postgres', 'SELECT count(*) FROM idem_outbox_archive'),
	'7', 'green: the archive holds the replicated and the new events');

# Later draws keep going up (no second catch-up, no step back).
my $later = $green->safe_psql('postgres', q{SELECT idem_outbox_stage('orders', '{"n": 8}'::jsonb)});
cmp_ok($later, '>', $id, 'green: the next id is above the previous one');
my $later_generation = $green->safe_psql('postgres',
	q{SELECT generation FROM idem_claim(k('later'), sha256('b'))});
cmp_ok($later_generation, '>', $new_generation, 'green: the next generation is above the previous one');

# The cut back: blue follows green, green stages, writes move back to blue.
$green->safe_psql('postgres',
	'CREATE PUBLICATION back_pub FOR TABLE idem_keys, idem_outbox_queue, idem_outbox_claimed');
my $green_connstr = $green->connstr . ' dbname=postgres';
# (blue's pending events were drained on green)
$blue->safe_psql('postgres', qq{DELETE FROM idem_outbox_queue;
	CREATE SUBSCRIPTION back_sub CONNECTION '$green_connstr' PUBLICATION back_pub
	  WITH (copy_data = false)});
$blue->wait_for_subscription_sync($green, 'back_sub');
my $green_last = $green->safe_psql('postgres', q{SELECT idem_outbox_stage('orders', '{"n": 9}'::jsonb)});
$green->wait_for_catchup('back_sub');
is($blue->safe_psql('postgres', "SELECT count(*) FROM idem_outbox_queue WHERE id = $green_last"),
	'1', "blue has green's last event ($green_last)");
$blue->safe_psql('postgres', 'DROP SUBSCRIPTION back_sub');
my $back = $blue_session->query_safe(q{SELECT idem_outbox_stage('orders', '{"n": 10}'::jsonb)});
cmp_ok($back, '>', $green_last,
	"blue, a backend that staged before: the id ($back) is above green's ($green_last)");
$blue_session->quit;

$green->stop;
$blue->stop;
done_testing();
