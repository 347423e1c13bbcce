# The Python and Node clients through the PL/Proxy router: the first-use
# check accepts a router (no extension, its idem_* functions on the
# search_path forwarding to partitions that have it) and still checks what
# the router shows (EXECUTE on the functions the runner calls); lease mode
# runs, replays, and the key is on the partition that owns it; fenced and
# in-transaction modes, which need the handler's transaction on the
# partition, are refused with the reason before anything is claimed.  The
# scaleout suite passes the Python interpreter in IDEM_PYTHON and the Node
# client's directory (with its node_modules) in IDEM_NODE_CLIENT.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use Scaleout;
use PostgreSQL::Test::Utils;
use Test::More;

my $src = "$FindBin::RealBin/../../..";
my $here = "$FindBin::RealBin/../clients";
my $python = $ENV{IDEM_PYTHON} || 'python3';
my $node_client = $ENV{IDEM_NODE_CLIENT} // '';

my ($router, @parts) = Scaleout::deploy(2);
my $conn = 'host=' . $router->host . ' port=' . $router->port;
$router->safe_psql('postgres', 'CREATE DATABASE plain');

# Run a client's script; its output, one fact a line.
my %clients = (
	python => sub {
		my ($dsn, $key) = @_;
		return ([ $python, "$here/router_python.py", $dsn, $key ], PYTHONPATH => "$src/client/python");
	},
	node => sub {
		my ($dsn, $key) = @_;
		return ([ 'node', "$here/router_node.js", $node_client, $dsn, $key ]);
	});

sub run_client
{
	my ($client, $dsn, $key) = @_;
	my ($cmd, %env) = $clients{$client}->($dsn, $key);
	my ($stdout, $stderr) = ('', '');
	IPC::Run::run($cmd, '>', \$stdout, '2>', \$stderr,
		init => sub { $ENV{$_} = $env{$_} for keys %env })
	  or diag("$client: exit $?: $stderr");
	note("$client: $stdout");
	return $stdout;
}

for my $client (qw(python node))
{
  SKIP:
	{
		skip 'the Node client has no node_modules (IDEM_NODE_CLIENT unset)', 12
		  if $client eq 'node' && !($node_client && -d "$node_client/node_modules");

		my $key = "router-$client-" . int(rand(1e9));
		my $out = run_client($client, "$conn dbname=postgres", $key);
		like($out, qr/^check passed$/m, "$client: the first-use check accepts the router");
		like($out, qr/^first 201 won_completed paid$/m, "$client: lease mode runs the handler through the router");
		like($out, qr/^again 201 replay paid$/m, "$client: the same key replays through the router");
		like($out, qr/^runs 1$/m, "$client: the handler ran once");

		# The router's hash picks the partition; the client's key is there, not on the other.
		my $owner = $router->safe_psql('postgres',
			"SELECT idem_key_partition(idem_key('alice', 'POST', '/payments', '$key'))");
		for my $i (0 .. $#parts)
		{
			my $outcome = $parts[$i]->safe_psql($parts[$i]->{idem_db},
				"SELECT outcome FROM idem_lookup(idem_key('alice', 'POST', '/payments', '$key'), "
				  . "idem_request_hash(convert_to('{\"amount\": 1}', 'UTF8')))");
			is($outcome, $i == $owner ? 'replay' : 'absent',
				"$client: the key is " . ($i == $owner ? '' : 'not ') . "on partition $i");
		}

		# Fenced and in-transaction modes are refused through the router, saying why, and claim nothing.
		for my $mode ('fenced', 'in-transaction')
		{
			like($out, qr/^\Q$mode\E 503 failed ran 0: .*\Q$mode\E mode cannot run through a PL\/Proxy router/m,
				"$client: $mode mode through the router is answered 503, saying why, without running the handler");
			my $claimed = join(',', map {
				$_->safe_psql($_->{idem_db},
					"SELECT count(*) FROM idem_keys WHERE cache_key = idem_key('alice', 'POST', '/payments', '$key-$mode')")
			} @parts);
			is($claimed, '0,0', "$client: $mode mode claimed nothing on the partitions");
		}

		# What the router shows is still checked: EXECUTE on the router's functions.
		$router->safe_psql('postgres', q{
			DO $$ BEGIN
				IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'svc') THEN CREATE ROLE svc LOGIN; END IF;
			END $$;
			REVOKE EXECUTE ON FUNCTION idem_release(bytea, uuid) FROM PUBLIC;
		});
		$out = run_client($client, "$conn dbname=postgres user=svc", $key);
		like($out, qr/^check refused: .*svc.* may not execute idem_release/mi,
			"$client: a role without EXECUTE on the router's idem_release is refused, saying so");
		$router->safe_psql('postgres', 'GRANT EXECUTE ON FUNCTION idem_release(bytea, uuid) TO PUBLIC');

		# Neither the extension nor a router: the error says both.
		$out = run_client($client, "$conn dbname=plain", $key);
		like($out, qr/^check refused: .*not installed .*nor is it a PL\/Proxy router/m,
			"$client: a database with neither the extension nor a router's functions is refused");
	}
}

done_testing();
