-- Lease-mode claims: every outcome of idem_claim and idem_lookup, the
-- fenced calls (renew, finalize, release, fail), cleanup, every bad
-- argument, the settings' ranges and the table's CHECK constraints.
--
-- Keys of this file are idem_key('regress', 'POST', '/claims', name).
-- Nothing random is printed: claim ids, generations and times are compared.

CREATE FUNCTION pg_temp.k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_key('regress', 'POST', '/claims', name) $$;
CREATE FUNCTION pg_temp.h(body text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_request_hash(convert_to(body, 'UTF8')) $$;

-- The error a statement raises, as "SQLSTATE: message (detail)", or "ok".
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

-- Every answer of idem_claim, kept under a step name for later comparison.
CREATE TEMP TABLE seen (step text PRIMARY KEY, name text NOT NULL,
                        LIKE idem_claim_result,
                        at timestamptz NOT NULL DEFAULT clock_timestamp());

-- Claim name for body, remember the answer as step, show its stable part.
CREATE FUNCTION pg_temp.claim(step text, name text, body text, lease interval DEFAULT NULL)
RETURNS TABLE (outcome text, owner boolean, retry_after boolean,
               status integer, headers jsonb, body text)
LANGUAGE sql AS $$
    INSERT INTO seen (step, name, outcome, claim_id, generation, lease_expires_at,
                      retry_after, response_status, response_headers, response_body)
    SELECT step, name, c.* FROM idem_claim(pg_temp.k(name), pg_temp.h(body), lease) c
    RETURNING outcome, claim_id IS NOT NULL AND generation IS NOT NULL
                       AND lease_expires_at IS NOT NULL,
              retry_after > '0', response_status, response_headers,
              convert_from(response_body, 'UTF8')
$$;
CREATE FUNCTION pg_temp.cid(step text) RETURNS uuid LANGUAGE sql AS
$$ SELECT claim_id FROM seen WHERE seen.step = cid.step $$;
CREATE FUNCTION pg_temp.gen(step text) RETURNS bigint LANGUAGE sql AS
$$ SELECT generation FROM seen WHERE seen.step = gen.step $$;
-- The stored row of a key, without its random or time-dependent values.
CREATE FUNCTION pg_temp.row_of(name text)
RETURNS TABLE (state text, request_hash text, claim_id text, generation text,
               lease boolean, finished boolean, status integer, headers jsonb,
               body text, replayable boolean, in_transaction boolean)
LANGUAGE sql AS $$
    SELECT k.state,
           CASE WHEN k.request_hash IS NULL THEN NULL
                WHEN k.request_hash = pg_temp.h('one') THEN 'h(one)'
                WHEN k.request_hash = pg_temp.h('two') THEN 'h(two)'
                ELSE 'other' END,
           coalesce((SELECT min(s.step) FROM seen s WHERE s.claim_id = k.claim_id), 'none'),
           coalesce((SELECT min(s.step) FROM seen s WHERE s.generation = k.generation), 'none'),
           k.lease_expires_at IS NOT NULL, k.finished_at IS NOT NULL,
           k.response_status, k.response_headers,
           convert_from(k.response_body, 'UTF8'), k.replayable, k.in_transaction
      FROM idem_keys k WHERE k.cache_key = pg_temp.k(name)
$$;

--
-- claimed, in_progress, mismatch
--
SELECT * FROM pg_temp.claim('a1', 'a', 'one');
-- The default lease is idem.lease (30s), on the server's clock: counted
-- from the claim's own time, so never beyond now + 30 s (an upper bound
-- only: a slow machine, valgrind, may take seconds to get here).
SELECT lease_expires_at - created_at BETWEEN '29.9 s' AND '30 s' AS default_lease,
       lease_expires_at <= clock_timestamp() + '30 s' AS server_clock,
       generation > 0 AS generation_positive
  FROM idem_keys WHERE cache_key = pg_temp.k('a');
-- The row says who owns it: claim_id and generation are a1's.
SELECT * FROM pg_temp.row_of('a');
-- Same request while a1 runs: in_progress, retry after what is left of the lease.
SELECT * FROM pg_temp.claim('a2', 'a', 'one');
SELECT claim_id IS NULL AS no_claim_id, generation IS NULL AS no_generation,
       retry_after <= '30 s' AS retry_within_lease
  FROM seen WHERE step = 'a2';
