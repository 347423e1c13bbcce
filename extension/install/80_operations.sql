-- What operators look at: statistics, keys in flight, stuck or cooling
-- down, and eviction of one key.  No view shows response bodies.
--
-- The views' expressions are resolved here, with the search_path set to
-- this schema (pg_catalog implicitly first): every function and operator
-- is named with its schema, so that nothing another role created here or
-- in public can be chosen.

-- The view over idem_stats() must refer to the function itself: called by
-- name, a function of another role's in this schema with the same leading
-- parameters and one more, defaulted, would make "idem_stats()" ambiguous
-- and this script fail.  So the function is created under a name nobody
-- can have guessed, the view is defined over it, and only then is it
-- renamed (a view refers to its functions by OID).  (The definition is
-- written out, not formatted, so that the SQL edition's build finds it.)
DO $stats_view$
DECLARE
    hidden CONSTANT text := pg_catalog.format('idem_stats_%s',
        pg_catalog.md5(pg_catalog.gen_random_uuid()::pg_catalog.text));
BEGIN
    EXECUTE pg_catalog.format(
        'CREATE FUNCTION @extschema@.%I(OUT counter pg_catalog.text, OUT value pg_catalog.int8,'
        ' OUT stats_reset pg_catalog.timestamptz) RETURNS SETOF pg_catalog.record %s', hidden,
        $definition$ AS 'MODULE_PATHNAME', 'idem_stats' LANGUAGE C VOLATILE $definition$);
    EXECUTE pg_catalog.format('CREATE VIEW @extschema@.idem_stats AS'
                              ' SELECT * FROM @extschema@.%I() AS idem_stats', hidden);
    EXECUTE pg_catalog.format('ALTER FUNCTION @extschema@.%I() RENAME TO idem_stats', hidden);
END
$stats_view$;
COMMENT ON VIEW idem_stats IS
    'pg_idem event counters since stats_reset (needs shared_preload_libraries)';

CREATE FUNCTION idem_stats_reset()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_stats_reset() IS 'zero every pg_idem counter';

-- Which edition answers: 'c' (this library) or 'sql' (the SQL edition,
-- docs/guides/managed-postgresql.md), so that a client's first-use check
-- can say which it found.
CREATE FUNCTION idem_edition()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_edition'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idem_edition() IS
    'the edition of pg_idem: c (the C library) or sql (the SQL edition)';

CREATE FUNCTION idem_evict(cache_key bytea)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_evict'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_evict(bytea) IS
    'forget one key whatever its state (the next request runs afresh)';

-- Each operator view names the role a row belongs to (scope::regrole: the
-- role's current name, its OID once it was dropped, '-' for the shared
-- scope of rows from before 0.3.0).
CREATE VIEW idem_inflight AS
SELECT cache_key, generation, in_transaction, created_at, lease_expires_at,
       lease_expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS lease_remaining,
       scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.>=) pg_catalog.clock_timestamp();
COMMENT ON VIEW idem_inflight IS 'keys whose handler holds a live lease';

CREATE VIEW idem_stuck AS
SELECT cache_key, generation, created_at, lease_expires_at,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) lease_expires_at AS expired_for,
       scope::pg_catalog.regrole AS scope,
       pg_catalog.count(*) OVER (PARTITION BY scope) AS stuck_in_scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.<) pg_catalog.clock_timestamp();
COMMENT ON VIEW idem_stuck IS
    'pending keys past their lease: the owner died or stalled; the next same request recovers them (stuck_in_scope: how many the row''s scope has)';

CREATE VIEW idem_cooling AS
SELECT cache_key, generation, finished_at, lease_expires_at AS cooldown_ends_at,
       lease_expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS cooldown_remaining,
       scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_keys
 WHERE state OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text
   AND lease_expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
COMMENT ON VIEW idem_cooling IS 'failed keys still in their cooldown';

CREATE VIEW idem_outbox_dead AS
SELECT id, topic, message_key, attempts, last_error, created_at, dead_at,
       scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_outbox
 WHERE state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text;
COMMENT ON VIEW idem_outbox_dead IS
    'outbox events that used up their attempts (payloads stay in idem_outbox)';

CREATE VIEW idem_inbox_dead AS
SELECT consumer, message_id, error_count, max_attempts, last_error,
       received_at, failed_at, dead_at, scope::pg_catalog.regrole AS scope
  FROM @extschema@.idem_inbox
 WHERE state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text;
COMMENT ON VIEW idem_inbox_dead IS
    'inbox messages that reached their retry cap; revive one with idem_inbox_retry';
