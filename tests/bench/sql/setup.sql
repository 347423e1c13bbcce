-- The benchmark's schema: one table per variant, all shaped exactly like
-- idem_keys, the PL/pgSQL variant's functions, and the runner's helpers.
-- Run once, after CREATE EXTENSION pg_idem, in the benchmark database.

CREATE SCHEMA bench;

-- Same columns, defaults, constraints, primary key and storage parameters
-- (fillfactor) as idem_keys; only idem_keys' constraint trigger, which
-- belongs to pg_idem's in-transaction mode, is not copied.
DO $$
DECLARE
    variant text;
    options text;
BEGIN
    SELECT coalesce(' WITH (' || array_to_string(reloptions, ', ') || ')', '')
      INTO options
      FROM pg_class WHERE oid = 'idem_keys'::regclass;
    FOREACH variant IN ARRAY ARRAY['idem_floor', 'idem_cte', 'idem_plpgsql'] LOOP
        EXECUTE format('CREATE TABLE bench.%I (LIKE idem_keys INCLUDING ALL)%s',
                       variant, options);
    END LOOP;
END
$$;

-- The minimal floor (issue 13): idem_keys' columns (names, types,
-- collations, NOT NULL, defaults) and its primary key (cache_key, scope),
-- nothing else: no CHECK constraint, no trigger, no other index; fillfactor
-- 70.  The bare statements on it are what pg_idem's fast path is measured
-- against.
CREATE TABLE bench.idem_minimal (LIKE idem_keys INCLUDING DEFAULTS INCLUDING INDEXES)
    WITH (fillfactor = 70);

-- Refuse to run on a minimal table that is not that (idem_keys grew an
-- index the LIKE copied, or lost a column): the floor would be wrong.
DO $$
DECLARE
    problem text;
BEGIN
    SELECT string_agg(p, '; ') INTO problem FROM (
        SELECT 'columns differ from idem_keys' AS p
         WHERE (SELECT array_agg((attname, atttypid, attcollation, attnotnull)::text ORDER BY attnum)
                  FROM pg_attribute WHERE attrelid = 'idem_keys'::regclass
                   AND attnum > 0 AND NOT attisdropped)
            IS DISTINCT FROM
               (SELECT array_agg((attname, atttypid, attcollation, attnotnull)::text ORDER BY attnum)
                  FROM pg_attribute WHERE attrelid = 'bench.idem_minimal'::regclass
                   AND attnum > 0 AND NOT attisdropped)
        UNION ALL
        SELECT 'constraints other than the primary key (cache_key, scope): ' ||
               string_agg(conname || ' ' || contype::text, ', ')
          FROM pg_constraint
         WHERE conrelid = 'bench.idem_minimal'::regclass
           AND NOT (contype = 'p' AND conkey::int2[] = (
                    SELECT array_agg(attnum ORDER BY array_position(ARRAY['cache_key', 'scope'], attname::text))
                      FROM pg_attribute WHERE attrelid = 'bench.idem_minimal'::regclass
                       AND attname IN ('cache_key', 'scope')))
        HAVING count(*) > 0
        UNION ALL
        SELECT 'indexes other than the primary key: ' || count(*)
          FROM pg_index WHERE indrelid = 'bench.idem_minimal'::regclass AND NOT indisprimary
        HAVING count(*) > 0
        UNION ALL
        SELECT 'triggers: ' || count(*)
          FROM pg_trigger WHERE tgrelid = 'bench.idem_minimal'::regclass
        HAVING count(*) > 0
        UNION ALL
        SELECT 'storage parameters are not fillfactor 70: ' || coalesce(reloptions::text, 'none')
          FROM pg_class WHERE oid = 'bench.idem_minimal'::regclass
           AND reloptions IS DISTINCT FROM ARRAY['fillfactor=70']
    ) problems;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'bench.idem_minimal is not the minimal floor: %', problem;
    END IF;
END
$$;

-- The PL/pgSQL variant: pg_idem's claim protocol (claims.c) written as
-- PL/pgSQL, statement for statement: read the key, decide, write with a
-- predicate that re-states the decision, read again if the key changed.
CREATE SEQUENCE bench.plpgsql_generation_seq AS bigint;

CREATE FUNCTION bench.plpgsql_claim(p_key bytea, p_hash bytea, p_lease interval)
RETURNS idem_claim_result
LANGUAGE plpgsql AS $$
DECLARE
    k bench.idem_plpgsql;
    r idem_claim_result;
    cid uuid := gen_random_uuid();
    ttl interval := current_setting('idem.ttl')::interval;
    ttl_passed boolean;
    live boolean;