-- Another request on the same key: mismatch, and the row is untouched.
SELECT * FROM pg_temp.claim('a3', 'a', 'two');
SELECT * FROM pg_temp.row_of('a');
-- A follower's answer writes nothing at all: no transaction id is assigned.
BEGIN;
SELECT outcome FROM idem_claim(pg_temp.k('a'), pg_temp.h('one'));
SELECT outcome FROM idem_claim(pg_temp.k('a'), pg_temp.h('two'));
SELECT pg_current_xact_id_if_assigned() IS NULL AS nothing_written;
COMMIT;

--
-- idem_lookup: the same decision, read-only
--
BEGIN;
SELECT 'a/one' AS probe, outcome, claim_id IS NULL AS no_claim_id, retry_after > '0' AS retry_after
  FROM idem_lookup(pg_temp.k('a'), pg_temp.h('one'))
UNION ALL
SELECT 'a/two', outcome, claim_id IS NULL, retry_after > '0'
  FROM idem_lookup(pg_temp.k('a'), pg_temp.h('two'))
UNION ALL
SELECT 'nobody/one', outcome, claim_id IS NULL, retry_after > '0'
  FROM idem_lookup(pg_temp.k('nobody'), pg_temp.h('one'));
SELECT pg_current_xact_id_if_assigned() IS NULL AS nothing_written,
       NOT EXISTS (SELECT FROM idem_keys WHERE cache_key = pg_temp.k('nobody')) AS still_absent;
COMMIT;

--
-- idem_renew
--
-- Renewing returns the new expiry, a1's lease now runs for an hour.
SELECT idem_renew(pg_temp.k('a'), pg_temp.cid('a1'), '1 hour') - clock_timestamp()
       BETWEEN '59 min' AND '1 hour' AS renewed_for_an_hour;
SELECT lease_expires_at - clock_timestamp() > '59 min' AS stored
  FROM idem_keys WHERE cache_key = pg_temp.k('a');
-- NULL lease = idem.lease: a renewal may also shorten the lease.
SELECT idem_renew(pg_temp.k('a'), pg_temp.cid('a1')) - clock_timestamp()
       BETWEEN '29 s' AND '30 s' AS renewed_for_default;
-- A forged claim id, or the wrong key, renews nothing: NULL.
SELECT idem_renew(pg_temp.k('a'), '00000000-0000-4000-8000-000000000000') IS NULL AS forged,
       idem_renew(pg_temp.k('nobody'), pg_temp.cid('a1')) IS NULL AS wrong_key;

--
-- idem_finalize and replay
--
-- Not the owner: false, and nothing changes.
SELECT idem_finalize(pg_temp.k('a'), '00000000-0000-4000-8000-000000000000',
                     201, '{"Location": "/orders/1"}', 'created') AS forged_finalize;
SELECT * FROM pg_temp.row_of('a');
-- strict => true turns the refusal into an error (SQLSTATE IL001) that
-- rolls the caller's transaction back.
SELECT idem_finalize(pg_temp.k('a'), '00000000-0000-4000-8000-000000000000',
                     201, '{}', 'created', strict => true);
\set VERBOSITY sqlstate
SELECT idem_finalize(pg_temp.k('a'), '00000000-0000-4000-8000-000000000000',
                     201, '{}', 'created', strict => true);
\set VERBOSITY default
-- The owner finalizes: true; the row is completed, the lease is gone.
SELECT idem_finalize(pg_temp.k('a'), pg_temp.cid('a1'),
                     201, '{"Location": "/orders/1", "Content-Type": "text/plain"}',
                     'created') AS finalized;
SELECT * FROM pg_temp.row_of('a');
-- Finalizing twice: false, or IL001 with strict; renewing a finished claim: NULL.
SELECT idem_finalize(pg_temp.k('a'), pg_temp.cid('a1'), 500, '{}', 'again') AS finalized_again;
SELECT split_part(pg_temp.try(format('SELECT idem_finalize(%L, %L, 500, %L, %L, true)',
                                     pg_temp.k('a'), pg_temp.cid('a1'), '{}', 'again')),
                  ' (', 1) AS strict_again;
