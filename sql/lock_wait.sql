-- lock_wait, the last argument of the five-argument idem_claim and
-- idem_begin and the four-argument idem_renew (keys/lock_wait.c): the
-- call's lock_timeout, for the call only.  The shorter signatures, which
-- the clients released before 0.6.0 call, run with the session's.
--
-- What the call ran with is seen from inside it: a row trigger on
-- idem_keys (fired by the claim's own write, before the call returns)
-- records current_setting('lock_timeout').  The waits themselves are in
-- the isolation spec claim_lock_wait.spec.
--
-- Keys of this file are idem_key('lock_wait', 'POST', '/lw', name).

CREATE FUNCTION pg_temp.k(name text) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT idem_key('lock_wait', 'POST', '/lw', name) $$;

CREATE TABLE public.lock_wait_seen (call serial, lock_timeout text);
CREATE FUNCTION public.lock_wait_record() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog AS $$
BEGIN
    IF NEW.cache_key = public.idem_key('lock_wait', 'POST', '/lw', 'fails inside') THEN
        RAISE EXCEPTION 'the handler''s trigger failed';
    END IF;
    INSERT INTO public.lock_wait_seen (lock_timeout) VALUES (current_setting('lock_timeout'));
    RETURN NULL;
END $$;
CREATE TRIGGER lock_wait_record AFTER INSERT OR UPDATE ON idem_keys
    FOR EACH ROW EXECUTE FUNCTION public.lock_wait_record();
-- What the last call ran with.
CREATE FUNCTION pg_temp.seen() RETURNS text LANGUAGE sql AS
$$ SELECT lock_timeout FROM public.lock_wait_seen ORDER BY call DESC LIMIT 1 $$;

SET lock_timeout = '5min';

-- A lease-mode claim: the call runs with lock_wait, the session keeps its own.
SELECT outcome FROM idem_claim(pg_temp.k('a'), idem_request_hash('x'), NULL, NULL, '2s');
SELECT pg_temp.seen() AS in_the_call, current_setting('lock_timeout') AS after_it;

-- Rounded up to whole milliseconds (lock_timeout's unit); 0 is one
-- millisecond: no waiting (lock_timeout's own 0 would mean no limit).
SELECT outcome FROM idem_claim(pg_temp.k('b'), idem_request_hash('x'), NULL, NULL, '1.5 ms');
SELECT pg_temp.seen() AS in_the_call;
SELECT outcome FROM idem_claim(pg_temp.k('c'), idem_request_hash('x'), NULL, NULL, '0');
SELECT pg_temp.seen() AS in_the_call;
-- Longer than lock_timeout can say: its largest value.
SELECT outcome FROM idem_claim(pg_temp.k('d'), idem_request_hash('x'), NULL, NULL, '100 days');
SELECT pg_temp.seen() AS in_the_call;
-- NULL, and the four-argument form: the session's lock_timeout.
SELECT outcome FROM idem_claim(pg_temp.k('e'), idem_request_hash('x'), NULL, NULL, NULL);
SELECT pg_temp.seen() AS in_the_call;
SELECT outcome FROM idem_claim(pg_temp.k('f'), idem_request_hash('x'), NULL, NULL);
SELECT pg_temp.seen() AS in_the_call;
-- By name: every argument is given (NULL keeps a default).
SELECT outcome FROM idem_claim(pg_temp.k('g'), idem_request_hash('x'), lease => NULL,
                               max_wait => NULL, lock_wait => '3s');
SELECT pg_temp.seen() AS in_the_call, current_setting('lock_timeout') AS after_it;

-- Negative: refused, with the fix.
SELECT outcome FROM idem_claim(pg_temp.k('h'), idem_request_hash('x'), NULL, NULL, '-1s');
SELECT outcome FROM idem_begin(pg_temp.k('h'), idem_request_hash('x'), NULL, NULL, '-1 ms');
SELECT idem_renew(pg_temp.k('a'), gen_random_uuid(), NULL, '-1s');

-- In the caller's transaction: idem_begin runs with lock_wait, and the
-- handler after it with the transaction's own lock_timeout.
BEGIN;
SET LOCAL lock_timeout = '7s';
SELECT outcome, claim_id AS begun FROM idem_begin(pg_temp.k('t'), idem_request_hash('x'),
                                                   NULL, NULL, '250ms') \gset
SELECT pg_temp.seen() AS in_the_call, current_setting('lock_timeout') AS handler_runs_with;
SELECT idem_finalize(pg_temp.k('t'), :'begun', 201, NULL, 'ok') AS finalized;
COMMIT;
SELECT current_setting('lock_timeout') AS after_the_transaction;

-- A call that fails after lock_wait took effect (here the trigger raises)
-- leaves the caller's setting: in a transaction, back to the savepoint ...
BEGIN;
SET LOCAL lock_timeout = '7s';
SAVEPOINT before_claim;
SELECT outcome FROM idem_begin(pg_temp.k('fails inside'), idem_request_hash('x'), NULL, NULL, '4s');
ROLLBACK TO SAVEPOINT before_claim;
SELECT current_setting('lock_timeout') AS after_the_failed_call;
COMMIT;
-- ... and outside one.
SELECT outcome FROM idem_claim(pg_temp.k('fails inside'), idem_request_hash('x'), NULL, NULL, '4s');
SELECT current_setting('lock_timeout') AS after_the_failed_call;

-- idem_renew takes it as well (a lease keeper must not outwait its lease).
SELECT claim_id AS renewing FROM idem_claim(pg_temp.k('r'), idem_request_hash('x')) \gset
SELECT idem_renew(pg_temp.k('r'), :'renewing', '1 min', '300ms') IS NOT NULL AS renewed;
SELECT pg_temp.seen() AS in_the_call, current_setting('lock_timeout') AS after_it;

-- The three-argument idem_renew: the session's.
SELECT idem_renew(pg_temp.k('r'), :'renewing', '1 min') IS NOT NULL AS renewed;
SELECT pg_temp.seen() AS in_the_call;

RESET lock_timeout;
DROP TRIGGER lock_wait_record ON idem_keys;
DROP FUNCTION public.lock_wait_record();
DROP TABLE public.lock_wait_seen;
DELETE FROM idem_keys WHERE cache_key IN (SELECT pg_temp.k(n) FROM unnest(
    ARRAY['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 't', 'fails inside', 'r']) n);
