# Inbox and outbox across crashes (issue 6): the retry cap holds when a
# consumer crashes at it, and a drainer killed mid-batch gets its rows back
# after the lease while its late ack changes nothing.
#
# A consumer killed at the cap: its backend records the failed attempt on
# the way out (before it releases the message), so the message is dead and
# dead-lettered, a delivery that was waiting for it finds it dead, and it
# never runs again, not after a restart either.  The same for a consumer
# whose client process dies (the backend sees the connection close).
#
# A drainer killed mid-batch, followed by an immediate stop: after the
# restart its events come back when their leases end, are published by
# another drainer (its stale ack changes nothing), and per-key order
# holds.  An event whose drainers keep dying is marked dead after its last
# attempt instead of being handed out again.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The inbox's locks live in shared memory: preloaded, without the cleanup worker.
my $node = IdemTest::new_node('inbox_outbox', 'idem.outbox_max_attempts = 3',
	"shared_preload_libraries = 'pg_idem'", 'idem.cleanup_worker = off');

$node->safe_psql('postgres', q{
	CREATE TABLE effects (message_id text NOT NULL);
	-- What drainers got, to compare tokens across crashes.
	CREATE TABLE claims (drainer text, id bigint, key text, token uuid);
});

# Run SQL and return its result.
sub q1
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

# One failed delivery of a message: begin, roll back, record the failure.
sub failed_delivery
{
	my ($message_id, $max) = @_;
	return q1(qq{
		BEGIN;
		SELECT idem_inbox_begin('tap', '$message_id', sha256('payload'), $max);
		ROLLBACK;
		SELECT outcome || ' ' || error_count FROM idem_inbox_fail('tap', '$message_id', 'handler failed');
	});
}

# A consumer that begins a message, runs its handler's write and stalls
# there (its transaction open); returns the session and its backend pid.
sub stalled_consumer
{
	my ($message_id, $max) = @_;
	my $session = $node->background_psql('postgres');
	my $pid = $session->query_safe('SELECT pg_backend_pid()');
	$session->query_safe('BEGIN');
	is( $session->query_safe(
			"SELECT idem_inbox_begin('tap', '$message_id', sha256('payload'), $max)"),
		'process', "$message_id: the consumer begins an attempt");
	$session->query_safe("INSERT INTO effects VALUES ('$message_id')");
	return ($session, $pid);
}

# The message's state, error count and last error.
sub message
{
	my ($message_id) = @_;
	return q1(qq{SELECT state || ' ' || error_count || ' ' || coalesce(last_error, '-')
	             FROM idem_inbox WHERE consumer = 'tap' AND message_id = '$message_id'});
}

# A delivery in a fresh session: what begin answers (rolled back at once).
sub redeliver
{
	my ($message_id, $max) = @_;
	return q1(qq{
		BEGIN;
		SELECT idem_inbox_begin('tap', '$message_id', sha256('payload'), $max);
		ROLLBACK;
	});
}

### Part 1: a consumer terminated during the last attempt, with a second
### delivery waiting for it.

like(failed_delivery('m-term', 3), qr/^process\nretry 1$/, 'm-term: first failure');
like(failed_delivery('m-term', 3), qr/^process\nretry 2$/, 'm-term: second failure');

my ($holder, $holder_pid) = stalled_consumer('m-term', 3);

my $waiter = $node->background_psql('postgres');
$waiter->query_safe('BEGIN');
$waiter->query_until(qr/waiting/, q{
	\echo waiting
	SELECT 'waiter got ' || idem_inbox_begin('tap', 'm-term', sha256('payload'), 3);
});
ok( $node->poll_query_until('postgres', qq{
		SELECT wait_event_type = 'Lock' FROM pg_stat_activity
		 WHERE query LIKE '%waiter got%' AND pid <> pg_backend_pid()}),
	'm-term: a second delivery waits for the running attempt');

