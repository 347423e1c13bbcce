# Crash recovery of claims: an immediate stop and a killed backend.
#
# Claims are rows in a WAL-logged table, so a crash keeps exactly what was
# committed: committed claims come back with their leases and responses,
# claims (and handler writes) of transactions in flight are gone, and an
# expired lease left by a crashed owner can be stolen.  A client whose
# backend died while it held a claim transaction gets a definite answer on
# a new connection by reading the key with idem_lookup.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# restart_after_crash: a backend killed with SIGKILL makes the postmaster
# reinitialize, as in production (the test framework turns it off).
my $node = IdemTest::new_node('crash', 'restart_after_crash = on');

$node->safe_psql('postgres', q{
	CREATE FUNCTION k(label text) RETURNS bytea
		LANGUAGE sql IMMUTABLE AS $$ SELECT idem_key('tap', 'POST', '/payments', label) $$;
	CREATE FUNCTION h(label text) RETURNS bytea
		LANGUAGE sql IMMUTABLE AS $$ SELECT idem_request_hash(convert_to(label, 'UTF8')) $$;
	CREATE TABLE payments (label text NOT NULL, claim_id uuid);
	-- What the test saw before the crash, to compare with after it.
	CREATE TABLE before_crash (label text PRIMARY KEY, claim_id uuid, generation bigint,
	                           lease_expires_at timestamptz);
});

# Run SQL and return its single-line result.
sub q1
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

# The outcome idem_lookup gives a label, as a client would poll it.
sub lookup
{
	my ($label) = @_;
	return q1("SELECT outcome FROM idem_lookup(k('$label'), h('$label'))");
}

# Claim a label in a transaction of its own and remember what it got.
sub committed_claim
{
	my ($label, $lease) = @_;
	q1(qq{
		INSERT INTO before_crash
		SELECT '$label', claim_id, generation, lease_expires_at
		  FROM idem_claim(k('$label'), h('$label'), '$lease')
	});
}

### Part 1: immediate stop with committed claims and claims in flight.

committed_claim('live', '1h');
committed_claim('done', '1h');
committed_claim('short', '1ms');
committed_claim('finalizing', '1h');
is( q1(q{
		SELECT idem_finalize(k('done'), claim_id, 201, '{"content-type": "text/plain"}',
		                     'paid done')
		  FROM before_crash WHERE label = 'done'}),
	't', 'done: finalized before the crash');

# In flight at the crash: a lease-mode claim, an in-transaction claim with
# its handler's write, and a finalize of a committed claim with its
# handler's write, all in open transactions.
my $inflight_claim = $node->background_psql('postgres');
$inflight_claim->query_safe(q{BEGIN});
is( $inflight_claim->query_safe(
		q{SELECT outcome FROM idem_claim(k('inflight-claim'), h('inflight-claim'), '1h')}),
	'claimed', 'in flight: lease-mode claim made, not committed');

my $inflight_begin = $node->background_psql('postgres');
$inflight_begin->query_safe(q{BEGIN});
is( $inflight_begin->query_safe(
		q{SELECT outcome FROM idem_begin(k('inflight-begin'), h('inflight-begin'))}),
	'claimed', 'in flight: in-transaction claim made');
$inflight_begin->query_safe(q{INSERT INTO payments VALUES ('inflight-begin', NULL)});

my $inflight_fin = $node->background_psql('postgres');
$inflight_fin->query_safe(q{BEGIN});
$inflight_fin->query_safe(q{INSERT INTO payments VALUES ('finalizing', NULL)});
is( $inflight_fin->query_safe(q{
		SELECT idem_finalize(k('finalizing'), claim_id, 201, NULL, 'paid finalizing',
		                     strict => true)
		  FROM before_crash WHERE label = 'finalizing'}),
	't', 'in flight: finalize of a committed claim, not committed');

my $max_generation_before = q1(q{SELECT max(generation) FROM idem_keys});

$node->stop('immediate');
$node->start;

# The sessions lost their server; let their psql processes go.
$_->quit for ($inflight_claim, $inflight_begin, $inflight_fin);

is( q1(q{
		SELECT k.state = 'pending' AND k.claim_id = b.claim_id
		       AND k.generation = b.generation
		       AND k.lease_expires_at = b.lease_expires_at
		  FROM idem_keys k JOIN before_crash b ON k.cache_key = k(b.label)
		 WHERE b.label = 'live'}),
	't', 'live: committed claim survives with its claim_id, generation and lease');
is(lookup('live'), 'in_progress', 'live: a follower is still told in_progress');

is( q1(q{
		SELECT outcome || ' ' || response_status || ' ' || convert_from(response_body, 'UTF8')
		       || ' ' || (response_headers ->> 'content-type')
		  FROM idem_claim(k('done'), h('done'))}),
	'replay 201 paid done text/plain', 'done: completed claim replays its response');

