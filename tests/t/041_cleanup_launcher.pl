# The cleanup launcher serves every database that has pg_idem, with no
# configuration: two databases are both cleaned, one in its own schema
# next to a look-alike function in public that must never run; after
# DROP EXTENSION a database is no longer served (and can be dropped); a
# database created later is picked up; idem.database restricts the set.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('launcher');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'pg_idem'
idem.cleanup_interval = '1s'
idem.ttl = '1s'
idem.tombstone_ttl = 0
});
$node->start;

# A finished key in database $db (pg_idem in schema $schema).
sub finished_key
{
	my ($db, $schema, $name) = @_;
	$node->safe_psql($db, qq{
SET search_path = $schema;
SELECT idem_finalize(idem_key('w', 'POST', '/p', '$name'), claim_id, 200, NULL, 'x')
  FROM idem_claim(idem_key('w', 'POST', '/p', '$name'), sha256('b'));});
}

# How many keys database $db holds.
sub keys_in
{
	my ($db, $schema) = @_;
	return $node->safe_psql($db, "SELECT count(*) FROM $schema.idem_keys");
}

$node->safe_psql('postgres', 'CREATE DATABASE app_a');
$node->safe_psql('postgres', 'CREATE DATABASE app_b');
$node->safe_psql('app_a', q{
CREATE SCHEMA idem;
CREATE EXTENSION pg_idem SCHEMA idem;
CREATE TABLE public.lookalike_calls (at timestamptz);
CREATE FUNCTION public.idem_cleanup(batch integer) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO public.lookalike_calls VALUES (now()); SELECT 0::bigint $$;
-- A role that may create in the extension's schema plants overloads there
-- that a call resolved by name could prefer (bigint for the batch).
CREATE ROLE hostile;
GRANT CREATE ON SCHEMA idem TO hostile;
GRANT INSERT ON public.lookalike_calls TO hostile;
SET ROLE hostile;
CREATE FUNCTION idem.idem_cleanup(batch bigint) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO public.lookalike_calls VALUES (now()); SELECT 0::bigint $$;
CREATE FUNCTION idem.idem_outbox_prune(older_than interval, batch bigint) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO public.lookalike_calls VALUES (now()); SELECT 0::bigint $$;
RESET ROLE;
});
$node->safe_psql('app_b', 'CREATE EXTENSION pg_idem');

# --- Two databases, both cleaned.
finished_key('app_a', 'idem', 'a1');
finished_key('app_b', 'public', 'b1');
ok($node->poll_query_until('app_a', 'SELECT count(*) = 0 FROM idem.idem_keys'),
	'database app_a (extension in schema idem) is cleaned');
ok($node->poll_query_until('app_b', 'SELECT count(*) = 0 FROM public.idem_keys'),
	'database app_b (extension in public) is cleaned');
is($node->safe_psql('app_a', 'SELECT count(*) FROM public.lookalike_calls'),
	'0', 'look-alikes in public and in the extension schema never ran');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_idem launcher'"),
	'1', 'one launcher');

# --- DROP EXTENSION: the database is no longer served, and can be dropped
# without FORCE (no worker stays connected to it). The DROP is left
# uncommitted until app_b's worker waits on it: a worker that found the
# extension before the DROP committed must not then fail on its dropped
# tables (it holds the extension's lock for its batch, and looks again).
my $log_offset = -s $node->logfile;
my $dropper = $node->background_psql('app_b');
$dropper->query_safe('BEGIN');
$dropper->query_safe('DROP EXTENSION pg_idem');
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity
	 WHERE datname = 'app_b' AND application_name = 'pg_idem cleanup worker' AND wait_event_type = 'Lock'}),
	"app_b's worker waits on the uncommitted DROP EXTENSION");
$dropper->query_safe('COMMIT');
$dropper->quit;
ok( $node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM pg_stat_activity
	 WHERE datname = 'app_b' AND application_name = 'pg_idem cleanup worker' AND wait_event_type = 'Lock'}),
	'and goes on once it commits');
$node->safe_psql('app_b', 'CREATE TABLE idem_keys (cache_key bytea)');
$node->safe_psql('app_b', "INSERT INTO idem_keys VALUES ('\\x00')");
finished_key('app_a', 'idem', 'a2');
ok($node->poll_query_until('app_a', 'SELECT count(*) = 0 FROM idem.idem_keys'),
	'app_a is still cleaned after DROP EXTENSION in app_b');
sleep 2;
is(keys_in('app_b', 'public'), '1',
	'app_b without the extension: its own table of that name is left alone');
unlike(slurp_file($node->logfile, $log_offset), qr/ERROR|FATAL/,
	'no worker error after DROP EXTENSION');
$node->safe_psql('postgres', 'DROP DATABASE app_b');
ok(1, 'DROP DATABASE without FORCE: no worker holds a connection');

# --- A database created later is picked up.
$node->safe_psql('postgres', 'CREATE DATABASE app_c');
$node->safe_psql('app_c', 'CREATE EXTENSION pg_idem');
finished_key('app_c', 'public', 'c1');
ok($node->poll_query_until('app_c', 'SELECT count(*) = 0 FROM public.idem_keys'),
	'a new database with the extension is cleaned');

# --- idem.database restricts the set (reload, no restart); a name that
# matches no database is reported.
$log_offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "idem.database = 'app_a, no_such_db'");
$node->reload;
$node->wait_for_log(qr/database "no_such_db" named in idem.database is not served/, $log_offset);
ok(1, 'a name in idem.database that matches no database is reported');
sleep 2;    # let a pass started before the reload end
finished_key('app_c', 'public', 'c2');
finished_key('app_a', 'idem', 'a3');
ok($node->poll_query_until('app_a', 'SELECT count(*) = 0 FROM idem.idem_keys'),
	'idem.database = app_a, no_such_db: app_a is cleaned');
sleep 2;
is(keys_in('app_c', 'public'), '1', 'idem.database = app_a, no_such_db: app_c is not served');
$node->append_conf('postgresql.conf', "idem.database = ''");
$node->reload;
ok($node->poll_query_until('app_c', 'SELECT count(*) = 0 FROM public.idem_keys'),
	'idem.database empty again: every database is served');

# --- A bad list is refused when set.
my ($ret, $stdout, $stderr) = $node->psql('postgres', q{ALTER SYSTEM SET idem.database = '"unterminated'});
like($stderr, qr/invalid value for parameter "idem.database"/, 'a malformed idem.database is refused');

# --- Settings refused at reload: idem.lease above idem.max_lease is
# reported and the old value kept (sql/settings.sql covers SET and
# ALTER ROLE/SYSTEM).
$log_offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "idem.lease = '2h'");
$node->reload;
$node->wait_for_log(qr/idem\.lease must be between 1ms and idem\.max_lease \(1h\)/, $log_offset);
ok(1, 'reload: idem.lease = 2h is refused with the range in the message');
is($node->safe_psql('postgres', 'SHOW idem.lease'), '30s', 'reload: the old value is kept');

$node->stop;
done_testing();
