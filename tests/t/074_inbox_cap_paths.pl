# The inbox's attempt cap on every path a session can take (issue 12,
# defects 3-5: a connection lost before the failure's commit, PREPARE
# TRANSACTION then ROLLBACK PREPARED, DISCARD ALL), and the documented
# limit of a server crash.  Each case uses max_attempts = 1: one failed attempt must make the
# message dead, so a second run of the handler is a cap violation.
#
# 1. The savepoint protocol's recording (idem_inbox_fail answered dead)
#    and then the connection drops before COMMIT: the attempt is still
#    counted (by the backend on its way out).
# 2. PREPARE TRANSACTION with an attempt open, or with its failure
#    recorded, is refused; the attempt stays this session's.
# 3. DISCARD ALL (what a session pooler runs when a client leaves) with an
#    unaccounted attempt: the attempt is handed over (nothing is written,
#    so it cannot fail), the next client inherits nothing, and the next
#    delivery of the message, on any connection, adopts the failure.
# 4. The attempt's lock is no advisory lock: it is not in pg_locks, and
#    pg_advisory_unlock_all() -- plain, in a view, in a SQL function, in a
#    statement prepared before the attempt -- releases nothing of the
#    attempt: it only drops the lock other deliveries sleep on, so the next
#    delivery adopts the orphan, its failure with it, and finds the message
#    dead; the first session's own recording and exit count nothing more.
# 5. A server crash during an attempt: not counted, the message runs once
#    more after the restart (the documented limit).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The inbox's locks live in shared memory: preloaded, without the cleanup
# worker (which would run behind the test's back).
my $node = IdemTest::new_node('inbox_cap', 'max_prepared_transactions = 5',
	"shared_preload_libraries = 'pg_idem'", 'idem.cleanup_worker = off');
$node->safe_psql('postgres', 'CREATE TABLE effects (message_id text NOT NULL)');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

sub message
{
	my ($id) = @_;
	return q1(qq{SELECT state || ' ' || error_count FROM idem_inbox
	             WHERE consumer = 'cap' AND message_id = '$id'});
}

sub runs
{
	return q1(qq{SELECT count(*) FROM effects WHERE message_id = '$_[0]'});
}

# A fresh delivery's answer (rolled back at once).
sub redeliver
{
	my ($id) = @_;
	return q1(qq{BEGIN; SELECT idem_inbox_begin('cap', '$id', sha256('p'), 1); ROLLBACK;});
}

sub terminate
{
	my ($session, $pid) = @_;
	is(q1("SELECT pg_terminate_backend($pid)"), 't', 'backend terminated');
	ok($node->poll_query_until('postgres',
			"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
		'backend gone');
	local $SIG{PIPE} = 'IGNORE';
	eval { $session->quit };
}

### 1. Recorded with the savepoint protocol, connection lost before COMMIT.
my $s = $node->background_psql('postgres');
my $pid = $s->query_safe('SELECT pg_backend_pid()');
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-drop', sha256('p'), 1)}),
	'process', 'drop: the attempt begins');
$s->query_safe(q{INSERT INTO effects VALUES ('m-drop')});
$s->query_safe('SAVEPOINT handler');
$s->query_safe(q{INSERT INTO effects VALUES ('m-drop-inner')});
$s->query_safe('ROLLBACK TO SAVEPOINT handler');
is($s->query_safe(q{SELECT outcome FROM idem_inbox_fail('cap', 'm-drop', 'handler failed')}),
	'dead', 'drop: idem_inbox_fail answers dead (not committed)');
terminate($s, $pid);
is(message('m-drop'), 'dead 1', 'drop: the attempt is counted after all');
is(redeliver('m-drop'), 'dead', 'drop: a redelivery finds the message dead');
is(runs('m-drop'), '0', 'drop: no effect committed, and the handler never runs again');

### 2. PREPARE TRANSACTION is refused while an attempt is unsettled.
$s = $node->background_psql('postgres', on_error_stop => 0);
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-2pc', sha256('p'), 1)}),
	'process', '2pc: the attempt begins');
my ($out, $ret) = $s->query(q{PREPARE TRANSACTION 'inbox_2pc'});
like($s->{stderr}, qr/cannot PREPARE a transaction with an inbox attempt|was not marked done/,
	'2pc: PREPARE TRANSACTION with an open attempt is refused');
$s->{stderr} = '';
is(q1('SELECT count(*) FROM pg_prepared_xacts'), '0', '2pc: nothing was prepared');
# The refused PREPARE rolled back: the attempt is an orphan, recorded next.
is($s->query_safe(q{SELECT outcome FROM idem_inbox_fail('cap', 'm-2pc', 'handler failed')}),
	'dead', '2pc: the attempt is still this session\'s to record');
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-2pc-b', sha256('p'), 1)}),
	'process', '2pc: a second attempt begins');
$s->query_safe('SAVEPOINT handler');
$s->query_safe('ROLLBACK TO SAVEPOINT handler');
is($s->query_safe(q{SELECT outcome FROM idem_inbox_fail('cap', 'm-2pc-b', 'failed')}),
	'dead', '2pc: its failure is recorded in the transaction');
