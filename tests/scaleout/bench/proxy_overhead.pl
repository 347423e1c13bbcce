# The PL/Proxy router's cost per pg_idem call: the same pgbench scripts
# against the router (two partitions behind it) and directly against one
# partition, interleaved, three rounds of 10 s each.  Not part of make test:
#
#   make installcheck REGRESS= ISOLATION= PROVE_FLAGS=-v \
#        PROVE_TESTS=tests/scaleout/bench/proxy_overhead.pl      (as the server user)
#
# Prints one line per script and target: median tps and mean latency, and
# the router/direct ratios.  Set BENCH_SECONDS and BENCH_CLIENTS to change
# the run.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../t";

use Scaleout;
use PostgreSQL::Test::Utils;
use Test::More;

my $seconds = $ENV{BENCH_SECONDS} // 10;
my $clients = $ENV{BENCH_CLIENTS} // 2;
my ($router, @parts) = Scaleout::deploy(2, 'fsync = off', 'synchronous_commit = off');

my $dir = PostgreSQL::Test::Utils::tempdir();
my %scripts = (
	# A read: what a retry of a finished request costs.
	lookup => q{\set n random(1, 1000)
SELECT outcome FROM idem_lookup(sha256(int8send(:n)), sha256(int8send(:n)));
},
	# A request's write path: claim a new key, then store its response.
	cycle => q{\set n random(1, 9000000000000000000)
SELECT claim_id AS cid FROM idem_claim(sha256(int8send(:n)), sha256(int8send(:n))) \gset
SELECT idem_finalize(sha256(int8send(:n)), :cid::uuid, 201, NULL, 'ok');
},
);
for my $s (keys %scripts)
{
	append_to_file("$dir/$s.sql", $scripts{$s});
}
# Keys for the lookups, finished, on every partition.
$router->safe_psql('postgres', q{
	SELECT idem_finalize(sha256(int8send(n)), claim_id, 200, NULL, 'x')
	  FROM generate_series(1, 1000) n, LATERAL idem_claim(sha256(int8send(n)), sha256(int8send(n)))});

my %targets = (
	router => [ $router->host, $router->port, 'postgres' ],
	direct => [ $parts[0]->host, $parts[0]->port, $parts[0]->{idem_db} ]);
my %tps;
for my $round (1 .. 3)
{
	for my $s (sort keys %scripts)
	{
		for my $t ('direct', 'router')
		{
			my ($host, $port, $db) = @{ $targets{$t} };
			my ($out, $err);
			IPC::Run::run([ 'pgbench', '-n', '-M', 'prepared', '-c', $clients, '-j', $clients, '-T', $seconds,
					'-f', "$dir/$s.sql", '-h', $host, '-p', $port, $db ], '>', \$out, '2>', \$err)
			  or die "pgbench failed: $err";
			my ($tps) = $out =~ /tps = ([0-9.]+)/;
			push @{ $tps{$s}{$t} }, $tps;
			note("round $round $s $t: $tps tps");
		}
	}
}

sub median { my @v = sort { $a <=> $b } @_; return $v[ int(@v / 2) ]; }

for my $s (sort keys %scripts)
{
	my ($d, $r) = (median(@{ $tps{$s}{direct} }), median(@{ $tps{$s}{router} }));
	my $calls = $s eq 'cycle' ? 2 : 1;
	diag(sprintf('%-7s direct %8.0f tps  router %8.0f tps  router/direct %.2f  '
		  . 'per call: direct %.3f ms, router %.3f ms, proxy adds %.3f ms (%d clients)',
		$s, $d, $r, $r / $d, 1000 * $clients / $d / $calls, 1000 * $clients / $r / $calls,
		1000 * $clients * (1 / $r - 1 / $d) / $calls, $clients));
}
ok(1, 'benchmark ran');
done_testing();
