-- A key's whole life: replay until idem.ttl, then expired (or rerun by
-- idem.after_ttl), the fingerprint until idem.tombstone_ttl, then a new
-- key; a crashed winner's pending key never goes to another body; the
-- in-progress polling hint; the follower's wait in the server (max_wait).
--
-- Keys of this file are idem_key('regress', 'POST', '/lifetime', name).
-- Ages are made by moving created_at back; nothing random is printed.

CREATE FUNCTION pg_temp.k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_key('regress', 'POST', '/lifetime', name) $$;
CREATE FUNCTION pg_temp.h(body text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_request_hash(convert_to(body, 'UTF8')) $$;
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text;
    msg text;
    det text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
    RETURN st || ': ' || msg || coalesce(nullif(' (' || det || ')', ' ()'), '');
END
$$;
CREATE TEMP TABLE won (key_name text PRIMARY KEY, claim_id uuid, generation bigint);
-- Claim name for body; a winner's claim id is kept for the later calls.
CREATE FUNCTION pg_temp.claim(name text, body text, lease interval DEFAULT NULL,
                              max_wait interval DEFAULT NULL)
RETURNS TABLE (outcome text, status integer, response text) LANGUAGE plpgsql AS $$
DECLARE
    r idem_claim_result;
BEGIN
    r := idem_claim(pg_temp.k(name), pg_temp.h(body), lease, max_wait);
    IF r.claim_id IS NOT NULL THEN
        INSERT INTO won VALUES (name, r.claim_id, r.generation)
            ON CONFLICT (key_name) DO UPDATE SET claim_id = excluded.claim_id,
                                             generation = excluded.generation;
    END IF;
    RETURN QUERY SELECT r.outcome, r.response_status, convert_from(r.response_body, 'UTF8');
END
$$;
CREATE FUNCTION pg_temp.cid(name text) RETURNS uuid LANGUAGE sql AS
$$ SELECT claim_id FROM won WHERE won.key_name = cid.name $$;
CREATE FUNCTION pg_temp.age(name text, by interval) RETURNS void LANGUAGE sql AS
$$ UPDATE idem_keys SET created_at = created_at - by WHERE cache_key = pg_temp.k(name) $$;
CREATE FUNCTION pg_temp.state(name text) RETURNS TABLE (state text, has_hash boolean,
                                                        status integer, body text)
LANGUAGE sql AS $$
    SELECT state, request_hash IS NOT NULL, response_status, convert_from(response_body, 'UTF8')
      FROM idem_keys WHERE cache_key = pg_temp.k(name)
$$;

SHOW idem.after_ttl;
SHOW idem.tombstone_ttl;
SHOW idem.max_wait;

--
-- Past idem.ttl: expired, for the same body and for another, with the
-- stored status but no body; nothing is written.
--
SELECT outcome FROM pg_temp.claim('e', 'one');
SELECT idem_finalize(pg_temp.k('e'), pg_temp.cid('e'), 201, '{"x": "y"}', 'kept') AS finalized;
SELECT * FROM pg_temp.claim('e', 'one');
SELECT pg_temp.age('e', '2 days');
SELECT * FROM pg_temp.claim('e', 'one');
SELECT * FROM pg_temp.claim('e', 'two');
SELECT outcome, response_status, response_body IS NULL AS no_body
  FROM idem_lookup(pg_temp.k('e'), pg_temp.h('one'));
SELECT * FROM pg_temp.state('e');
-- The cleanup drops the response at the first horizon and keeps the row.
SELECT idem_cleanup() AS cleaned;
SELECT * FROM pg_temp.state('e');
SELECT * FROM pg_temp.claim('e', 'one');
-- With idem.after_ttl = 'rerun' the expired key runs again, a newer generation.
SET idem.after_ttl = 'rerun';
SELECT generation AS before FROM idem_keys WHERE cache_key = pg_temp.k('e') \gset
SELECT * FROM pg_temp.claim('e', 'two');
SELECT generation > :before AS newer FROM idem_keys WHERE cache_key = pg_temp.k('e');
SELECT idem_finalize(pg_temp.k('e'), pg_temp.cid('e'), 200, NULL, 'rerun') AS finalized;
RESET idem.after_ttl;
SELECT * FROM pg_temp.claim('e', 'two');
-- Past the second horizon the row is deleted: the next request is a new key.
SELECT pg_temp.age('e', '40 days');
SELECT idem_cleanup() AS cleaned;
SELECT count(*) AS rows_left FROM idem_keys WHERE cache_key = pg_temp.k('e');
SELECT outcome FROM pg_temp.claim('e', 'three');
-- idem.tombstone_ttl = 0: one horizon, rows go at idem.ttl.
SELECT idem_finalize(pg_temp.k('e'), pg_temp.cid('e'), 200, NULL, 'x') AS finalized;
SELECT pg_temp.age('e', '2 days');
SET idem.tombstone_ttl = 0;
SELECT idem_cleanup() AS cleaned;
SELECT count(*) AS rows_left FROM idem_keys WHERE cache_key = pg_temp.k('e');
RESET idem.tombstone_ttl;
-- The cleanup writes the keys it picked by TID, not by a probe of the
-- primary key per key (index_scans 0), and so with TID scans off too: its
-- only sequential scans of idem_keys are its two picks (deleting, then
-- expiring); a write that found its batch by another scan would read the
-- whole table per batch.
-- 10,000 fresh keys make the table big enough that the planner would
-- choose a TID scan anyway (a table of a few pages is scanned whole).
INSERT INTO idem_keys (cache_key, scope, state, request_hash, generation, response_status, response_body)
SELECT sha256(int8send(i)), current_user::regrole, 'completed', sha256(int8send(i)), i, 200, '\x00'
  FROM generate_series(1, 10000) i;
ANALYZE idem_keys;
SELECT outcome FROM pg_temp.claim('e', 'four');
SELECT idem_finalize(pg_temp.k('e'), pg_temp.cid('e'), 200, NULL, 'x') AS finalized;
SELECT pg_temp.age('e', '40 days');
BEGIN;
SET LOCAL enable_tidscan = off;
SELECT seq_scan AS seq_before, idx_scan AS idx_before
  FROM pg_stat_xact_user_tables WHERE relid = 'idem_keys'::regclass \gset
SELECT idem_cleanup() AS cleaned;
SELECT seq_scan - :seq_before AS seq_scans, idx_scan - :idx_before AS index_scans
  FROM pg_stat_xact_user_tables WHERE relid = 'idem_keys'::regclass;
SELECT count(*) AS rows_left FROM idem_keys WHERE cache_key = pg_temp.k('e');
SHOW enable_tidscan;
COMMIT;
DELETE FROM idem_keys WHERE cache_key IN (SELECT sha256(int8send(i)) FROM generate_series(1, 10000) i);
-- Ordinary users cannot change the policy (it decides others' keys).
CREATE ROLE regress_idem_lifetime;
SET ROLE regress_idem_lifetime;
SELECT pg_temp.try($$SET idem.after_ttl = 'rerun'$$) AS after_ttl,
       pg_temp.try($$SET idem.tombstone_ttl = '1s'$$) AS tombstone_ttl,
       pg_temp.try($$SET idem.max_wait = '1h'$$) AS max_wait;
RESET ROLE;
DROP ROLE regress_idem_lifetime;
SELECT pg_temp.try($$SET idem.after_ttl = 'sometimes'$$) AS bad_policy;
-- (The SQL edition keeps a bad value until it is used: back to the default.)
RESET idem.after_ttl;

--
-- A crashed winner's pending key never goes to another body, however old
-- (0.2.0 handed it over as recovered_ttl); the same body recovers it.
--
SELECT outcome FROM pg_temp.claim('p', 'one', '1 ms');
SELECT pg_sleep(0.01);
SELECT pg_temp.age('p', '2 days');
SELECT outcome FROM pg_temp.claim('p', 'two');
SET idem.after_ttl = 'rerun';
SELECT outcome FROM pg_temp.claim('p', 'two');
RESET idem.after_ttl;
SELECT * FROM pg_temp.state('p');
SELECT outcome FROM pg_temp.claim('p', 'one');
SELECT idem_release(pg_temp.k('p'), pg_temp.cid('p')) AS released;

--
-- in_progress: a short polling hint in retry_after (not the lease), the
-- lease's end in lease_expires_at; cooldown: what is left of it.
--
SELECT outcome FROM pg_temp.claim('w', 'one', '1 hour');
SELECT outcome, claim_id IS NULL AS no_claim_id, generation IS NULL AS no_generation,
       retry_after <= '1 s' AND retry_after > '0' AS short_hint,
       lease_expires_at > clock_timestamp() + '59 min' AS lease_end
  FROM idem_claim(pg_temp.k('w'), pg_temp.h('one'));
SELECT outcome, lease_expires_at IS NULL AS no_lease_for_other_body
  FROM idem_claim(pg_temp.k('w'), pg_temp.h('two'));

--
-- max_wait: bad values, the bound, READ COMMITTED only.
--
SELECT pg_temp.try($$SELECT idem_claim(pg_temp.k('w'), pg_temp.h('one'), NULL, '-1 s')$$) AS negative;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.try($$SELECT idem_claim(pg_temp.k('w'), pg_temp.h('one'), NULL, '1 s')$$) AS repeatable_read;
COMMIT;
-- Zero and NULL do not wait.
SELECT outcome FROM idem_claim(pg_temp.k('w'), pg_temp.h('one'), NULL, '0');
SELECT outcome FROM idem_claim(pg_temp.k('w'), pg_temp.h('one'), max_wait => NULL);
-- A wait longer than idem.max_wait is cut to it: in_progress after 50 ms.
SET idem.max_wait = '50ms';
SELECT outcome FROM idem_claim(pg_temp.k('w'), pg_temp.h('one'), NULL, '1 hour');
RESET idem.max_wait;
-- Another body is never waited for: mismatch at once.
SELECT outcome FROM idem_claim(pg_temp.k('w'), pg_temp.h('two'), NULL, '1 hour');
-- A lease that runs out while the follower waits: it recovers the key.
SELECT outcome FROM pg_temp.claim('x', 'one', '100 ms');
SELECT outcome FROM pg_temp.claim('x', 'one', NULL, '10 s');
SELECT idem_finalize(pg_temp.k('x'), pg_temp.cid('x'), 200, NULL, 'x') AS finalized;
-- A request that arrives during a cooldown is answered at once (the
-- cooldown bounds retries); only a follower already waiting for the winner
-- waits it out (tests/isolation/specs/claim_wait_wakeup.spec).
SELECT outcome FROM pg_temp.claim('c', 'one');
SELECT idem_fail(pg_temp.k('c'), pg_temp.cid('c'), '1 hour') AS failed;
SELECT outcome FROM pg_temp.claim('c', 'one', NULL, '10 s');
DELETE FROM idem_keys WHERE cache_key = pg_temp.k('c');
-- statement_timeout ends a wait with its own error, nothing written.
SET statement_timeout = '100ms';
SELECT outcome FROM idem_claim(pg_temp.k('w'), pg_temp.h('one'), NULL, '10 s');
RESET statement_timeout;
SELECT state FROM idem_keys WHERE cache_key = pg_temp.k('w');
SELECT idem_release(pg_temp.k('w'), pg_temp.cid('w')) AS released;

DELETE FROM idem_keys WHERE cache_key IN (pg_temp.k('e'), pg_temp.k('p'), pg_temp.k('w'),
                                         pg_temp.k('x'), pg_temp.k('c'));
