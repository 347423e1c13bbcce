# Claims and finalizes while the table owner maintains idem_keys (issue 24).
#
# Five client connections claim and finalize keys while another runs, in
# rounds, the maintenance an operator runs on a live table: REINDEX TABLE
# CONCURRENTLY, CREATE and DROP INDEX CONCURRENTLY, VACUUM FULL, CLUSTER,
# ADD / ALTER TYPE / DROP COLUMN, SET (fillfactor), a trigger created and
# dropped, ANALYZE.  Every one of them invalidates idem_keys' relcache
# entry, so the claimers' backends rebuild their kept state of the table
# (direct_table.c) over and over, often while the maintenance commits its
# next step.  0.4.0 crashed a backend this way (a pointer into the freed
# trigger array, see direct_build.c), and answered some claims racing
# for a new key 23505 from the primary key's REINDEX CONCURRENTLY copy.
#
# The claimers walk the same keys, so they race for each new key: the
# one told "claimed" finalizes it, the others are followers.  Asserted:
# the server never restarted and no connection was lost; no claim was
# answered 23505 or an internal error; no key was claimed twice; every
# claim a client was told it won has its row, and every finalize it was
# told succeeded has its response stored.  The run is a number of
# maintenance rounds (IDEM_MAINTENANCE_ROUNDS, default 50), within a
# generous deadline; nothing is asserted about how much got done in it.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdemTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $NCLAIMERS = 5;
my $ROUNDS = $ENV{IDEM_MAINTENANCE_ROUNDS} // 50;
my $CHUNK = 20;          # claims sent to a claimer at a time
my $DEADLINE = 600;      # seconds; a run far longer than this is stuck

my $node = IdemTest::new_node('maintenance');
$node->safe_psql('postgres', q{
	CREATE FUNCTION st_key(label integer) RETURNS bytea
		LANGUAGE sql IMMUTABLE AS $$ SELECT idem_key('maint', 'POST', '/orders', label::text) $$;
	CREATE FUNCTION st_hash(label integer) RETURNS bytea
		LANGUAGE sql IMMUTABLE AS $$ SELECT idem_request_hash(convert_to('order ' || label, 'UTF8')) $$;
});
my $started_at = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

# One round of maintenance, as the table owner (here the superuser).
my $round = q{
REINDEX TABLE CONCURRENTLY idem_keys;
CREATE INDEX CONCURRENTLY st_generation ON idem_keys (generation);
DROP INDEX CONCURRENTLY st_generation;
VACUUM FULL idem_keys;
CLUSTER idem_keys USING idem_keys_pkey;
ALTER TABLE idem_keys ADD COLUMN st_extra integer;
ALTER TABLE idem_keys ALTER COLUMN st_extra TYPE bigint;
ALTER TABLE idem_keys DROP COLUMN st_extra;
ALTER TABLE idem_keys SET (fillfactor = 70);
CREATE TRIGGER st_never AFTER INSERT ON idem_keys FOR EACH STATEMENT
	WHEN (false) EXECUTE FUNCTION suppress_redundant_updates_trigger();
DROP TRIGGER st_never ON idem_keys;
ALTER TABLE idem_keys RESET (fillfactor);
ANALYZE idem_keys;
};
my %maint = (in => join('', map { "\\echo ROUND $_\n$round" } 1 .. $ROUNDS) . "\\echo MAINTENANCE DONE\n\\q\n",
	out => '', err => '');
$maint{h} = IPC::Run::start(
	[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=0', '-v', 'VERBOSITY=verbose', '-d', $node->connstr('postgres'),
	  '-f', '-' ],
	'<', \$maint{in}, '>', \$maint{out}, '2>', \$maint{err});

# A claimer: claims key after key; finalizes the ones it wins.  Each line
# it prints says what it was told: C|claimer|label|outcome, F|claimer|label|t.
my @claimers = map { { id => $_, next => 0, in => '', out => '', err => '' } } 1 .. $NCLAIMERS;
for my $c (@claimers)
{
	$c->{in} = "\\set VERBOSITY verbose\n";
	$c->{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=0', '-d', $node->connstr('postgres'), '-f', '-' ],
		'<', \$c->{in}, '>', \$c->{out}, '2>', \$c->{err});
}

