# The inbox's attempt cap on every path a session can take (issue 12,
# defects 3-5; SCENARIOS #30-32), and the documented limit of a server
# crash.  Each case uses max_attempts = 1: one failed attempt must make the
# message dead, so a second run of the handler is a cap violation.
#
# 1. The savepoint protocol's recording (idem_inbox_fail answered dead)
#    and then the connection drops before COMMIT: the attempt is still
#    counted (by the backend on its way out).
# 2. PREPARE TRANSACTION with an attempt open, or with its failure
#    recorded, is refused; the attempt stays this session's.
# 3. DISCARD ALL (what a session pooler runs when a client leaves) with an
#    unaccounted attempt: the attempt is recorded before the locks go.
# 4. pg_advisory_unlock_all() with an attempt open or unaccounted for is
#    refused.
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

my $node = IdemTest::new_node('inbox_cap', 'max_prepared_transactions = 5');
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

### 3. DISCARD ALL records the unaccounted attempt before it drops the locks.
$s = $node->background_psql('postgres');
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-discard', sha256('p'), 1)}),
	'process', 'discard: the attempt begins');
$s->query_safe(q{INSERT INTO effects VALUES ('m-discard')});
$s->query_safe('ROLLBACK');
$s->query_safe('DISCARD ALL');
is(message('m-discard'), 'dead 1', 'discard: DISCARD ALL recorded the attempt');
is(q1(q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'}), '0',
	'discard: and released the message');
is(redeliver('m-discard'), 'dead', 'discard: a delivery on another connection finds it dead');
# The session goes on as a fresh one: a new attempt on it works.
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-discard-2', sha256('p'), 1)}),
	'process', 'discard: the session takes new attempts');
$s->query_safe(q{SELECT idem_inbox_done('cap', 'm-discard-2')});
$s->query_safe('COMMIT');
$s->quit;

### 4. pg_advisory_unlock_all() is refused while an attempt needs its lock.
$s = $node->background_psql('postgres', on_error_stop => 0);
$s->query_safe('BEGIN');
$s->query_safe(q{SELECT idem_inbox_begin('cap', 'm-unlock', sha256('p'), 1)});
$s->query(q{SELECT pg_advisory_unlock_all()});
like($s->{stderr}, qr/cannot release all advisory locks while an inbox attempt is unaccounted for/,
	'unlock: refused with an open attempt');
$s->{stderr} = '';
$s->query_safe('ROLLBACK');
$s->query(q{SELECT pg_advisory_unlock_all()});
like($s->{stderr}, qr/cannot release all advisory locks/,
	'unlock: refused with an unaccounted attempt');
$s->{stderr} = '';
is($s->query_safe(q{SELECT outcome FROM idem_inbox_fail('cap', 'm-unlock', 'failed')}),
	'dead', 'unlock: the attempt is recorded');
is($s->query_safe(q{SELECT 'ok' FROM (SELECT pg_advisory_unlock_all()) s}), 'ok',
	'unlock: allowed once every attempt is accounted for');
$s->quit;

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
