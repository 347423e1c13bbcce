# idem.cleanup_delay paces the cleanup worker (issue 35): it sleeps the
# delay after each full batch; a reload changes the sleep in progress;
# SIGTERM ends it at once; sleeps never carry a pass past half of
# idem.cleanup_database_timeout (no "skipped" WARNING for a paced pass);
# the jobs take turns, so a job with nothing to do leaves the pass's time
# to the keys, and each job gets a batch in every pass; a cancel ends the
# sleeping, not the worker; bad values are refused with the usual GUC
# errors.
#
# Nothing is timed tightly: each check counts batches (10 keys each)
# against a 10 s delay, so a slow machine can only make the worker do
# fewer batches, never more, and every "at once" is bounded by several
# seconds against the minutes the delay would take.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = PostgreSQL::Test::Cluster->new('cleanup_delay');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_idem'
idem.cleanup_worker = off
idem.cleanup_interval = '1s'
idem.cleanup_database_timeout = '1d'
idem.cleanup_batch = 10
idem.cleanup_delay = '10s'
idem.ttl = '1s'
idem.tombstone_ttl = 0
idem.outbox_retention = '1s'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pg_idem');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# Settings by ALTER SYSTEM, then a reload.
sub reload_with
{
	my %set = @_;
	q1(join('', map { "ALTER SYSTEM SET idem.$_ = '$set{$_}';\n" } sort keys %set)
		  . 'SELECT pg_reload_conf();');
}

# $n finished keys named $prefix-1 .. $prefix-$n, past idem.ttl on return.
sub finished_keys
{
	my ($prefix, $n) = @_;
	q1(qq{
		SELECT count(idem_finalize(idem_key('w', 'POST', '/p', '$prefix-' || i), c.claim_id, 200, NULL, 'x'))
		  FROM generate_series(1, $n) i,
		       LATERAL idem_claim(idem_key('w', 'POST', '/p', '$prefix-' || i), sha256('b')) c});
	sleep 2;
}

sub keys_left { return q1('SELECT count(*) FROM idem_keys'); }

# $n published outbox events, past idem.outbox_retention on return.
sub published_events
{
	my ($n) = @_;
	q1(qq{SELECT count(idem_outbox_stage('t', '{}'::jsonb)) FROM generate_series(1, $n)});
	q1(q{WITH c AS (SELECT * FROM idem_outbox_claim(1000, '30 s'))
	     SELECT idem_outbox_ack((array_agg(claim_token))[1], array_agg(id)) FROM c});
	sleep 2;
}
sub archived { return q1('SELECT count(*) FROM idem_outbox_archive'); }

# Whether $sql returns t within $secs seconds.
sub within
{
	my ($secs, $sql) = @_;
	my $until = time + $secs;
	while (time < $until)
	{
		return 1 if q1($sql) eq 't';
		select(undef, undef, undef, 0.2);
	}
	return 0;
}

my $worker = q{FROM pg_stat_activity WHERE backend_type = 'pg_idem cleanup'};

### 1. The delay is honoured: one batch, then a 10 s sleep.
finished_keys('a', 500);
reload_with(cleanup_worker => 'on');
ok($node->poll_query_until('postgres', 'SELECT count(*) < 500 FROM idem_keys'),
	'the worker starts its pass');
my $first = keys_left();
is($first, '490', 'its first batch deleted idem.cleanup_batch keys');
sleep 4;
cmp_ok(keys_left(), '>=', 480,
	'4 s later at most one more batch: the worker sleeps 10 s after a full batch');
ok(within(60, "SELECT count(*) = 1 AND bool_and(wait_event = 'Extension') $worker"),
	'the sleeping worker waits on its latch (wait event Extension)');

### 2. A reload applies a new delay to the sleep in progress.
# The same pass: another would start only after this one's 48 sleeps.
reload_with(cleanup_delay => '0');
ok(within(60, 'SELECT count(*) = 0 FROM idem_keys'),
	'idem.cleanup_delay = 0 by reload: the rest (48 batches, 8 min at 10 s) is deleted at once');
is(q1("SELECT setting FROM pg_settings WHERE name = 'idem.cleanup_delay'"), '0',
	'the new value is in effect');

### 3. SIGTERM during a long sleep ends the worker at once.
reload_with(cleanup_delay => '10s');
ok(within(60, "SELECT current_setting('idem.cleanup_delay') = '10s'"), 'delay 10s again');
finished_keys('b', 500);
ok(within(60, "SELECT count(*) = 1 AND bool_and(wait_event = 'Extension') $worker"),
	'a new pass sleeps after its first batch');
# No pass after this one: a terminated worker's keys stay as it left them.
reload_with(cleanup_interval => '1d');
# Terminate the worker caught early in its sleep (at most 5 s into it);
# pg_terminate_backend waits for its exit until 0.5 s before its sleep
# would have ended, and says whether it came.
my ($terminated, $left) = ('', '');
for my $try (1 .. 5)
{
	next unless within(60, "SELECT count(*) = 1 AND bool_and(wait_event = 'Extension') $worker");
	$left = keys_left();
	$terminated = q1(qq{
		SELECT pg_terminate_backend(pid,
		         (9500 - 1000 * extract(epoch FROM clock_timestamp() - state_change))::bigint)
		  $worker AND wait_event = 'Extension'
		   AND clock_timestamp() - state_change < interval '5 s'});
	last if $terminated ne '';
	sleep 1;
}
is($terminated, 't', 'SIGTERM in a 10 s sleep: the worker exits before the sleep would end');
sleep 2;
is(keys_left(), $left, 'no batch after the SIGTERM');
ok($node->log_contains('terminating background worker "pg_idem cleanup" due to administrator command'),
	'the worker reports why it ended');
