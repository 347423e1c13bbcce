-- Every idem.* duration setting at both ends of its documented range,
-- through every arithmetic that uses it.  0.5.0's inbox backoff computed
-- base * 2^n as an interval: with idem.inbox_backoff_base = '1d' (inside
-- its range) the 28th failure overflowed (22008), failures stopped
-- counting, and a message with max_attempts = 30 ran 34 times.  The
-- launcher's settings (idem.cleanup_interval, cleanup_database_timeout:
-- reload only) are exercised at their bounds by TAP 085.
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;

-- The inbox backoff at its top: 40 failures of one message (cap 1000),
-- each retry_after the cap of one day from the first on.
SET idem.inbox_backoff_base = '1d';
SET idem.inbox_backoff_max = '1d';
-- n deliveries of message m, each failing and recorded in a transaction
-- of its own; what the last recording answered, and the distinct delays.
CREATE TEMP TABLE fail_times (message text, failures integer, outcome text, delays text);
CREATE PROCEDURE pg_temp.fail_n(m text, n integer, cap integer)
LANGUAGE plpgsql AS $$
DECLARE
  r record;
  seen text[] := '{}';
  decision text;
BEGIN
  FOR i IN 1..n LOOP
    decision := idem_inbox_begin('sb', m, sha256('p'), cap);
    EXIT WHEN decision <> 'process';
    SELECT * INTO r FROM idem_inbox_fail('sb', m, 'failure ' || i);
    IF r.retry_after IS NOT NULL AND NOT r.retry_after::text = ANY (seen) THEN
      seen := seen || r.retry_after::text;
    END IF;
    COMMIT;
    EXIT WHEN r.outcome = 'dead';
  END LOOP;
  INSERT INTO fail_times VALUES (m, r.error_count, r.outcome, array_to_string(seen, ', '));
  COMMIT;
END
$$;
CREATE FUNCTION pg_temp.fail_times(m text, n integer, cap integer)
RETURNS TABLE (failures integer, outcome text, delays text)
LANGUAGE sql AS $$
  SELECT failures, outcome, delays FROM fail_times WHERE message = m
$$;
CALL pg_temp.fail_n('m-base-1d', 40, 1000);
SELECT * FROM pg_temp.fail_times('m-base-1d', 40, 1000);
-- Dead exactly at the cap: 30 runs, not 34.
CALL pg_temp.fail_n('m-cap-30', 40, 30);
SELECT * FROM pg_temp.fail_times('m-cap-30', 40, 30);
SELECT idem_inbox_begin('sb', 'm-cap-30', sha256('p'), 30) AS after_the_cap;
SELECT state, error_count FROM idem_inbox WHERE consumer = 'sb' ORDER BY message_id;

-- Base and cap at the bottom, then the base at its top under a small cap.
SET idem.inbox_backoff_base = '1ms';
SET idem.inbox_backoff_max = '1ms';
CALL pg_temp.fail_n('m-base-1ms', 40, 1000);
SELECT * FROM pg_temp.fail_times('m-base-1ms', 40, 1000);
SET idem.inbox_backoff_max = '1min';
CALL pg_temp.fail_n('m-1ms-to-1min', 40, 1000);
SELECT * FROM pg_temp.fail_times('m-1ms-to-1min', 40, 1000);
SET idem.inbox_backoff_base = '1d';
CALL pg_temp.fail_n('m-1d-cut-to-1min', 3, 1000);
SELECT * FROM pg_temp.fail_times('m-1d-cut-to-1min', 3, 1000);
RESET idem.inbox_backoff_base;
RESET idem.inbox_backoff_max;

-- Leases and cooldowns at idem.max_lease's top (24 days), and at 1 ms.
SET idem.max_lease = '2147483647ms';
SET idem.lease = '2147483647ms';
SET idem.failure_cooldown = '2147483647ms';
SELECT outcome, lease_expires_at - now() > interval '24 days' AS leased_24_days
  FROM idem_claim(idem_key('sb', 'POST', '/b', 'lease-max'), sha256('p'));
SELECT idem_renew(idem_key('sb', 'POST', '/b', 'lease-max'), claim_id) - now() > interval '24 days' AS renewed
  FROM idem_keys WHERE cache_key = idem_key('sb', 'POST', '/b', 'lease-max');