SELECT idem_renew(pg_temp.k('a'), pg_temp.cid('a1')) IS NULL AS renew_finished;
-- Every later claim of the same request replays the stored response.
SELECT * FROM pg_temp.claim('a4', 'a', 'one');
SELECT * FROM pg_temp.claim('a5', 'a', 'two');
SELECT outcome, response_status, response_headers, convert_from(response_body, 'UTF8') AS body
  FROM idem_lookup(pg_temp.k('a'), pg_temp.h('one'));

-- A NULL body (a 204, say) is stored and replayed as an empty body; NULL headers stay NULL.
SELECT outcome FROM pg_temp.claim('e1', 'empty', 'one');
SELECT idem_finalize(pg_temp.k('empty'), pg_temp.cid('e1'), 204, NULL, NULL) AS finalized;
SELECT state, status, headers, body = '' AS empty_body, replayable FROM pg_temp.row_of('empty');
SELECT outcome, status, headers, body = '' AS empty_body FROM pg_temp.claim('e2', 'empty', 'one');

-- A body over idem.max_response_bytes is recorded as completed, not replayable.
SET idem.max_response_bytes = 4;
SELECT outcome FROM pg_temp.claim('n1', 'big', 'one');
SELECT outcome FROM pg_temp.claim('n2', 'fits', 'one');
SELECT idem_finalize(pg_temp.k('big'), pg_temp.cid('n1'), 200, '{"X": "1"}', 'hello') AS big,
       idem_finalize(pg_temp.k('fits'), pg_temp.cid('n2'), 200, '{"X": "1"}', 'four') AS fits;
RESET idem.max_response_bytes;
SELECT * FROM pg_temp.row_of('big');
SELECT * FROM pg_temp.row_of('fits');
SELECT * FROM pg_temp.claim('n3', 'big', 'one');
SELECT * FROM pg_temp.claim('n4', 'fits', 'one');
SELECT * FROM pg_temp.claim('n5', 'big', 'two');

-- What finalize refuses, before it writes anything: the claim stays pending.
SELECT outcome FROM pg_temp.claim('f1', 'f', 'one');
SELECT call, pg_temp.try(format(call, pg_temp.k('f'), pg_temp.cid('f1'))) AS result
  FROM (VALUES ('SELECT idem_finalize(%L, %L, 99, NULL, NULL)'),
               ('SELECT idem_finalize(%L, %L, 600, NULL, NULL)'),
               ('SELECT idem_finalize(%L, %L, NULL, NULL, NULL)'),
               ('SELECT idem_finalize(%L, %L, 200, NULL, NULL, NULL)'),
               ('SELECT idem_finalize(%L, %L, 200, ''[]'', NULL)'),
               ('SELECT idem_finalize(%L, %L, 200, ''"text/plain"'', NULL)'),
               ('SELECT idem_finalize(%L, %L, 200, ''{"X-Count": 1}'', NULL)'),
               ('SELECT idem_finalize(%L, %L, 200, ''{"X-Null": null}'', NULL)'),
               ('SELECT idem_finalize(%L, %L, 200, ''{"X": ["a", "b"]}'', NULL)'),
               ('SELECT idem_finalize(%L, %L, 200, ''{"X": {"a": "b"}}'', NULL)')) v(call);
SELECT state, claim_id FROM pg_temp.row_of('f');
SELECT idem_finalize(pg_temp.k('f'), pg_temp.cid('f1'), 200, '[]', NULL);
SELECT idem_finalize(pg_temp.k('f'), pg_temp.cid('f1'), 600, NULL, NULL);
-- The bounds themselves and an empty header object are fine.
SELECT idem_finalize(pg_temp.k('f'), pg_temp.cid('f1'), 599, '{}', NULL) AS status_599;
SELECT outcome FROM pg_temp.claim('f2', 'f100', 'one');
SELECT idem_finalize(pg_temp.k('f100'), pg_temp.cid('f2'), 100, '{"A": "1", "B": ""}', 'x') AS status_100;

