# One database never stalls the cleanup of the others (issue 24, item 8).
#
# A CREATEDB owner idle in BEGIN; ALTER DATABASE stuck RENAME TO ...; holds
# the lock every connection to that database takes, so its cleanup worker
# cannot even connect.  The launcher waits for it at most
# idem.cleanup_database_timeout, stops it with a WARNING that names the
# database and what the worker waits for (that lock, held by the owner's
# process), and serves the other databases; once the transaction ends,
# the skipped database is cleaned again.
#
# No timing is asserted: every check waits for its state with the TAP
# framework's generous deadline.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('cleanup_stalled');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_idem'
idem.cleanup_worker = off
idem.cleanup_interval = '1s'
idem.cleanup_database_timeout = '2s'
idem.ttl = '1s'
idem.tombstone_ttl = 0
});
$node->start;

# The stuck database first: a pass visits the databases in catalog order.
$node->safe_psql('postgres', q{
	CREATE ROLE dbowner LOGIN CREATEDB;
	CREATE DATABASE stuck OWNER dbowner;
	CREATE DATABASE other;
});
$node->safe_psql($_, 'CREATE EXTENSION pg_idem') for qw(stuck other);

# A finished key in database $db.
sub finished_key
{
	my ($db, $name) = @_;
	$node->safe_psql($db, qq{
		SELECT idem_finalize(idem_key('w', 'POST', '/p', '$name'), claim_id, 200, NULL, 'x')
		  FROM idem_claim(idem_key('w', 'POST', '/p', '$name'), sha256('b'))});
}

finished_key('stuck', 's1');
finished_key('other', 'o1');

# The owner renames its database in a transaction it leaves open.
my $owner = $node->background_psql('postgres', extra_params => [ '-U', 'dbowner' ]);
$owner->query_safe('BEGIN');
$owner->query_safe('ALTER DATABASE stuck RENAME TO stuck_renamed');
my $owner_pid = $owner->query_safe('SELECT pg_backend_pid()');
my $log_offset = -s $node->logfile;

# Cleanup starts now.
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET idem.cleanup_worker = on; SELECT pg_reload_conf()});

ok( $node->poll_query_until('other', 'SELECT count(*) = 0 FROM idem_keys'),
	'the other database is cleaned while one database is locked');
ok($node->wait_for_log(
		qr/WARNING:  pg_idem cleanup of database "stuck" skipped: its worker did not finish within idem.cleanup_database_timeout/,
		$log_offset),
	'a WARNING names the skipped database');
like(slurp_file($node->logfile, $log_offset),
	qr/DETAIL:  The worker \(process \d+\) waits for Lock\/object: the lock on database "stuck" itself, held by process $owner_pid\./,
	'the WARNING says what the worker waits for and who holds it');

# Passes go on: a key finished now in the other database is cleaned too.
finished_key('other', 'o2');
ok( $node->poll_query_until('other', 'SELECT count(*) = 0 FROM idem_keys'),
	'later passes still serve the other database');

# The lock is gone: the skipped database is cleaned at a later pass.
$owner->query_safe('ROLLBACK');
$owner->quit;
ok( $node->poll_query_until('stuck', 'SELECT count(*) = 0 FROM idem_keys'),
	'once the transaction ends, the skipped database is cleaned');
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_idem launcher'}),
	'1', 'the launcher is still running');

$node->stop;
done_testing();
