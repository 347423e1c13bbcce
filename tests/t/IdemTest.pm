# Shared set-up of the pg_idem TAP tests.
package IdemTest;

use strict;
use warnings;

use PostgreSQL::Test::Cluster;

# A started node with pg_idem created in the postgres database; extra
# postgresql.conf lines in @conf.  pg_idem is not preloaded: claims need
# no shared memory, and no cleanup worker then runs behind the test's back.
sub new_node
{
	my ($name, @conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);

	$node->init;
	$node->append_conf('postgresql.conf', join('', map { "$_\n" } @conf)) if @conf;
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION pg_idem');
	return $node;
}

1;
