-- The target schema: warn when a role that is not a superuser may create
-- objects in it.  Such a role can plant functions and operators next to
-- pg_idem's, and a script or a call that resolves a name through the
-- schema could pick theirs.  pg_idem's own SQL names everything with its
-- schema and exact argument types, but the application's calls are the
-- application's; so the advice is a schema of its own.  A warning, not a
-- refusal: the README's quick start installs into public, which on
-- PostgreSQL 15 the database owner may create in.
DO $schema_check$
DECLARE
    target CONSTANT pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    writers pg_catalog.text;
BEGIN
    SELECT pg_catalog.string_agg(w.who, ', '::pg_catalog.text ORDER BY w.who)
      INTO writers
      FROM (SELECT 'PUBLIC'::pg_catalog.text AS who
              FROM pg_catalog.pg_namespace n,
                   pg_catalog.aclexplode(COALESCE(n.nspacl, pg_catalog.acldefault('n'::pg_catalog."char", n.nspowner))) a
             WHERE n.oid OPERATOR(pg_catalog.=) target
               AND a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
               AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text
            UNION
            SELECT pg_catalog.quote_ident(r.rolname::pg_catalog.text)
              FROM pg_catalog.pg_roles r
             WHERE NOT r.rolsuper
               AND NOT r.rolname OPERATOR(pg_catalog.~~) 'pg\_%'::pg_catalog.text
               -- The installing role itself (the owner of what it creates):
               -- on a managed service, where it is no superuser (the SQL
               -- edition), it is the extension's owner, trusted as such.
               AND r.rolname OPERATOR(pg_catalog.<>) CURRENT_USER
               AND pg_catalog.has_schema_privilege(r.oid, target, 'CREATE'::pg_catalog.text)) w;
    IF writers IS NOT NULL THEN
        RAISE WARNING 'schema "%" is writable by roles that are not superusers',
            (SELECT n.nspname FROM pg_catalog.pg_namespace n WHERE n.oid OPERATOR(pg_catalog.=) target)
            USING DETAIL = pg_catalog.format('Roles that may create objects in it: %s.'::pg_catalog.text, writers),
                  HINT = 'Install pg_idem into a schema of its own that only its owner may create in: CREATE SCHEMA idem; CREATE EXTENSION pg_idem SCHEMA idem;';
    END IF;
END
$schema_check$;
