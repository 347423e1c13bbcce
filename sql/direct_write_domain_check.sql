-- Pins a fix from the second review of the direct path (table/direct_table.c has_foreign_code): a DBA's column of a domain
-- whose CHECK calls a function of theirs is not seen as "foreign code"
-- (the default's CoerceToDomain names no function; the domain's
-- constraints are looked up when it runs), so the write is not pinned and
-- the DBA's check function resolves names with the caller's search_path,
-- as the table's owner.  A role allowed to claim (idem_client) shadows
-- lower() and gets its function run as the superuser.  0.3.0's SECURITY
-- DEFINER ... SET search_path ran it pinned.
-- Expected: no NOTICE from the role's function.

CREATE ROLE regress_domain_claimer LOGIN;
GRANT idem_client TO regress_domain_claimer;
CREATE SCHEMA regress_domain_claimer_schema AUTHORIZATION regress_domain_claimer;
CREATE FUNCTION public.regress_tag_is_lower(v text) RETURNS boolean
    LANGUAGE plpgsql AS $$ BEGIN RETURN lower(v) = v; END $$;
CREATE DOMAIN public.regress_tag AS text CHECK (public.regress_tag_is_lower(VALUE));
ALTER TABLE idem_keys ADD COLUMN regress_tag public.regress_tag DEFAULT 'web';

SET ROLE regress_domain_claimer;
CREATE FUNCTION regress_domain_claimer_schema.lower(text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'role''s function runs as superuser: %', (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
    RETURN $1;
END $$;
SET search_path = regress_domain_claimer_schema, pg_catalog, public;
SELECT outcome FROM idem_claim(idem_key('domain_check', 'POST', '/domain', 'k1'), idem_request_hash('x'));
RESET search_path;
RESET ROLE;

SELECT regress_tag AS tag FROM idem_keys WHERE cache_key = idem_key('domain_check', 'POST', '/domain', 'k1');

DELETE FROM idem_keys WHERE cache_key = idem_key('domain_check', 'POST', '/domain', 'k1');
ALTER TABLE idem_keys DROP COLUMN regress_tag;
DROP DOMAIN public.regress_tag;
DROP FUNCTION public.regress_tag_is_lower(text);
DROP FUNCTION regress_domain_claimer_schema.lower(text);
DROP SCHEMA regress_domain_claimer_schema;
DROP ROLE regress_domain_claimer;
