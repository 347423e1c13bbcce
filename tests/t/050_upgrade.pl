# Upgrades: for every version an upgrade starts from (the ones the package
# installs: extension/releases/ holds the oldest one's install script and
# each step's upgrade script, docs/design.md says which), put rows in its
# state tables, walk ALTER EXTENSION pg_idem UPDATE to the current version,
# and check that the rows survive and keep working, and that the upgraded
# catalog is the one a fresh install creates.
#
# The rows of the previous release are written by this library, which
# serves its tables until the update (core/schema.c); older tables are
# refused with 55000 until the update, so their rows are written as their
# own library wrote them, by INSERT: keys in each state, of a role that
# still exists, of a role dropped before the update (whose name a new role
# then takes), of the shared scope ('', a row from before 0.3.0 that an
# upgrade kept), and a pending outbox event.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_idem'");
$node->start;

my $current = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'pg_idem'");
my @versions = split /\n/, $node->safe_psql('postgres',
	"SELECT version FROM pg_available_extension_versions WHERE name = 'pg_idem'
	  ORDER BY string_to_array(version, '.')::int[]");
my @old = grep { $_ ne $current } @versions;
my $previous = $old[-1];
ok(scalar(@old) >= 2, "versions an upgrade starts from: @old (the previous release: $previous)");

# Everything a fresh install and an upgrade must agree on, one line per object.
my $catalog_query = q{
WITH ext AS (SELECT oid, extnamespace FROM pg_extension WHERE extname = 'pg_idem'),
members AS (SELECT classid, objid FROM pg_depend, ext
             WHERE refclassid = 'pg_extension'::regclass AND refobjid = ext.oid AND deptype = 'e')
SELECT line FROM (
  SELECT 'function ' || p.oid::regprocedure || ' returns ' || pg_get_function_result(p.oid)
         || ' volatile=' || p.provolatile::text || ' strict=' || p.proisstrict
         || ' secdef=' || p.prosecdef || ' config=' || coalesce(p.proconfig::text, '')
         || ' acl=' || coalesce(p.proacl::text, '') || ' src=' || p.prosrc AS line
    FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
  UNION ALL
  SELECT 'relation ' || c.relname || ' kind=' || c.relkind::text
         || ' options=' || coalesce(c.reloptions::text, '') || ' acl=' || coalesce(c.relacl::text, '')
    FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
  UNION ALL
  SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
         || ' notnull=' || a.attnotnull || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
    FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
  UNION ALL
  SELECT 'dumped ' || t.config::regclass || ' where ' || t.condition
    FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS t(config, condition)
   WHERE e.extname = 'pg_idem'
  UNION ALL
  SELECT 'constraint ' || conrelid::regclass || '.' || conname || ' ' || pg_get_constraintdef(co.oid)
    FROM pg_constraint co JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = co.conrelid
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = i.indrelid
  UNION ALL
  SELECT 'trigger ' || pg_get_triggerdef(t.oid)
    FROM pg_trigger t JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = t.tgrelid
   WHERE NOT t.tgisinternal
  UNION ALL
  SELECT 'view ' || c.relname || ' ' || pg_get_viewdef(c.oid)
    FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
   WHERE c.relkind = 'v'
  UNION ALL
  SELECT 'type ' || t.typname
    FROM pg_type t JOIN members m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
) lines ORDER BY line};

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION pg_idem');
my $fresh_catalog = $node->safe_psql('fresh', $catalog_query);
cmp_ok(length($fresh_catalog), '>', 1000, 'the fresh install has a catalog to compare');

foreach my $version (@old)
{
	my $db = "from_$version";
	$db =~ s/\./_/g;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION pg_idem VERSION '$version'");

	my $role_prefix = $db;
	my $generations_before;
	if ($version eq $previous)
	{
		# State in every shape, by this library's calls: completed,
		# pending, failed, and a pending claim whose lease already ran out.
		$node->safe_psql(
			$db, q{
SELECT idem_finalize(idem_key('u', 'POST', '/up', 'done'), claim_id, 201,
                     '{"content-type": "text/plain"}', 'kept across the upgrade')
  FROM idem_claim(idem_key('u', 'POST', '/up', 'done'), sha256('body'));
SELECT idem_claim(idem_key('u', 'POST', '/up', 'live'), sha256('body'), '1 hour');
SELECT idem_fail(idem_key('u', 'POST', '/up', 'failed'), claim_id, '1 hour')
  FROM idem_claim(idem_key('u', 'POST', '/up', 'failed'), sha256('body'));
SELECT idem_claim(idem_key('u', 'POST', '/up', 'abandoned'), sha256('body'), '1 millisecond');
});
		$generations_before = $node->safe_psql($db, 'SELECT max(generation) FROM idem_keys');
		is( $node->safe_psql($db,
				"SELECT count(*) FROM pg_attribute WHERE attrelid = 'idem_keys'::regclass
				    AND attname = 'scope' AND atttypid = 'regrole'::regtype"),
			'1', "$version: the previous release keeps scopes as role OIDs");
	}
	else
	{
		# This library refuses the tables until the update, saying why.
		my ($rc, $out, $err) = $node->psql($db,
			"SELECT * FROM idem_claim(idem_key('u', 'POST', '/up', 'done'), sha256('body'))");
		like($err, qr/ERROR:  pg_idem's tables need ALTER EXTENSION pg_idem UPDATE\n.*this database has pg_idem \Q$version\E\.\nHINT:  Run ALTER EXTENSION pg_idem UPDATE in this database\./s,
			"$version: older than $previous: refused until the update");

		# The same state as the version's library wrote it, scopes by role
		# name: the superuser's keys, a role's that exists, a dropped role's
		# (whose name a new role takes after the update), a shared key, and
		# a grant on the idem_outbox view, which the update re-creates.
		$node->safe_psql(
			$db, qq{
CREATE ROLE ${role_prefix}_live;
CREATE ROLE ${role_prefix}_gone;
GRANT idem_client TO ${role_prefix}_live, ${role_prefix}_gone;
GRANT SELECT (state, created_at) ON idem_outbox TO ${role_prefix}_live;
INSERT INTO idem_keys (cache_key, scope, state, request_hash, claim_id, generation,
                       lease_expires_at, finished_at, response_status, response_headers, response_body)
SELECT idem_key('u', 'POST', '/up', k.name), k.scope, k.state, sha256('body'), gen_random_uuid(),
       nextval('idem_generation_seq'), clock_timestamp() + k.lease,
       CASE WHEN k.state <> 'pending' THEN clock_timestamp() END,
       k.status, k.headers, convert_to(k.body, 'UTF8')
  FROM (VALUES
    ('done', current_user::text, 'completed', NULL::interval, 201, '{"content-type": "text/plain"}'::jsonb,
     'kept across the upgrade'),
    ('live', current_user, 'pending', '1 hour', NULL, NULL, NULL),
    ('failed', current_user, 'failed', '1 hour', NULL, NULL, NULL),
    ('abandoned', current_user, 'pending', '-1 second', NULL, NULL, NULL),
    ('role', '${role_prefix}_live', 'completed', NULL, 201, NULL, 'live''s'),
    ('role', '${role_prefix}_gone', 'completed', NULL, 201, NULL, 'gone''s'),
    ('shared', '', 'completed', NULL, 201, NULL, 'shared')
  ) AS k(name, scope, state, lease, status, headers, body);
INSERT INTO idem_outbox_queue (topic, payload, available_at, scope)
VALUES ('upgrade.before', '{"staged": "before"}', clock_timestamp(), current_user);
REVOKE idem_client FROM ${role_prefix}_gone;
DROP ROLE ${role_prefix}_gone;
});
		$generations_before = $node->safe_psql($db, 'SELECT max(generation) FROM idem_keys');
	}

	$node->safe_psql($db, 'ALTER EXTENSION pg_idem UPDATE');
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'pg_idem'"),
		$current, "$version: updated to $current");

	# The rows survived and the protocol still works on them.
	is( $node->safe_psql(
			$db,
			"SELECT outcome || ' ' || response_status || ' ' || convert_from(response_body, 'UTF8')
			   FROM idem_claim(idem_key('u', 'POST', '/up', 'done'), sha256('body'))"),
		'replay 201 kept across the upgrade',
		"$version: a completed key replays after the upgrade");
	is( $node->safe_psql(
			$db,
			"SELECT outcome FROM idem_claim(idem_key('u', 'POST', '/up', 'live'), sha256('body'))"),
		'in_progress', "$version: a live claim is still in progress");
	is( $node->safe_psql(
			$db,
			"SELECT outcome FROM idem_claim(idem_key('u', 'POST', '/up', 'failed'), sha256('body'))"),
		'cooldown', "$version: a failed key is still cooling down");
	is( $node->safe_psql(
			$db,
			"SELECT outcome || ' ' || (generation > $generations_before)
			   FROM idem_claim(idem_key('u', 'POST', '/up', 'abandoned'), sha256('body'))"),
		'recovered_abandoned true',
		"$version: an abandoned claim is recovered with a higher generation");

	if ($version ne $previous)
	{
		is( $node->safe_psql(
				$db, qq{
SET ROLE ${role_prefix}_live;
SELECT outcome || ' ' || convert_from(response_body, 'UTF8')
  FROM idem_claim(idem_key('u', 'POST', '/up', 'role'), sha256('body'));
}),
			"replay live's",
			"$version: a role's named scope became its OID: its key replays");
		is( $node->safe_psql(
				$db, qq{
CREATE ROLE ${role_prefix}_gone;
GRANT idem_client TO ${role_prefix}_gone;
SET ROLE ${role_prefix}_gone;
SELECT outcome FROM idem_lookup(idem_key('u', 'POST', '/up', 'role'), sha256('body'));
}),
			'absent',
			"$version: a new role under a dropped role's name gets none of its keys");
		is( $node->safe_psql(
				$db,
				"SELECT string_agg(scope::text, ',' ORDER BY scope) FROM idem_keys
				  WHERE cache_key = idem_key('u', 'POST', '/up', 'role')
				    AND scope NOT IN ('${role_prefix}_live'::regrole)"),
			'1',
			"$version: the dropped role's key is in the no-role scope (OID 1)");
		is( $node->safe_psql(
				$db,
				"SELECT string_agg(convert_from(response_body, 'UTF8'), ',') FROM idem_keys WHERE scope = 0"),
			'shared', "$version: the shared key ('') is in the shared scope (0), and no named one");
		is( $node->safe_psql(
				$db, qq{
SET ROLE ${role_prefix}_live;
SELECT outcome || ' ' || convert_from(response_body, 'UTF8')
  FROM idem_claim(idem_key('u', 'POST', '/up', 'shared'), sha256('body'));
}),
			'replay shared', "$version: any role replays the shared key");
		is( $node->safe_psql(
				$db,
				"SELECT has_column_privilege('${role_prefix}_live', 'idem_outbox', 'state', 'SELECT')
				        AND NOT has_column_privilege('${role_prefix}_live', 'idem_outbox', 'payload', 'SELECT')"),
			't', "$version: the column grant on idem_outbox survived its re-creation");
		is( $node->safe_psql(
				$db, q{
BEGIN;
SELECT string_agg(topic, ',') FROM idem_outbox_claim(10, '1 minute');
COMMIT;
}),
			'upgrade.before', "$version: an event staged before the upgrade is claimed by its stager's role");
	}
	else
	{
		is( $node->safe_psql(
				$db,
				"SELECT count(*) FILTER (WHERE scope = current_user::regrole) || '/' || count(*) FROM idem_keys"),
			'4/4', "$version: rows keep their role's scope");
	}

	# What the new version added works on the upgraded database.
	is( $node->safe_psql(
			$db, q{
BEGIN;
SELECT idem_outbox_stage('upgrade.checked', '{"ok": true}'::jsonb) > 0;
COMMIT;
SELECT count(*) FROM idem_outbox_claim(10, '1 minute');
}),
		"t\n1", "$version: the outbox works after the upgrade");
	cmp_ok($node->safe_psql($db, "SELECT count(*) FROM idem_stats"),
		'>', 0, "$version: statistics work after the upgrade");

	# And the catalog is the one a fresh install creates.
	my $upgraded_catalog = $node->safe_psql($db, $catalog_query);
	is($upgraded_catalog, $fresh_catalog,
		"$version: the upgraded catalog equals a fresh install of $current");
}

# A version older than the oldest an upgrade starts from has no update
# path in this package: ALTER EXTENSION UPDATE says so and changes nothing
# (docs/guides/upgrading.md: such a database steps through the release
# that still upgrades it).  No such version installs any more: one is
# stamped by hand.
$node->safe_psql('postgres', 'CREATE DATABASE unsupported');
$node->safe_psql('unsupported', q{CREATE EXTENSION pg_idem;
UPDATE pg_extension SET extversion = '0.2.0' WHERE extname = 'pg_idem'});
my ($rc, $out, $err) = $node->psql('unsupported', 'ALTER EXTENSION pg_idem UPDATE');
like($err, qr/ERROR:  extension "pg_idem" has no update path from version "0\.2\.0" to version "\Q$current\E"/,
	"a version before $old[0]: no update path, said so");

$node->stop;
done_testing();