BEGIN
    FOR attempt IN 1..16 LOOP
        SELECT * INTO k FROM bench.idem_plpgsql WHERE cache_key = p_key;
        IF NOT FOUND THEN
            INSERT INTO bench.idem_plpgsql AS t
                   (cache_key, state, request_hash, claim_id, generation,
                    lease_expires_at, created_at)
            VALUES (p_key, 'pending', p_hash, cid,
                    nextval('bench.plpgsql_generation_seq'),
                    clock_timestamp() + p_lease, clock_timestamp())
            ON CONFLICT (cache_key, scope) DO NOTHING
            RETURNING 'claimed', t.claim_id, t.generation, t.lease_expires_at
                 INTO r.outcome, r.claim_id, r.generation, r.lease_expires_at;
            IF FOUND THEN
                RETURN r;
            END IF;
            CONTINUE;
        END IF;

        live := k.state = 'completed' OR k.lease_expires_at > clock_timestamp();
        ttl_passed := clock_timestamp() - k.created_at > ttl;
        IF NOT (ttl_passed AND (k.state = 'completed' OR NOT live)) THEN
            IF k.request_hash IS NOT NULL AND k.request_hash <> p_hash THEN
                r.outcome := 'mismatch';
                RETURN r;
            END IF;
            IF k.state = 'completed' THEN
                IF NOT k.replayable THEN
                    r.outcome := 'not_replayable';
                    RETURN r;
                END IF;
                r.outcome := 'replay';
                r.response_status := k.response_status;
                r.response_headers := k.response_headers;
                r.response_body := k.response_body;
                RETURN r;
            END IF;
            IF live THEN
                r.outcome := CASE k.state WHEN 'pending' THEN 'in_progress' ELSE 'cooldown' END;
                r.retry_after := k.lease_expires_at - clock_timestamp();
                RETURN r;
            END IF;
        END IF;

        IF ttl_passed THEN
            UPDATE bench.idem_plpgsql t SET state = 'pending', request_hash = p_hash,
                   claim_id = cid, generation = nextval('bench.plpgsql_generation_seq'),
                   lease_expires_at = clock_timestamp() + p_lease,
                   created_at = clock_timestamp(), finished_at = NULL,
                   response_status = NULL, response_headers = NULL,
                   response_body = NULL, replayable = true
             WHERE t.cache_key = p_key AND t.created_at < clock_timestamp() - ttl
               AND (t.state = 'completed' OR t.lease_expires_at < clock_timestamp())
            RETURNING 'recovered_ttl', t.claim_id, t.generation, t.lease_expires_at
                 INTO r.outcome, r.claim_id, r.generation, r.lease_expires_at;
        ELSE
            UPDATE bench.idem_plpgsql t SET state = 'pending', request_hash = p_hash,
                   claim_id = cid, generation = nextval('bench.plpgsql_generation_seq'),
                   lease_expires_at = clock_timestamp() + p_lease,
                   created_at = clock_timestamp(), finished_at = NULL,
                   response_status = NULL, response_headers = NULL,
                   response_body = NULL, replayable = true
             WHERE t.cache_key = p_key AND t.state IN ('pending', 'failed')
               AND t.lease_expires_at < clock_timestamp()
               AND (t.request_hash = p_hash OR t.request_hash IS NULL)
            RETURNING 'recovered_abandoned', t.claim_id, t.generation, t.lease_expires_at
                 INTO r.outcome, r.claim_id, r.generation, r.lease_expires_at;
        END IF;
        IF FOUND THEN
            RETURN r;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'could not claim idempotency key: it changed concurrently 16 times'
        USING ERRCODE = 'serialization_failure';
END
$$;

CREATE FUNCTION bench.plpgsql_finalize(p_key bytea, p_claim uuid, p_status integer,
                                       p_headers jsonb, p_body bytea)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE bench.idem_plpgsql
       SET state = 'completed', response_status = p_status,
           response_headers = p_headers, response_body = p_body, replayable = true,
           finished_at = clock_timestamp(), lease_expires_at = NULL
     WHERE cache_key = p_key AND claim_id = p_claim AND state = 'pending';
    RETURN FOUND;
END
$$;

CREATE FUNCTION bench.plpgsql_renew(p_key bytea, p_claim uuid, p_lease interval)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    expires timestamptz;
BEGIN
    UPDATE bench.idem_plpgsql SET lease_expires_at = clock_timestamp() + p_lease
     WHERE cache_key = p_key AND claim_id = p_claim AND state = 'pending'
    RETURNING lease_expires_at INTO expires;
    RETURN expires;
END
$$;

CREATE FUNCTION bench.plpgsql_release(p_key bytea, p_claim uuid)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM bench.idem_plpgsql
     WHERE cache_key = p_key AND claim_id = p_claim AND state = 'pending';
    RETURN FOUND;