--
-- idem_fail and cooldown
--
SELECT outcome FROM pg_temp.claim('c1', 'c', 'one');
SELECT idem_fail(pg_temp.k('c'), pg_temp.cid('c1'), '1 hour') AS failed;
SELECT * FROM pg_temp.row_of('c');
-- The same request gets cooldown with the time left; another gets mismatch.
SELECT * FROM pg_temp.claim('c2', 'c', 'one');
SELECT retry_after BETWEEN '59 min' AND '1 hour' AS retry_after_cooldown FROM seen WHERE step = 'c2';
SELECT * FROM pg_temp.claim('c3', 'c', 'two');
SELECT outcome, retry_after > '59 min' AS retry_after FROM idem_lookup(pg_temp.k('c'), pg_temp.h('one'));
-- The failed claim is finished: no second fail, finalize, renew or release.
SELECT idem_fail(pg_temp.k('c'), pg_temp.cid('c1'), '0') AS fail_again,
       idem_finalize(pg_temp.k('c'), pg_temp.cid('c1'), 200, NULL, NULL) AS finalize_after_fail,
       idem_renew(pg_temp.k('c'), pg_temp.cid('c1')) IS NULL AS renew_after_fail,
       idem_release(pg_temp.k('c'), pg_temp.cid('c1')) AS release_after_fail;
SELECT * FROM pg_temp.row_of('c');
-- A NULL cooldown means idem.failure_cooldown.
SET idem.failure_cooldown = '10min';
SELECT outcome FROM pg_temp.claim('d1', 'd', 'one');
SELECT idem_fail(pg_temp.k('d'), pg_temp.cid('d1')) AS failed;
SELECT lease_expires_at - finished_at BETWEEN '9 min 59 s' AND '10 min' AS default_cooldown
  FROM idem_keys WHERE cache_key = pg_temp.k('d');
RESET idem.failure_cooldown;
-- A failed claim cannot be released any more: the cooldown stands.
SELECT idem_release(pg_temp.k('d'), pg_temp.cid('d1')) AS release_failed;

--
-- Generations strictly increase: claim, fail, take over, release, claim again.
--
SELECT outcome FROM pg_temp.claim('g1', 'g', 'one');
-- A cooldown of 0: claimable again at once, by the same request.
SELECT idem_fail(pg_temp.k('g'), pg_temp.cid('g1'), '0') AS failed;
SELECT outcome FROM idem_lookup(pg_temp.k('g'), pg_temp.h('one'));
SELECT * FROM pg_temp.claim('g2', 'g', 'one');
SELECT idem_release(pg_temp.k('g'), pg_temp.cid('g2')) AS released;
-- Released: only a tombstone is left (no hash, no owner, no response), and
-- the next claim, of any request, wins at once.
SELECT state, request_hash IS NULL AS no_hash, claim_id IS NULL AS no_owner,
       response_body IS NULL AS no_response
  FROM idem_keys WHERE cache_key = pg_temp.k('g');
SELECT outcome FROM idem_lookup(pg_temp.k('g'), pg_temp.h('two'));
SELECT * FROM pg_temp.claim('g3', 'g', 'two');
SELECT idem_release(pg_temp.k('g'), pg_temp.cid('g2')) AS release_again;
SELECT pg_temp.gen('g2') > pg_temp.gen('g1') AS g2_after_g1,
       pg_temp.gen('g3') > pg_temp.gen('g2') AS g3_after_g2,
       pg_temp.cid('g1') <> pg_temp.cid('g2') AND pg_temp.cid('g2') <> pg_temp.cid('g3') AS new_claim_ids;
-- The stale owners g1 and g2 can no longer touch g3's claim.
SELECT idem_finalize(pg_temp.k('g'), pg_temp.cid('g1'), 200, NULL, 'stale') AS g1_finalize,
       idem_renew(pg_temp.k('g'), pg_temp.cid('g2')) IS NULL AS g2_renew,
       idem_fail(pg_temp.k('g'), pg_temp.cid('g2')) AS g2_fail,
       idem_release(pg_temp.k('g'), pg_temp.cid('g1')) AS g1_release;
SELECT * FROM pg_temp.row_of('g');

--
-- recovered_abandoned: a lease that ran out
--
SELECT * FROM pg_temp.claim('s1', 's', 'one', '5 ms');
SELECT pg_sleep(0.02);
SELECT outcome FROM idem_lookup(pg_temp.k('s'), pg_temp.h('one'));
-- Only the same request may take an abandoned claim over.
SELECT * FROM pg_temp.claim('s2', 's', 'two');
SELECT * FROM pg_temp.claim('s3', 's', 'one');
SELECT pg_temp.gen('s3') > pg_temp.gen('s1') AS newer_generation,
       pg_temp.cid('s3') <> pg_temp.cid('s1') AS new_claim_id;
