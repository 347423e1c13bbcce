-- The hot path keeps working in one session across everything that can
-- change idem_keys or the extension under it (issue 13: per-backend state
-- invalidated by relcache invalidation, DDL, DROP/CREATE EXTENSION and
-- ALTER EXTENSION UPDATE).  A backend that keeps relations, indexes,
-- prepared CHECK expressions, plans or the generation sequence across
-- calls must notice each of these, including DDL that rolls back.
--
-- pg_temp.cycle(label) runs every call of the hot path against fresh keys
-- (label/a ... label/f): claim (claimed, in_progress, mismatch, replay,
-- cooldown, recovered_abandoned, expired, recovered_ttl), lookup, renew,
-- finalize, release, fail, idem_begin with its deferred trigger (IL002),
-- a forged and a stale claim_id.  It runs as one statement (one
-- transaction): the cleanup worker, which may visit this database, never
-- sees its backdated rows.  Nothing random is printed.
--
-- Everything runs in a database of its own, in one session after the \c.

\set regress_db :DBNAME
CREATE DATABASE idem_regress_cache;
\c idem_regress_cache
CREATE EXTENSION pg_idem;

CREATE FUNCTION pg_temp.k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_key('regress', 'POST', '/cache', name) $$;

-- The error a statement raises, as its SQLSTATE, or "ok".
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$$;

-- Every call goes through EXECUTE, so that no plan of this function's own
-- outlives the objects it names.
CREATE FUNCTION pg_temp.cycle(label text) RETURNS TABLE (step text, result text)
LANGUAGE plpgsql AS $$
DECLARE
    ka bytea; kb bytea; kc bytea; kd bytea; ke bytea; kf bytea;
    h1 CONSTANT bytea := sha256('one');
    h2 CONSTANT bytea := sha256('two');
    r record;
    id uuid;
    old_id uuid;
    gen bigint;
    ok boolean;
    ts timestamptz;
