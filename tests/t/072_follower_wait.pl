# Followers waiting in the server (idem_claim(..., max_wait); issue 14):
# woken only after the winner's commit, and a cancelled or terminated
# waiter leaves nothing behind.  The isolation tester sees only lock waits, and a
# waiting follower holds no lock, so these races are driven from here: a
# follower is started, seen waiting in pg_stat_activity, and then the
# winner acts.
#
# - woken by finalize (replay), release (claimed), fail (recovered after
#   the cooldown) and by the winner's lease running out (recovered);
# - never woken before the winner commits: the finalize is held in an open
#   transaction and the follower's wake-up counter does not move; a
#   rolled-back finalize wakes nobody;
# - a cancelled waiter leaves nothing behind (no lock, no row change);
# - while it sleeps a follower keeps its statement's xmin (see 077);
# - a winner killed while 10 followers wait: exactly one of them takes the
#   key over once the lease runs out, the others then replay its response.
#
# Assertions are on outcomes and counters, never on tight timings: every
# max_wait is far longer than the step that should end the wait.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('follower_wait');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_idem'
idem.cleanup_worker = off
max_connections = 40
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pg_idem');
$node->safe_psql('postgres', q{
	CREATE FUNCTION k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE
		AS $$ SELECT idem_key('tap', 'POST', '/wait', name) $$;
	CREATE FUNCTION h() RETURNS bytea LANGUAGE sql IMMUTABLE
		AS $$ SELECT idem_request_hash('body') $$;
	CREATE TABLE winners (name text PRIMARY KEY, claim_id uuid);
});

sub q1 { return $node->safe_psql('postgres', $_[0]); }

sub counter
{
	return q1("SELECT value FROM idem_stats WHERE counter = '$_[0]'");
}

# A winner's claim of name, its claim id kept in winners.
sub win
{
	my ($name, $lease) = @_;
	return q1(qq{
		INSERT INTO winners SELECT '$name', claim_id
		  FROM idem_claim(k('$name'), h(), '$lease') WHERE outcome = 'claimed'
		RETURNING 'claimed'});
}

# A follower waiting up to max_wait, seen sleeping in the server.
sub follower
{
	my ($name, $max_wait, $label) = @_;
	my $session = $node->background_psql('postgres');
	$session->query_until(qr/started/, qq{
		\\echo started
		SELECT '$label:' || outcome FROM idem_claim(k('$name'), h(), NULL, '$max_wait');
	});
	ok( $node->poll_query_until('postgres', qq{
			SELECT count(*) = 1 FROM pg_stat_activity
			 WHERE query LIKE '%$label:%' AND wait_event_type = 'Extension'
			   AND pid <> pg_backend_pid()}),
		"$label: the follower waits in the server");
	return $session;
}

# What a waiting follower answered (blocks until it does).
sub answer
{
	my ($session, $label) = @_;
	my $out = $session->query_safe("SELECT 'done'");
	$session->quit;
	my ($got) = $out =~ /$label:(\w+)/;
	return $got // "no answer: $out";
}

### finalize, held open: nobody wakes before the commit.
win('fin', '1 hour');
my $wakeups = counter('follower_wakeups');
my $f = follower('fin', '60 s', 'fin');
my $winner = $node->background_psql('postgres');
$winner->query_safe('BEGIN');
is( $winner->query_safe(
		"SELECT idem_finalize(k('fin'), claim_id, 201, NULL, 'ok') FROM winners WHERE name = 'fin'"),
	't', 'fin: finalized, not yet committed');
# The held finalize must not wake the follower: it is still sleeping and
# its wake-up counter (published when its claim returns) has not moved.
sleep 1;
is( q1(q{SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%fin:%'
          AND wait_event_type = 'Extension' AND pid <> pg_backend_pid()}),
	'1', 'fin: still waiting while the finalize is uncommitted');
# A sleeper keeps its statement's snapshot (077 shows why).
is( q1(q{SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%fin:%'
          AND backend_xmin IS NOT NULL AND pid <> pg_backend_pid()}),
	'1', 'fin: the sleeping follower keeps its statement xmin');