SELECT * FROM pg_temp.row_of('s');
-- The old owner is fenced out of every call.
SELECT idem_renew(pg_temp.k('s'), pg_temp.cid('s1')) IS NULL AS s1_renew,
       idem_finalize(pg_temp.k('s'), pg_temp.cid('s1'), 200, NULL, 'late') AS s1_finalize,
       idem_fail(pg_temp.k('s'), pg_temp.cid('s1')) AS s1_fail,
       idem_release(pg_temp.k('s'), pg_temp.cid('s1')) AS s1_release;
SELECT idem_finalize(pg_temp.k('s'), pg_temp.cid('s3'), 200, NULL, 'done') AS s3_finalize;
SELECT * FROM pg_temp.row_of('s');

--
-- recovered_ttl: keys older than idem.ttl (aged here by moving created_at
-- back), with idem.after_ttl = 'rerun'; the default, 'refuse', is in
-- sql/lifetime.sql.
--
SET idem.after_ttl = 'rerun';
SELECT outcome FROM pg_temp.claim('t1', 't', 'one');
SELECT idem_finalize(pg_temp.k('t'), pg_temp.cid('t1'), 200, NULL, 'old') AS finalized;
UPDATE idem_keys SET created_at = created_at - interval '2 days' WHERE cache_key = pg_temp.k('t');
-- A completed key past its ttl is claimable by any request, even another one.
SELECT outcome FROM idem_lookup(pg_temp.k('t'), pg_temp.h('two'));
SELECT * FROM pg_temp.claim('t2', 't', 'two');
SELECT pg_temp.gen('t2') > pg_temp.gen('t1') AS newer_generation;
SELECT * FROM pg_temp.row_of('t');
-- A longer idem.ttl keeps it replayable.
SELECT idem_finalize(pg_temp.k('t'), pg_temp.cid('t2'), 200, NULL, 'new') AS finalized;
UPDATE idem_keys SET created_at = created_at - interval '2 days' WHERE cache_key = pg_temp.k('t');
SET idem.ttl = '3d';
SELECT outcome, status, body FROM pg_temp.claim('t3', 't', 'two');
RESET idem.ttl;
-- An old claim whose lease is still live (renewed) is not taken away.
SELECT outcome FROM pg_temp.claim('t4', 'tlive', 'one');
UPDATE idem_keys SET created_at = created_at - interval '2 days' WHERE cache_key = pg_temp.k('tlive');
SELECT * FROM pg_temp.claim('t5', 'tlive', 'two');
SELECT * FROM pg_temp.claim('t6', 'tlive', 'one');
-- Nor an old failed key still in its cooldown.
SELECT idem_fail(pg_temp.k('tlive'), pg_temp.cid('t4'), '1 hour') AS failed;
SELECT * FROM pg_temp.claim('t7', 'tlive', 'one');
SELECT * FROM pg_temp.claim('t8', 'tlive', 'two');
-- Once its lease or cooldown is over, an old key goes to any request.
UPDATE idem_keys SET lease_expires_at = clock_timestamp() - interval '1 s'
 WHERE cache_key = pg_temp.k('tlive');
SELECT * FROM pg_temp.claim('t9', 'tlive', 'two');
SELECT idem_release(pg_temp.k('tlive'), pg_temp.cid('t9')) AS released;
DELETE FROM idem_keys WHERE cache_key = pg_temp.k('t');
RESET idem.after_ttl;

--
-- Legacy rows written before request hashes were stored (request_hash NULL)
--
INSERT INTO idem_keys (cache_key, state, request_hash, generation, finished_at,
                       response_status, response_headers, response_body)
VALUES (pg_temp.k('legacy'), 'completed', NULL, nextval('idem_generation_seq'),
        clock_timestamp(), 200, '{"X-Legacy": "yes"}', 'legacy');
-- They replay for any request.
SELECT * FROM pg_temp.claim('l1', 'legacy', 'one');
SELECT * FROM pg_temp.claim('l2', 'legacy', 'two');
SELECT outcome FROM idem_lookup(pg_temp.k('legacy'), pg_temp.h('two'));
-- A legacy failed key past its cooldown (no hash, like a released key's
-- tombstone) is claimed by any request.
INSERT INTO idem_keys (cache_key, state, request_hash, generation, lease_expires_at, finished_at)
VALUES (pg_temp.k('legacy-failed'), 'failed', NULL, nextval('idem_generation_seq'),
        clock_timestamp() - interval '1 s', clock_timestamp() - interval '2 s');
