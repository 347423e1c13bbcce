-- Scope isolation of the direct drainer, attacked from the client side:
-- role b's drainer never claims, acks or nacks role a's events, whatever
-- b puts on its search_path (its own idem_outbox_queue in a schema of its
-- own and in pg_temp: the direct path opens the extension's table by its
-- schema, never by search_path), through a SECURITY DEFINER wrapper of
-- b's that a calls (it acts in b's scope: a's events stay a's), across SET
-- ROLE between the claim and the ack, or with a's token.
CREATE ROLE ob_sc_a LOGIN IN ROLE idem_client;
CREATE ROLE ob_sc_b LOGIN IN ROLE idem_client;
CREATE SCHEMA ob_sc_b AUTHORIZATION ob_sc_b;
CREATE TEMP TABLE parked AS
  SELECT id, available_at FROM idem_outbox_queue WHERE scope = 0 AND state = 'pending';
UPDATE idem_outbox_queue SET available_at = 'infinity' WHERE id IN (SELECT id FROM parked);
CREATE TEMP TABLE got (who text, payload jsonb, token uuid, id bigint);
GRANT ALL ON got TO ob_sc_a, ob_sc_b;

SET ROLE ob_sc_a;
SELECT idem_outbox_stage('ob.sc', '{"of": "a", "n": 1}'::jsonb) > 0 AS a1,
       idem_outbox_stage('ob.sc', '{"of": "a", "n": 2}'::jsonb) > 0 AS a2;
RESET ROLE;

-- b's look-alike queue, first on its search_path, and one in pg_temp,
-- each with a claimable event of b's scope.
SET ROLE ob_sc_b;
CREATE TABLE ob_sc_b.idem_outbox_queue (
    id bigserial PRIMARY KEY, topic text, message_key text, key_hash bytea, payload jsonb,
    payload_bytes bytea, headers jsonb, state text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0, last_error text, available_at timestamptz,
    claim_token uuid, created_at timestamptz DEFAULT clock_timestamp(),
    published_at timestamptz, dead_at timestamptz, scope regrole);
CREATE INDEX idem_outbox_claimable ON ob_sc_b.idem_outbox_queue (scope, available_at, id)
    WHERE state = 'pending';
INSERT INTO ob_sc_b.idem_outbox_queue (topic, payload, available_at, scope)
VALUES ('ob.sc', '{"of": "fake"}', clock_timestamp(), 'ob_sc_b');
CREATE TEMP TABLE idem_outbox_queue (LIKE ob_sc_b.idem_outbox_queue INCLUDING ALL);
INSERT INTO pg_temp.idem_outbox_queue (topic, payload, available_at, scope)
VALUES ('ob.sc', '{"of": "temp"}', clock_timestamp(), 'ob_sc_b');
SET search_path = ob_sc_b, pg_temp, public;
SELECT payload FROM idem_outbox_claim(10);
SELECT topic, state, events FROM idem_outbox_backlog();
RESET search_path;
DROP TABLE pg_temp.idem_outbox_queue;
RESET ROLE;

-- A SECURITY DEFINER wrapper of b's, called by a: it claims in b's scope.
SET ROLE ob_sc_b;
SELECT idem_outbox_stage('ob.sc', '{"of": "b"}'::jsonb) > 0 AS b1;
CREATE FUNCTION ob_sc_b.claim_for_anyone() RETURNS SETOF jsonb
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
  SELECT payload FROM public.idem_outbox_claim(10)
$$;
RESET ROLE;
GRANT USAGE ON SCHEMA ob_sc_b TO ob_sc_a;
SET ROLE ob_sc_a;
SELECT * FROM ob_sc_b.claim_for_anyone();
-- a's own claim still finds both of a's events.
INSERT INTO got SELECT 'a', payload, claim_token, id FROM idem_outbox_claim(10);
SELECT payload FROM got ORDER BY id;
RESET ROLE;

-- b, with a's token and ids (leaked), directly or after SET ROLE from a
-- session that claimed as a: nothing acked, nacks stale.
SET ROLE ob_sc_b;
SELECT idem_outbox_ack(token, ARRAY[id]) AS b_acks_with_a_token FROM got WHERE payload->>'n' = '1';
SELECT n.outcome AS b_nacks_with_a_token FROM got g, idem_outbox_nack(g.token, g.id, 'by b') n
 WHERE g.payload->>'n' = '1';
-- ... nor by naming a's scope, which b is no member of.
SET idem.scope = 'ob_sc_a';
SELECT idem_outbox_ack(token, ARRAY[id]) FROM got WHERE payload->>'n' = '1';
RESET idem.scope;
RESET ROLE;
-- a's events are untouched and still a's to settle.
SET ROLE ob_sc_a;
SELECT sum(idem_outbox_ack(token, ARRAY[id])) AS a_acks FROM got;
RESET ROLE;
SELECT payload, state, attempts, scope::regrole FROM idem_outbox WHERE topic = 'ob.sc' ORDER BY id;
SELECT count(*) AS look_alike_rows_untouched FROM ob_sc_b.idem_outbox_queue WHERE claim_token IS NULL;

DELETE FROM idem_outbox WHERE topic = 'ob.sc';
UPDATE idem_outbox_queue q SET available_at = p.available_at FROM parked p WHERE q.id = p.id;
DROP TABLE got;
DROP SCHEMA ob_sc_b CASCADE;
DROP ROLE ob_sc_a;
DROP ROLE ob_sc_b;
