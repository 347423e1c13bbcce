-- Operator surface: statistics, views, eviction, privileges.
-- (The regression cluster runs with shared_preload_libraries = 'pg_idem'.)

SELECT idem_stats_reset() IS NOT NULL AS reset;
SELECT count(*) AS counters, count(*) FILTER (WHERE value <> 0) AS nonzero FROM idem_stats;

-- Counted at commit: a committed claim, a replay and a mismatch.
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/a', 'k1'), sha256('a'));
SELECT idem_finalize(idem_key('ops', 'POST', '/a', 'k1'), claim_id, 200, NULL, 'ok')
  FROM idem_keys WHERE cache_key = idem_key('ops', 'POST', '/a', 'k1');
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/a', 'k1'), sha256('a'));
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/a', 'k1'), sha256('b'));

-- An aborted claim counts nothing, nor does a rolled-back subtransaction.
BEGIN;
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/a', 'k2'), sha256('a'));
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/a', 'k3'), sha256('a'));
ROLLBACK TO SAVEPOINT s;
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/a', 'k1'), sha256('a'));
COMMIT;

-- A stale finalize counts as lease_lost.
SELECT idem_finalize(idem_key('ops', 'POST', '/a', 'k1'), gen_random_uuid(), 200, NULL, 'x');

SELECT counter, value FROM idem_stats WHERE value <> 0 ORDER BY counter;

-- Operator views: in flight, stuck, cooling.  None shows a response body.
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/v', 'live'), sha256('a'), '1 minute');
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/v', 'stuck'), sha256('a'), '1 millisecond');
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/v', 'cool'), sha256('a'));
SELECT idem_fail(idem_key('ops', 'POST', '/v', 'cool'), claim_id, '1 minute')
  FROM idem_keys WHERE cache_key = idem_key('ops', 'POST', '/v', 'cool');
SELECT pg_sleep(0.01);
SELECT cache_key = idem_key('ops', 'POST', '/v', 'live') AS is_live,
       lease_remaining > '50 seconds' AS lease_left
  FROM idem_inflight WHERE cache_key = idem_key('ops', 'POST', '/v', 'live');
SELECT count(*) AS stuck FROM idem_stuck WHERE cache_key = idem_key('ops', 'POST', '/v', 'stuck');
SELECT cooldown_remaining > '50 seconds' AS cooling
  FROM idem_cooling WHERE cache_key = idem_key('ops', 'POST', '/v', 'cool');
SELECT attname FROM pg_attribute
 WHERE attrelid IN ('idem_inflight'::regclass, 'idem_stuck'::regclass, 'idem_cooling'::regclass)
   AND attname LIKE 'response%';

-- Eviction: the key is gone; the owner's finalize is fenced out; the next
-- claim wins with a higher generation.
SELECT generation AS g0 FROM idem_keys WHERE cache_key = idem_key('ops', 'POST', '/v', 'live') \gset
SELECT claim_id AS live_claim FROM idem_keys WHERE cache_key = idem_key('ops', 'POST', '/v', 'live') \gset
SELECT idem_evict(idem_key('ops', 'POST', '/v', 'live')) AS evicted;
SELECT idem_evict(idem_key('ops', 'POST', '/v', 'live')) AS evicted_again;
SELECT idem_finalize(idem_key('ops', 'POST', '/v', 'live'), :'live_claim', 200, NULL, 'late') AS late_finalize;
SELECT outcome, generation > :g0 AS generation_went_up
  FROM idem_claim(idem_key('ops', 'POST', '/v', 'live'), sha256('a'));
SELECT idem_evict(NULL);
SELECT idem_evict('\x00');

-- Privileges: PUBLIC gets nothing; idem_client the request path only;
-- idem_admin the views too.
CREATE ROLE regress_idem_app LOGIN;
CREATE ROLE regress_idem_nobody LOGIN;
CREATE ROLE regress_idem_ops LOGIN;
GRANT idem_client TO regress_idem_app;
GRANT idem_admin TO regress_idem_ops;

SET ROLE regress_idem_nobody;
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/p', 'k'), sha256('a'));
SELECT count(*) FROM idem_keys;
RESET ROLE;

SET ROLE regress_idem_app;
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/p', 'k'), sha256('a'));
SELECT outcome FROM idem_claim(idem_key('ops', 'POST', '/p', 'k'), sha256('a'));
SELECT count(*) FROM idem_keys;
UPDATE idem_keys SET state = 'completed';
SELECT count(*) FROM idem_inflight;
SELECT * FROM idem_stats;
SELECT idem_evict(idem_key('ops', 'POST', '/p', 'k'));
SELECT idem_cleanup();
SELECT idem_stats_reset();
RESET ROLE;

SET ROLE regress_idem_ops;
SELECT count(*) > 0 AS sees_inflight FROM idem_inflight;
SELECT count(*) > 0 AS sees_keys FROM idem_keys;
SELECT idem_evict(idem_key('ops', 'POST', '/p', 'k')) AS evicted;
UPDATE idem_keys SET state = 'completed';
RESET ROLE;

-- Every function is SECURITY INVOKER, so that the scope is the calling
-- role's: the claim hot path runs no SQL and switches to the owner in C,
-- the others run their statements as the owner with a pinned search_path
-- (core/statements.c); pure ones need neither.
SELECT p.proname, p.prosecdef, p.proconfig
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_idem') AND d.deptype = 'e'
   AND p.proname IN ('idem_claim', 'idem_finalize', 'idem_key', 'idem_keys_claim_finished',
                     'idem_cleanup')
 ORDER BY 1;
SELECT count(*) AS public_grants FROM information_schema.role_routine_grants
 WHERE grantee = 'PUBLIC' AND routine_name LIKE 'idem\_%';

DROP ROLE regress_idem_app, regress_idem_nobody, regress_idem_ops;
DELETE FROM idem_keys WHERE cache_key IN (
    idem_key('ops', 'POST', '/a', 'k1'), idem_key('ops', 'POST', '/v', 'live'),
    idem_key('ops', 'POST', '/v', 'stuck'), idem_key('ops', 'POST', '/v', 'cool'),
    idem_key('ops', 'POST', '/p', 'k'));
