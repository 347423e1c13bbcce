-- Issue 12, defects 1 and 2: overloads planted by a role that may create
-- in the extension's schema (here public, the README's default install)
-- must never run inside the attempts functions, nor make them ambiguous.
--
--  1. idem_attempt_open computed the object key in SQL with an integer
--     literal where idem_attempt_object_key takes bigint: a planted
--     (text, text, uuid, integer, text) overload was the better match and
--     ran as the extension's owner.
--  2. promote and fail staged their event with three of the five
--     arguments of idem_outbox_stage: a planted (text, jsonb, text)
--     overload made them fail with "function ... is not unique".
\set SHOW_CONTEXT never

CREATE ROLE regress_ha_attacker NOLOGIN;
CREATE ROLE regress_ha_client NOLOGIN;
GRANT idem_client TO regress_ha_client;
GRANT CREATE ON SCHEMA public TO regress_ha_attacker;

SET ROLE regress_ha_attacker;
CREATE TABLE public.ha_calls (fn text, current_usr name, session_usr name);
GRANT INSERT ON public.ha_calls TO PUBLIC;
CREATE FUNCTION public.idem_attempt_object_key(text, text, uuid, integer, text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ha_calls VALUES ('idem_attempt_object_key(..integer..)', current_user, session_user);
    RETURN 'planted';
END $$;
CREATE FUNCTION public.idem_attempt_object_key(text, text, uuid, integer, character varying)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ha_calls VALUES ('idem_attempt_object_key(..varchar)', current_user, session_user);
    RETURN 'planted';
END $$;
CREATE FUNCTION public.idem_intent_hash(json)
RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ha_calls VALUES ('idem_intent_hash(json)', current_user, session_user);
    RETURN '\x00'::bytea;
END $$;
CREATE FUNCTION public.idem_outbox_stage(text, jsonb, text)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ha_calls VALUES ('idem_outbox_stage(text, jsonb, text)', current_user, session_user);
    RETURN 0;
END $$;
-- Even a call with every argument exactly typed is ambiguous once the
-- schema holds the same leading parameters plus one with a default: the
-- functions call neither through SQL any more.
CREATE FUNCTION public.idem_outbox_stage(text, jsonb, text, jsonb, interval, integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ha_calls VALUES ('idem_outbox_stage(.., integer DEFAULT 0)', current_user, session_user);
    RETURN 0;
END $$;
CREATE FUNCTION public.idem_attempt_object_key(text, text, uuid, bigint, text, integer DEFAULT 0)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ha_calls VALUES ('idem_attempt_object_key(.., integer DEFAULT 0)', current_user, session_user);
    RETURN 'planted';
END $$;
RESET ROLE;

SELECT idem_attempt_register_kind('ha_upload', 'replace', 'ha');

SET ROLE regress_ha_client;
-- Defect 1: the key is the extension's, not the planted function's.
SELECT decision, generation, replace(object_key, attempt_id::text, '<id>') AS object_key
  FROM idem_attempt_open('ha_upload', 't1', 'r1', 'alice', '{"n": 1}'::jsonb, 'a.pdf');
-- Defect 2: promote and fail stage their events.
SELECT idem_attempt_store(a.attempt_id, 1::bigint, sha256('blob'::bytea)) AS stored,
       idem_attempt_promote(a.attempt_id, 1::bigint, sha256('blob'::bytea)) AS promoted
  FROM idem_attempt_open('ha_upload', 't1', 'r1', 'alice', '{"n": 1}'::jsonb, 'a.pdf') a;
SELECT idem_attempt_fail(a.attempt_id, 1::bigint, 'reaped_no_blob') AS failed
  FROM idem_attempt_open('ha_upload', 't1', 'r2', 'alice', '{"n": 2}'::jsonb, 'b.pdf') a;
-- The reopen rotates the key the same way.
SELECT decision, generation, replace(object_key, attempt_id::text, '<id>') AS object_key
  FROM idem_attempt_open('ha_upload', 't1', 'r2', 'alice', '{"n": 2}'::jsonb, 'b.pdf');
SELECT idem_attempt_fail(a.attempt_id, 2::bigint, 'digest_mismatch') AS failed
  FROM idem_attempt_open('ha_upload', 't1', 'r2', 'alice', '{"n": 2}'::jsonb, 'b.pdf') a;
RESET ROLE;
-- (The client reopens it: an attempt is its role's, the superuser's
-- reopen would not find it.)
CREATE TEMP TABLE ha_r2 AS
SELECT attempt_id, replace(object_key, attempt_id::text, '<id>') AS object_key_before
  FROM idem_attempts WHERE kind = 'ha_upload' AND client_request_id = 'r2';
GRANT SELECT ON ha_r2 TO regress_ha_client;
SET ROLE regress_ha_client;
SELECT idem_attempt_reopen(attempt_id, 2::bigint) AS reopened, object_key_before FROM ha_r2;
RESET ROLE;
DROP TABLE ha_r2;
SELECT generation, replace(object_key, attempt_id::text, '<id>') AS object_key
  FROM idem_attempts WHERE kind = 'ha_upload' AND client_request_id = 'r2';

-- The sweep derives the abandoned generations' keys.
SELECT s.generation, replace(s.object_key, s.attempt_id::text, '<id>') AS object_key
  FROM idem_attempt_sweep_batch('0'::interval, 100) s
  JOIN idem_attempts a USING (attempt_id)
 WHERE a.kind = 'ha_upload'
 ORDER BY s.generation;
SELECT topic, payload ->> 'status' AS status, message_key
  FROM idem_outbox WHERE topic LIKE 'ha\_upload.%' ORDER BY id;
SELECT intent_hash = sha256(convert_to(intent::text, 'UTF8')) AS hash_is_sha256_of_intent
  FROM idem_attempts WHERE kind = 'ha_upload' ORDER BY client_request_id;

-- What the clients' own calls see is theirs to type exactly.
SELECT public.idem_attempt_object_key('ha'::text, 't1'::text,
       '00000000-0000-4000-8000-000000000000'::uuid, 3::bigint, 'x.pdf'::text, 0) AS own_call;

-- Nothing planted ran, except the call just made on purpose.

SELECT fn, current_usr = current_user AS ran_as_the_caller FROM public.ha_calls;

--
-- Clean up
--
DELETE FROM idem_outbox WHERE topic LIKE 'ha\_upload.%';
DELETE FROM idem_attempt_targets WHERE kind = 'ha_upload';
DELETE FROM idem_attempts WHERE kind = 'ha_upload';
DELETE FROM idem_attempt_kinds WHERE kind = 'ha_upload';
DROP OWNED BY regress_ha_attacker;
REVOKE CREATE ON SCHEMA public FROM regress_ha_attacker;
DROP ROLE regress_ha_attacker;
DROP ROLE regress_ha_client;
