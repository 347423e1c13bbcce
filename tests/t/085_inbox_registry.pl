# The inbox's registry and the recording of attempts, against what broke
# 0.5.0's promises, each case with max_attempts = 1 where a second run of
# the handler would be a cap violation:
#
# 1. Fairness.  0.5.0 kept MaxBackends x 16 entries in one pool: one
#    session holding attempts open or orphaned filled it, and every role
#    in every database got 53400 on its first delivery.  Now a session
#    holds at most idem.inbox_attempts_per_session in its open transaction
#    (its orphans are handed over to make room) and a role at most
#    idem.inbox_attempts_per_role over every session; whoever hits a
#    bound gets 53400 naming it, and another role's first delivery works.
# 2. Recording that does not depend on the session's state: a session
#    whose transactions default to read-only (a replica-style pool,
#    SET SESSION CHARACTERISTICS) records its orphan on exit and hands it
#    over at DISCARD ALL (0.5.0: "cannot execute INSERT in a read-only
#    transaction", and with max_attempts = 1 the next delivery was told to
#    process); an exit whose recording fails (any error) hands it over,
#    and the next delivery adopts it; the cleanup worker records failures
#    handed over for messages nobody delivers again.
# 3. The launcher's settings at both ends of their ranges.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = IdemTest::new_node('inbox_registry', "shared_preload_libraries = 'pg_idem'",
	'idem.cleanup_worker = off', 'max_connections = 40');
$node->safe_psql('postgres', q{
	CREATE TABLE effects (message_id text NOT NULL);
	GRANT INSERT ON effects TO PUBLIC;
	CREATE ROLE greedy LOGIN IN ROLE idem_client;
	CREATE ROLE modest LOGIN IN ROLE idem_client;
	ALTER ROLE greedy SET idem.inbox_attempts_per_role = 6;
	ALTER ROLE greedy SET idem.inbox_attempts_per_session = 4;
	ALTER ROLE greedy SET search_path = public;
	ALTER ROLE modest SET search_path = public;
	-- A delivery whose handler succeeds: its decision.
	CREATE FUNCTION deliver_once(c text, m text, cap integer) RETURNS text
	LANGUAGE plpgsql AS $$
	DECLARE
	  d text := idem_inbox_begin(c, m, sha256('p'), cap);
	BEGIN
	  IF d = 'process' THEN
	    PERFORM idem_inbox_done(c, m);
	  END IF;
	  RETURN d;
	END $$;
});

sub q1 { return $node->safe_psql('postgres', $_[0]); }

sub message
{
	my ($consumer, $id) = @_;
	return q1(qq{SELECT state || ' ' || error_count FROM idem_inbox
	             WHERE consumer = '$consumer' AND message_id = '$id'});
}

# A delivery in its own transaction whose handler succeeds, committed:
# its answer (max_attempts 1 unless given).
sub deliver
{
	my ($role, $consumer, $id, $cap) = @_;
	$cap //= 1;
	return $node->safe_psql('postgres',
		qq{SET ROLE $role; SELECT deliver_once('$consumer', '$id', $cap)});
}

# psql as a role: (exit code, stdout, stderr).
sub try_as
{
	my ($role, $sql) = @_;
	my ($out, $err) = ('', '');
	my $rc = $node->psql('postgres', "\\set VERBOSITY verbose\n$sql", stdout => \$out, stderr => \$err,
		extra_params => [ '-U', $role ]);
	return ($rc, $out, $err);
}

### 1. Fairness.

# One session of greedy: its open transaction may hold 4 attempts.
my $s = $node->background_psql('postgres', extra_params => [ '-U', 'greedy' ],
	on_error_stop => 0);
$s->query_safe('BEGIN');
for my $i (1 .. 4)
{
	is($s->query_safe(qq{SELECT idem_inbox_begin('fair', 'open-$i', sha256('p'), 1)}),
		'process', "session bound: attempt $i of 4 begins");
}
$s->query(q{SELECT idem_inbox_begin('fair', 'open-5', sha256('p'), 1)});
like($s->{stderr}, qr/this session has 4 inbox attempts not accounted for/,
	'session bound: the fifth is refused, naming the count');
like($s->{stderr}, qr/idem\.inbox_attempts_per_session is 4/,
	'session bound: and the setting');
