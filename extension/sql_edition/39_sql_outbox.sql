-- The SQL edition of the outbox (outbox/outbox_stage.c, outbox_claim.c;
-- the ack, nack, prune, wait and backlog are in 39_sql_outbox_drain.sql,
-- after outbox_ack.c, outbox_prune.c, outbox_wait.c): the same rows, staged in
-- the caller's transaction into idem_outbox_queue, claimed in batches FOR
-- UPDATE SKIP LOCKED under a fenced lease (the first claim moves an event
-- into idem_outbox_claimed, a later one updates it there), acked by
-- marking it published where it is, per-key order kept across both tables.
--
-- The C edition walks the tables' indexes directly; this one states the
-- same thing in SQL, as 0.4.0 did: the batch is picked in MATERIALIZED
-- CTEs (SKIP LOCKED under IN (...) may return more than the limit), a row
-- changed since the snapshot is followed to its newest version and
-- checked again by FOR UPDATE, and the ack's UPDATE (or DELETE) and the
-- nack's UPDATE re-check token, state and scope against the newest
-- version.  Every snapshot finds an event in exactly one of the two
-- tables: its claim's DELETE from the queue and INSERT into
-- idem_outbox_claimed commit together.  Nothing wakes an idle drainer (no
-- shared memory): idem_outbox_wait polls.
-- (The request-path functions reach their idem__* functions through
-- casts; 21_sql_claims.sql says why.)

-- The event's checks (outbox_stage.c): topic 1 .. 255 bytes, a key not
-- empty (its SHA-256 is what per-key order compares), headers an object,
-- a delay not negative.  Host declares nothing.
-- @snippet stage_checks(topic, key, headers, delay)
IF pg_catalog.octet_length(%topic%) = 0 OR pg_catalog.octet_length(%topic%) > 255 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = 'topic must be between 1 and 255 bytes',
        DETAIL = pg_catalog.format('The topic given is %s bytes long.', pg_catalog.octet_length(%topic%));
END IF;
IF %key% = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'key must not be empty',
        HINT = 'Pass NULL for an event that needs no per-key order.';
END IF;
IF %headers% IS NOT NULL AND pg_catalog.jsonb_typeof(%headers%) <> 'object' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'headers must be a JSON object',
        DETAIL = 'Headers are stored as {"name": value, ...}.';
END IF;
IF %delay% < '0'::pg_catalog.interval THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'delay must not be negative',
        DETAIL = pg_catalog.format('The delay given is %s.', %delay%);
END IF;
-- @end

-- A key's SHA-256, of its bytes as the database stores them.
-- @snippet key_hash(key)
pg_catalog.sha256(pg_catalog.convert_to(%key%, pg_catalog.current_setting('server_encoding')))
-- @end