BEGIN
    EXECUTE 'SELECT pg_temp.k($1), pg_temp.k($2), pg_temp.k($3), pg_temp.k($4), pg_temp.k($5), pg_temp.k($6)'
       INTO ka, kb, kc, kd, ke, kf
      USING label || '/a', label || '/b', label || '/c', label || '/d', label || '/e', label || '/f';
    PERFORM set_config('idem.after_ttl', 'refuse', true);

    -- a: a new key, its followers, its owner's calls, its replay.
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING ka, h1;
    id := r.claim_id;
    step := 'a: claim'; result := r.outcome || ', owner ' || (id IS NOT NULL); RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING ka, h1;
    step := 'a: same request'; result := r.outcome || ', owner ' || (r.claim_id IS NOT NULL); RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING ka, h2;
    step := 'a: another body'; result := r.outcome; RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_lookup($1, $2)' INTO r USING ka, h1;
    step := 'a: lookup'; result := r.outcome; RETURN NEXT;
    EXECUTE 'SELECT idem_renew($1, $2, $3)' INTO ts USING ka, id, interval '10 minutes';
    step := 'a: renew'; result := coalesce((ts > clock_timestamp() + interval '5 minutes')::text, 'null'); RETURN NEXT;
    EXECUTE 'SELECT idem_renew($1, $2)' INTO ts USING ka, gen_random_uuid();
    step := 'a: renew, forged id'; result := coalesce(ts::text, 'null'); RETURN NEXT;
    EXECUTE 'SELECT idem_finalize($1, $2, 201, $3, $4)' INTO ok
      USING ka, gen_random_uuid(), '{"content-type": "text/plain"}'::jsonb, convert_to('forged', 'UTF8');
    step := 'a: finalize, forged id'; result := ok; RETURN NEXT;
    EXECUTE 'SELECT idem_finalize($1, $2, 201, $3, $4)' INTO ok
      USING ka, id, '{"content-type": "text/plain"}'::jsonb, convert_to(label || ' a', 'UTF8');
    step := 'a: finalize'; result := ok; RETURN NEXT;
    EXECUTE 'SELECT idem_finalize($1, $2, 201, NULL, $3)' INTO ok USING ka, id, convert_to('again', 'UTF8');
    step := 'a: finalize again'; result := ok; RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING ka, h1;
    step := 'a: retry'; result := format('%s %s %s %s', r.outcome, r.response_status,
                                         r.response_headers, convert_from(r.response_body, 'UTF8')); RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_lookup($1, $2)' INTO r USING ka, h1;
    step := 'a: lookup'; result := r.outcome || ' ' || convert_from(r.response_body, 'UTF8'); RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING ka, h2;
    step := 'a: another body'; result := r.outcome; RETURN NEXT;

    -- b: released and claimed again; failed, cooling down, taken over.
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kb, h1;
    id := r.claim_id; gen := r.generation;
    step := 'b: claim'; result := r.outcome; RETURN NEXT;
    EXECUTE 'SELECT idem_release($1, $2)' INTO ok USING kb, id;
    step := 'b: release'; result := ok; RETURN NEXT;
    EXECUTE 'SELECT idem_release($1, $2)' INTO ok USING kb, id;
    step := 'b: release again'; result := ok; RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kb, h2;
    step := 'b: claim, another body'; result := r.outcome || ', newer ' || (r.generation > gen); RETURN NEXT;
    id := r.claim_id; gen := r.generation;
    EXECUTE 'SELECT idem_fail($1, $2, $3)' INTO ok USING kb, id, interval '1 hour';
    step := 'b: fail'; result := ok; RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kb, h2;
    step := 'b: retry in cooldown'; result := r.outcome || ', retry_after ' || (r.retry_after > '0'); RETURN NEXT;
    EXECUTE 'UPDATE idem_keys SET lease_expires_at = clock_timestamp() - interval ''1 second'' WHERE cache_key = $1'
      USING kb;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kb, h2;
    step := 'b: retry after cooldown'; result := r.outcome || ', newer ' || (r.generation > gen); RETURN NEXT;
    EXECUTE 'SELECT idem_finalize($1, $2, 200, NULL, NULL)' INTO ok USING kb, r.claim_id;
    step := 'b: finalize'; result := ok; RETURN NEXT;

    -- c: an abandoned lease taken over; the old owner is fenced out.
    EXECUTE 'SELECT * FROM idem_claim($1, $2, $3)' INTO r USING kc, h1, interval '1 hour';
    old_id := r.claim_id; gen := r.generation;
    step := 'c: claim'; result := r.outcome; RETURN NEXT;
    EXECUTE 'UPDATE idem_keys SET lease_expires_at = clock_timestamp() - interval ''1 second'' WHERE cache_key = $1'
      USING kc;
    EXECUTE 'SELECT * FROM idem_lookup($1, $2)' INTO r USING kc, h1;
    step := 'c: lookup'; result := r.outcome; RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kc, h2;
    step := 'c: another body'; result := r.outcome; RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kc, h1;
    id := r.claim_id;
    step := 'c: same request'; result := r.outcome || ', newer ' || (r.generation > gen); RETURN NEXT;
    EXECUTE 'SELECT idem_renew($1, $2)' INTO ts USING kc, old_id;
    step := 'c: old owner renews'; result := coalesce(ts::text, 'null'); RETURN NEXT;
    EXECUTE 'SELECT idem_finalize($1, $2, 200, NULL, $3)' INTO ok USING kc, old_id, convert_to('stale', 'UTF8');
    step := 'c: old owner finalizes'; result := ok; RETURN NEXT;
    EXECUTE 'SELECT idem_finalize($1, $2, 200, NULL, $3)' INTO ok USING kc, id, convert_to(label || ' c', 'UTF8');
    step := 'c: new owner finalizes'; result := ok; RETURN NEXT;

    -- d: past idem.ttl: expired, or run again with idem.after_ttl = rerun.
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kd, h1;
    gen := r.generation;
    EXECUTE 'SELECT idem_finalize($1, $2, 200, NULL, $3)' INTO ok USING kd, r.claim_id, convert_to('d', 'UTF8');
    step := 'd: claim, finalize'; result := r.outcome || ', ' || ok; RETURN NEXT;
    EXECUTE 'UPDATE idem_keys SET created_at = created_at - interval ''2 days'','
            ' finished_at = finished_at - interval ''2 days'' WHERE cache_key = $1' USING kd;
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kd, h1;
    step := 'd: retry past ttl'; result := r.outcome || ' ' || r.response_status; RETURN NEXT;
    PERFORM set_config('idem.after_ttl', 'rerun', true);
    EXECUTE 'SELECT * FROM idem_claim($1, $2)' INTO r USING kd, h2;
    step := 'd: rerun past ttl'; result := r.outcome || ', newer ' || (r.generation > gen); RETURN NEXT;
    PERFORM set_config('idem.after_ttl', 'refuse', true);
    EXECUTE 'SELECT idem_finalize($1, $2, 200, NULL, $3)' INTO ok USING kd, r.claim_id, convert_to('d again', 'UTF8');
    step := 'd: finalize'; result := ok; RETURN NEXT;

    -- e: an in-transaction claim, finished in the same transaction.
    EXECUTE 'SELECT * FROM idem_begin($1, $2)' INTO r USING ke, h1;
    step := 'e: begin'; result := r.outcome; RETURN NEXT;
    EXECUTE 'SELECT idem_finalize($1, $2, 201, NULL, $3)' INTO ok USING ke, r.claim_id, convert_to(label || ' e', 'UTF8');
    step := 'e: finalize'; result := ok; RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_begin($1, $2)' INTO r USING ke, h1;
    step := 'e: begin again'; result := r.outcome || ' ' || convert_from(r.response_body, 'UTF8'); RETURN NEXT;

    -- f: an in-transaction claim left unfinished: the deferred trigger
    -- refuses it (checked now instead of at commit); nothing is left.
    BEGIN
        EXECUTE 'SELECT * FROM idem_begin($1, $2)' INTO r USING kf, h1;
        SET CONSTRAINTS idem_keys_claim_finished IMMEDIATE;
        result := 'not refused';
    EXCEPTION WHEN OTHERS THEN
        result := SQLSTATE;
    END;
    SET CONSTRAINTS idem_keys_claim_finished DEFERRED;
    step := 'f: unfinished begin'; RETURN NEXT;
    EXECUTE 'SELECT * FROM idem_lookup($1, $2)' INTO r USING kf, h1;
    step := 'f: lookup'; result := r.outcome; RETURN NEXT;
