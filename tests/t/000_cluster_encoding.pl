# Every cluster the suites create is UTF8, whatever locale the caller's
# environment sets.  With LANG unset initdb makes SQL_ASCII clusters, and
# then text comes back as bytes in psycopg and comparisons such as
# b'claimed' == 'claimed' fail far from the cause (issue 24, item 12).
# tests/lib.sh sets the locale for everything it runs; this test fails if
# a cluster made the way every TAP test makes one (PostgreSQL::Test::Cluster
# ->init, no --locale) would not be UTF8.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('encoding');
$node->init;
$node->start;

is($node->safe_psql('postgres', 'SHOW server_encoding'), 'UTF8',
	'a cluster made by PostgreSQL::Test::Cluster->init is UTF8 (LANG is '
	  . ($ENV{LANG} // 'unset') . ')');
is( $node->safe_psql(
		'postgres',
		q{SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database
		   WHERE pg_encoding_to_char(encoding) <> 'UTF8'}),
	'', 'and so is every database in it (template0, template1, postgres)');

$node->stop;
done_testing();