-- Per-key commit order (outbox_stage.c, lock_key_slots): the slots of
-- the keys (a NULL key has none), each locked FOR UPDATE until the
-- transaction ends, in ascending order (two batches of crossing keys wait,
-- never deadlock), before any id is drawn: a second stager of a key waits
-- for the first one's transaction, then draws a higher id.  A slot is the
-- first 16 bits of the key's SHA-256 with the scope's OID mixed in, masked
-- to the 16384 rows of idem_outbox_key_slots, as the C edition computes
-- it.  The rows are only locked, never updated: REPEATABLE READ goes on
-- after the wait without a serialization failure.  Host declares
-- s_scope, k_slots int4[] and k_locked int8.
-- @snippet lock_key_slots(keys)
k_slots := ARRAY(SELECT DISTINCT ((((pg_catalog.get_byte({{key_hash(k.v)}}, 0) << 8)
                                    | pg_catalog.get_byte({{key_hash(k.v)}}, 1))
                                   # (s_scope::pg_catalog.int8 & 16383)::pg_catalog.int4) & 16383)
                   FROM pg_catalog.unnest(%keys%) AS k(v) WHERE k.v IS NOT NULL ORDER BY 1);
IF pg_catalog.cardinality(k_slots) > 0 THEN
    PERFORM FROM @extschema@.idem_outbox_key_slots ks WHERE ks.slot = ANY (k_slots)
      ORDER BY ks.slot FOR UPDATE;
    GET DIAGNOSTICS k_locked = ROW_COUNT;
    IF k_locked <> pg_catalog.cardinality(k_slots) THEN
        RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = pg_catalog.format('pg_idem key slot %s is missing',
                (SELECT pg_catalog.min(m.v) FROM pg_catalog.unnest(k_slots) AS m(v)
                  WHERE NOT EXISTS (SELECT FROM @extschema@.idem_outbox_key_slots ks WHERE ks.slot = m.v))),
            DETAIL = 'Table idem_outbox_key_slots must hold the rows 0 to 16383 its install made.',
            HINT = 'Insert the missing rows: INSERT INTO idem_outbox_key_slots SELECT generate_series(0, 16383) ON CONFLICT DO NOTHING.';
    END IF;
END IF;
-- @end

-- Before a session's first stage, the id sequence is caught up with the
-- tables (core/sequences.c: after a logical-replication cut-over it
-- starts below the replicated ids); idem_sql.outbox_ids_checked says a
-- session did.  Catch-ups wait for one another (SHARE UPDATE EXCLUSIVE on
-- the queue), so that none moves the sequence back.  Host declares
-- c_highest bigint.
-- @snippet outbox_ids_catch_up()
IF pg_catalog.current_setting('idem_sql.outbox_ids_checked', true) IS DISTINCT FROM 'yes' THEN
    SELECT GREATEST((SELECT pg_catalog.max(q.id) FROM @extschema@.idem_outbox_queue q),
                    (SELECT pg_catalog.max(c.id) FROM @extschema@.idem_outbox_claimed c))
      INTO c_highest;
    IF c_highest > COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_outbox_id_seq'::pg_catalog.regclass), 0) THEN
        LOCK TABLE @extschema@.idem_outbox_queue IN SHARE UPDATE EXCLUSIVE MODE;
        IF c_highest > COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_outbox_id_seq'::pg_catalog.regclass), 0) THEN
            PERFORM pg_catalog.setval('@extschema@.idem_outbox_id_seq'::pg_catalog.regclass, c_highest + 1000000);
            RAISE LOG 'pg_idem advanced sequence "idem_outbox_id_seq" past %', c_highest
                USING DETAIL = 'Its position was not above what its tables hold, as after a logical-replication cut-over.';
        END IF;
    END IF;
    PERFORM pg_catalog.set_config('idem_sql.outbox_ids_checked', 'yes', false);
END IF;
-- @end

-- @before idem_outbox_stage_json
CREATE TYPE @extschema@.idem__outbox_stage_call AS (
    topic pg_catalog.text, payload pg_catalog.jsonb, payload_bytes pg_catalog.bytea, message_key pg_catalog.text,
    headers pg_catalog.jsonb, delay pg_catalog.interval, caller @extschema@.idem__caller);
-- Stage one event of the caller's scope in its transaction; its id.
CREATE FUNCTION @extschema@.idem__outbox_stage(args @extschema@.idem__outbox_stage_call)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    c_highest pg_catalog.int8;
    v_id pg_catalog.int8;
    k_slots pg_catalog.int4[];
    k_locked pg_catalog.int8;
BEGIN
    {{null_arg(args.topic, 1, topic, 'idem_outbox_stage')}}
    {{stage_checks(args.topic, args.message_key, args.headers, args.delay)}}
    IF args.payload IS NULL AND args.payload_bytes IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'payload must not be null',
            DETAIL = pg_catalog.format('Argument 2 of %s, payload, is null.', 'idem_outbox_stage');
    END IF;
    {{null_arg(args.delay, 5, delay, 'idem_outbox_stage')}}
    {{caller_scope(args.caller)}}
    IF args.message_key IS NOT NULL THEN
        {{lock_key_slots(ARRAY[args.message_key])}}
    END IF;
    {{outbox_ids_catch_up()}}
    INSERT INTO @extschema@.idem_outbox_queue AS q
           (topic, message_key, key_hash, payload, payload_bytes, headers, available_at, scope)
    VALUES (args.topic, args.message_key,
            CASE WHEN args.message_key IS NOT NULL THEN {{key_hash(args.message_key)}} END,
            args.payload, args.payload_bytes, args.headers,
            pg_catalog.clock_timestamp() + args.delay, s_scope)
    RETURNING q.id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'triggered_action_exception', MESSAGE = 'outbox event not staged',
            DETAIL = 'A BEFORE INSERT trigger on idem_outbox_queue skipped the row.';
    END IF;
    RETURN v_id;
END
$function$;
CREATE CAST (@extschema@.idem__outbox_stage_call AS pg_catalog.int8)
    WITH FUNCTION @extschema@.idem__outbox_stage(@extschema@.idem__outbox_stage_call);
-- @end

-- @symbol idem_outbox_stage_json
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, NULL, $3, $4, $5, CURRENT_USER)::@extschema@.idem__outbox_stage_call::pg_catalog.int8;
END
$function$
-- @end

-- @symbol idem_outbox_stage_bytes
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, NULL, $2, $3, $4, $5, CURRENT_USER)::@extschema@.idem__outbox_stage_call::pg_catalog.int8;
END
$function$
-- @end

