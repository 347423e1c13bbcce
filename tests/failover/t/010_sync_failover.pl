# A primary failover under synchronous streaming replication.
#
# A primary and a synchronous standby, both with pg_idem preloaded (the
# cleanup worker waits for the end of recovery).  A storm of claims,
# renewals and finalizes from four clients with a multi-host connection
# string and target_session_attrs=read-write (tests/failover/storm.py);
# the primary stops immediately mid-storm; the standby is promoted; the
# clients carry on against it.  Then on the new primary: every claim and
# response acknowledged to a client is there, no handler ran twice, a
# crashed winner's live lease still holds and its expired one is
# recovered, the stale claim id is refused, and the cleanup worker runs.

use strict;
use warnings;

use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my @conf = (
	"shared_preload_libraries = 'pg_idem'",
	"idem.cleanup_interval = '1s'",
	"wal_level = replica");
my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', join('', map { "$_\n" } @conf));
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION pg_idem');
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
# Synchronous: a commit is acknowledged once the standby has flushed it.
$primary->append_conf('postgresql.conf', "synchronous_standby_names = 'standby'\n");
$primary->reload;
$primary->poll_query_until('postgres',
	q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'})
  or die 'the standby never became synchronous';
ok(1, 'the standby is synchronous');

sub q1
{
	my ($node, $sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

my $k = sub { "sha256(convert_to('storm:$_[0]', 'UTF8'))" };
my $h = sub { "sha256(convert_to('body $_[0]', 'UTF8'))" };

# Crashed winners: claims committed before the crash and never finished,
# one with a lease that outlives the failover, one with a short lease.
my ($live_id, $live_gen, $live_expiry) = split /\|/, q1($primary, qq{
	SELECT claim_id, generation, lease_expires_at FROM idem_claim(${\ $k->('live')}, ${\ $h->('live')}, '1 hour')});
my ($short_id, $short_gen) = split /\|/, q1($primary, qq{
	SELECT claim_id, generation FROM idem_claim(${\ $k->('short')}, ${\ $h->('short')}, '2 seconds')});

is(q1($standby, q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_idem cleanup'}), 0,
	'no cleanup worker runs on the standby');

# The storm.
my $dir = PostgreSQL::Test::Utils::tempdir();
my ($log, $stop) = ("$dir/storm.log", "$dir/stop");
my $conninfo = sprintf('host=%s,%s port=%d,%d dbname=postgres target_session_attrs=read-write connect_timeout=2',
	$primary->host, $standby->host, $primary->port, $standby->port);
my $storm = IPC::Run::start([ 'python3', "$FindBin::RealBin/../storm.py", $conninfo, 4, $log, $stop ],
	'>', "$dir/storm.out", '2>', "$dir/storm.err");

# Count lines of one kind in the log so far.
sub logged
{
	my ($what) = @_;
	return 0 unless -f $log;
	return scalar grep { /^$what / } split /\n/, slurp_file($log);
}

# Wait for a count under a generous deadline, never "at least N within a
# fixed time": on a busy 2-core CI machine the storm may be slow to start.
sub wait_for_logged
{
	my ($what, $count) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (logged($what) < $count)
	{
		return 0 if time() > $deadline;
		usleep(100_000);
	}
	return 1;
}

# Wait until the storm is well under way, then crash the primary mid-storm.
ok(wait_for_logged('finalized', 100), 'the storm finalized 100 keys on the old primary');
$primary->stop('immediate');
my $before = logged('finalized');
$standby->promote;
ok(1, 'the standby is promoted');
my $new = $standby;

# Let the clients reconnect and carry on against the new primary.
ok(wait_for_logged('finalized', $before + 50), 'the clients reconnected and carry on against the new primary');
append_to_file($stop, 'stop');
ok($storm->finish, 'every client ended cleanly') or diag(slurp_file("$dir/storm.err"));

### Every acknowledged claim and response is on the new primary.

my (%claimed, %ran, %done);
for (split /\n/, slurp_file($log))
{
	my ($what, $label, @rest) = split / /;
	$claimed{$label} = [@rest] if $what eq 'claimed';
	$ran{$label}++ if $what eq 'ran';
	$done{$label} = 1 if $what eq 'finalized' || $what eq 'settled';
}
ok(logged('reconnected') >= 1, 'the crash broke clients mid-request: ' . logged('reconnected') . ' reconnected');
note('finalizes of unknown outcome settled by reading the key: ' . logged('settled'));
note(sprintf('%d claims, %d handler runs, %d responses acknowledged', scalar(keys %claimed),
	scalar(keys %ran), scalar(keys %done)));
q1($new, q{CREATE TABLE acked_claims (label text, claim_id uuid, generation bigint);
           CREATE TABLE acked_responses (label text)});
q1($new, 'INSERT INTO acked_claims VALUES ' .
	join(',', map { "('$_', '$claimed{$_}[0]', $claimed{$_}[1])" } sort keys %claimed));
q1($new, 'INSERT INTO acked_responses VALUES ' . join(',', map { "('$_')" } sort keys %done));

is(q1($new, q{SELECT count(*) FROM acked_claims a
                LEFT JOIN idem_keys k ON k.cache_key = sha256(convert_to('storm:' || a.label, 'UTF8'))
                                     AND k.generation = a.generation
               WHERE k.cache_key IS NULL}), 0,
	'every acknowledged claim is on the new primary with its generation');
is(q1($new, q{SELECT count(*) FROM acked_responses a,
                LATERAL idem_lookup(sha256(convert_to('storm:' || a.label, 'UTF8')),
                                    sha256(convert_to('body ' || a.label, 'UTF8'))) l
               WHERE l.outcome IS DISTINCT FROM 'replay'
                  OR convert_from(l.response_body, 'UTF8') IS DISTINCT FROM 'body ' || a.label}), 0,
	'every acknowledged response replays, byte for byte');
is(scalar(grep { $ran{$_} > 1 } keys %ran), 0, 'no handler ran twice for a key');
is(scalar(grep { !$ran{$_} } keys %done), 0, 'every stored response comes from one handler run');

### Crashed winners, leases and fences on the new primary.

is(q1($new, qq{SELECT outcome FROM idem_claim(${\ $k->('live')}, ${\ $h->('live')})})
	. q1($new, qq{SELECT '/' || (lease_expires_at = '$live_expiry') FROM idem_keys WHERE cache_key = ${\ $k->('live')}}),
	'in_progress/true', 'a crashed winner\'s live lease holds on the new primary, to the same instant');
$new->poll_query_until('postgres', qq{SELECT outcome = 'claimable' FROM idem_lookup(${\ $k->('short')}, ${\ $h->('short')})})
  or die 'the short lease never expired';
my ($o, $stealer, $gen) = split /\|/, q1($new, qq{
	SELECT outcome, claim_id, generation FROM idem_claim(${\ $k->('short')}, ${\ $h->('short')}, '1 hour')});
is($o, 'recovered_abandoned', 'a crashed winner\'s key is recovered after its lease');
ok($gen > $short_gen, "with a greater generation ($short_gen -> $gen)");
is(q1($new, qq{SELECT idem_finalize(${\ $k->('short')}, '$short_id', 201, NULL, 'stale')}), 'f',
	'the stale claim id is refused on the new primary');
is(q1($new, qq{SELECT idem_renew(${\ $k->('short')}, '$short_id')}), '', 'and cannot renew');
is(q1($new, qq{SELECT idem_finalize(${\ $k->('short')}, '$stealer', 201, NULL, 'new')}), 't',
	'the new owner finalizes');

### The cleanup worker runs on the new primary.

$new->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'pg_idem launcher'})
  or die 'no cleanup launcher';
ok(1, 'the cleanup launcher started on the new primary');
q1($new, q{ALTER SYSTEM SET idem.ttl = '1s'; ALTER SYSTEM SET idem.tombstone_ttl = 0;
           ALTER SYSTEM SET idem.cleanup_interval = '1s'; SELECT pg_reload_conf()});
ok($new->poll_query_until('postgres', q{SELECT count(*) = 0 FROM idem_keys WHERE state = 'completed'}),
	'and its workers delete the finished keys past idem.ttl');

done_testing();