ok(within(60, "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'pg_idem launcher'"),
	'the launcher carries on');

### 4. Sleeps never carry a pass past half of idem.cleanup_database_timeout.
# 4 s: a pass may sleep until 2 s after its start, so a 10 s sleep is
# never begun: one batch per pass, then the next pass a second later; the
# launcher never has to stop a worker.
# The other jobs still get their batch in each pass: a backlog of keys
# does not hold up the outbox's prune.
published_events(30);
is(archived(), '30', '30 published events past their retention');
my $log_offset = -s $node->logfile;
my $before = keys_left();
reload_with(cleanup_database_timeout => '4s', cleanup_interval => '1s');
ok(within(120, "SELECT count(*) <= $before - 40 FROM idem_keys"),
	'timeout 4s, delay 10s: passes of one batch each go on');
ok(within(60, 'SELECT count(*) = 0 FROM idem_outbox_archive'),
	'the outbox is pruned beside them, a batch a pass');
cmp_ok(keys_left(), '>', 0, 'while the keys are still being deleted');
ok(!$node->log_contains('skipped: its worker did not finish', $log_offset),
	'no pass was stopped by the launcher');
reload_with(cleanup_database_timeout => '1d', cleanup_delay => '0');
ok(within(60, 'SELECT count(*) = 0 FROM idem_keys'), 'the rest is deleted unpaced');

### 5. The jobs take turns: the keys have the pass's whole time to themselves.
# Timeout 24 s: a pass may sleep until 12 s after its start.  With a 2 s
# delay that is about 6 batches of 10 keys; a share of a quarter per job
# (0.6.0's first pacing) allowed 2.  Only batches slower than a second
# would bring the new worker down to the old one's 2 batches.
reload_with(cleanup_interval => '1d', cleanup_delay => '2s',
	cleanup_database_timeout => '24s');
ok(within(60, "SELECT count(*) = 0 $worker"), 'no pass runs');
finished_keys('c', 300);
$log_offset = -s $node->logfile;
reload_with(cleanup_interval => '1s');
ok(within(60, "SELECT count(*) = 1 $worker"), 'a pass starts');
# No pass after this one.
reload_with(cleanup_interval => '1d');
ok(within(60, "SELECT count(*) = 0 $worker"), 'the pass ends');
my $deleted = 300 - keys_left();
note("one pass deleted $deleted keys");
cmp_ok($deleted, '>=', 40,
	'one pass deleted at least 4 batches of keys: more than a quarter of its time allows');
cmp_ok($deleted, '<', 300, 'and stopped at half of the timeout, the rest left for the next');
ok(!$node->log_contains('skipped: its worker did not finish', $log_offset),
	'the launcher did not have to stop it');

### 5b. A cancel during a sleep ends the pass's sleeping, not the worker.
# With a 10 s delay and a day's timeout the pass would sleep for minutes;
# after the cancel it gives each job its batch and exits (0).
reload_with(cleanup_delay => '10s', cleanup_database_timeout => '1d',
	cleanup_interval => '1d');
ok(within(60, "SELECT count(*) = 0 $worker"), 'no pass runs');
$log_offset = -s $node->logfile;
reload_with(cleanup_interval => '1s');
ok(within(60, "SELECT count(*) = 1 AND bool_and(wait_event = 'Extension') $worker"),
	'a pass sleeps after its first batch');
reload_with(cleanup_interval => '1d');
my $pid = q1("SELECT pid $worker");
is(q1("SELECT pg_cancel_backend($pid)"), 't', 'the sleeping worker is sent a cancel');
ok(within(60, "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
	'it stops sleeping: the pass ends');
ok($node->log_contains('canceling statement due to user request', $log_offset),
	'the cancel is reported');
ok(!$node->log_contains('pg_idem cleanup.*exited with exit code 1', $log_offset),
	'the worker did not die of it');
reload_with(cleanup_delay => '0', cleanup_interval => '1s');
ok(within(60, 'SELECT count(*) = 0 FROM idem_keys'), 'the next passes delete the rest');

### 6. Bad values are refused with the usual errors; the range's ends are taken.
for my $bad ([ "'-1'", qr/22023: -1 ms is outside the valid range for parameter "idem.cleanup_delay" \(0( ms)? \.\. 10000( ms)?\)/ ],
	[ "'11s'", qr/22023: 11000 ms is outside the valid range for parameter "idem.cleanup_delay" \(0( ms)? \.\. 10000( ms)?\)/ ],
	[ "'soon'", qr/22023: invalid value for parameter "idem.cleanup_delay": "soon"/ ])
{
	my ($value, $error) = @$bad;
	my ($ret, $stdout, $stderr) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nALTER SYSTEM SET idem.cleanup_delay = $value");
	like($stderr, $error, "idem.cleanup_delay = $value is refused");
}
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSET idem.cleanup_delay = 0");
like($stderr, qr/55P02: parameter "idem.cleanup_delay" cannot be changed now/,
	'a session cannot set it (reload only)');
for my $value ('0', '10s')
{
	reload_with(cleanup_delay => $value);
	ok(within(60, "SELECT current_setting('idem.cleanup_delay') = '$value'"),
		"idem.cleanup_delay = $value is taken");
}
is(q1("SELECT unit || ' ' || min_val || ' ' || max_val || ' ' || boot_val || ' ' || context
	     FROM pg_settings WHERE name = 'idem.cleanup_delay'"),
	'ms 0 10000 200 sighup', 'pg_settings: unit, range, default, reload only');

ok(!$node->log_contains('TRAP|server process .* was terminated by signal'), 'no backend crashed');
$node->stop;
done_testing();