is(q1("SELECT pg_terminate_backend($holder_pid)"), 't', 'm-term: consumer terminated');
ok( $node->poll_query_until('postgres', qq{
		SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $holder_pid}),
	'm-term: its backend is gone');
eval { $holder->quit };

like($waiter->query_safe('COMMIT'), qr/waiter got dead/,
	'm-term: the waiting delivery finds the message dead, not runnable');
$waiter->quit;

is(message('m-term'), 'dead 3 consumer session ended during the attempt',
	'm-term: the killed attempt is counted, at the cap');
is(q1(q{SELECT count(*) FROM idem_outbox WHERE topic = 'idem.inbox.dead'
                                         AND payload->>'message_id' = 'm-term'}),
	'1', 'm-term: one dead letter staged');
is(q1(q{SELECT count(*) FROM effects WHERE message_id = 'm-term'}),
	'0', "m-term: the killed attempt's effects rolled back");

### Part 2: a consumer whose client process dies mid-attempt.

like(failed_delivery('m-client', 2), qr/^process\nretry 1$/, 'm-client: first failure');
my ($client, $client_pid) = stalled_consumer('m-client', 2);
$client->{run}->kill_kill;
ok( $node->poll_query_until('postgres', qq{
		SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $client_pid}),
	'm-client: its backend noticed the closed connection and exited');
is(message('m-client'), 'dead 2 consumer session ended during the attempt',
	'm-client: the attempt of the vanished client is counted, at the cap');

# And one that dies below the cap: counted, and the message runs again.
my ($early, $early_pid) = stalled_consumer('m-early', 5);
$early->{run}->kill_kill;
ok( $node->poll_query_until('postgres', qq{
		SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $early_pid}),
	'm-early: backend exited');
is(message('m-early'), 'failed 1 consumer session ended during the attempt',
	'm-early: the attempt is counted, below the cap');
like(failed_delivery('m-early', 5), qr/^process\nretry 2$/,
	'm-early: the next delivery runs it, and records its own failure');

### Part 3: a drainer killed mid-batch, then an immediate stop.

q1(q{
	SELECT idem_outbox_stage('tap.event', jsonb_build_object('n', 1), 'k1'),
	       idem_outbox_stage('tap.event', jsonb_build_object('n', 2), 'k1'),
	       idem_outbox_stage('tap.event', jsonb_build_object('n', 3), 'k2'),
	       idem_outbox_stage('tap.event', jsonb_build_object('n', 4)),
	       idem_outbox_stage('tap.event', jsonb_build_object('n', 5));
	-- Part 1 and 2's dead letters are not this part's business.
	UPDATE idem_outbox SET state = 'published', published_at = clock_timestamp()
	 WHERE topic = 'idem.inbox.dead';
});

my $drainer = $node->background_psql('postgres');
my $drainer_pid = $drainer->query_safe('SELECT pg_backend_pid()');
is( $drainer->query_safe(q{
		WITH c AS (SELECT * FROM idem_outbox_claim(10, '2 s')),
		     saved AS (INSERT INTO claims SELECT 'A', id, key, claim_token FROM c)
		SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM c}),
	'1,3,4,5', 'drainer A claims every head: k1 event 2 waits for event 1');
# A publishes event 4 and acks it, then dies before acking the others.
is( $drainer->query_safe(q{
		SELECT idem_outbox_ack(token, ARRAY[id]) FROM claims c
		  JOIN idem_outbox o USING (id) WHERE o.payload->>'n' = '4'}),
	'1', 'drainer A acks event 4');
q1("SELECT pg_terminate_backend($drainer_pid)");
eval { $drainer->quit };
$node->stop('immediate');
$node->start;

is( q1(q{SELECT string_agg(state || ':' || attempts, ',' ORDER BY id)
           FROM idem_outbox WHERE topic = 'tap.event'}),
	'pending:1,pending:0,pending:1,published:1,pending:1',
	'after the restart: nothing lost, the claim and its attempts survived');