$s->{stderr} = '';
# Meanwhile another role's first delivery, and greedy's own on another
# session, work.
is(deliver('modest', 'fair', 'first'), 'process',
	'session bound: another role\'s first delivery is not refused');
$s->query_safe('ROLLBACK');
is($s->query_safe(q{SELECT count(*) FROM pg_stat_activity WHERE pid = pg_backend_pid()}), '1',
	'session bound: the session goes on');

# greedy's four attempts are orphans now; two more orphans on this
# session: the orphans are handed over to make room, and all count for
# the role (6).
for my $i (5 .. 6)
{
	$s->query_safe('BEGIN');
	is($s->query_safe(qq{SELECT idem_inbox_begin('fair', 'open-$i', sha256('p'), 1)}),
		'process', "role bound: orphan $i begins (the session hands its orphans over)");
	$s->query_safe('ROLLBACK');
}
# The seventh attempt of greedy is refused, on any of its sessions.
my ($rc, $out, $err) = try_as('greedy',
	q{BEGIN; SELECT idem_inbox_begin('fair', 'open-7', sha256('p'), 1); ROLLBACK;});
like($err, qr/role "greedy" has 6 inbox attempts not accounted for/,
	'role bound: the seventh attempt of the role is refused, naming the role');
like($err, qr/idem\.inbox_attempts_per_role/, 'role bound: and the setting');
like($err, qr/ERROR:  53400:/, 'role bound: 53400');
# Another role is not affected.
is(deliver('modest', 'fair', 'second'), 'process',
	'role bound: another role\'s first delivery works');
# A redelivery of one of greedy's own messages adopts its orphan (no new
# entry): the message is dead, not run again.
is(deliver('greedy', 'fair', 'open-1'), 'dead',
	'role bound: a redelivery adopts the orphan and finds the message dead');
is(message('fair', 'open-1'), 'dead 1', 'role bound: its failure is written');
# That freed one: the next new message of greedy begins.
($rc, $out, $err) = try_as('greedy',
	q{BEGIN; SELECT idem_inbox_begin('fair', 'open-7', sha256('p'), 1); ROLLBACK;});
is($out, 'process', 'role bound: room again once an attempt is accounted for');
$s->quit;
# The session's end records what it still holds; what it handed over is
# adopted by deliveries.
for my $i (2 .. 6)
{
	is(deliver('greedy', 'fair', "open-$i"), 'dead', "fair: open-$i is dead after one run");
}
is(q1(q{SELECT count(*) FROM idem_inbox WHERE consumer = 'fair' AND state = 'dead' AND error_count = 1
            AND scope = 'greedy'::regrole}),
	'7', 'fair: each of greedy\'s seven messages counted its one failure (open-7 at its session\'s exit)');

### 2. Recording whatever the session's state.

# A pooler's read-only default: the work runs in BEGIN READ WRITE, the
# recording at exit in a transaction of pg_idem's own.
$node->safe_psql('postgres', q{
	CREATE ROLE readonly_consumer LOGIN IN ROLE idem_client;
	ALTER ROLE readonly_consumer SET default_transaction_read_only = on;
	ALTER ROLE readonly_consumer SET search_path = public;
});
$s = $node->background_psql('postgres', extra_params => [ '-U', 'readonly_consumer' ]);
is($s->query_safe('SHOW default_transaction_read_only'), 'on', 'read-only: the session\'s default');
$s->query_safe('BEGIN READ WRITE');
is($s->query_safe(q{SELECT idem_inbox_begin('ro', 'exit', sha256('p'), 1)}),
	'process', 'read-only exit: the attempt begins');
$s->query_safe(q{INSERT INTO effects VALUES ('exit')});
$s->query_safe('ROLLBACK');
my $pid = $s->query_safe('SELECT pg_backend_pid()');
$s->quit;
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
	'read-only exit: the backend is gone');
is(message('ro', 'exit'), 'dead 1', 'read-only exit: the attempt was recorded on the way out');
is(deliver('readonly_consumer', 'ro', 'exit'), 'dead',
	'read-only exit: the next delivery is not told to process');

# SET SESSION CHARACTERISTICS, then DISCARD ALL: nothing to write, so
# nothing fails; the next delivery adopts the failure.
$s = $node->background_psql('postgres', extra_params => [ '-U', 'modest' ], on_error_stop => 0);
$s->query_safe('SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY');
$s->query_safe('BEGIN READ WRITE');
is($s->query_safe(q{SELECT idem_inbox_begin('ro', 'discard', sha256('p'), 1)}),
	'process', 'read-only discard: the attempt begins');