is(lookup('inflight-claim'), 'absent', 'in-flight lease-mode claim is gone');
is(lookup('inflight-begin'), 'absent', 'in-flight in-transaction claim is gone');
is( q1(q{SELECT count(*) FROM payments}),
	'0', 'no handler write of an in-flight transaction survived');
is( q1(q{
		SELECT k.state || ' ' || (k.claim_id = b.claim_id) || ' ' || (k.response_body IS NULL)
		  FROM idem_keys k JOIN before_crash b ON k.cache_key = k(b.label)
		 WHERE b.label = 'finalizing'}),
	'pending true true', 'finalizing: the uncommitted finalize is lost, the claim is still owned');

is(lookup('short'), 'claimable', 'short: the expired lease is claimable after the crash');
is( q1(qq{
		SELECT outcome || ' ' || (generation > $max_generation_before)
		  FROM idem_claim(k('short'), h('short'))}),
	'recovered_abandoned true',
	'short: stolen, with a generation above every generation committed before the crash');

### Part 2: a backend terminated while it holds a claim transaction.

# The client claimed in a transaction and started its handler; its backend
# is terminated before COMMIT.
my $victim = $node->background_psql('postgres');
my $victim_pid = $victim->query_safe(q{SELECT pg_backend_pid()});
$victim->query_safe(q{BEGIN});
$victim->query_safe(
	q{SELECT outcome FROM idem_claim(k('terminated'), h('terminated'), '1h')});
$victim->query_safe(q{INSERT INTO payments VALUES ('terminated', NULL)});
is(q1("SELECT pg_terminate_backend($victim_pid)"), 't', 'claim holder terminated');
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $victim_pid")
  or die 'terminated backend did not exit';
$victim->quit;

# On a new connection, reading the key says the claim never happened: the
# request may be retried, and its retry wins the key.
is(lookup('terminated'), 'absent', 'terminated: a new connection reads "absent"');
is( q1(q{SELECT outcome FROM idem_claim(k('terminated'), h('terminated'), '1h')}),
	'claimed', 'terminated: the retry claims the key');
is(q1(q{SELECT count(*) FROM payments}), '0', 'terminated: its handler write is gone');

### Part 3: a backend killed with SIGKILL while it finalizes.

# A committed claim with a short lease, then the handler's transaction
# (payment + finalize) open when the backend is killed.  SIGKILL makes the
# postmaster reinitialize: every backend is restarted through crash recovery.
committed_claim('killed', '2s');
my $killed = $node->background_psql('postgres');
my $killed_pid = $killed->query_safe(q{SELECT pg_backend_pid()});
$killed->query_safe(q{BEGIN});
$killed->query_safe(q{INSERT INTO payments SELECT 'killed', claim_id FROM before_crash WHERE label = 'killed'});
is( $killed->query_safe(q{
		SELECT idem_finalize(k('killed'), claim_id, 201, NULL, 'paid killed', strict => true)
		  FROM before_crash WHERE label = 'killed'}),
	't', 'killed: finalize done, transaction still open');

# The postmaster notices the kill asynchronously: a connection made before
# it does would see the server up, and the next one refused during crash
# recovery.  Wait for the restart to begin, then for connections.
my $log_offset = -s $node->logfile;
kill 'KILL', $killed_pid;
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
$node->poll_query_until('postgres', 'SELECT true')
  or die 'server did not come back after SIGKILL of a backend';
$killed->quit;

# A definite answer: the finalize did not commit, the claim is still
# pending under its lease, and nothing was paid.  Once the lease runs out
# the key is claimable, a retry steals it and does the work exactly once.
like(lookup('killed'), qr/^(in_progress|claimable)$/,
	'killed: a new connection reads the claim as unfinished');
is( q1(q{SELECT count(*) FROM payments WHERE label = 'killed'}),
	'0', 'killed: the payment of the killed transaction is gone');
$node->poll_query_until('postgres',
	q{SELECT outcome = 'claimable' FROM idem_lookup(k('killed'), h('killed'))})
  or die 'lease of the killed claim never ran out';
my $retry = q1(q{
	WITH c AS (SELECT * FROM idem_claim(k('killed'), h('killed'))),
	     pay AS (INSERT INTO payments SELECT 'killed', claim_id FROM c RETURNING claim_id)
	SELECT c.outcome || ' '
	       || idem_finalize(k('killed'), c.claim_id, 201, NULL, 'paid killed', strict => true)
	  FROM c JOIN pay USING (claim_id)});
is($retry, 'recovered_abandoned true', 'killed: the retry steals the key and finalizes');
is( q1(q{
		SELECT count(*) || ' ' || bool_and(p.claim_id = k.claim_id)
		  FROM payments p JOIN idem_keys k ON k.cache_key = k(p.label)
		 WHERE p.label = 'killed'}),
	'1 true', 'killed: exactly one payment, by the claim that owns the key');
is(lookup('killed'), 'replay', 'killed: later requests replay');

$node->stop;
done_testing();