SELECT * FROM pg_temp.claim('l3', 'legacy-failed', 'two');
SELECT * FROM pg_temp.row_of('legacy-failed');
-- A pending claim always has its request hash: there is no legacy pending row.
\set VERBOSITY terse
UPDATE idem_keys SET request_hash = NULL WHERE cache_key = pg_temp.k('legacy-failed');
\set VERBOSITY default

--
-- idem_cleanup
--
SELECT pg_temp.try(call) AS result
  FROM (VALUES ('SELECT idem_cleanup(0)'), ('SELECT idem_cleanup(-1)'),
               ('SELECT idem_cleanup(NULL)'), ('SELECT idem_cleanup(1000001)')) v(call);
SELECT idem_cleanup(0);
-- Old keys in every state; failed keys still in cooldown come first, so
-- that a batch picked without the cooldown predicate would be all of them.
SELECT outcome FROM pg_temp.claim('x1', 'x-cooling-1', 'one');
SELECT outcome FROM pg_temp.claim('x2', 'x-cooling-2', 'one');
SELECT outcome FROM pg_temp.claim('x3', 'x-cooling-3', 'one');
SELECT outcome FROM pg_temp.claim('x4', 'x-done-1', 'one');
SELECT outcome FROM pg_temp.claim('x5', 'x-done-2', 'one');
SELECT outcome FROM pg_temp.claim('x6', 'x-cooled', 'one');
SELECT outcome FROM pg_temp.claim('x7', 'x-pending', 'one');
SELECT outcome FROM pg_temp.claim('x8', 'x-abandoned', 'one', '1 ms');
SELECT outcome FROM pg_temp.claim('x9', 'x-recent', 'one');
SELECT count(*) FILTER (WHERE idem_fail(pg_temp.k(name), claim_id, '1 hour')) AS cooling
  FROM seen WHERE step IN ('x1', 'x2', 'x3');
SELECT count(*) FILTER (WHERE idem_finalize(pg_temp.k(name), claim_id, 200, NULL, 'x')) AS done
  FROM seen WHERE step IN ('x4', 'x5', 'x9');
SELECT idem_fail(pg_temp.k('x-cooled'), pg_temp.cid('x6'), '0') AS cooled;
UPDATE idem_keys SET created_at = created_at - interval '2 days'
 WHERE cache_key IN (SELECT pg_temp.k(name) FROM seen WHERE step IN ('x1','x2','x3','x4','x5','x6','x7','x8'));
-- One horizon here (idem.tombstone_ttl = 0: rows go at idem.ttl); the
-- two horizons are in sql/lifetime.sql.
SET idem.tombstone_ttl = 0;
-- A ttl longer than their age: nothing to delete.
SET idem.ttl = '3d';
SELECT idem_cleanup() AS deleted_with_long_ttl;
RESET idem.ttl;
-- At most batch rows per call, and only finished rows past their ttl.
SELECT idem_cleanup(2) AS deleted;
SELECT idem_cleanup(2) AS deleted;
SELECT idem_cleanup(2) AS deleted;
SELECT s.name, r.state
  FROM seen s LEFT JOIN LATERAL pg_temp.row_of(s.name) r ON true
 WHERE s.step LIKE 'x_' ORDER BY s.step;
RESET idem.tombstone_ttl;