-- @before idem_outbox_stage_batch
CREATE TYPE @extschema@.idem__outbox_stage_batch_call AS (
    topic pg_catalog.text, payloads pg_catalog.jsonb[], message_keys pg_catalog.text[],
    headers pg_catalog.jsonb[], delay pg_catalog.interval, caller @extschema@.idem__caller);
-- One event per payload, in array order, in one INSERT; the ids in order.
CREATE FUNCTION @extschema@.idem__outbox_stage_batch(args @extschema@.idem__outbox_stage_batch_call)
RETURNS pg_catalog.int8[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    c_highest pg_catalog.int8;
    v_n pg_catalog.int4 := COALESCE(pg_catalog.cardinality(args.payloads), 0);
    v_ids pg_catalog.int8[];
    v_bad pg_catalog.int4;
    k_slots pg_catalog.int4[];
    k_locked pg_catalog.int8;
BEGIN
    {{null_arg(args.topic, 1, topic, 'idem_outbox_stage_batch')}}
    {{stage_checks(args.topic, NULL::pg_catalog.text, NULL::pg_catalog.jsonb, '0'::pg_catalog.interval)}}
    {{null_arg(args.payloads, 2, payloads, 'idem_outbox_stage_batch')}}
    IF pg_catalog.array_ndims(args.payloads) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'array_subscript_error', MESSAGE = 'payloads must be a one-dimensional array',
            DETAIL = pg_catalog.format('The array given has %s dimensions.', pg_catalog.array_ndims(args.payloads));
    END IF;
    IF v_n > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'program_limit_exceeded',
            MESSAGE = 'at most 10000 events can be staged in one batch',
            DETAIL = pg_catalog.format('The batch has %s payloads.', v_n),
            HINT = 'Split it into several calls in the same transaction.';
    END IF;
    v_bad := (SELECT pg_catalog.min(o) FROM pg_catalog.unnest(args.payloads) WITH ORDINALITY AS p(v, o) WHERE p.v IS NULL);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'payloads must not contain nulls',
            DETAIL = pg_catalog.format('Payload %s is NULL.', v_bad);
    END IF;
    IF pg_catalog.array_ndims(args.message_keys) > 1 OR pg_catalog.array_ndims(args.headers) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'array_subscript_error',
            MESSAGE = pg_catalog.format('%s must be a one-dimensional array',
                                        CASE WHEN pg_catalog.array_ndims(args.message_keys) > 1 THEN 'keys' ELSE 'headers' END),
            DETAIL = pg_catalog.format('The array given has %s dimensions.',
                                       GREATEST(pg_catalog.array_ndims(args.message_keys), pg_catalog.array_ndims(args.headers)));
    END IF;
    IF args.message_keys IS NOT NULL AND COALESCE(pg_catalog.cardinality(args.message_keys), 0) <> v_n THEN
        RAISE EXCEPTION USING ERRCODE = 'array_subscript_error', MESSAGE = 'keys must have one element per payload',
            DETAIL = pg_catalog.format('There are %s payloads and %s keys.', v_n, pg_catalog.cardinality(args.message_keys)),
            HINT = 'Pass NULL for no keys at all, or a NULL element for one event.';
    END IF;
    IF args.headers IS NOT NULL AND COALESCE(pg_catalog.cardinality(args.headers), 0) <> v_n THEN
        RAISE EXCEPTION USING ERRCODE = 'array_subscript_error', MESSAGE = 'headers must have one element per payload',
            DETAIL = pg_catalog.format('There are %s payloads and %s headers.', v_n, pg_catalog.cardinality(args.headers)),
            HINT = 'Pass NULL for no headers at all, or a NULL element for one event.';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.unnest(args.message_keys) AS k(v) WHERE k.v = '') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'key must not be empty',
            HINT = 'Pass NULL for an event that needs no per-key order.';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.unnest(args.headers) AS h(v)
                WHERE h.v IS NOT NULL AND pg_catalog.jsonb_typeof(h.v) <> 'object') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'headers must be a JSON object',
            DETAIL = 'Headers are stored as {"name": value, ...}.';
    END IF;
    {{null_arg(args.delay, 5, delay, 'idem_outbox_stage_batch')}}
    {{stage_checks(args.topic, NULL::pg_catalog.text, NULL::pg_catalog.jsonb, args.delay)}}
    {{caller_scope(args.caller)}}
    IF v_n = 0 THEN
        RETURN '{}'::pg_catalog.int8[];
    END IF;
    {{lock_key_slots(args.message_keys)}}
    {{outbox_ids_catch_up()}}
    -- Ids drawn in array order (the default's nextval, row by row in
    -- ordinality order), so per-key order follows the arrays.
    WITH staged AS (
        INSERT INTO @extschema@.idem_outbox_queue AS q
               (topic, message_key, key_hash, payload, headers, available_at, scope)
        SELECT args.topic, args.message_keys[e.o],
               CASE WHEN args.message_keys[e.o] IS NOT NULL THEN {{key_hash(args.message_keys[e.o])}} END,
               e.payload, args.headers[e.o], pg_catalog.clock_timestamp() + args.delay, s_scope
          FROM pg_catalog.unnest(args.payloads) WITH ORDINALITY AS e(payload, o)
         ORDER BY e.o
        RETURNING q.id)
    SELECT pg_catalog.array_agg(s.id ORDER BY s.id) INTO v_ids FROM staged s;
    RETURN v_ids;
