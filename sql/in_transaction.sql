-- In-transaction claims (idem_begin): the claim, the handler's writes and
-- the finalize commit together, and the deferred constraint trigger
-- idem_keys_claim_finished refuses to commit a claim left unfinished.
--
-- Keys of this file are idem_key('regress', 'POST', '/txn', name).

CREATE FUNCTION pg_temp.k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_key('regress', 'POST', '/txn', name) $$;
CREATE FUNCTION pg_temp.h(body text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_request_hash(convert_to(body, 'UTF8')) $$;

-- Claim ids, kept as session settings regress.<step> for later calls.
CREATE FUNCTION pg_temp.keep(step text, claim uuid) RETURNS uuid LANGUAGE sql AS
$$ SELECT set_config('regress.' || step, claim::text, false)::uuid WHERE claim IS NOT NULL $$;
CREATE FUNCTION pg_temp.cid(step text) RETURNS uuid LANGUAGE sql AS
$$ SELECT current_setting('regress.' || step)::uuid $$;

-- Begin (in-transaction claim) name for body; remember the claim id as step.
CREATE FUNCTION pg_temp.opened(step text, name text, body text, lease interval DEFAULT NULL)
RETURNS TABLE (outcome text, owner boolean, status integer, body text)
LANGUAGE sql AS $$
    SELECT c.outcome, pg_temp.keep(step, c.claim_id) IS NOT NULL,
           c.response_status, convert_from(c.response_body, 'UTF8')
      FROM idem_begin(pg_temp.k(name), pg_temp.h(body), lease) c
$$;
-- The same for a lease-mode claim.
CREATE FUNCTION pg_temp.claim(step text, name text, body text, lease interval DEFAULT NULL)
RETURNS TABLE (outcome text, owner boolean)
LANGUAGE sql AS $$
    SELECT c.outcome, pg_temp.keep(step, c.claim_id) IS NOT NULL
      FROM idem_claim(pg_temp.k(name), pg_temp.h(body), lease) c
$$;
-- The stored row of a key, without its random or time-dependent values.
CREATE FUNCTION pg_temp.row_of(name text)
RETURNS TABLE (state text, status integer, body text, in_transaction boolean)
LANGUAGE sql AS $$
    SELECT state, response_status, convert_from(response_body, 'UTF8'), in_transaction
      FROM idem_keys WHERE cache_key = pg_temp.k(name)
$$;

-- The handler's own table: its writes must commit or roll back with the claim.
CREATE TEMP TABLE orders (name text);

--
-- Begin, work and finalize in one transaction: all of it commits.
--
BEGIN;
SELECT * FROM pg_temp.opened('t1', 'one', 'x');
SELECT * FROM pg_temp.row_of('one');
INSERT INTO orders VALUES ('one');
SELECT idem_finalize(pg_temp.k('one'), pg_temp.cid('t1'), 201, '{}', 'made') AS finalized;
COMMIT;
SELECT * FROM pg_temp.row_of('one');
SELECT count(*) AS orders FROM orders WHERE name = 'one';
SELECT outcome, response_status FROM idem_lookup(pg_temp.k('one'), pg_temp.h('x'));

--
-- Commit without finishing the claim: refused with IL002, nothing persists.
--
BEGIN;
SELECT * FROM pg_temp.opened('t2', 'two', 'x');
INSERT INTO orders VALUES ('two');
COMMIT;
SELECT count(*) AS rows FROM idem_keys WHERE cache_key = pg_temp.k('two');
SELECT count(*) AS orders FROM orders WHERE name = 'two';
SELECT outcome FROM idem_lookup(pg_temp.k('two'), pg_temp.h('x'));
-- The SQLSTATE.
\set VERBOSITY sqlstate
BEGIN;
SELECT outcome FROM pg_temp.opened('t3', 'two', 'x');
COMMIT;
\set VERBOSITY default
-- The constraint's name, schema and table reach the client (errtableconstraint);
-- SET CONSTRAINTS ... IMMEDIATE runs the commit-time check where it can be caught.
DO $$
DECLARE
    st text;
    cons text;
    tab text;
    sch text;
BEGIN
    PERFORM idem_begin(pg_temp.k('two'), pg_temp.h('x'));
    SET CONSTRAINTS idem_keys_claim_finished IMMEDIATE;
    RAISE EXCEPTION 'not reached';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, cons = CONSTRAINT_NAME,
                            tab = TABLE_NAME, sch = SCHEMA_NAME;
    RAISE NOTICE 'sqlstate %, constraint %, table %.%', st, cons, sch, tab;
END
$$;
SELECT count(*) AS rows FROM idem_keys WHERE cache_key = pg_temp.k('two');
-- Outside a transaction block the claim commits at once: refused at once.
SELECT outcome FROM idem_begin(pg_temp.k('two'), pg_temp.h('x'));
SELECT count(*) AS rows FROM idem_keys WHERE cache_key = pg_temp.k('two');

--
-- Rollback leaves the key free.
--
BEGIN;
SELECT * FROM pg_temp.opened('t4', 'three', 'x');
INSERT INTO orders VALUES ('three');
ROLLBACK;
SELECT outcome FROM idem_lookup(pg_temp.k('three'), pg_temp.h('x'));
SELECT count(*) AS orders FROM orders WHERE name = 'three';
-- So does a rollback to a savepoint; the rest of the transaction commits.
BEGIN;
INSERT INTO orders VALUES ('three');
SAVEPOINT handler;
SELECT * FROM pg_temp.opened('t5', 'three', 'x');
ROLLBACK TO SAVEPOINT handler;
COMMIT;
SELECT outcome FROM idem_lookup(pg_temp.k('three'), pg_temp.h('x'));
SELECT count(*) AS orders FROM orders WHERE name = 'three';
-- A finalize rolled back to a savepoint leaves the claim unfinished again.
BEGIN;
SELECT * FROM pg_temp.opened('t6', 'three', 'x');
SAVEPOINT s;
SELECT idem_finalize(pg_temp.k('three'), pg_temp.cid('t6'), 200, NULL, 'x') AS finalized;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT outcome FROM idem_lookup(pg_temp.k('three'), pg_temp.h('x'));

--
-- Release or fail in the same transaction also commit.
--
BEGIN;
SELECT * FROM pg_temp.opened('t7', 'released', 'x');
SELECT idem_release(pg_temp.k('released'), pg_temp.cid('t7')) AS released;
COMMIT;
SELECT outcome FROM idem_lookup(pg_temp.k('released'), pg_temp.h('x'));
BEGIN;
SELECT * FROM pg_temp.opened('t8', 'failed', 'x');
SELECT idem_fail(pg_temp.k('failed'), pg_temp.cid('t8'), '1 hour') AS failed;
COMMIT;
SELECT * FROM pg_temp.row_of('failed');
SELECT outcome, retry_after > '59 min' AS retry_after FROM idem_lookup(pg_temp.k('failed'), pg_temp.h('x'));
-- The cooldown holds for in-transaction claims too.
BEGIN;
SELECT * FROM pg_temp.opened('t9', 'failed', 'x');
SELECT pg_current_xact_id_if_assigned() IS NULL AS nothing_written;
COMMIT;

--
-- A renewed claim must still be finished; a finished one commits.
--
BEGIN;
SELECT * FROM pg_temp.opened('t10', 'renewed', 'x');
SELECT idem_renew(pg_temp.k('renewed'), pg_temp.cid('t10'), '1 min') IS NOT NULL AS renewed;
COMMIT;
BEGIN;
SELECT * FROM pg_temp.opened('t11', 'renewed', 'x');
SELECT idem_renew(pg_temp.k('renewed'), pg_temp.cid('t11'), '1 min') IS NOT NULL AS renewed;
SELECT idem_finalize(pg_temp.k('renewed'), pg_temp.cid('t11'), 200, NULL, 'ok') AS finalized;
COMMIT;
SELECT * FROM pg_temp.row_of('renewed');

--
-- Beginning a key this transaction already holds: in_progress, not a second claim.
--
BEGIN;
SELECT * FROM pg_temp.opened('t12', 'twice', 'x');
SELECT * FROM pg_temp.opened('t13', 'twice', 'x');
SELECT * FROM pg_temp.opened('t14', 'twice', 'y');
SELECT idem_finalize(pg_temp.k('twice'), pg_temp.cid('t12'), 200, NULL, 'once') AS finalized;
COMMIT;

--
-- A strict finalize that lost its claim aborts the whole transaction.
--
BEGIN;
SELECT * FROM pg_temp.opened('t15', 'strict', 'x');
INSERT INTO orders VALUES ('strict');
SELECT idem_finalize(pg_temp.k('strict'), '00000000-0000-4000-8000-000000000000',
                     200, NULL, 'x', strict => true);
COMMIT;
SELECT count(*) AS rows, (SELECT count(*) FROM orders WHERE name = 'strict') AS orders
  FROM idem_keys WHERE cache_key = pg_temp.k('strict');

--
-- idem_begin on a completed key: replay, nothing written, the commit is fine.
--
BEGIN;
SELECT * FROM pg_temp.opened('t16', 'one', 'x');
SELECT pg_current_xact_id_if_assigned() IS NULL AS nothing_written;
COMMIT;
BEGIN;
SELECT * FROM pg_temp.opened('t17', 'one', 'other');
COMMIT;

--
-- A lease-mode claim that is still running: in_progress for idem_begin.
--
SELECT * FROM pg_temp.claim('t18', 'leased', 'x');
BEGIN;
SELECT outcome, owner FROM pg_temp.opened('t19', 'leased', 'x');
COMMIT;
-- Lease-mode claims are not checked at commit: no trigger is queued for them.
BEGIN;
SELECT * FROM pg_temp.claim('t20', 'leased-2', 'x');
COMMIT;
SELECT * FROM pg_temp.row_of('leased-2');

--
-- idem_begin takes over an expired lease-mode claim.
--
SELECT * FROM pg_temp.claim('t21', 'stolen', 'x', '5 ms');
SELECT pg_sleep(0.02);
-- Taken over but left unfinished: the commit fails and the old claim is back.
BEGIN;
SELECT * FROM pg_temp.opened('t22', 'stolen', 'x');
SELECT * FROM pg_temp.row_of('stolen');
COMMIT;
SELECT *, (SELECT claim_id = pg_temp.cid('t21') FROM idem_keys WHERE cache_key = pg_temp.k('stolen')) AS old_claim
  FROM pg_temp.row_of('stolen');
-- Taken over and finalized: commits; the old owner is fenced out.
BEGIN;
SELECT * FROM pg_temp.opened('t23', 'stolen', 'x');
SELECT idem_finalize(pg_temp.k('stolen'), pg_temp.cid('t23'), 200, NULL, 'thief') AS finalized;
COMMIT;
SELECT * FROM pg_temp.row_of('stolen');
SELECT idem_finalize(pg_temp.k('stolen'), pg_temp.cid('t21'), 200, NULL, 'late') AS old_owner_finalize;
SELECT outcome, convert_from(response_body, 'UTF8') AS body FROM idem_lookup(pg_temp.k('stolen'), pg_temp.h('x'));

--
-- The lease argument of idem_begin is checked like idem_claim's.
--
SELECT idem_begin(pg_temp.k('bad'), pg_temp.h('x'), '0');
SELECT idem_begin(pg_temp.k('bad'), NULL);

-- Leave the shared table as we found it.
CREATE TEMP TABLE names AS
    SELECT pg_temp.k(n) AS cache_key
      FROM unnest('{one,two,three,released,failed,renewed,twice,strict,leased,leased-2,stolen,bad}'::text[]) n;
DELETE FROM idem_keys WHERE cache_key IN (SELECT cache_key FROM names);
SELECT count(*) AS rows_left FROM idem_keys WHERE cache_key IN (SELECT cache_key FROM names);