sub claims
{
	my ($c) = @_;
	my $script = '';
	for (1 .. $CHUNK)
	{
		my $label = $c->{next}++;
		my $id = $c->{id};
		$script .= qq{\\set won f
\\set line 'C|$id|$label|error'
SELECT outcome = 'claimed' AS won, claim_id AS cid, 'C|$id|$label|' || outcome AS line
  FROM idem_claim(st_key($label), st_hash($label), '1 hour') \\gset
\\echo :line
\\if :won
SELECT 'F|$id|$label|' || idem_finalize(st_key($label), :'cid', 201, NULL,
                                        convert_to('order $label by $id', 'UTF8'));
\\endif
};
	}
	return $script;
}

my $deadline = time + $DEADLINE;
my $maintenance_done = 0;
while (time < $deadline)
{
	eval { $maint{h}->pump_nb };
	$maintenance_done = 1 if $maint{out} =~ /MAINTENANCE DONE/;
	last if $maintenance_done;
	for my $c (@claimers)
	{
		eval { $c->{h}->pump_nb };
		$c->{in} .= claims($c) if length($c->{in}) == 0;
	}
	usleep(20_000);
}
ok($maintenance_done, "the $ROUNDS maintenance rounds ended within ${DEADLINE} s");
eval { $maint{h}->finish };
for my $c (@claimers)
{
	$c->{in} .= "\\q\n";
	eval { $c->{h}->finish };
}

is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $started_at,
	'the server never restarted');
my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|server process .* was terminated/, 'no backend crashed');

my $claimer_errors = join('', map { $_->{err} } @claimers);
unlike($claimer_errors, qr/connection to server was lost|server closed the connection/,
	'no claimer lost its connection');
unlike($claimer_errors, qr/ERROR:  23505/, 'no claim or finalize was answered 23505');
unlike($claimer_errors, qr/ERROR:  XX/, 'no internal error');
my %sqlstates;
$sqlstates{$1}++ while $claimer_errors =~ /ERROR:  ([0-9A-Z]{5})/g;
diag("claimers' errors by SQLSTATE: " . join(', ', map { "$_ $sqlstates{$_}" } sort keys %sqlstates))
  if %sqlstates;
diag("maintenance errors: $1") while $maint{err} =~ /ERROR:  (.*)/g;

# What the clients were told.
my (%won, %finalized, %outcomes);
for my $c (@claimers)
{
	for my $line (split /\n/, $c->{out})
	{
		if ($line =~ /^C\|(\d+)\|(\d+)\|(\w+)$/)
		{
			$outcomes{$3}++;
			push @{ $won{$2} }, $1 if $3 eq 'claimed';
		}
		elsif ($line =~ /^F\|(\d+)\|(\d+)\|t$/)
		{
			$finalized{$2} = $1;
		}
	}
}
diag('claim outcomes: ' . join(', ', map { "$_ $outcomes{$_}" } sort keys %outcomes));
ok(scalar(keys %won) > 0, 'some claims were won');
my @twice = grep { @{ $won{$_} } > 1 } keys %won;
is(scalar(@twice), 0, 'no key was claimed twice') or diag("claimed twice: @twice");

# What the table holds: every acknowledged claim and finalize is there.
my %rows;
my $last_label = (sort { $b <=> $a } map { $_->{next} } @claimers)[0];
for my $row (split /\n/, $node->safe_psql('postgres', qq{
	SELECT l, k.state, coalesce(convert_from(k.response_body, 'UTF8'), '')
	  FROM generate_series(0, $last_label) l JOIN idem_keys k ON k.cache_key = st_key(l)}))
{
	my ($label, $state, $body) = split /\|/, $row, -1;
	$rows{$label} = [ $state, $body ];
}
my @missing = grep { !exists $rows{$_} } keys %won;
is(scalar(@missing), 0, 'every claim a client won has its row') or diag("missing: @missing");
my @lost = grep {
	!exists $rows{$_} || $rows{$_}[0] ne 'completed' || $rows{$_}[1] ne "order $_ by $finalized{$_}"
} keys %finalized;
is(scalar(@lost), 0, 'every acknowledged finalize has its response stored') or diag("lost: @lost");

my ($rc, $stdout, $stderr) = $node->psql('postgres', q{
	CREATE EXTENSION IF NOT EXISTS amcheck;
	SELECT count(bt_index_check(i.indexrelid, true))
	  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
	 WHERE i.indrelid = 'idem_keys'::regclass AND c.relam = 403 AND i.indisvalid});
is($rc, 0, "amcheck (heapallindexed) passes on idem_keys' valid B-tree indexes") or diag($stderr);

$node->stop;
done_testing();