END
$$;

-- What a retry of an earlier cycle's finished keys gets now.
CREATE FUNCTION pg_temp.replays(label text) RETURNS TABLE (key text, outcome text, body text)
LANGUAGE plpgsql AS $$
DECLARE
    name text;
    r record;
BEGIN
    FOREACH name IN ARRAY ARRAY['a', 'c', 'e'] LOOP
        EXECUTE 'SELECT * FROM idem_lookup(pg_temp.k($1), $2)' INTO r USING label || '/' || name, sha256('one');
        key := label || '/' || name; outcome := r.outcome; body := convert_from(r.response_body, 'UTF8');
        RETURN NEXT;
    END LOOP;
END
$$;

-- The storage of idem_keys and its primary key, to tell that DDL below
-- gave them new files (or new OIDs).
CREATE FUNCTION pg_temp.files() RETURNS TABLE (table_oid oid, table_file oid, pkey_oid oid, pkey_file oid)
LANGUAGE sql AS $$
    SELECT c.oid, c.relfilenode, i.oid, i.relfilenode
      FROM pg_class c, pg_class i
     WHERE c.oid = 'idem_keys'::regclass AND i.oid = 'idem_keys_pkey'::regclass
$$;
CREATE TEMP TABLE files_before AS SELECT * FROM pg_temp.files();
CREATE FUNCTION pg_temp.files_changed() RETURNS TABLE (new_table_oid boolean, new_table_file boolean,
                                                       new_pkey_oid boolean, new_pkey_file boolean)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT n.table_oid <> b.table_oid, n.table_file <> b.table_file,
                        n.pkey_oid <> b.pkey_oid, n.pkey_file <> b.pkey_file
                   FROM pg_temp.files() n, files_before b;
    DELETE FROM files_before;
    INSERT INTO files_before SELECT * FROM pg_temp.files();
END
$$;

--
-- 1. The baseline.
--
SELECT * FROM pg_temp.cycle('base');

--
-- 2. A column added (with a default), then dropped.
--
ALTER TABLE idem_keys ADD COLUMN regress_note text DEFAULT 'noted';
SELECT * FROM pg_temp.cycle('add_column');
-- A row the claim inserted has the new column's default, as an INSERT
-- naming the other columns would give it.
SELECT state, regress_note FROM idem_keys WHERE cache_key = pg_temp.k('add_column/a');
SELECT * FROM pg_temp.replays('base');
ALTER TABLE idem_keys DROP COLUMN regress_note;
SELECT * FROM pg_temp.cycle('drop_column');
SELECT * FROM pg_temp.replays('add_column');
-- Added in a transaction that rolls back after the calls used it.
BEGIN;
ALTER TABLE idem_keys ADD COLUMN regress_gone integer;
SELECT * FROM pg_temp.cycle('column_rolled_back');
ROLLBACK;
SELECT * FROM pg_temp.cycle('after_column_rollback');
SELECT * FROM pg_temp.replays('column_rolled_back');