END
$$;

-- Empty a variant's table and give it the rows a scenario starts from:
-- n completed keys (replay), n pending keys with a live lease (renew), or
-- n pending outbox events (drain).
-- Key i is sha256(int8send(i)) and its claim id md5(int8send(i))::uuid,
-- as the pgbench scripts compute them.
CREATE FUNCTION bench.reset(tbl regclass, kind text, n integer)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('TRUNCATE %s', tbl);
    IF tbl = 'idem_outbox_queue'::regclass THEN
        TRUNCATE idem_outbox_claimed;
    END IF;
    IF kind = 'completed' THEN
        EXECUTE format($f$
            INSERT INTO %s (cache_key, scope, state, request_hash, claim_id, generation,
                            finished_at, response_status, response_headers, response_body)
            SELECT sha256(int8send(i)), current_user::text::regrole, 'completed',
                   '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9',
                   md5(int8send(i))::uuid, i, clock_timestamp(), 200,
                   '{"content-type": "application/json"}', '{"id": 42, "status": "created"}'
              FROM generate_series(1, $1) i$f$, tbl) USING n;
    ELSIF kind = 'pending' THEN
        EXECUTE format($f$
            INSERT INTO %s (cache_key, scope, state, request_hash, claim_id, generation,
                            lease_expires_at)
            SELECT sha256(int8send(i)), current_user::text::regrole, 'pending',
                   '\x5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9',
                   md5(int8send(i))::uuid, i, clock_timestamp() + interval '1 hour'
              FROM generate_series(1, $1) i$f$, tbl) USING n;
    ELSIF kind = 'outbox' THEN
        -- n pending events, exactly as idem_outbox_stage writes them (its
        -- per-row cost would make seeding a drain run slower than the run).
        INSERT INTO idem_outbox_queue (topic, message_key, key_hash, payload, available_at, scope)
        SELECT 'orders', 'order-' || i, sha256(('order-' || i)::bytea),
               '{"id": 42, "status": "created"}', clock_timestamp(), current_user::text::regrole
          FROM generate_series(1, n) i;
    END IF;
END
$$;

-- Wait until the pgbench sessions have exited: a backend flushes its
-- table and WAL statistics on exit, before it leaves pg_stat_activity.
CREATE PROCEDURE bench.wait_for_clients()
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..500 LOOP
        EXIT WHEN NOT EXISTS (SELECT FROM pg_stat_activity
                               WHERE backend_type = 'client backend'
                                 AND pid <> pg_backend_pid());
        PERFORM pg_sleep(0.01);
    END LOOP;
END
$$;

-- pg_idem's claim outcome counters ("name=value ..."), empty when this
-- build has no idem_stats view.
CREATE FUNCTION bench.claim_stats()
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    result text;
BEGIN
    IF to_regclass('idem_stats') IS NULL THEN
        RETURN '';
    END IF;
    EXECUTE $q$SELECT string_agg(counter || '=' || value, ' ') FROM idem_stats
                WHERE counter IN ('claimed', 'recovered_ttl', 'recovered_abandoned',
                                  'in_progress', 'replay', 'released')$q$
       INTO result;
    RETURN coalesce(result, '');
END
$$;

-- One line of the counters the runner diffs around a run: numbers, then
-- after a ';' pg_idem's claim outcomes.
CREATE FUNCTION bench.snapshot(tbl regclass)
RETURNS text
LANGUAGE sql AS $$
    SELECT concat_ws(',', pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'),
                     w.wal_records, w.wal_fpi, w.wal_bytes,
                     t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del,
                     t.n_live_tup, t.n_dead_tup,
                     pg_table_size(tbl), pg_indexes_size(tbl),
                     w.wal_sync, round(w.wal_sync_time * 1000)) || ';' || bench.claim_stats()
      FROM pg_stat_wal w, pg_stat_user_tables t
     WHERE t.relid = tbl
$$;

-- Size and liveness of idem_keys, sampled during the steady-state runs.
-- live_bytes is the size of the live rows themselves (tuple header and
-- data, as pg_column_size reports it for a whole row).
CREATE FUNCTION bench.steady_sample()
RETURNS text
LANGUAGE sql AS $$
    SELECT concat_ws(',', pg_table_size('idem_keys'), pg_indexes_size('idem_keys'),
                     (SELECT count(*) FROM idem_keys),
                     (SELECT coalesce(sum(pg_column_size(k.*)), 0) FROM idem_keys k),
                     t.n_dead_tup, t.autovacuum_count + t.vacuum_count,
                     pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'))
      FROM pg_stat_user_tables t
     WHERE t.relid = 'idem_keys'::regclass
$$;
