# The scripted PL/Proxy deployment of pg_idem: N partition servers with
# pg_idem and one router server with PL/Proxy and tests/scaleout/router.sql.
package Scaleout;

use strict;
use warnings;

use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;

# Deploy $n partitions (a power of 2) and a router; extra postgresql.conf
# lines of the partitions in @conf.  Returns ($router, @partitions).  The
# partitions preload pg_idem, as production servers do (the inbox's cap
# lives in shared memory), without the cleanup worker, which would write
# while the tests read.
sub deploy
{
	my ($n, @conf) = @_;
	my @parts;
	for my $i (0 .. $n - 1)
	{
		my $node = PostgreSQL::Test::Cluster->new("part$i");
		$node->init;
		$node->append_conf('postgresql.conf',
			join('', map { "$_\n" } 'max_connections = 60',
				"shared_preload_libraries = 'pg_idem'", 'idem.cleanup_worker = off', @conf));
		$node->start;
		# A database named after the partition, so that PL/Proxy's errors name it.
		$node->safe_psql('postgres', "CREATE DATABASE idem_p$i");
		$node->safe_psql("idem_p$i", 'CREATE EXTENSION pg_idem');
		$node->{idem_db} = "idem_p$i";
		push @parts, $node;
	}

	my $router = PostgreSQL::Test::Cluster->new('router');
	$router->init;
	$router->append_conf('postgresql.conf', "max_connections = 60\n");
	$router->start;
	my $options = join(', ', "connection_lifetime '1800'",
		map { "p$_ '" . conninfo($parts[$_]) . "'" } 0 .. $n - 1);
	$router->safe_psql('postgres', qq{
		CREATE EXTENSION plproxy;
		CREATE SERVER idem FOREIGN DATA WRAPPER plproxy OPTIONS ($options);
		CREATE USER MAPPING FOR PUBLIC SERVER idem OPTIONS (user 'postgres');
	});
	my $sql = slurp_file("$FindBin::RealBin/../router.sql");
	$router->safe_psql('postgres', $sql);
	return ($router, @parts);
}

# How the router (and a client on this machine) reaches a partition.
sub conninfo
{
	my ($node) = @_;
	return 'host=' . $node->host . ' port=' . $node->port . ' dbname=' . $node->{idem_db};
}

1;