--
-- Bad arguments: refused by name with a proper SQLSTATE, before any write
--
SELECT call, pg_temp.try(call) AS result
  FROM (VALUES ($$SELECT idem_claim(NULL, pg_temp.h('one'))$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), NULL)$$),
               ($$SELECT idem_claim(substr(pg_temp.k('bad'), 1, 31), pg_temp.h('one'))$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one') || '\x00'::bytea)$$),
               ($$SELECT idem_claim('', pg_temp.h('one'))$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '0')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '-1 s')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '1 microsecond')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '999 microseconds')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '1 hour 1 ms')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '10 years')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '1 day -25 hours')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '178000000 years')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '-178000000 years')$$),
               ($$SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '-2000000000 days')$$),
               ($$SELECT idem_lookup(NULL, pg_temp.h('one'))$$),
               ($$SELECT idem_lookup(pg_temp.k('bad'), NULL)$$),
               ($$SELECT idem_lookup(pg_temp.k('bad'), '\x00')$$),
               ($$SELECT idem_renew(NULL, gen_random_uuid())$$),
               ($$SELECT idem_renew(pg_temp.k('bad'), NULL)$$),
               ($$SELECT idem_renew(pg_temp.k('bad'), gen_random_uuid(), '0')$$),
               ($$SELECT idem_renew(pg_temp.k('bad'), gen_random_uuid(), '2 hours')$$),
               ($$SELECT idem_finalize(NULL, gen_random_uuid(), 200, NULL, NULL)$$),
               ($$SELECT idem_finalize(pg_temp.k('bad'), NULL, 200, NULL, NULL)$$),
               ($$SELECT idem_release(NULL, gen_random_uuid())$$),
               ($$SELECT idem_release(pg_temp.k('bad'), NULL)$$),
               ($$SELECT idem_release('\x01', gen_random_uuid())$$),
               ($$SELECT idem_fail(NULL, gen_random_uuid())$$),
               ($$SELECT idem_fail(pg_temp.k('bad'), NULL)$$),
               ($$SELECT idem_fail(pg_temp.k('bad'), gen_random_uuid(), '-1 ms')$$),
               ($$SELECT idem_fail(pg_temp.k('bad'), gen_random_uuid(), '2 hours')$$)) v(call);
SELECT count(*) AS rows_written FROM idem_keys WHERE cache_key = pg_temp.k('bad');
-- How two of them read in full.
SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one') || '\x00'::bytea);
SELECT idem_claim(pg_temp.k('bad'), pg_temp.h('one'), '10 years');
-- The smallest and the largest leases are accepted.
SELECT outcome FROM pg_temp.claim('b1', 'b-short', 'one', '1 ms');
SELECT outcome FROM pg_temp.claim('b2', 'b-long', 'one', '1 hour');
-- A NULL lease is idem.lease, itself bounded by idem.max_lease.
SET idem.lease = '5s';
SELECT outcome FROM pg_temp.claim('b3', 'b-default', 'one', NULL);
SELECT s.name, k.lease_expires_at - k.created_at BETWEEN l - '100 ms' AND l AS lease_as_asked
  FROM seen s JOIN idem_keys k ON k.cache_key = pg_temp.k(s.name)
  JOIN (VALUES ('b1', interval '1 ms'), ('b2', '1 hour'), ('b3', '5 s')) v(step, l) ON v.step = s.step
 ORDER BY s.step;
-- (idem.lease over idem.max_lease is refused when set: sql/settings.sql.)
SET idem.max_lease = '3h';
SET idem.lease = '2h';
SELECT outcome FROM pg_temp.claim('b4', 'b-over', 'one');
RESET idem.lease;
RESET idem.max_lease;

--
-- Settings: ranges, units, and who may change them
--
SHOW idem.lease;
SHOW idem.max_lease;
SHOW idem.ttl;
SHOW idem.failure_cooldown;
SHOW idem.max_response_bytes;
SET idem.lease = 0;
SET idem.lease = -1;
SET idem.max_lease = 0;
SET idem.ttl = 0;
SET idem.failure_cooldown = -1;
SET idem.max_response_bytes = -1;
SET idem.max_response_bytes = '2GB';
SET idem.lease = 'forever';
SET idem.no_such_setting = 1;
SET idem.failure_cooldown = 0;
SET idem.max_response_bytes = 0;
SET idem.lease = '1ms';
SHOW idem.lease;
RESET ALL;
-- idem.max_lease bounds what any caller may ask for, and idem.ttl decides
-- when other requests' keys may be taken over: only a superuser sets them.
CREATE ROLE regress_idem_user;
SET ROLE regress_idem_user;
SET idem.lease = '10s';
SET idem.max_lease = '1d';
SET idem.ttl = '1s';
RESET ROLE;
DROP ROLE regress_idem_user;
RESET ALL;