SELECT idem_fail(idem_key('sb', 'POST', '/b', 'lease-max'), claim_id) AS failed_with_max_cooldown
  FROM idem_keys WHERE cache_key = idem_key('sb', 'POST', '/b', 'lease-max');
SELECT outcome FROM idem_claim(idem_key('sb', 'POST', '/b', 'lease-max'), sha256('p'));
SET idem.lease = '1ms';
SET idem.failure_cooldown = '0';
SELECT outcome FROM idem_claim(idem_key('sb', 'POST', '/b', 'lease-min'), sha256('p'));
SELECT idem_fail(idem_key('sb', 'POST', '/b', 'lease-min'), claim_id) AS failed_without_cooldown
  FROM idem_keys WHERE cache_key = idem_key('sb', 'POST', '/b', 'lease-min');
SELECT outcome FROM idem_claim(idem_key('sb', 'POST', '/b', 'lease-min'), sha256('p'));
SET idem.max_lease = '1ms';
SELECT outcome FROM idem_claim(idem_key('sb', 'POST', '/b', 'lease-tiny'), sha256('p'));
RESET idem.lease;
RESET idem.failure_cooldown;
RESET idem.max_lease;

-- The key horizons at both ends: a finished key, then cleanup.
SELECT idem_finalize(idem_key('sb', 'POST', '/b', 'done'), claim_id, 201, NULL, 'ok')
  FROM idem_claim(idem_key('sb', 'POST', '/b', 'done'), sha256('p'));
SET idem.ttl = '2147483647s';
SET idem.tombstone_ttl = '2147483647s';
SELECT outcome FROM idem_claim(idem_key('sb', 'POST', '/b', 'done'), sha256('p'));
SELECT idem_cleanup(1000) >= 0 AS cleanup_at_68_years;
SET idem.ttl = '1s';
SET idem.tombstone_ttl = '0';
SELECT idem_cleanup(1000) >= 0 AS cleanup_at_1s;
RESET idem.ttl;
RESET idem.tombstone_ttl;

-- A follower's wait at both ends (nothing to wait for: the key is free).
SET idem.max_wait = '0';
SELECT outcome FROM idem_claim(idem_key('sb', 'POST', '/b', 'wait-0'), sha256('p'), max_wait => '1h');
SET idem.max_wait = '1h';
SELECT outcome FROM idem_claim(idem_key('sb', 'POST', '/b', 'wait-1h'), sha256('p'), max_wait => '1h');
RESET idem.max_wait;

-- The outbox's backoff: its longest step (24 days) after a nack.
SET idem.outbox_backoff = '2147483647ms';
SELECT idem_outbox_stage('sb.bounds', '{}'::jsonb) > 0 AS staged;
SELECT n.outcome, n.retry_after > interval '24 days' AS backed_off_24_days
  FROM idem_outbox_claim(10) c, idem_outbox_nack(c.claim_token, c.id, 'no') n
 WHERE c.topic = 'sb.bounds';
RESET idem.outbox_backoff;

-- The retentions the worker passes to the prune functions, at both ends.
SELECT idem_outbox_prune('2147483647 seconds', 1000) >= 0 AS outbox_68_years,
       idem_outbox_prune('1 second', 1000) >= 0 AS outbox_1s,
       idem_inbox_prune('2147483647 seconds', 1000) >= 0 AS inbox_68_years,
       idem_inbox_prune('1 second', 1000) >= 0 AS inbox_1s,
       idem_attempt_prune('2147483647 seconds', 1000) >= 0 AS attempts_68_years,
       idem_attempt_prune('1 second', 1000) >= 0 AS attempts_1s;

DELETE FROM idem_outbox WHERE topic = 'sb.bounds'
   OR (topic = 'idem.inbox.dead' AND payload->>'consumer' = 'sb');
DELETE FROM idem_inbox WHERE consumer = 'sb';
DELETE FROM idem_keys WHERE cache_key IN (
  idem_key('sb', 'POST', '/b', 'lease-max'), idem_key('sb', 'POST', '/b', 'lease-min'),
  idem_key('sb', 'POST', '/b', 'lease-tiny'), idem_key('sb', 'POST', '/b', 'done'),
  idem_key('sb', 'POST', '/b', 'wait-0'), idem_key('sb', 'POST', '/b', 'wait-1h'));