END
$function$;
CREATE CAST (@extschema@.idem__outbox_stage_batch_call AS pg_catalog.int8[])
    WITH FUNCTION @extschema@.idem__outbox_stage_batch(@extschema@.idem__outbox_stage_batch_call);
-- @end

-- @symbol idem_outbox_stage_batch
LANGUAGE plpgsql VOLATILE ROWS 100 SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN QUERY SELECT pg_catalog.unnest(ROW($1, $2, $3, $4, $5, CURRENT_USER)
                 ::@extschema@.idem__outbox_stage_batch_call::pg_catalog.int8[]);
END
$function$
-- @end

-- Per-key order's probe: is an event of o's scope and key with a lower
-- id pending in either table?  An event not yet claimed is in the queue,
-- one leased or backing off in idem_outbox_claimed, and a claim moves an
-- event between them in one transaction, so a snapshot finds a pending
-- earlier event in one table or the other.  o is a row of either table.
-- @snippet outbox_key_held(o)
(EXISTS (SELECT FROM @extschema@.idem_outbox_queue e
          WHERE e.key_hash = %o%.key_hash AND e.state = 'pending' AND e.scope = %o%.scope AND e.id < %o%.id)
 OR EXISTS (SELECT FROM @extschema@.idem_outbox_claimed e
             WHERE e.key_hash = %o%.key_hash AND e.state = 'pending' AND e.scope = %o%.scope AND e.id < %o%.id))
-- @end

-- A claim's candidates in one table (the queue, or idem_outbox_claimed
-- for events whose lease ran out or whose backoff passed): at most limit
-- claimable events of the scope, in the order they became claimable,
-- locked, skipping those another transaction holds.  Host declares v_now.
-- @snippet outbox_claimable(tbl, scope, limit)
SELECT c.id, c.available_at FROM @extschema@.%tbl% c
 WHERE c.scope = %scope% AND c.state = 'pending' AND c.available_at <= v_now
   AND (c.key_hash IS NULL OR NOT {{outbox_key_held(c)}})
 ORDER BY c.available_at, c.id
 LIMIT %limit% FOR UPDATE SKIP LOCKED
-- @end

-- Of the two tables' candidates, the earliest (available_at, then id),
-- at most limit, each marked with its table.
-- @snippet outbox_earliest(in_queue, in_claimed, limit)
SELECT o.id, o.in_queue
  FROM (SELECT q.id, q.available_at, true AS in_queue FROM %in_queue% q
        UNION ALL
        SELECT c.id, c.available_at, false FROM %in_claimed% c) o
 ORDER BY o.available_at, o.id
 LIMIT %limit%