($out, $ret) = $s->query(q{PREPARE TRANSACTION 'inbox_2pc_b'});
like($s->{stderr}, qr/cannot PREPARE a transaction with an inbox attempt/,
	'2pc: PREPARE TRANSACTION with a recorded failure is refused too');
$s->{stderr} = '';
# A message marked done is refused too: ROLLBACK PREPARED would undo it.
$s->query_safe('BEGIN');
$s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-2pc-c', sha256('p'), 1)});
$s->query_safe(q{SELECT idem_inbox_done('cap', 'm-2pc-c')});
($out, $ret) = $s->query(q{PREPARE TRANSACTION 'inbox_2pc_c'});
like($s->{stderr}, qr/cannot PREPARE a transaction with an inbox attempt/,
	'2pc: PREPARE TRANSACTION of a processed message is refused');
$s->{stderr} = '';
is(q1('SELECT count(*) FROM pg_prepared_xacts'), '0', '2pc: still nothing prepared');
$s->quit;
is(message('m-2pc'), 'dead 1', '2pc: the first attempt is counted');
is(message('m-2pc-b'), 'dead 1', '2pc: the second attempt is counted (by the exit)');

### 3. DISCARD ALL hands the unaccounted attempt over.
$s = $node->background_psql('postgres');
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-discard', sha256('p'), 1)}),
	'process', 'discard: the attempt begins');
$s->query_safe(q{INSERT INTO effects VALUES ('m-discard')});
$s->query_safe('ROLLBACK');
$s->query_safe('DISCARD ALL');
is(message('m-discard'), '', 'discard: DISCARD ALL wrote nothing');
is(redeliver('m-discard'), 'dead', 'discard: a delivery on another connection adopts the failure: dead');
is(redeliver('m-discard'), 'dead', 'discard: a delivery that rolled back handed it over again');
is(q1(q{SELECT idem_inbox_begin('cap', 'm-discard', sha256('p'), 1)}), 'dead',
	'discard: a delivery that commits');
is(message('m-discard'), 'dead 1', 'discard: wrote the failure');
is(runs('m-discard'), '0', 'discard: the handler never ran again');
# The session goes on as a fresh one: a new attempt on it works.
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-discard-2', sha256('p'), 1)}),
	'process', 'discard: the session takes new attempts');
$s->query_safe(q{SELECT idem_inbox_done('cap', 'm-discard-2')});
$s->query_safe('COMMIT');
$s->quit;

### 4. No SQL reaches the attempt's lock.
q1(q{CREATE VIEW unlock_view AS SELECT pg_advisory_unlock_all()::text AS u;
     CREATE FUNCTION unlock_fn() RETURNS void LANGUAGE sql AS 'SELECT pg_advisory_unlock_all()';});
$s = $node->background_psql('postgres', on_error_stop => 0);
$s->query_safe(q{PREPARE unlock_prepared AS SELECT pg_advisory_unlock_all()});
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-unlock', sha256('p'), 1)}),
	'process', 'unlock: the attempt begins');
is(q1(q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'}), '0',
	'unlock: the attempt holds no advisory lock (pg_locks shows nothing of it)');
$s->query_safe(q{INSERT INTO effects VALUES ('m-unlock')});
$s->query_safe('ROLLBACK');
$s->query_safe(q{SELECT pg_advisory_unlock_all()});
$s->query_safe(q{SELECT * FROM unlock_view});
$s->query_safe(q{SELECT unlock_fn()});
$s->query_safe(q{EXECUTE unlock_prepared});
$s->query_safe('DISCARD PLANS');
is(runs('m-unlock'), '0', 'unlock: the failed attempt left no effect');
# The session dropped the lock others wait on, so another connection's
# delivery adopts the orphan, failure and all: it is never told to process.
is(q1(q{SELECT idem_inbox_begin('cap', 'm-unlock', sha256('p'), 1)}), 'dead',
	'unlock: a second delivery adopts the unaccounted attempt and finds the message dead');
is(message('m-unlock'), 'dead 1', 'unlock: the failure is counted once');
# The first session's own recording, and its exit, count nothing more.
is($s->query_safe(q{SELECT outcome || ' ' || error_count FROM idem_inbox_fail('cap', 'm-unlock', 'late')}),
	'dead 1', 'unlock: the first session\'s idem_inbox_fail records nothing and answers dead');
$s->quit;
is(message('m-unlock'), 'dead 1', 'unlock: nor does its exit');
is(redeliver('m-unlock'), 'dead', 'unlock: a delivery finds the message dead');

### 5. A server crash during an attempt is not counted (documented limit).
$s = $node->background_psql('postgres');
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-crash', sha256('p'), 1)}),
	'process', 'crash: the attempt begins');
$node->stop('immediate');
{ local $SIG{PIPE} = 'IGNORE'; eval { $s->quit }; }
$node->start;
is(message('m-crash'), '', 'crash: nothing of the attempt survived the crash');
is(redeliver('m-crash'), 'process', 'crash: the message runs once more after the restart');

$node->stop;
done_testing();