--
-- The CHECK constraints of idem_keys: even a direct write keeps rows coherent
--
\set VERBOSITY terse
INSERT INTO idem_keys (cache_key, state, request_hash, generation, lease_expires_at)
VALUES (pg_temp.k('chk'), 'pending', pg_temp.h('one'), 1, clock_timestamp());
INSERT INTO idem_keys (cache_key, state, request_hash, claim_id, generation)
VALUES (pg_temp.k('chk'), 'pending', pg_temp.h('one'), gen_random_uuid(), 1);
INSERT INTO idem_keys (cache_key, state, claim_id, generation, lease_expires_at)
VALUES (pg_temp.k('chk'), 'pending', gen_random_uuid(), 1, clock_timestamp());
INSERT INTO idem_keys (cache_key, state, generation, response_status)
VALUES (pg_temp.k('chk'), 'completed', 1, 200);
INSERT INTO idem_keys (cache_key, state, generation, response_body)
VALUES (pg_temp.k('chk'), 'completed', 1, 'x');
INSERT INTO idem_keys (cache_key, state, generation)
VALUES (pg_temp.k('chk'), 'failed', 1);
INSERT INTO idem_keys (cache_key, state, generation)
VALUES (pg_temp.k('chk'), 'done', 1);
INSERT INTO idem_keys (cache_key, state, generation, response_status, response_body)
VALUES (pg_temp.k('chk'), 'completed', 1, 600, 'x');
INSERT INTO idem_keys (cache_key, state, generation, response_status, response_body)
VALUES (substr(pg_temp.k('chk'), 2), 'completed', 1, 200, 'x');
INSERT INTO idem_keys (cache_key, state, request_hash, generation, response_status, response_body)
VALUES (pg_temp.k('chk'), 'completed', '\x0102', 1, 200, 'x');
INSERT INTO idem_keys (cache_key, state, response_status, response_body)
VALUES (pg_temp.k('chk'), 'completed', 200, 'x');
-- Not replayable: completed without a stored response is allowed.
INSERT INTO idem_keys (cache_key, state, generation, replayable)
VALUES (pg_temp.k('chk'), 'completed', 1, false);
DELETE FROM idem_keys WHERE cache_key = pg_temp.k('chk');
\set VERBOSITY default

-- Leave the shared table as we found it (the session ends at \c below).
DELETE FROM idem_keys WHERE cache_key IN (SELECT pg_temp.k(name) FROM seen);
SELECT count(*) AS rows_left FROM idem_keys WHERE cache_key IN (SELECT pg_temp.k(name) FROM seen);

--
-- The extension in a schema of its own, off the search_path
--
\set regress_db :DBNAME
CREATE DATABASE idem_regress_schema;
\c idem_regress_schema
CREATE SCHEMA s;
CREATE EXTENSION pg_idem SCHEMA s;
-- A decoy table of the same name on the search_path must not be used.
CREATE TABLE public.idem_keys (cache_key bytea);
SET search_path = public;
SELECT outcome, claim_id IS NOT NULL AS owner
  FROM s.idem_claim(s.idem_key('u', 'POST', '/p', 'k'), s.idem_request_hash('b'));
SELECT claim_id AS o_claim FROM s.idem_keys \gset
SELECT s.idem_renew(s.idem_key('u', 'POST', '/p', 'k'), :'o_claim') IS NOT NULL AS renewed,
       s.idem_finalize(s.idem_key('u', 'POST', '/p', 'k'), :'o_claim', 200, NULL, 'ok') AS finalized;
SELECT outcome, convert_from(response_body, 'UTF8') AS body
  FROM s.idem_claim(s.idem_key('u', 'POST', '/p', 'k'), s.idem_request_hash('b'));
SELECT outcome FROM s.idem_lookup(s.idem_key('u', 'POST', '/p', 'k'), s.idem_request_hash('b'));
SELECT s.idem_cleanup() AS cleaned;
SELECT (SELECT count(*) FROM s.idem_keys) AS extension_rows,
       (SELECT count(*) FROM public.idem_keys) AS decoy_rows;
-- Dropped and created again in the same session, in the same schema and
-- in another one: nothing cached from the old objects is used.
DROP EXTENSION pg_idem;
CREATE EXTENSION pg_idem SCHEMA s;
SELECT outcome FROM s.idem_claim(s.idem_key('u', 'POST', '/p', 'k'), s.idem_request_hash('b'));
DROP EXTENSION pg_idem;
CREATE SCHEMA t;
CREATE EXTENSION pg_idem SCHEMA t;
SELECT outcome FROM t.idem_claim(t.idem_key('u', 'POST', '/p', 'k'), t.idem_request_hash('b'));
SELECT outcome FROM t.idem_claim(t.idem_key('u', 'POST', '/p', 'k'), t.idem_request_hash('b'));
SELECT count(*) AS rows_in_t FROM t.idem_keys;
\c :regress_db
DROP DATABASE idem_regress_schema WITH (FORCE);