$winner->query_safe('COMMIT');
is(answer($f, 'fin'), 'replay', 'fin: woken by the commit, the follower replays');
cmp_ok(counter('follower_wakeups'), '>', $wakeups, 'fin: a commit woke it');

### a finalize that rolls back wakes nobody and changes nothing.
win('rb', '1 hour');
$wakeups = counter('follower_wakeups');
$f = follower('rb', '3 s', 'rb');
q1(q{BEGIN; SELECT idem_finalize(k('rb'), claim_id, 201, NULL, 'x') FROM winners WHERE name = 'rb';
     ROLLBACK;});
is(answer($f, 'rb'), 'in_progress', 'rb: after its max_wait the follower answers in_progress');
is(counter('follower_wakeups'), $wakeups, 'rb: the rolled-back finalize woke nobody');

### release: the follower claims.
win('rel', '1 hour');
$f = follower('rel', '60 s', 'rel');
q1(q{SELECT idem_release(k('rel'), claim_id) FROM winners WHERE name = 'rel'});
is(answer($f, 'rel'), 'claimed', 'rel: after a release the follower claims');

### fail with a cooldown: the follower waits it out, then recovers.
win('fail', '1 hour');
$f = follower('fail', '60 s', 'fail');
q1(q{SELECT idem_fail(k('fail'), claim_id, '300 ms') FROM winners WHERE name = 'fail'});
is(answer($f, 'fail'), 'recovered_abandoned', 'fail: after the cooldown the follower recovers');

### the lease runs out while the follower waits.
win('lease', '1 s');
$f = follower('lease', '60 s', 'lease');
is(answer($f, 'lease'), 'recovered_abandoned', 'lease: the follower recovers the abandoned key');

### a cancelled waiter leaves nothing behind.
win('cancel', '1 hour');
my $before = q1(q{SELECT state || generation FROM idem_keys WHERE cache_key = k('cancel')});
$f = follower('cancel', '60 s', 'cancel');
my $pid = q1(q{SELECT pid FROM pg_stat_activity WHERE query LIKE '%cancel:%'
                AND pid <> pg_backend_pid()});
is(q1("SELECT pg_cancel_backend($pid)"), 't', 'cancel: waiter cancelled');
ok( $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid AND state = 'active'"),
	'cancel: the waiter stopped waiting');
{
	# psql stops at the error (ON_ERROR_STOP): writing to it may raise SIGPIPE.
	local $SIG{PIPE} = 'IGNORE';
	eval { $f->quit; };
}
is(q1("SELECT count(*) FROM pg_locks WHERE pid = $pid AND locktype <> 'virtualxid'"),
	'0', 'cancel: the cancelled waiter holds no lock');
is(q1(q{SELECT state || generation FROM idem_keys WHERE cache_key = k('cancel')}),
	$before, 'cancel: the key is unchanged');

### a winner killed while 10 followers wait: one takes over.
my $dying = $node->background_psql('postgres');
my $dying_pid = $dying->query_safe('SELECT pg_backend_pid()');
$dying->query_safe(q{SELECT outcome FROM idem_claim(k('kill'), h(), '2 s')});
my @followers = map { follower('kill', '30 s', "kill$_") } 1 .. 10;
is(q1("SELECT pg_terminate_backend($dying_pid)"), 't', 'kill: the winner is killed');
eval { $dying->quit };
# Once its lease is over exactly one follower recovers the key; the others
# keep waiting for the new owner.
ok( $node->poll_query_until('postgres', q{
		SELECT state = 'pending' AND lease_expires_at > clock_timestamp() + '10 s'
		  FROM idem_keys WHERE cache_key = k('kill')}),
	'kill: a follower took the key over');
# The new owner is the session whose claim returned; finish it for it.
q1(q{SELECT idem_finalize(k('kill'), claim_id, 200, NULL, 'after the crash')
       FROM idem_keys WHERE cache_key = k('kill')});
my %answers;
$answers{ answer($followers[ $_ - 1 ], "kill$_") }++ for 1 .. 10;
is($answers{recovered_abandoned} // 0, 1, 'kill: exactly one follower recovered the key');
is($answers{replay} // 0, 9, 'kill: the nine others replay its response');

$node->stop;
done_testing();
