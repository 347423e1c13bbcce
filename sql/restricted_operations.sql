-- pg_idem refuses to act inside a security-restricted operation: there
-- PostgreSQL runs a table owner's index expressions and a materialized
-- view's query as that owner on behalf of the maintenance role, and such
-- code must not act in the maintenance role's scope (nor in any other it
-- did not choose).  A role plants calls of idem_lookup, idem_outbox_claim
-- and idem_outbox_ack in an index expression and a materialized view of
-- its own; the superuser's REINDEX, ANALYZE, CREATE INDEX, CLUSTER,
-- VACUUM FULL and REFRESH MATERIALIZED VIEW are refused with 42501 and
-- leave the superuser's keys and events untouched.

CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ': ' || msg;
END
$$;
CREATE ROLE regress_planter;
GRANT idem_client TO regress_planter;
GRANT CREATE ON SCHEMA public TO regress_planter;

-- The superuser's state the planted code is after.
SELECT idem_finalize(idem_key('su', 'POST', '/sro', 'k'), claim_id, 200, NULL, 'secret')
  FROM idem_claim(idem_key('su', 'POST', '/sro', 'k'), sha256('b'));
BEGIN;
SELECT idem_outbox_stage('sro.su', '{"n": 1}'::jsonb) > 0 AS staged;
COMMIT;

SET ROLE regress_planter;
CREATE TABLE public.planted (n int);
INSERT INTO public.planted SELECT g FROM generate_series(1, 3) g;
-- Immutable by its label only: what the index expression runs.
CREATE FUNCTION public.planted_lookup(n int) RETURNS int LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, public AS $$
BEGIN
    PERFORM idem_lookup(idem_key('su', 'POST', '/sro', 'k'), sha256('b'));
    RETURN n;
END
$$;
CREATE FUNCTION public.planted_drain(n int) RETURNS int LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, public AS $$
DECLARE
    token uuid;
BEGIN
    SELECT claim_token INTO token FROM idem_outbox_claim(10) LIMIT 1;
    IF token IS NOT NULL THEN
        PERFORM idem_outbox_ack(token, ARRAY[0]::bigint[]);
    END IF;
    RETURN n;
END
$$;
-- Outside maintenance, as the planter: its own scope, nothing of the superuser's.
SELECT public.planted_lookup(1) AS own_call;
SELECT count(*) AS own_events FROM idem_outbox_claim(10);
RESET ROLE;
-- The planter's CREATE INDEX itself is a restricted operation too.
SET ROLE regress_planter;
SELECT pg_temp.try('CREATE INDEX planted_direct ON public.planted (public.planted_lookup(n))') AS create_index;
RESET ROLE;
-- Indexes whose expressions reach pg_idem only later (CREATE OR REPLACE):
-- one per function planted.
SET ROLE regress_planter;
CREATE FUNCTION public.planted_ack(n int) RETURNS int LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, public AS $$
BEGIN
    PERFORM idem_outbox_ack(gen_random_uuid(), ARRAY[n]::bigint[]);
    RETURN n;
END
$$;
CREATE FUNCTION public.via_lookup(n int) RETURNS int LANGUAGE sql IMMUTABLE AS $$ SELECT n $$;
CREATE FUNCTION public.via_drain(n int) RETURNS int LANGUAGE sql IMMUTABLE AS $$ SELECT n $$;
CREATE FUNCTION public.via_ack(n int) RETURNS int LANGUAGE sql IMMUTABLE AS $$ SELECT n $$;
CREATE INDEX planted_lookup_idx ON public.planted (public.via_lookup(n));
CREATE INDEX planted_drain_idx ON public.planted (public.via_drain(n));
CREATE INDEX planted_ack_idx ON public.planted (public.via_ack(n));
CREATE OR REPLACE FUNCTION public.via_lookup(n int) RETURNS int LANGUAGE sql IMMUTABLE
AS $$ SELECT public.planted_lookup(n) $$;
CREATE OR REPLACE FUNCTION public.via_drain(n int) RETURNS int LANGUAGE sql IMMUTABLE
AS $$ SELECT public.planted_drain(n) $$;
CREATE OR REPLACE FUNCTION public.via_ack(n int) RETURNS int LANGUAGE sql IMMUTABLE
AS $$ SELECT public.planted_ack(n) $$;
CREATE FUNCTION public.planted_view_body() RETURNS int LANGUAGE sql AS
$$ SELECT 1 $$;
CREATE MATERIALIZED VIEW public.planted_view AS SELECT public.planted_view_body() AS n WITH NO DATA;
CREATE OR REPLACE FUNCTION public.planted_view_body() RETURNS int LANGUAGE sql AS
$$ SELECT public.planted_drain(1) + public.planted_lookup(1) $$;
RESET ROLE;

-- The superuser's maintenance: every one refused, with its SQLSTATE.
SELECT pg_temp.try('REINDEX INDEX public.planted_lookup_idx') AS reindex_lookup;
SELECT pg_temp.try('REINDEX INDEX public.planted_drain_idx') AS reindex_drain;
SELECT pg_temp.try('REINDEX INDEX public.planted_ack_idx') AS reindex_ack;
SELECT pg_temp.try('REINDEX TABLE public.planted') AS reindex_table;
SELECT pg_temp.try('ANALYZE public.planted') AS analyze;
SELECT pg_temp.try('CLUSTER public.planted USING planted_lookup_idx') AS cluster;
SELECT pg_temp.try('REFRESH MATERIALIZED VIEW public.planted_view') AS refresh;
\set VERBOSITY terse
VACUUM FULL public.planted;
\set VERBOSITY default

-- The superuser's key and event are as they were.
SELECT outcome, convert_from(response_body, 'UTF8') AS body
  FROM idem_lookup(idem_key('su', 'POST', '/sro', 'k'), sha256('b'));
SELECT state, attempts FROM idem_outbox WHERE topic = 'sro.su';

-- The message names the role the code runs as and says why.
\set VERBOSITY default
REINDEX INDEX public.planted_lookup_idx;

DROP MATERIALIZED VIEW public.planted_view;
DROP TABLE public.planted;
DROP FUNCTION public.planted_view_body(), public.via_lookup(int), public.via_drain(int),
              public.via_ack(int), public.planted_lookup(int), public.planted_drain(int),
              public.planted_ack(int);
DELETE FROM idem_keys WHERE cache_key = idem_key('su', 'POST', '/sro', 'k');
DELETE FROM idem_outbox WHERE topic = 'sro.su';
REVOKE CREATE ON SCHEMA public FROM regress_planter;
REVOKE idem_client FROM regress_planter;
DROP ROLE regress_planter;
