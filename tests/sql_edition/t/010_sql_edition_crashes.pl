# The SQL edition across killed sessions and a crash of the server: what
# it guarantees, as docs/guides/managed-postgresql.md's table states it,
# on a server without pg_idem's library (the plain script,
# IDEM_SQL_SCRIPT).
#
# - An in-transaction claim whose backend is killed leaves nothing; a
#   lease-mode winner's key is recovered by the same request after its
#   lease; committed claims and responses survive an immediate stop, the
#   claims in flight do not.
# - A follower waiting in the server (polling) that is terminated leaves
#   nothing behind; the winner finishes as if it had never come.
# - The inbox: an attempt whose consumer is terminated before its failure
#   is recorded is not counted (the C edition counts it at session exit:
#   plain SQL keeps nothing across the rollback), nor is one whose
#   recording's transaction dies before its COMMIT; one recorded and
#   committed by the savepoint protocol is, and the cap holds.
# - A drainer killed after its claim committed: the events come back when
#   the lease ends, with the attempt counted, and its late ack changes
#   nothing.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $script = $ENV{IDEM_SQL_SCRIPT};
plan skip_all => 'IDEM_SQL_SCRIPT names no SQL edition plain script' unless $script && -f $script;

my $node = PostgreSQL::Test::Cluster->new('sql_edition_crashes');
$node->init;
$node->start;
my ($rc, $out, $err) = $node->psql('postgres', undef,
	extra_params => [ '-v', 'ON_ERROR_STOP=1', '-v', 'schema=public', '-f', $script ]);
is($rc, 0, 'the plain script installs') or diag($err);
$node->safe_psql('postgres', 'CREATE TABLE effects (what text)');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

sub backend_gone
{
	my ($pid) = @_;
	return $node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid");
}

### Claims.

# An in-transaction claim (idem_begin) whose backend is terminated.
my $s = $node->background_psql('postgres');
my $pid = $s->query_safe('SELECT pg_backend_pid()');
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT outcome FROM idem_begin(idem_key('t', 'POST', '/p', 'tx'), sha256('a'))}),
	'claimed', 'an in-transaction claim');
is(q1("SELECT pg_terminate_backend($pid)"), 't', 'its backend is terminated');
ok(backend_gone($pid), 'and gone');
eval { $s->quit };
is(q1(q{SELECT count(*) FROM idem_keys WHERE cache_key = idem_key('t', 'POST', '/p', 'tx')}), '0',
	'the killed in-transaction claim left no row');
is(q1(q{SELECT outcome FROM idem_claim(idem_key('t', 'POST', '/p', 'tx'), sha256('a'))}), 'claimed',
	'the next request claims the key afresh');

# A lease-mode winner that dies after its claim committed: the same
# request recovers the key once the lease ran out.
q1(q{SELECT outcome FROM idem_claim(idem_key('t', 'POST', '/p', 'lease'), sha256('a'), '1 hour')});
is(q1(q{SELECT outcome FROM idem_claim(idem_key('t', 'POST', '/p', 'lease'), sha256('a'))}), 'in_progress',
	'the dead winner\'s lease still runs');
# Its end moved into the past, as if the hour had gone by.
q1(q{UPDATE idem_keys SET lease_expires_at = clock_timestamp() - interval '1 second'
      WHERE cache_key = idem_key('t', 'POST', '/p', 'lease')});
is(q1(q{SELECT outcome FROM idem_claim(idem_key('t', 'POST', '/p', 'lease'), sha256('a'))}), 'recovered_abandoned',
	'the same request recovers the key');

# A follower polling in the server, terminated; the winner finishes.
my $winner_claim = q1(q{SELECT claim_id FROM idem_claim(idem_key('t', 'POST', '/p', 'wait'), sha256('a'), '1 hour')});
my $f = $node->background_psql('postgres');
my $fpid = $f->query_safe('SELECT pg_backend_pid()');
$f->query_until(qr/sent/, q{
	\echo sent
	SELECT outcome FROM idem_claim(idem_key('t', 'POST', '/p', 'wait'), sha256('a'), NULL, '1 minute');
});
ok($node->poll_query_until('postgres', "SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = $fpid"),
	'a follower polls in the server');
my $before = q1(q{SELECT state || ' ' || generation || ' ' || claim_id FROM idem_keys
	WHERE cache_key = idem_key('t', 'POST', '/p', 'wait')});
is(q1("SELECT pg_terminate_backend($fpid)"), 't', 'the follower is terminated');
ok(backend_gone($fpid), 'and gone');
eval { $f->quit };
is(q1(q{SELECT state || ' ' || generation || ' ' || claim_id FROM idem_keys
	WHERE cache_key = idem_key('t', 'POST', '/p', 'wait')}), $before, 'the follower left the key as it was');
is(q1(qq{SELECT idem_finalize(idem_key('t', 'POST', '/p', 'wait'), '$winner_claim', 201, NULL, 'done')}), 't',
	'the winner finalizes');

# An immediate stop: committed claims and responses survive with their
# leases, an in-transaction claim in flight does not.
q1(q{SELECT idem_finalize(idem_key('t', 'POST', '/p', 'kept'), claim_id, 200, NULL, 'kept')
       FROM idem_claim(idem_key('t', 'POST', '/p', 'kept'), sha256('a'))});
