# The outbox's wait and its claim plans (issues 13 and 14).
#
# Part 1, on a server with pg_idem preloaded: idem_outbox_wait is woken by
# a stage's commit and never before: while the stager holds its commit,
# the waiter stays asleep (seen in its wait, and still there after more
# than one of its bounded sleeps); the commit ends the wait with true.
# The ack of a key's head wakes a waiter for the key's next event.
# Without the library preloaded the wait polls and still sees the commit.
#
# Part 2: the claim is index-driven under every plan at 1 M events: a
# queue holding 1 M delayed events, and idem_outbox_claimed 200 k
# published and 200 k leased ones, claimed under plan_cache_mode = force_generic_plan
# and force_custom_plan, in a session whose plan was cached while the
# queue was empty and that sees the queue grow without an ANALYZE, and
# after an ANALYZE.  No claim may scan the outbox sequentially or walk
# through the delayed events: the statistics of the claim's own
# transaction (pg_stat_xact_user_tables) count its sequential scans and
# the rows it fetched.  (On 0.2.0 the generic plan was a hash join over a
# sequential scan of the whole outbox.  Since 0.5.0 the claim runs on the
# direct path, with no plan at all; these counts hold it to the same.)

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = IdemTest::new_node('outbox_wait', "shared_preload_libraries = 'pg_idem'",
	'autovacuum = off');
$node->restart;

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# Is a session asleep in idem_outbox_wait right now?
my $asleep = q{SELECT count(*) > 0 FROM pg_stat_activity
	WHERE query LIKE 'SELECT idem_outbox_wait(%' AND wait_event = 'Extension'};
my $running = q{SELECT count(*) FROM pg_stat_activity
	WHERE query LIKE 'SELECT idem_outbox_wait(%' AND state = 'active'};

### Part 1: woken by the commit, not before.

my $stager = $node->background_psql('postgres');
my $waiter = $node->background_psql('postgres');
$stager->query_safe('BEGIN');
$stager->query_safe(q{SELECT idem_outbox_stage('tap.wait', '{"n": 1}'::jsonb)});
$waiter->query_until(qr/waiting/, "\\echo waiting\nSELECT idem_outbox_wait('60 s') AS woke;\n");
ok($node->poll_query_until('postgres', $asleep), 'the waiter sleeps while the stage is uncommitted');
sleep(2);
is(q1($running), '1', 'and still waits after two seconds (several bounded sleeps)');
my $committed_at = time();
$stager->query_safe('COMMIT');
my $answer = $waiter->query_safe(q{SELECT 'after'});
my $woke_ms = (time() - $committed_at) * 1000;
like($answer, qr/^t\nafter$/, 'the commit ends the wait with true');
note(sprintf('the waiter returned %.1f ms after COMMIT returned', $woke_ms));

# A key's next event becomes work when its head is acked.
q1(q{DELETE FROM idem_outbox});
q1(q{SELECT idem_outbox_stage('tap.wait', '{"n": 2}'::jsonb, 'k'),
            idem_outbox_stage('tap.wait', '{"n": 3}'::jsonb, 'k')});
my $claim = q1(q{SELECT claim_token || ' ' || id FROM idem_outbox_claim(10)});
my ($token, $head) = split / /, $claim;
is(q1(q{SELECT idem_outbox_wait('0')}), 'f', 'the second event waits behind its leased head');
$waiter->query_until(qr/waiting/, "\\echo waiting\nSELECT idem_outbox_wait('60 s') AS woke;\n");
ok($node->poll_query_until('postgres', $asleep), 'a waiter sleeps');
is(q1("SELECT idem_outbox_ack('$token', ARRAY[${head}::bigint])"), '1', 'the head is acked');
like($waiter->query_safe(q{SELECT 'after'}), qr/^t\nafter$/, 'the ack wakes the waiter');
is(q1(q{SELECT payload->>'n' FROM idem_outbox_claim(10)}), '3', 'the next event of the key is claimable');
$stager->quit;
$waiter->quit;

