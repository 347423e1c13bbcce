-- Role isolation: one role can neither replay, claim, finalize nor fail
-- another role's keys, even when it computes them; idem.scope shares keys
-- among members of a role; keys from before scopes are shared by all.

CREATE FUNCTION pg_temp.k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_key('regress', 'POST', '/scopes', name) $$;
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
CREATE ROLE regress_alice;
CREATE ROLE regress_bob;
CREATE ROLE regress_carol;
GRANT idem_client TO regress_alice, regress_bob, regress_carol;
-- What each role got, to hand claim ids around in the test.
CREATE TABLE scope_seen (who text, outcome text, claim_id uuid, generation bigint);
GRANT ALL ON scope_seen TO PUBLIC;

-- alice claims and finalizes the key.
SET ROLE regress_alice;
INSERT INTO scope_seen SELECT 'alice', outcome, claim_id, generation
  FROM idem_claim(pg_temp.k('k'), pg_temp.h('one'));
SELECT idem_finalize(pg_temp.k('k'), claim_id, 201, NULL, 'alice''s')
  FROM scope_seen WHERE who = 'alice';
SELECT outcome, convert_from(response_body, 'UTF8') AS body
  FROM idem_claim(pg_temp.k('k'), pg_temp.h('one'));
RESET ROLE;

-- bob computes the same cache key: it is his own key, not alice's.
SET ROLE regress_bob;
SELECT outcome FROM idem_lookup(pg_temp.k('k'), pg_temp.h('one'));
INSERT INTO scope_seen SELECT 'bob', outcome, claim_id, generation
  FROM idem_claim(pg_temp.k('k'), pg_temp.h('one'));
SELECT outcome FROM scope_seen WHERE who = 'bob';
-- Another body under bob's scope is no mismatch against alice's key.
SELECT outcome FROM idem_claim(pg_temp.k('other'), pg_temp.h('two'));
-- He cannot take over or read her key through idem.scope.
SET idem.scope = 'regress_alice';
SELECT pg_temp.try($$SELECT idem_claim(pg_temp.k('k'), pg_temp.h('one'))$$) AS claim_as_alice;
SELECT pg_temp.try($$SELECT idem_lookup(pg_temp.k('k'), pg_temp.h('one'))$$) AS lookup_as_alice;
SET idem.scope = 'regress_nobody';
SELECT pg_temp.try($$SELECT idem_claim(pg_temp.k('k'), pg_temp.h('one'))$$) AS no_such_role;
RESET idem.scope;
SELECT idem_finalize(pg_temp.k('k'), claim_id, 200, NULL, 'bob''s')
  FROM scope_seen WHERE who = 'bob';
RESET ROLE;

-- Two rows, one per role; alice still replays hers, bob his.
SELECT scope::regrole, state, convert_from(response_body, 'UTF8') AS body
  FROM idem_keys WHERE cache_key = pg_temp.k('k') ORDER BY scope::regrole::text;
SET ROLE regress_alice;
SELECT outcome, convert_from(response_body, 'UTF8') AS body
  FROM idem_claim(pg_temp.k('k'), pg_temp.h('one'));
RESET ROLE;

-- A member of alice's role shares her keys with idem.scope.
GRANT regress_alice TO regress_carol;
SET ROLE regress_carol;
SELECT outcome FROM idem_claim(pg_temp.k('k'), pg_temp.h('one'));
SET idem.scope = 'regress_alice';
SELECT outcome, convert_from(response_body, 'UTF8') AS body
  FROM idem_claim(pg_temp.k('k'), pg_temp.h('one'));
RESET idem.scope;
RESET ROLE;

-- The claim id is the owner's capability: fenced calls need no scope, so
-- a claim made before an upgrade is finished by its owner; without the id
-- nobody else can finish it.
SET ROLE regress_alice;
INSERT INTO scope_seen SELECT 'alice2', outcome, claim_id, generation
  FROM idem_claim(pg_temp.k('k2'), pg_temp.h('one'));
RESET ROLE;
SET ROLE regress_bob;
SELECT idem_finalize(pg_temp.k('k2'), gen_random_uuid(), 200, NULL, 'forged') AS forged;
-- Nor with alice's own claim id, leaked to him: the fenced calls check the
-- scope as well, and answer as for a claim id that does not exist.
SELECT idem_renew(pg_temp.k('k2'), claim_id, '1 minute') AS renewed_with_leaked,
       idem_finalize(pg_temp.k('k2'), claim_id, 200, NULL, 'forged') AS finalized_with_leaked,
       idem_release(pg_temp.k('k2'), claim_id) AS released_with_leaked,
       idem_fail(pg_temp.k('k2'), claim_id, '1 minute') AS failed_with_leaked
  FROM scope_seen WHERE who = 'alice2';
-- Also when he has a row of his own for the cache key.
SELECT outcome FROM idem_claim(pg_temp.k('k2'), pg_temp.h('one'));
SELECT idem_fail(pg_temp.k('k2'), claim_id, '1 minute') AS failed_with_leaked_own_row
  FROM scope_seen WHERE who = 'alice2';
RESET ROLE;
SELECT scope::regrole, state FROM idem_keys WHERE cache_key = pg_temp.k('k2')
 ORDER BY scope::regrole::text;
SET ROLE regress_alice;
SELECT idem_finalize(pg_temp.k('k2'), claim_id, 200, NULL, 'alice''s') AS alice_finalizes
  FROM scope_seen WHERE who = 'alice2';
RESET ROLE;

-- Keys written before 0.3.0 (scope 0) are shared by every role.
INSERT INTO idem_keys (cache_key, state, request_hash, generation, finished_at,
                       response_status, response_body)
VALUES (pg_temp.k('legacy'), 'completed', pg_temp.h('one'), nextval('idem_generation_seq'),
        clock_timestamp(), 200, 'legacy');
SET ROLE regress_bob;
SELECT outcome, convert_from(response_body, 'UTF8') AS body
  FROM idem_claim(pg_temp.k('legacy'), pg_temp.h('one'));
RESET ROLE;
SET ROLE regress_alice;
SELECT outcome FROM idem_claim(pg_temp.k('legacy'), pg_temp.h('two'));
RESET ROLE;
SELECT count(*) AS legacy_rows FROM idem_keys WHERE cache_key = pg_temp.k('legacy');

DELETE FROM idem_keys WHERE cache_key IN (pg_temp.k('k'), pg_temp.k('k2'), pg_temp.k('other'),
                                         pg_temp.k('legacy'));
DROP TABLE scope_seen;
REVOKE idem_client FROM regress_alice, regress_bob, regress_carol;
DROP ROLE regress_alice, regress_bob, regress_carol;
