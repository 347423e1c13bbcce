# The C++ client over the PL/Proxy deployment (client/cpp/tests/partition_test.cpp):
# its partition map and hash agree with the router's on thousands of keys,
# lease mode runs through the router, and run_fenced / run_in_transaction
# commit the handler's writes and the finalize on the partition that owns
# the key, and through the router those two modes are refused, saying why.  The scaleout suite passes the binary in IDEM_PARTITION_TESTS
# (built with the client); without it the test is skipped.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use Scaleout;
use PostgreSQL::Test::Utils;
use Test::More;

my $bin = $ENV{IDEM_PARTITION_TESTS} // '';
plan skip_all => 'the C++ client was not built (IDEM_PARTITION_TESTS unset)' unless $bin && -x $bin;

my ($router, @parts) = Scaleout::deploy(2);
my $dsn = 'host=' . $router->host . ' port=' . $router->port . ' dbname=postgres';
my ($stdout, $stderr);
my $ok = IPC::Run::run([ $bin ], '>', \$stdout, '2>', \$stderr,
	init => sub { $ENV{PG_IDEM_SCALEOUT_ROUTER} = $dsn });
note($stdout);
ok($ok, 'the C++ partition routing tests pass') or diag($stdout, $stderr);
like($stdout, qr/\[  PASSED  \] 5 tests/, 'all five of them ran');

done_testing();