$s->query_safe('ROLLBACK');
$s->query('DISCARD ALL');
is($s->{stderr}, '', 'read-only discard: DISCARD ALL does not fail');
is(deliver('modest', 'ro', 'discard'), 'dead',
	'read-only discard: the next delivery adopts the failure and finds the message dead');
is(message('ro', 'discard'), 'dead 1', 'read-only discard: counted once');
$s->quit;

# An exit whose recording fails: a DBA's trigger refuses the write for
# this consumer.  The error ends the backend (it is logged); the attempt
# is handed over, and the next delivery adopts it.
$node->safe_psql('postgres', q{
	CREATE FUNCTION refuse_exit_recording() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
	  IF NEW.consumer = 'doomed' AND NEW.state <> 'processing'
	     AND current_setting('application_name') = 'doomed_consumer' THEN
	    RAISE EXCEPTION 'the recording fails';
	  END IF;
	  RETURN NEW;
	END $$;
	CREATE TRIGGER refuse_exit_recording BEFORE INSERT OR UPDATE ON idem_inbox
	  FOR EACH ROW EXECUTE FUNCTION refuse_exit_recording();
});
$s = $node->background_psql('postgres', extra_params => [ '-U', 'modest' ]);
$s->query_safe(q{SET application_name = 'doomed_consumer'});
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('doomed', 'm', sha256('p'), 1)}),
	'process', 'failed recording: the attempt begins');
$s->query_safe('ROLLBACK');
$pid = $s->query_safe('SELECT pg_backend_pid()');
$s->quit;
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
	'failed recording: the backend is gone');
is(message('doomed', 'm'), '', 'failed recording: nothing was written on the way out');
ok($node->log_contains('the recording fails'), 'failed recording: the error is logged');
is(deliver('modest', 'doomed', 'm'), 'dead',
	'failed recording: the next delivery adopts the attempt and finds the message dead');
is(message('doomed', 'm'), 'dead 1', 'failed recording: counted once');

# Handed over and never delivered again: the cleanup worker records it.
$s = $node->background_psql('postgres', extra_params => [ '-U', 'modest' ]);
$s->query_safe('BEGIN');
is($s->query_safe(q{SELECT idem_inbox_begin('sweep', 'm', sha256('p'), 3)}),
	'process', 'sweep: the attempt begins');
$s->query_safe('ROLLBACK');
$s->query_safe('DISCARD ALL');
$s->quit;
is(message('sweep', 'm'), '', 'sweep: handed over, nothing written yet');
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET idem.cleanup_worker = on;
	ALTER SYSTEM SET idem.cleanup_interval = '1s';
	SELECT pg_reload_conf();
});
ok($node->poll_query_until('postgres',
		q{SELECT state || ' ' || error_count || ' ' || last_error FROM idem_inbox
		   WHERE consumer = 'sweep' AND message_id = 'm'},
		'failed 1 consumer session ended or was reset before the attempt was recorded'),
	'sweep: the cleanup worker recorded the failure');
is(q1(q{SELECT scope::regrole FROM idem_inbox WHERE consumer = 'sweep'}), 'modest',
	'sweep: in the role\'s scope');
is(deliver('modest', 'sweep', 'm', 3), 'process', 'sweep: the next delivery starts from the count');
is(message('sweep', 'm'), 'done 1', 'sweep: and the failure stays counted');

### 3. The launcher's settings at both ends of their ranges.
for my $setting ([ 'cleanup_interval', '1d' ], [ 'cleanup_interval', '1s' ],
	[ 'cleanup_database_timeout', '1d' ], [ 'cleanup_database_timeout', '1s' ])
{
	my ($name, $value) = @$setting;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET idem.$name = '$value'; SELECT pg_reload_conf();");
	ok($node->poll_query_until('postgres',
			"SELECT current_setting('idem.$name') = '$value'"),
		"launcher: idem.$name = $value is in effect");
	ok($node->poll_query_until('postgres',
			q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'pg_idem launcher'}),
		"launcher: still running with idem.$name = $value");
}

is(q1('SELECT count(*) FROM effects'), '0', 'no handler effect was ever committed');
ok(!$node->log_contains('TRAP|server process .* was terminated by signal'),
	'no backend crashed');
done_testing();
