-- The drainer's functions (claim, ack, nack) given bad or odd input: each
-- bad one is refused with its SQLSTATE, a lower-case message and a detail
-- (shown here, unlike sql/outbox.sql's SQLSTATE and message); each odd but
-- valid one has its documented answer; and afterwards every event is
-- accounted for: published exactly once, or still pending, none lost.
CREATE ROLE ob_bad_client LOGIN IN ROLE idem_client;
CREATE TEMP TABLE parked AS
  SELECT id, available_at FROM idem_outbox_queue WHERE scope = 0 AND state = 'pending';
UPDATE idem_outbox_queue SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
CREATE TEMP TABLE claimed (payload jsonb, token uuid, id bigint);
GRANT ALL ON claimed TO ob_bad_client;
-- Refused or not, for input PostgreSQL 15 cannot parse but 17 can (an
-- infinite interval): never accepted.
CREATE FUNCTION pg_temp.refused(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'accepted';
EXCEPTION WHEN invalid_parameter_value OR invalid_datetime_format THEN
  RETURN 'refused';
END $$;

SET ROLE ob_bad_client;
SELECT idem_outbox_stage('ob.bad', '{"n": 1}'::jsonb) > 0 AS first,
       idem_outbox_stage('ob.bad', '{"n": 2}'::jsonb, 'ob-bad-key') > 0 AS second,
       idem_outbox_stage('ob.bad', '{"n": 3}'::jsonb, 'ob-bad-key') > 0 AS third;
RESET ROLE;
CREATE TEMP TABLE events AS SELECT payload, id FROM idem_outbox_queue WHERE topic = 'ob.bad';
GRANT SELECT ON events TO ob_bad_client;
SET ROLE ob_bad_client;

--
-- idem_outbox_claim(batch, lease).
--
SELECT * FROM idem_outbox_claim(0);
SELECT * FROM idem_outbox_claim(-1);
SELECT * FROM idem_outbox_claim(-2147483648);
SELECT * FROM idem_outbox_claim(10001);
SELECT * FROM idem_outbox_claim(2147483647);
SELECT * FROM idem_outbox_claim(NULL);
SELECT * FROM idem_outbox_claim(1, '0');
SELECT * FROM idem_outbox_claim(1, '-1 s');
SELECT * FROM idem_outbox_claim(1, '1 microsecond');
SELECT * FROM idem_outbox_claim(1, '61 minutes');
SELECT * FROM idem_outbox_claim(1, '1 month');
SELECT * FROM idem_outbox_claim(1, '178000000 years');
SELECT * FROM idem_outbox_claim(1, '-178000000 years');
SELECT pg_temp.refused($$SELECT * FROM idem_outbox_claim(1, 'infinity')$$) AS infinite_lease,
       pg_temp.refused($$SELECT * FROM idem_outbox_claim(1, '-infinity')$$) AS minus_infinite_lease;
-- None of those leased anything.
RESET ROLE;
SELECT payload, attempts, claim_token IS NULL AS unclaimed FROM idem_outbox
 WHERE topic = 'ob.bad' ORDER BY id;
SET ROLE ob_bad_client;
-- A NULL lease is idem.lease's (30 s); 1 ms and idem.max_lease are the bounds.
-- (The claim's clock reading lies between these two, however slow.)
SELECT clock_timestamp() AS before_claim \gset
INSERT INTO claimed SELECT payload, claim_token, id FROM idem_outbox_claim(1, NULL);
SELECT payload FROM claimed;
RESET ROLE;
SELECT available_at BETWEEN :'before_claim'::timestamptz + interval '30 s'
                        AND clock_timestamp() + interval '30 s' AS lease_30s
  FROM idem_outbox_claimed WHERE topic = 'ob.bad' AND claim_token IS NOT NULL;
SET ROLE ob_bad_client;
BEGIN;
SELECT count(*) AS one_ms_lease FROM idem_outbox_claim(1, '1 millisecond');
ROLLBACK;
BEGIN;
SELECT count(*) AS one_hour_lease FROM idem_outbox_claim(1, '1 hour');
ROLLBACK;

--
-- idem_outbox_ack(token, ids).
--
SELECT idem_outbox_ack(NULL, '{1}');
SELECT idem_outbox_ack(gen_random_uuid(), NULL);
SELECT idem_outbox_ack(gen_random_uuid(), '{1, NULL}');
SELECT idem_outbox_ack(gen_random_uuid(), '{NULL}');
SELECT idem_outbox_ack(gen_random_uuid(), '{{1}, {2}}');
-- Valid, acking nothing: an empty array, ids nobody has, a made-up token,
-- the right token with ids it does not hold.
SELECT idem_outbox_ack(gen_random_uuid(), '{}') AS empty;
SELECT idem_outbox_ack(token, ARRAY[0, -1, -9223372036854775808, 9223372036854775807])
       AS made_up_ids FROM claimed;
SELECT idem_outbox_ack(gen_random_uuid(), ARRAY[id]) AS made_up_token FROM claimed;
SELECT idem_outbox_ack('00000000-0000-0000-0000-000000000000', ARRAY[id]) AS nil_token FROM claimed;
SELECT idem_outbox_ack(token, ARRAY(SELECT id FROM events WHERE payload <> '{"n": 1}'))
       AS not_held FROM claimed;
-- The id held, given many times, with other bounds than 1: acked once.
SELECT idem_outbox_ack(token, ('[5:8]={' || id || ',' || id || ',' || id || ',0}')::bigint[])
       AS acked_once FROM claimed;
-- And again: already published.
SELECT idem_outbox_ack(token, ARRAY[id]) AS acked_again FROM claimed;
TRUNCATE claimed;

--
-- idem_outbox_nack(token, id, error).
--
INSERT INTO claimed SELECT payload, claim_token, id FROM idem_outbox_claim(10);
SELECT payload FROM claimed ORDER BY id;
SELECT * FROM idem_outbox_nack(NULL, 1, 'e');
SELECT * FROM idem_outbox_nack(gen_random_uuid(), NULL, 'e');
SELECT * FROM idem_outbox_nack(gen_random_uuid(), 1, NULL);
-- Stale: ids nobody has, a made-up token, a published event.
SELECT n.* FROM claimed c, idem_outbox_nack(c.token, 0, 'e') n;
SELECT n.* FROM claimed c, idem_outbox_nack(gen_random_uuid(), c.id, 'e') n;
SELECT n.* FROM claimed c, idem_outbox_nack(c.token, (SELECT min(id) FROM events), 'e') n;
-- An empty error text is an error text; a long one is kept whole.
SELECT n.outcome, n.attempts FROM claimed c, idem_outbox_nack(c.token, c.id, '') n;
RESET ROLE;
SELECT last_error = '' AS empty_error_kept FROM idem_outbox_claimed
 WHERE topic = 'ob.bad' AND payload = '{"n": 2}';
UPDATE idem_outbox_claimed SET available_at = clock_timestamp()
 WHERE topic = 'ob.bad' AND payload = '{"n": 2}';
SET ROLE ob_bad_client;
TRUNCATE claimed;
INSERT INTO claimed SELECT payload, claim_token, id FROM idem_outbox_claim(10);
SELECT n.outcome, n.attempts FROM claimed c, idem_outbox_nack(c.token, c.id, repeat('x', 1000000)) n;
-- Twice: the first released the event.
SELECT n.outcome FROM claimed c, idem_outbox_nack(c.token, c.id, 'again') n;
RESET ROLE;
SELECT length(last_error) AS error_length FROM idem_outbox_claimed
 WHERE topic = 'ob.bad' AND payload = '{"n": 2}';

-- Every event accounted for: the first published once, the key's head
-- backing off after two attempts, the key's second held back by it.
SELECT payload, state, attempts FROM idem_outbox WHERE topic = 'ob.bad' ORDER BY id;
SELECT count(*) AS archived_rows FROM idem_outbox_claimed WHERE topic = 'ob.bad' AND state = 'published';

DELETE FROM idem_outbox WHERE topic = 'ob.bad';
UPDATE idem_outbox_queue q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
DROP TABLE claimed, events;
DROP FUNCTION pg_temp.refused(text);
DROP ROLE ob_bad_client;
