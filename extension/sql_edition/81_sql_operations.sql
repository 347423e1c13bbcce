-- The SQL edition of the operator surface (core/stats.c, keys/evict.c):
-- statistics as a view over the tables, and eviction of one key.
--
-- The C edition counts events (claims by outcome, finalizes, acks, ...)
-- in shared memory since idem_stats_reset(); the SQL edition has no
-- shared memory, and a counter row every request updated would serialize
-- them all.  So its idem_stats shows what the tables hold now: gauges,
-- counted when the view is read (a scan of each table: for an admin's
-- dashboard, not for every request), stats_reset NULL.

-- @symbol idem_stats
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
    SELECT s.counter, s.value, NULL::pg_catalog.timestamptz
      FROM (SELECT 'keys_' || k.state, pg_catalog.count(*) FROM @extschema@.idem_keys k GROUP BY k.state
            UNION ALL
            SELECT 'keys_stuck', pg_catalog.count(*) FROM @extschema@.idem_keys k
             WHERE k.state = 'pending' AND k.lease_expires_at < pg_catalog.clock_timestamp()
            UNION ALL
            SELECT 'outbox_' || o.state, pg_catalog.count(*)
              FROM (SELECT q.state FROM @extschema@.idem_outbox_queue q
                    UNION ALL
                    SELECT c.state FROM @extschema@.idem_outbox_claimed c WHERE c.state <> 'published') o
             GROUP BY o.state
            UNION ALL
            -- The published events kept for idem.outbox_retention, under
            -- the name the counter had when idem_outbox_archive held them.
            SELECT 'outbox_archived', pg_catalog.count(*) FROM @extschema@.idem_outbox_claimed c
             WHERE c.state = 'published'
            UNION ALL
            SELECT 'inbox_' || m.state, pg_catalog.count(*) FROM @extschema@.idem_inbox m GROUP BY m.state
            UNION ALL
            SELECT 'attempts_' || a.status, pg_catalog.count(*) FROM @extschema@.idem_attempts a GROUP BY a.status)
           AS s(counter, value)
     ORDER BY s.counter
$function$
-- @end

-- Nothing to reset: the gauges are what the tables hold.
-- @symbol idem_stats_reset
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
    SELECT pg_catalog.clock_timestamp()
$function$
-- @end

-- Forget one key whatever its state, in every scope (admin): a tombstone
-- without response, hash or owner; a live owner's later finalize changes
-- nothing, and the next request claims the key afresh.
-- @symbol idem_evict
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_cache_key ALIAS FOR $1;
BEGIN
    {{digest_arg(p_cache_key, 1, cache_key, 'idem_evict')}}
    UPDATE @extschema@.idem_keys AS k SET {{tombstone()}}
     WHERE k.cache_key = p_cache_key
       AND NOT (k.state = 'failed' AND k.request_hash IS NULL AND k.claim_id IS NULL);
    RETURN FOUND;
END
$function$
-- @end

-- @symbol idem_edition
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $function$
    SELECT 'sql'::pg_catalog.text
$function$
-- @end