# Not preloaded: the fallback poll still sees the commit.
q1(q{DELETE FROM idem_outbox});
$node->append_conf('postgresql.conf', "shared_preload_libraries = ''");
$node->restart;
$stager = $node->background_psql('postgres');
$waiter = $node->background_psql('postgres');
$stager->query_safe('BEGIN');
$stager->query_safe(q{SELECT idem_outbox_stage('tap.wait', '{"n": 4}'::jsonb)});
$waiter->query_until(qr/waiting/, "\\echo waiting\nSELECT idem_outbox_wait('60 s') AS woke;\n");
ok($node->poll_query_until('postgres', $asleep), 'not preloaded: the waiter polls');
is(q1($running), '1', 'not preloaded: still waiting before the commit');
$stager->query_safe('COMMIT');
# (query, not query_safe: the wait's once-per-backend WARNING about the
# missing preload is on stderr; 079 checks it.)
like($waiter->query(q{SELECT 'after'}), qr/^t\nafter$/, 'not preloaded: the commit ends the wait');
like($waiter->{stderr}, qr/WARNING:  pg_idem is not loaded via shared_preload_libraries/,
	'not preloaded: the waiter was warned that it polls');
$stager->quit;
$waiter->quit;
q1(q{DELETE FROM idem_outbox});

### Part 2: claim plans at 1 M events.

# The two tables a claim reads.
my $hot = 'idem_outbox_queue';
my $claimed = 'idem_outbox_claimed';

# Claim batch in session $s in a transaction of its own, and check what
# the claim read: no sequential scan of the outbox, and rows fetched
# bounded by the batch, not by the 1 M delayed events.  The claim count.
sub claim_checked
{
	my ($s, $batch, $what) = @_;
	$s->query_safe('BEGIN');
	my $claimed = $s->query_safe("SELECT count(*) FROM idem_outbox_claim($batch)");
	my ($seq, $fetched) = split /\|/, $s->query_safe(qq{
		SELECT coalesce(sum(seq_scan), 0) || '|' || coalesce(sum(idx_tup_fetch), 0)
		  FROM pg_stat_xact_user_tables WHERE relid IN ('$hot'::regclass, '$claimed'::regclass)});
	$s->query_safe('COMMIT');
	is($seq, '0', "$what: no sequential scan of the outbox");
	cmp_ok($fetched, '<=', 10 * $batch + 10, "$what: rows fetched bounded by the batch")
	  or diag("fetched $fetched rows for a batch of $batch");
	return $claimed;
}

# A drainer whose plan is cached while the queue is empty.
my $drainer = $node->background_psql('postgres');
$drainer->query_safe(q{SET plan_cache_mode = force_generic_plan});
$drainer->query_safe(q{SELECT count(*) FROM idem_outbox_claim(100)}) for 1 .. 3;

q1(qq{
	INSERT INTO $hot (topic, payload, available_at)
	SELECT 'tap.later', '{"n": 0}', clock_timestamp() + interval '1 day'
	  FROM generate_series(1, 1000000);
	INSERT INTO $claimed (id, topic, payload, available_at, state, attempts, created_at,
	                      published_at, scope)
	SELECT nextval('idem_outbox_id_seq'), 'tap.history', '{"n": 0}', clock_timestamp(),
	       'published', 1, clock_timestamp(), clock_timestamp(), 0
	  FROM generate_series(1, 200000);
	INSERT INTO $claimed (id, topic, payload, available_at, state, attempts, created_at,
	                      claim_token, scope)
	SELECT nextval('idem_outbox_id_seq'), 'tap.leased', '{"n": 0}',
	       clock_timestamp() + interval '1 day', 'pending', 1, clock_timestamp(),
	       gen_random_uuid(), 0
	  FROM generate_series(1, 200000);
	SELECT idem_outbox_stage('tap.now', jsonb_build_object('n', i)) FROM generate_series(1, 100) i;
});

is(claim_checked($drainer, 100, 'generic plan cached before the queue grew'), '100',
	'a plan cached on an empty queue claims 100 of 1 M');

q1(qq{ANALYZE $hot, $claimed});
for my $mode ('force_generic_plan', 'force_custom_plan')
{
	my $s = $node->background_psql('postgres');
	$s->query_safe("SET plan_cache_mode = $mode");
	q1(q{SELECT idem_outbox_stage('tap.now', jsonb_build_object('n', i)) FROM generate_series(1, 101) i});
	is(claim_checked($s, 1, "$mode after ANALYZE, batch 1"), '1', "$mode: batch 1");
	is(claim_checked($s, 100, "$mode after ANALYZE, batch 100"), '100', "$mode: batch 100");
	is(claim_checked($s, 100, "$mode after ANALYZE, nothing due"), '0', "$mode: nothing else is due");
	$s->quit;
}
$drainer->quit;

done_testing();
