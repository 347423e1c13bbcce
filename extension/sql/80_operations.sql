-- What operators look at: statistics, keys in flight, stuck or cooling
-- down, and eviction of one key.  No view shows response bodies.

CREATE FUNCTION idem_stats(OUT counter text, OUT value bigint,
                           OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats'
LANGUAGE C VOLATILE;

CREATE VIEW idem_stats AS SELECT * FROM idem_stats();
COMMENT ON VIEW idem_stats IS
    'pg_idem event counters since stats_reset (needs shared_preload_libraries)';

CREATE FUNCTION idem_stats_reset()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_stats_reset() IS 'zero every pg_idem counter';

CREATE FUNCTION idem_evict(cache_key bytea)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_evict'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION idem_evict(bytea) IS
    'forget one key whatever its state (the next request runs afresh)';

CREATE VIEW idem_inflight AS
SELECT cache_key, generation, in_transaction, created_at, lease_expires_at,
       lease_expires_at - clock_timestamp() AS lease_remaining
  FROM idem_keys
 WHERE state = 'pending' AND lease_expires_at >= clock_timestamp();
COMMENT ON VIEW idem_inflight IS 'keys whose handler holds a live lease';

CREATE VIEW idem_stuck AS
SELECT cache_key, generation, created_at, lease_expires_at,
       clock_timestamp() - lease_expires_at AS expired_for
  FROM idem_keys
 WHERE state = 'pending' AND lease_expires_at < clock_timestamp();
COMMENT ON VIEW idem_stuck IS
    'pending keys past their lease: the owner died or stalled; the next same request recovers them';

CREATE VIEW idem_cooling AS
SELECT cache_key, generation, finished_at, lease_expires_at AS cooldown_ends_at,
       lease_expires_at - clock_timestamp() AS cooldown_remaining
  FROM idem_keys
 WHERE state = 'failed' AND lease_expires_at > clock_timestamp();
COMMENT ON VIEW idem_cooling IS 'failed keys still in their cooldown';

CREATE VIEW idem_outbox_dead AS
SELECT id, topic, message_key, attempts, last_error, created_at, dead_at
  FROM idem_outbox
 WHERE state = 'dead';
COMMENT ON VIEW idem_outbox_dead IS
    'outbox events that used up their attempts (payloads stay in idem_outbox)';

CREATE VIEW idem_inbox_dead AS
SELECT consumer, message_id, error_count, max_attempts, last_error,
       received_at, failed_at, dead_at
  FROM idem_inbox
 WHERE state = 'dead';
COMMENT ON VIEW idem_inbox_dead IS
    'inbox messages that reached their retry cap; revive one with idem_inbox_retry';
