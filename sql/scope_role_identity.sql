-- The scope is the role's identity (its OID) and the role whose code
-- calls pg_idem: a renamed role keeps its keys, a new role created under
-- an old name gets none, a dropped role's rows are nobody's; a SECURITY
-- DEFINER function acts in its owner's scope, a trigger in its table
-- owner's.

CREATE FUNCTION pg_temp.k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_key('regress', 'POST', '/identity', name) $$;
CREATE FUNCTION pg_temp.h(body text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_request_hash(convert_to(body, 'UTF8')) $$;
CREATE ROLE regress_svc;
GRANT idem_client TO regress_svc;

-- regress_svc finishes a key.
SET ROLE regress_svc;
SELECT idem_finalize(pg_temp.k('r'), claim_id, 201, NULL, 'svc''s')
  FROM idem_claim(pg_temp.k('r'), pg_temp.h('one'));
RESET ROLE;

-- Renamed, it still replays its key.
ALTER ROLE regress_svc RENAME TO regress_svc_old;
SET ROLE regress_svc_old;
SELECT outcome, convert_from(response_body, 'UTF8') AS body
  FROM idem_claim(pg_temp.k('r'), pg_temp.h('one'));
RESET ROLE;
SELECT scope::regrole AS scope, state FROM idem_keys WHERE cache_key = pg_temp.k('r');

-- A new role under the old name gets none of it: its claim runs afresh.
CREATE ROLE regress_svc;
GRANT idem_client TO regress_svc;
SET ROLE regress_svc;
SELECT outcome FROM idem_lookup(pg_temp.k('r'), pg_temp.h('one'));
SELECT outcome FROM idem_claim(pg_temp.k('r'), pg_temp.h('one'));
RESET ROLE;
SELECT scope::regrole AS scope, state FROM idem_keys WHERE cache_key = pg_temp.k('r')
 ORDER BY scope::regrole::text;

-- Dropped, its row is nobody's: it shows as a bare OID, and no role, the
-- new regress_svc included, reaches it.
DELETE FROM idem_keys WHERE cache_key = pg_temp.k('r') AND scope = 'regress_svc'::regrole;
REVOKE idem_client FROM regress_svc_old;
DROP ROLE regress_svc_old;
SELECT scope::regrole::text ~ '^[0-9]+$' AS bare_oid, state
  FROM idem_keys WHERE cache_key = pg_temp.k('r');
SET ROLE regress_svc;
SELECT outcome FROM idem_lookup(pg_temp.k('r'), pg_temp.h('one'));
RESET ROLE;
DELETE FROM idem_keys WHERE cache_key = pg_temp.k('r');

REVOKE idem_client FROM regress_svc;
DROP ROLE regress_svc;

CREATE ROLE regress_owner;
CREATE ROLE regress_other;
GRANT idem_client TO regress_owner, regress_other;
GRANT CREATE ON SCHEMA public TO regress_owner, regress_other;

-- A SECURITY DEFINER function of regress_owner's, called by regress_other:
-- it acts in its owner's scope (its owner wrote it), not the caller's.
SET ROLE regress_owner;
CREATE FUNCTION public.svc_claim(key bytea) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS
$$ SELECT outcome FROM idem_claim(key, idem_request_hash('\x01'::bytea)) $$;
GRANT EXECUTE ON FUNCTION public.svc_claim(bytea) TO regress_other;
RESET ROLE;
SET ROLE regress_other;
SELECT public.svc_claim(pg_temp.k('definer')) AS through_definer;
SELECT outcome FROM idem_lookup(pg_temp.k('definer'), idem_request_hash('\x01'::bytea)) AS own_lookup;
RESET ROLE;
SELECT scope::regrole AS scope FROM idem_keys WHERE cache_key = pg_temp.k('definer');

-- A foreign key's cascade deletes from the referencing table as that
-- table's owner, and a BEFORE trigger fires inside it: regress_other's
-- trigger acts in regress_other's scope, although regress_owner's DELETE
-- on its own table set it off.  (An AFTER trigger fires later, at the end
-- of the outer statement, as its role, as every trigger does.)
SET ROLE regress_owner;
CREATE TABLE public.svc_parent (id int PRIMARY KEY);
GRANT SELECT, REFERENCES ON public.svc_parent TO regress_other;
INSERT INTO public.svc_parent VALUES (1);
RESET ROLE;
SET ROLE regress_other;
CREATE TABLE public.other_child (id int REFERENCES public.svc_parent ON DELETE CASCADE);
INSERT INTO public.other_child VALUES (1);
CREATE FUNCTION public.other_on_delete() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, public AS $$
BEGIN
    PERFORM idem_claim(idem_key('regress', 'POST', '/identity', 'cascade'),
                       idem_request_hash('\x02'::bytea));
    RETURN OLD;
END
$$;
CREATE TRIGGER other_on_delete BEFORE DELETE ON public.other_child
    FOR EACH ROW EXECUTE FUNCTION public.other_on_delete();
RESET ROLE;
SET ROLE regress_owner;
DELETE FROM public.svc_parent;
RESET ROLE;
SELECT scope::regrole AS scope FROM idem_keys WHERE cache_key = pg_temp.k('cascade');

DROP TABLE public.other_child, public.svc_parent;
DROP FUNCTION public.other_on_delete(), public.svc_claim(bytea);
DELETE FROM idem_keys WHERE cache_key IN (pg_temp.k('definer'), pg_temp.k('cascade'));
REVOKE CREATE ON SCHEMA public FROM regress_owner, regress_other;
REVOKE idem_client FROM regress_owner, regress_other;
DROP ROLE regress_owner, regress_other;