my $pending = q1(q{SELECT claim_id || ' ' || lease_expires_at FROM idem_claim(idem_key('t', 'POST', '/p', 'pend'), sha256('a'), '1 hour')});
my $tx = $node->background_psql('postgres');
$tx->query_safe('BEGIN');
$tx->query_safe(q{SELECT outcome FROM idem_begin(idem_key('t', 'POST', '/p', 'crash-tx'), sha256('a'))});
$node->stop('immediate');
eval { $tx->quit };
$node->start;
is(q1(q{SELECT outcome || ' ' || convert_from(response_body, 'UTF8') FROM idem_claim(idem_key('t', 'POST', '/p', 'kept'), sha256('a'))}),
	'replay kept', 'after the crash: the committed response replays');
is(q1(q{SELECT claim_id || ' ' || lease_expires_at FROM idem_keys WHERE cache_key = idem_key('t', 'POST', '/p', 'pend')}),
	$pending, 'after the crash: the committed claim keeps its owner and lease');
is(q1(q{SELECT count(*) FROM idem_keys WHERE cache_key = idem_key('t', 'POST', '/p', 'crash-tx')}), '0',
	'after the crash: the in-transaction claim in flight is gone');

### The inbox.

# A consumer stalled in its handler, its transaction open.
sub stalled_consumer
{
	my ($message_id, $max) = @_;
	my $c = $node->background_psql('postgres');
	my $cpid = $c->query_safe('SELECT pg_backend_pid()');
	$c->query_safe('BEGIN');
	is($c->query_safe("SELECT idem_inbox_begin('tap', '$message_id', sha256('p'), $max)"), 'process',
		"$message_id: the consumer begins an attempt");
	$c->query_safe('SAVEPOINT handler');
	$c->query_safe("INSERT INTO effects VALUES ('$message_id')");
	return ($c, $cpid);
}

sub message
{
	my ($message_id) = @_;
	return q1(qq{SELECT coalesce((SELECT state || ' ' || error_count FROM idem_inbox
	                               WHERE consumer = 'tap' AND message_id = '$message_id'), 'none')});
}

# Terminated before its failure is recorded: not counted.
my ($c1, $c1pid) = stalled_consumer('m-killed', 2);
is(q1("SELECT pg_terminate_backend($c1pid)"), 't', 'm-killed: the consumer is terminated');
ok(backend_gone($c1pid), 'm-killed: its backend is gone');
eval { $c1->quit };
is(message('m-killed'), 'none', 'm-killed: the attempt is not counted (SQL edition)');
is(q1(q{BEGIN; SELECT idem_inbox_begin('tap', 'm-killed', sha256('p'), 2); ROLLBACK;}), 'process',
	'm-killed: the message is delivered again');

# The savepoint protocol: the failure recorded, then killed before COMMIT:
# the recording rolls back with its transaction.
my ($c2, $c2pid) = stalled_consumer('m-late', 2);
$c2->query_safe('ROLLBACK TO SAVEPOINT handler');
is($c2->query_safe(q{SELECT outcome || ' ' || error_count FROM idem_inbox_fail('tap', 'm-late', 'boom')}),
	'retry 1', 'm-late: the failure is recorded in the attempt\'s transaction');
is(q1("SELECT pg_terminate_backend($c2pid)"), 't', 'm-late: the consumer is terminated before COMMIT');
ok(backend_gone($c2pid), 'm-late: its backend is gone');
eval { $c2->quit };
is(message('m-late'), 'none', 'm-late: the uncommitted recording is not counted (SQL edition)');

# The savepoint protocol committed: counted, and the cap holds.
for my $n (1 .. 2)
{
	my ($c, $cpid) = stalled_consumer('m-cap', 2);
	$c->query_safe('ROLLBACK TO SAVEPOINT handler');
	$c->query_safe(q{SELECT idem_inbox_fail('tap', 'm-cap', 'boom')});
	$c->query_safe('COMMIT');
	$c->quit;
}
is(message('m-cap'), 'dead 2', 'm-cap: two committed failures, dead at the cap of 2');
is(q1(q{BEGIN; SELECT idem_inbox_begin('tap', 'm-cap', sha256('p'), 2); ROLLBACK;}), 'dead',
	'm-cap: never delivered again');
is(q1(q{SELECT count(*) FROM idem_outbox WHERE topic = 'idem.inbox.dead' AND payload->>'message_id' = 'm-cap'}), '1',
	'm-cap: one dead letter');
is(q1(q{SELECT count(*) FROM effects WHERE what = 'm-cap'}), '0', 'm-cap: no effect committed');

### The outbox: a drainer killed after its claim committed.
q1(q{SELECT idem_outbox_stage('t.events', '{"n": 1}'::jsonb, 'k')});
my $stale = q1(q{SELECT claim_token || ' ' || id FROM idem_outbox_claim(10, '1 hour') WHERE topic = 't.events'});
my ($token, $id) = split / /, $stale;
# The dead drainer's lease, ended (moved into the past).
q1(qq{UPDATE idem_outbox_claimed SET available_at = clock_timestamp() - interval '1 second' WHERE id = $id});
my $again = q1(q{SELECT attempts || ' ' || claim_token FROM idem_outbox_claim(10, '1 minute') WHERE topic = 't.events'});
my ($attempts, $token2) = split / /, $again;
is($attempts, '2', 'another drainer gets the event, its first attempt counted');
is(q1(qq{SELECT idem_outbox_ack('$token', ARRAY[$id]::bigint[])}), '0', 'the dead drainer\'s late ack changes nothing');
is(q1(qq{SELECT idem_outbox_ack('$token2', ARRAY[$id]::bigint[])}), '1', 'the new drainer acks it');

$node->stop;
done_testing();