--
-- 3. CHECK constraints added and dropped: the calls enforce the ones there
-- are, and only those.
--
ALTER TABLE idem_keys ADD CONSTRAINT regress_no_teapot CHECK (response_status IS DISTINCT FROM 418),
    ADD CONSTRAINT regress_no_forbidden CHECK (request_hash IS DISTINCT FROM sha256('forbidden'));
SELECT claim_id AS check_claim FROM idem_claim(pg_temp.k('check/a'), sha256('one')) \gset
SELECT pg_temp.try(format($$SELECT idem_finalize(%L, %L, 418, NULL, 'teapot')$$,
                          pg_temp.k('check/a'), :'check_claim')) AS finalize_418,
       pg_temp.try($$SELECT idem_claim(pg_temp.k('check/b'), sha256('forbidden'))$$) AS claim_forbidden;
SELECT * FROM pg_temp.cycle('check_added');
ALTER TABLE idem_keys DROP CONSTRAINT regress_no_teapot, DROP CONSTRAINT regress_no_forbidden;
SELECT idem_finalize(pg_temp.k('check/a'), :'check_claim', 418, NULL, 'teapot') AS finalize_418;
SELECT outcome FROM idem_claim(pg_temp.k('check/b'), sha256('forbidden')) AS claim_forbidden;
SELECT * FROM pg_temp.cycle('check_dropped');

--
-- 4. An index created, then dropped.  The calls maintain the new index (on
-- state: finalize, release and fail are no longer HOT updates): scanned
-- through it, idem_keys has the rows a sequential scan finds.
--
CREATE INDEX regress_idem_keys_state ON idem_keys (state);
SELECT * FROM pg_temp.cycle('index');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SET enable_indexonlyscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idem_keys WHERE state = 'completed';
CREATE TEMP TABLE via_index AS
SELECT s AS state, (SELECT count(*) FROM idem_keys k WHERE k.state = s) AS keys
  FROM unnest(ARRAY['pending', 'completed', 'failed', 'expired']) s;
RESET enable_seqscan;
RESET enable_bitmapscan;
RESET enable_indexonlyscan;
SELECT i.state, i.keys = (SELECT count(*) FROM idem_keys k WHERE k.state || '' = i.state) AS index_agrees
  FROM via_index i ORDER BY i.state;
DROP INDEX regress_idem_keys_state;
SELECT * FROM pg_temp.cycle('index_dropped');
-- Created in a transaction that rolls back after the calls used it.
BEGIN;
CREATE INDEX regress_idem_keys_gone ON idem_keys (generation);
SELECT * FROM pg_temp.cycle('index_rolled_back');
ROLLBACK;
SELECT * FROM pg_temp.cycle('after_index_rollback');

--
-- 5. A trigger created, then dropped: the calls' writes fire it while it
-- exists, and not after.
--
CREATE TABLE regress_fired (op text);
CREATE FUNCTION regress_count_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.regress_fired VALUES (TG_OP);
    RETURN NULL;
END
$$;
CREATE TRIGGER regress_count_write AFTER INSERT OR UPDATE ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION regress_count_write();
SELECT * FROM pg_temp.cycle('trigger');
SELECT op, count(*) > 0 AS fired FROM regress_fired GROUP BY op ORDER BY op;
DROP TRIGGER regress_count_write ON idem_keys;
DELETE FROM regress_fired;
SELECT * FROM pg_temp.cycle('trigger_dropped');
SELECT count(*) AS fired_after_drop FROM regress_fired;
DROP TABLE regress_fired;
DROP FUNCTION regress_count_write();

--
-- 6. Storage parameters.
--
ALTER TABLE idem_keys SET (fillfactor = 50);
SELECT * FROM pg_temp.cycle('fillfactor');
ALTER TABLE idem_keys SET (fillfactor = 70);
SELECT * FROM pg_temp.cycle('fillfactor_back');
SELECT reloptions FROM pg_class WHERE oid = 'idem_keys'::regclass;

