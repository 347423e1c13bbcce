# The C++ client through a synchronous failover (client/cpp/tests/failover_storm.cpp):
# four threads send requests through runner::run_in_transaction with a
# multi-host connection string and target_session_attrs=read-write; the
# primary stops immediately mid-storm and the standby is promoted; every
# request that lost its answer is sent again with its key.  On the new
# primary: every answered request has exactly one effect row (the handler's
# write committed once, with its response) and its response replays.  The
# failover suite passes the binary in IDEM_FAILOVER_STORM; without it the
# test is skipped.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $bin = $ENV{IDEM_FAILOVER_STORM} // '';
plan skip_all => 'the C++ client was not built (IDEM_FAILOVER_STORM unset)' unless $bin && -x $bin;

my $primary = PostgreSQL::Test::Cluster->new('cpp_primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION pg_idem;
	CREATE TABLE storm_effects (label text NOT NULL, generation bigint NOT NULL)});
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('cpp_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->append_conf('postgresql.conf', "synchronous_standby_names = 'cpp_standby'\n");
$primary->reload;
$primary->poll_query_until('postgres',
	q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'cpp_standby'})
  or die 'the standby never became synchronous';

my $dir = PostgreSQL::Test::Utils::tempdir();
my ($log, $stop) = ("$dir/storm.log", "$dir/stop");
my $conninfo = sprintf('host=%s,%s port=%d,%d dbname=postgres target_session_attrs=read-write connect_timeout=2',
	$primary->host, $standby->host, $primary->port, $standby->port);
my $storm = IPC::Run::start([ $bin, $conninfo, 4, $log, $stop ], '>', "$dir/out", '2>', "$dir/err");

sub answered
{
	return 0 unless -f $log;
	return scalar(() = slurp_file($log) =~ /^answered /mg);
}

# Wait for a count under a generous deadline, never "at least N within a
# fixed time" (a busy CI machine).
sub wait_for_answered
{
	my ($count) = @_;
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (answered() < $count)
	{
		return 0 if time() > $deadline;
		usleep(100_000);
	}
	return 1;
}

ok(wait_for_answered(100), 'the C++ clients got 100 answers from the old primary');
$primary->stop('immediate');
my $before = answered();
$standby->promote;
ok(wait_for_answered($before + 50), 'and carry on against the promoted standby');
append_to_file($stop, 'stop');
ok($storm->finish, 'every client thread ended') or diag(slurp_file("$dir/err"));

my %answered;
for (split /\n/, slurp_file($log))
{
	my (undef, $label, $status) = split / /;
	$answered{$label} = $status;
}
is(scalar(grep { $answered{$_} ne '201' } keys %answered), 0, 'every answer is the handler\'s 201');
$standby->safe_psql('postgres', 'CREATE TABLE answered (label text)');
$standby->safe_psql('postgres', 'INSERT INTO answered VALUES ' . join(',', map { "('$_')" } sort keys %answered));
is($standby->safe_psql('postgres', q{
	SELECT count(*) FROM answered a
	 WHERE (SELECT count(*) FROM storm_effects e WHERE e.label = a.label) <> 1}), 0,
	'every answered request has exactly one effect row on the new primary');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM (SELECT label FROM storm_effects GROUP BY label HAVING count(*) > 1) d}),
	0, 'no request\'s effect committed twice');
is($standby->safe_psql('postgres', q{
	SELECT count(*) FROM answered a,
	       LATERAL idem_lookup(idem_key('storm', 'POST', '/effects', a.label),
	                           sha256(convert_to('{"label":"' || a.label || '"}', 'UTF8'))) l
	 WHERE l.outcome IS DISTINCT FROM 'replay'
	    OR convert_from(l.response_body, 'UTF8') IS DISTINCT FROM 'effect ' || a.label}), 0,
	'every answered response replays on the new primary');
note(scalar(keys %answered) . ' requests answered');

done_testing();