-- @end

-- @before idem_outbox_claim
CREATE TYPE @extschema@.idem__outbox_claim_call AS (
    batch pg_catalog.int4, lease pg_catalog.interval, caller @extschema@.idem__caller);
CREATE TYPE @extschema@.idem__outbox_claimed AS (
    id pg_catalog.int8, topic pg_catalog.text, key pg_catalog.text, payload pg_catalog.jsonb,
    payload_bytes pg_catalog.bytea, headers pg_catalog.jsonb, attempts pg_catalog.int4,
    created_at pg_catalog.timestamptz, claim_token pg_catalog.uuid, lease_expires_at pg_catalog.timestamptz);
-- Lease at most batch claimable events of the caller's scope (then of the
-- shared scope of events from before 0.3.0) to a fresh token, counting
-- the attempt; one whose attempts are used up (its last lease ran out)
-- goes dead instead, never to be handed out again.  In id order.
--
-- Each table gives at most batch candidates of a scope, locked; the
-- earliest batch of their union (available_at, then id) are taken.  The
-- others stay locked until the claim's transaction ends (other drainers
-- skip them meanwhile) and are claimable again after it.  A candidate
-- from the queue is moved: deleted there and inserted into
-- idem_outbox_claimed with every column and its lease; one from
-- idem_outbox_claimed is updated where it is.
CREATE FUNCTION @extschema@.idem__outbox_claim(args @extschema@.idem__outbox_claim_call)
RETURNS @extschema@.idem__outbox_claimed[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    a_max_ms pg_catalog.int8;
    a_us pg_catalog.numeric;
    a_text pg_catalog.text;
    v_lease pg_catalog.interval;
    v_max_attempts pg_catalog.int8;
    v_token CONSTANT pg_catalog.uuid := pg_catalog.gen_random_uuid();
    v_now pg_catalog.timestamptz;
    v_rows @extschema@.idem__outbox_claimed[];
    v_moved pg_catalog.int8;
    v_inserted pg_catalog.int8;
BEGIN
    {{null_arg(args.batch, 1, batch, 'idem_outbox_claim')}}
    IF args.batch < 1 OR args.batch > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'batch must be between 1 and 10000',
            DETAIL = pg_catalog.format('The batch given is %s.', args.batch);
    END IF;
    {{lease_arg(v_lease, args.lease, lease, false, idem.lease)}}
    {{caller_scope(args.caller)}}
    {{setting_int(v_max_attempts, idem.outbox_max_attempts)}}
    -- The scan's bound; the lease starts when the rows are locked.
    v_now := pg_catalog.clock_timestamp();
    WITH own_queue AS MATERIALIZED ({{outbox_claimable(idem_outbox_queue, s_scope, args.batch)}}),
    own_claimed AS MATERIALIZED ({{outbox_claimable(idem_outbox_claimed, s_scope, args.batch)}}),
    own AS MATERIALIZED ({{outbox_earliest(own_queue, own_claimed, args.batch)}}),
    -- The shared scope 0 only for what the caller's own left of the batch
    -- (and never twice for a caller whose scope is 0 itself).
    shared_queue AS MATERIALIZED ({{outbox_claimable(idem_outbox_queue, 0::pg_catalog.oid,
        CASE WHEN s_scope = 0 THEN 0 ELSE GREATEST(args.batch - (SELECT pg_catalog.count(*) FROM own), 0) END)}}),
    shared_claimed AS MATERIALIZED ({{outbox_claimable(idem_outbox_claimed, 0::pg_catalog.oid,
        CASE WHEN s_scope = 0 THEN 0 ELSE GREATEST(args.batch - (SELECT pg_catalog.count(*) FROM own), 0) END)}}),
    shared AS MATERIALIZED ({{outbox_earliest(shared_queue, shared_claimed,
        GREATEST(args.batch - (SELECT pg_catalog.count(*) FROM own), 0))}}),
    picked AS (SELECT o.id, o.in_queue FROM own o UNION ALL SELECT s.id, s.in_queue FROM shared s),
    moved AS (
        DELETE FROM @extschema@.idem_outbox_queue q USING picked p
         WHERE q.id = p.id AND p.in_queue
        RETURNING q.*),
    inserted AS (
        INSERT INTO @extschema@.idem_outbox_claimed AS c
               (id, topic, message_key, key_hash, payload, payload_bytes, headers, state, attempts, last_error,
                available_at, claim_token, created_at, published_at, dead_at, scope)
        SELECT m.id, m.topic, m.message_key, m.key_hash, m.payload, m.payload_bytes, m.headers,
               CASE WHEN m.attempts >= v_max_attempts THEN 'dead' ELSE 'pending' END,
               CASE WHEN m.attempts >= v_max_attempts THEN m.attempts ELSE m.attempts + 1 END,
               CASE WHEN m.attempts >= v_max_attempts AND m.claim_token IS NOT NULL
                    THEN 'lease expired during the last attempt' ELSE m.last_error END,
               CASE WHEN m.attempts >= v_max_attempts THEN m.available_at
                    ELSE pg_catalog.clock_timestamp() + v_lease END,
               CASE WHEN m.attempts >= v_max_attempts THEN NULL ELSE v_token END,
               m.created_at, m.published_at,
               CASE WHEN m.attempts >= v_max_attempts THEN pg_catalog.clock_timestamp() END,
               m.scope
          FROM moved m
        RETURNING c.id, c.topic, c.message_key, c.payload, c.payload_bytes, c.headers, c.attempts,
                  c.created_at, c.claim_token, c.available_at, c.state),
    updated AS (
        UPDATE @extschema@.idem_outbox_claimed c
           SET attempts = CASE WHEN c.attempts >= v_max_attempts THEN c.attempts ELSE c.attempts + 1 END,
               state = CASE WHEN c.attempts >= v_max_attempts THEN 'dead' ELSE c.state END,
               dead_at = CASE WHEN c.attempts >= v_max_attempts THEN pg_catalog.clock_timestamp() END,
               last_error = CASE WHEN c.attempts >= v_max_attempts AND c.claim_token IS NOT NULL
                                 THEN 'lease expired during the last attempt' ELSE c.last_error END,
               claim_token = CASE WHEN c.attempts >= v_max_attempts THEN NULL ELSE v_token END,
               available_at = CASE WHEN c.attempts >= v_max_attempts THEN c.available_at
                                   ELSE pg_catalog.clock_timestamp() + v_lease END
          FROM picked p
         WHERE c.id = p.id AND NOT p.in_queue
        RETURNING c.id, c.topic, c.message_key, c.payload, c.payload_bytes, c.headers, c.attempts,
                  c.created_at, c.claim_token, c.available_at, c.state)
    SELECT (SELECT pg_catalog.count(*) FROM moved), (SELECT pg_catalog.count(*) FROM inserted),
           (SELECT pg_catalog.array_agg(ROW(t.id, t.topic, t.message_key, t.payload, t.payload_bytes, t.headers,
                                            t.attempts, t.created_at, t.claim_token, t.available_at)
                                        ::@extschema@.idem__outbox_claimed ORDER BY t.id)
              FROM (SELECT * FROM inserted UNION ALL SELECT * FROM updated) t WHERE t.state = 'pending')
      INTO v_moved, v_inserted, v_rows;
    -- A BEFORE INSERT trigger on idem_outbox_claimed that skipped a row
    -- would lose the event the queue gave up: nothing of the claim stays.
    IF v_inserted <> v_moved THEN
        RAISE EXCEPTION USING ERRCODE = 'triggered_action_exception', MESSAGE = 'outbox event not claimed',
            DETAIL = 'A BEFORE INSERT trigger on idem_outbox_claimed skipped the row.';
    END IF;
    RETURN COALESCE(v_rows, '{}');
END
$function$;
CREATE CAST (@extschema@.idem__outbox_claim_call AS @extschema@.idem__outbox_claimed[])
    WITH FUNCTION @extschema@.idem__outbox_claim(@extschema@.idem__outbox_claim_call);
-- @end

-- @symbol idem_outbox_claim
LANGUAGE plpgsql VOLATILE ROWS 100 SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN QUERY SELECT c.* FROM pg_catalog.unnest(ROW($1, $2, CURRENT_USER)
                 ::@extschema@.idem__outbox_claim_call::@extschema@.idem__outbox_claimed[]) AS c;
END
$function$
-- @end