--
-- 7. New files for the table and its index: VACUUM FULL, CLUSTER, REINDEX
-- (also CONCURRENTLY, which gives the primary key a new OID), TRUNCATE;
-- and a REINDEX and a TRUNCATE that roll back.
--
SELECT * FROM pg_temp.files_changed();
VACUUM FULL idem_keys;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.cycle('vacuum_full');
SELECT * FROM pg_temp.replays('fillfactor_back');
CLUSTER idem_keys USING idem_keys_pkey;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.cycle('cluster');
SELECT * FROM pg_temp.replays('vacuum_full');
REINDEX INDEX idem_keys_pkey;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.cycle('reindex');
SELECT * FROM pg_temp.replays('cluster');
REINDEX INDEX CONCURRENTLY idem_keys_pkey;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.cycle('reindex_concurrently');
SELECT * FROM pg_temp.replays('reindex');
BEGIN;
REINDEX TABLE idem_keys;
SELECT * FROM pg_temp.cycle('reindex_rolled_back');
ROLLBACK;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.cycle('after_reindex_rollback');
BEGIN;
TRUNCATE idem_keys;
SELECT * FROM pg_temp.cycle('truncate_rolled_back');
ROLLBACK;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.replays('reindex_concurrently');
TRUNCATE idem_keys;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.replays('reindex_concurrently');
SELECT * FROM pg_temp.cycle('truncate');

--
-- 8. The generation sequence moved forward (as after a restore): the next
-- claim draws from where it is now, not from values fetched before.
--
SELECT setval('idem_generation_seq', 1000000000) > 0 AS moved;
SELECT outcome, generation > 1000000000 AS from_the_sequence
  FROM idem_claim(pg_temp.k('moved/a'), sha256('one'));
SELECT * FROM pg_temp.cycle('sequence');

--
-- 9. The extension dropped and created again: new table, index, sequence
-- and functions.  Also inside a transaction that rolls back, after the
-- calls used the new objects: the old ones are back.
--
DROP EXTENSION pg_idem;
CREATE EXTENSION pg_idem;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.replays('truncate');
SELECT * FROM pg_temp.cycle('recreated');
BEGIN;
DROP EXTENSION pg_idem;
CREATE EXTENSION pg_idem;
SELECT * FROM pg_temp.cycle('recreated_rolled_back');
ROLLBACK;
SELECT * FROM pg_temp.files_changed();
SELECT * FROM pg_temp.replays('recreated');
SELECT * FROM pg_temp.replays('recreated_rolled_back');
SELECT * FROM pg_temp.cycle('after_extension_rollback');

--
-- 10. Tables older than the library serves (0.4.0's: scopes by role name)
-- are refused, with the hint to update, until ALTER EXTENSION UPDATE in
-- the same session, after which every call works at once (the probe of
-- core/schema.c is kept until a relcache invalidation of idem_keys).  The
-- previous release's (0.5.0) are served before the update, and their keys
-- replay after it (docs/guides/upgrading.md, rolling upgrades).
--
CREATE FUNCTION pg_temp.refusal(sql text) RETURNS TABLE (code text, message text, detail text, hint text)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN NEXT;
END
$$;
DROP EXTENSION pg_idem;
CREATE EXTENSION pg_idem VERSION '0.4.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_idem';
SELECT code, message, detail LIKE '%; this database has pg_idem 0.4.0.' AS detail_names_version, hint
  FROM pg_temp.refusal($$SELECT * FROM idem_claim(pg_temp.k('v040'), sha256('one'))$$);
SELECT pg_temp.try($$SELECT idem_cleanup(10)$$) AS cleanup,
       pg_temp.try($$SELECT idem_outbox_stage('t', '{}'::jsonb)$$) AS stage,
       pg_temp.try($$SELECT * FROM idem_outbox_claim(10, '1 minute')$$) AS outbox_claim;
ALTER EXTENSION pg_idem UPDATE;
SELECT * FROM pg_temp.cycle('v040_updated');

DROP EXTENSION pg_idem;
CREATE EXTENSION pg_idem VERSION '0.5.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_idem';
SELECT * FROM pg_temp.cycle('v050');
ALTER EXTENSION pg_idem UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'pg_idem') AS updated
  FROM pg_extension WHERE extname = 'pg_idem';
SELECT * FROM pg_temp.replays('v050');
SELECT * FROM pg_temp.cycle('updated');

\c :regress_db
DROP DATABASE idem_regress_cache WITH (FORCE);