ok( $node->poll_query_until('postgres', q{
		SELECT bool_and(available_at <= clock_timestamp()) FROM idem_outbox
		 WHERE topic = 'tap.event' AND state = 'pending' AND claim_token IS NOT NULL}),
	"drainer A's leases run out");
is( q1(q{
		WITH c AS (SELECT * FROM idem_outbox_claim(10, '1 min')),
		     saved AS (INSERT INTO claims SELECT 'B', id, key, claim_token FROM c)
		SELECT string_agg((payload->>'n') || '@' || attempts, ',' ORDER BY id) FROM c}),
	'1@2,3@2,5@2', "drainer B gets A's unacked events back, as second attempts");
is( q1(q{SELECT sum(idem_outbox_ack(token, ARRAY[id])) FROM claims WHERE drainer = 'A'}),
	'0', "drainer A's late acks change nothing");
is( q1(q{SELECT sum(idem_outbox_ack(token, ARRAY[id])) FROM claims WHERE drainer = 'B'}),
	'3', 'drainer B acks them');
is( q1(q{
		WITH c AS (SELECT * FROM idem_outbox_claim(10)),
		     saved AS (INSERT INTO claims SELECT 'C', id, key, claim_token FROM c)
		SELECT string_agg((payload->>'n') || '@' || attempts, ',') FROM c}),
	'2@1', 'then k1 event 2, after event 1');
is( q1(q{SELECT sum(idem_outbox_ack(token, ARRAY[id])) FROM claims WHERE drainer = 'C'}),
	'1', 'drainer C acks it');
is( q1(q{SELECT string_agg(state, ',' ORDER BY id) FROM idem_outbox WHERE topic = 'tap.event'}),
	'published,published,published,published,published', 'every event published');

### Part 4: an event whose drainers keep dying is dead after its last
### attempt (idem.outbox_max_attempts = 3), never handed out a fourth time.

q1(q{SELECT idem_outbox_stage('tap.poison', jsonb_build_object('n', 1), 'kp'),
            idem_outbox_stage('tap.poison', jsonb_build_object('n', 2), 'kp')});
for my $attempt (1 .. 3)
{
	my $d = $node->background_psql('postgres');
	my $pid = $d->query_safe('SELECT pg_backend_pid()');
	is( $d->query_safe(q{SELECT (payload->>'n') || '@' || attempts FROM idem_outbox_claim(10, '200 ms')}),
		"1\@$attempt", "poison: attempt $attempt handed out");
	q1("SELECT pg_terminate_backend($pid)");
	eval { $d->quit };
	ok( $node->poll_query_until('postgres', q{
			SELECT available_at <= clock_timestamp() FROM idem_outbox
			 WHERE topic = 'tap.poison' AND payload->>'n' = '1'}),
		"poison: lease $attempt runs out");
	$node->stop('immediate') if $attempt == 2;
	$node->start if $attempt == 2;
}
is(q1(q{SELECT count(*) FROM idem_outbox_claim(10)}), '0',
	'poison: the next claim hands out nothing (event 2 still waits behind event 1)');
is( q1(q{SELECT state || ' ' || attempts || ' ' || last_error FROM idem_outbox
          WHERE topic = 'tap.poison' AND payload->>'n' = '1'}),
	'dead 3 lease expired during the last attempt',
	'poison: dead after its third attempt');
is( q1(q{SELECT (payload->>'n') || '@' || attempts FROM idem_outbox_claim(10)}),
	'2@1', 'poison: the dead event no longer holds back its key');
is(q1(q{SELECT max(attempts) FROM idem_outbox}), '3', 'no event ran past its cap');

### After everything: the inbox messages stay where they were.

$node->stop('immediate');
$node->start;
is(redeliver('m-term', 3), 'dead', 'm-term: still dead after a restart');
is(redeliver('m-client', 2), 'dead', 'm-client: still dead after a restart');
is(q1(q{SELECT count(*) FROM effects}), '0', 'no effect of a killed attempt survived');

$node->stop;
done_testing();
