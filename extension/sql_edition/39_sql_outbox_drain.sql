-- The SQL edition of the outbox's drainer side after the claim
-- (outbox/outbox_ack.c, outbox_prune.c, outbox_wait.c): the ack, the nack,
-- the prune, the wait, the backlog and hand edits through the idem_outbox
-- view.  Staging and the claim, and what the two files share (the
-- snippets), are in 39_sql_outbox.sql, whose head says how the SQL
-- edition states the C edition's outbox.

-- @before idem_outbox_ack
CREATE TYPE @extschema@.idem__outbox_ack_call AS (
    token pg_catalog.uuid, ids pg_catalog.int8[], caller @extschema@.idem__caller);
-- Publish the events among ids that the token still holds: marked
-- published where they are in idem_outbox_claimed, the row otherwise as
-- the claim left it (or deleted, idem.outbox_archive = off).  Held means
-- pending, not only the token: a published event keeps its token, and a
-- second ack of it publishes nothing.
CREATE FUNCTION @extschema@.idem__outbox_ack(args @extschema@.idem__outbox_ack_call)
RETURNS pg_catalog.int4
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    v_archive pg_catalog.bool;
    v_acked pg_catalog.int4;
BEGIN
    {{null_arg(args.token, 1, token, 'idem_outbox_ack')}}
    {{null_arg(args.ids, 2, ids, 'idem_outbox_ack')}}
    IF pg_catalog.array_ndims(args.ids) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'array_subscript_error', MESSAGE = 'ids must be a one-dimensional array',
            DETAIL = pg_catalog.format('The array given has %s dimensions.', pg_catalog.array_ndims(args.ids));
    END IF;
    IF pg_catalog.array_position(args.ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'ids must not contain nulls',
            DETAIL = 'An element of the array given is null: an event id is never null.';
    END IF;
    {{caller_scope(args.caller)}}
    BEGIN
        v_archive := COALESCE(NULLIF(pg_catalog.current_setting('idem.outbox_archive', true), ''), 'on')::pg_catalog.bool;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('parameter "%s" requires a Boolean value', 'idem.outbox_archive');
    END;
    IF v_archive THEN
        UPDATE @extschema@.idem_outbox_claimed c
           SET state = 'published', published_at = pg_catalog.clock_timestamp()
         WHERE c.id = ANY (args.ids) AND c.claim_token = args.token AND c.state = 'pending'
           AND c.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid]);
    ELSE
        DELETE FROM @extschema@.idem_outbox_claimed c
         WHERE c.id = ANY (args.ids) AND c.claim_token = args.token AND c.state = 'pending'
           AND c.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid]);
    END IF;
    GET DIAGNOSTICS v_acked = ROW_COUNT;
    RETURN v_acked;
END
$function$;
CREATE CAST (@extschema@.idem__outbox_ack_call AS pg_catalog.int4)
    WITH FUNCTION @extschema@.idem__outbox_ack(@extschema@.idem__outbox_ack_call);
-- @end

-- @symbol idem_outbox_ack
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, CURRENT_USER)::@extschema@.idem__outbox_ack_call::pg_catalog.int4;
END
$function$
-- @end

-- The outbox's backoff schedule (idem.outbox_backoff: durations, the last
-- repeating), as an interval[]; target is an interval[] variable.
-- @snippet outbox_backoff(target)
DECLARE
    b_raw CONSTANT pg_catalog.text := COALESCE(NULLIF(pg_catalog.current_setting('idem.outbox_backoff', true), ''),
                                               '5s, 30s, 2min, 5min, 15min, 30min');
    b_item pg_catalog.text;
    b_m pg_catalog.text[];
BEGIN
    %target% := '{}';
    FOREACH b_item IN ARRAY pg_catalog.string_to_array(b_raw, ',') LOOP
        b_m := pg_catalog.regexp_match(b_item, '^\s*(\d+(\.\d+)?)\s*(us|ms|s|min|h|d)?\s*$');
        IF b_m IS NULL OR pg_catalog.cardinality(%target%) = 32 THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = pg_catalog.format('invalid value for parameter "%s": "%s"', 'idem.outbox_backoff', b_raw),
                DETAIL = CASE WHEN b_m IS NULL THEN pg_catalog.format('"%s" is not a duration such as 5s, 2min or 1h.', pg_catalog.btrim(b_item))
                              ELSE 'At most 32 steps are allowed.' END;
        END IF;
        %target% := %target% || (b_m[1] || ' ' || CASE COALESCE(b_m[3], 'ms') WHEN 'us' THEN 'microseconds'
                                 WHEN 'ms' THEN 'milliseconds' WHEN 's' THEN 'seconds' WHEN 'min' THEN 'minutes'
                                 WHEN 'h' THEN 'hours' ELSE 'days' END)::pg_catalog.interval;
    END LOOP;
END;
-- @end

-- @before idem_outbox_nack
CREATE TYPE @extschema@.idem__outbox_nack_call AS (
    token pg_catalog.uuid, id pg_catalog.int8, error pg_catalog.text, caller @extschema@.idem__caller);
-- A failed publish: retry after the backoff, dead after the last
-- attempt, or stale when the token no longer holds the event.
CREATE FUNCTION @extschema@.idem__outbox_nack(args @extschema@.idem__outbox_nack_call)
RETURNS @extschema@.idem_outbox_nack_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    v_max_attempts pg_catalog.int8;
    v_schedule pg_catalog.interval[];
    v_out @extschema@.idem_outbox_nack_result;
    v_state pg_catalog.text;
BEGIN
    {{null_arg(args.token, 1, token, 'idem_outbox_nack')}}
    {{null_arg(args.id, 2, id, 'idem_outbox_nack')}}
    {{null_arg(args.error, 3, error, 'idem_outbox_nack')}}
    {{caller_scope(args.caller)}}
    {{setting_int(v_max_attempts, idem.outbox_max_attempts)}}
    {{outbox_backoff(v_schedule)}}
    -- Held as the ack's: pending, with the token (a published event keeps it).
    UPDATE @extschema@.idem_outbox_claimed c
       SET last_error = args.error, claim_token = NULL,
           state = CASE WHEN c.attempts >= v_max_attempts THEN 'dead' ELSE c.state END,
           dead_at = CASE WHEN c.attempts >= v_max_attempts THEN pg_catalog.clock_timestamp() ELSE c.dead_at END,
           available_at = CASE WHEN c.attempts >= v_max_attempts THEN c.available_at
                               ELSE pg_catalog.clock_timestamp()
                                    + v_schedule[LEAST(GREATEST(c.attempts, 1), pg_catalog.cardinality(v_schedule))] END
     WHERE c.id = args.id AND c.claim_token = args.token AND c.state = 'pending'
       AND c.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid])
    RETURNING c.attempts, c.state INTO v_out.attempts, v_state;
    IF NOT FOUND THEN
        v_out.outcome := 'stale';
    ELSIF v_state = 'dead' THEN
        v_out.outcome := 'dead';
    ELSE
        v_out.outcome := 'retry';
        v_out.retry_after := v_schedule[LEAST(GREATEST(v_out.attempts, 1), pg_catalog.cardinality(v_schedule))];
    END IF;
    RETURN v_out;
END
$function$;
CREATE CAST (@extschema@.idem__outbox_nack_call AS @extschema@.idem_outbox_nack_result)
    WITH FUNCTION @extschema@.idem__outbox_nack(@extschema@.idem__outbox_nack_call);
-- @end

-- @symbol idem_outbox_nack
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, CURRENT_USER)::@extschema@.idem__outbox_nack_call::@extschema@.idem_outbox_nack_result;
END
$function$
-- @end

-- The prune (outbox_prune.c), admin only, as the tables' owner: at most
-- batch events finished before now - older_than, first the published
-- ones of idem_outbox_claimed (by published_at, which its BRIN index
-- serves), then its dead ones (by dead_at, its partial index's), then
-- published or dead ones a hand edit left in the queue.  Each step locks
-- what it picked (SKIP LOCKED: a row a claim, an ack or a redrive holds
-- is left for the next pass) and deletes it only if the newest version is
-- still finished.
-- @symbol idem_outbox_prune
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_older_than ALIAS FOR $1;
    v_batch ALIAS FOR $2;
    v_deleted pg_catalog.int8;
    v_more pg_catalog.int8 := 0;
    v_cutoff pg_catalog.timestamptz;
BEGIN
    {{null_arg(v_older_than, 1, older_than, 'idem_outbox_prune')}}
    IF v_older_than < '0'::pg_catalog.interval THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'older_than must not be negative',
            DETAIL = pg_catalog.format('The older_than given is %s.', v_older_than);
    END IF;
    {{null_arg(v_batch, 2, batch, 'idem_outbox_prune')}}
    IF v_batch < 1 OR v_batch > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'batch must be between 1 and 1000000',
            DETAIL = pg_catalog.format('The batch given is %s.', v_batch);
    END IF;
    -- A value, not clock_timestamp() in the scans: an index condition.
    v_cutoff := pg_catalog.clock_timestamp() - v_older_than;
    WITH picked AS MATERIALIZED (
        SELECT c.id FROM @extschema@.idem_outbox_claimed c
         WHERE c.state = 'published' AND c.published_at < v_cutoff
         LIMIT v_batch FOR UPDATE SKIP LOCKED)
    DELETE FROM @extschema@.idem_outbox_claimed c
     WHERE c.id = ANY (ARRAY(SELECT b.id FROM picked b))
       AND c.state = 'published' AND c.published_at < v_cutoff;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    IF v_deleted < v_batch THEN
        WITH picked AS MATERIALIZED (
            SELECT c.id FROM @extschema@.idem_outbox_claimed c
             WHERE c.state = 'dead' AND c.dead_at < v_cutoff
             LIMIT v_batch - v_deleted FOR UPDATE SKIP LOCKED)
        DELETE FROM @extschema@.idem_outbox_claimed c
         WHERE c.id = ANY (ARRAY(SELECT b.id FROM picked b))
           AND c.state = 'dead' AND c.dead_at < v_cutoff;
        GET DIAGNOSTICS v_more = ROW_COUNT;
        v_deleted := v_deleted + v_more;
        v_more := 0;
    END IF;
    IF v_deleted < v_batch THEN
        WITH picked AS MATERIALIZED (
            SELECT q.id FROM @extschema@.idem_outbox_queue q
             WHERE q.state IN ('published', 'dead')
               AND COALESCE(q.published_at, q.dead_at) < v_cutoff
             LIMIT v_batch - v_deleted FOR UPDATE SKIP LOCKED)
        DELETE FROM @extschema@.idem_outbox_queue q
         WHERE q.id = ANY (ARRAY(SELECT b.id FROM picked b))
           AND q.state IN ('published', 'dead')
           AND COALESCE(q.published_at, q.dead_at) < v_cutoff;
        GET DIAGNOSTICS v_more = ROW_COUNT;
    END IF;
    RETURN v_deleted + v_more;
END
$function$
-- @end

-- @before idem_outbox_wait
CREATE TYPE @extschema@.idem__outbox_wait_call AS (timeout pg_catalog.interval, caller @extschema@.idem__caller);
-- True as soon as an event of the caller's scope is claimable, false once
-- timeout has passed: a probe with a snapshot of its own, then a sleep of
-- 1 ms doubling to 50 ms (or until the next event of the scope is due).
CREATE FUNCTION @extschema@.idem__outbox_wait(args @extschema@.idem__outbox_wait_call)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    a_max_ms pg_catalog.int8;
    a_us pg_catalog.numeric;
    a_text pg_catalog.text;
    v_timeout pg_catalog.interval;
    v_deadline pg_catalog.timestamptz;
    v_now pg_catalog.timestamptz;
    v_found pg_catalog.bool;
    v_next pg_catalog.timestamptz;
    v_poll_ms pg_catalog.int4 := 1;
BEGIN
    {{null_arg(args.timeout, 1, timeout, 'idem_outbox_wait')}}
    {{lease_arg(v_timeout, args.timeout, timeout, true, idem.lease)}}
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'active_sql_transaction',
            MESSAGE = 'idem_outbox_wait must run in a READ COMMITTED transaction',
            DETAIL = 'Under REPEATABLE READ or SERIALIZABLE the wait could never see new events.',
            HINT = 'Call it outside an explicit transaction block.';
    END IF;
    {{caller_scope(args.caller)}}
    v_deadline := pg_catalog.clock_timestamp() + v_timeout;
    LOOP
        v_now := pg_catalog.clock_timestamp();
        -- Claimable in either table (the queue's new events, or
        -- idem_outbox_claimed's expired leases and passed backoffs), and
        -- the next one due in either.
        SELECT EXISTS (SELECT FROM @extschema@.idem_outbox_queue o
                        WHERE o.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid]) AND o.state = 'pending'
                          AND o.available_at <= v_now
                          AND (o.key_hash IS NULL OR NOT {{outbox_key_held(o)}}))
               OR EXISTS (SELECT FROM @extschema@.idem_outbox_claimed o
                           WHERE o.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid]) AND o.state = 'pending'
                             AND o.available_at <= v_now
                             AND (o.key_hash IS NULL OR NOT {{outbox_key_held(o)}})),
               LEAST((SELECT pg_catalog.min(q.available_at) FROM @extschema@.idem_outbox_queue q
                       WHERE q.scope = s_scope AND q.state = 'pending' AND q.available_at > v_now),
                     (SELECT pg_catalog.min(q.available_at) FROM @extschema@.idem_outbox_queue q
                       WHERE q.scope = 0::pg_catalog.oid AND q.state = 'pending' AND q.available_at > v_now),
                     (SELECT pg_catalog.min(c.available_at) FROM @extschema@.idem_outbox_claimed c
                       WHERE c.scope = s_scope AND c.state = 'pending' AND c.available_at > v_now),
                     (SELECT pg_catalog.min(c.available_at) FROM @extschema@.idem_outbox_claimed c
                       WHERE c.scope = 0::pg_catalog.oid AND c.state = 'pending' AND c.available_at > v_now))
          INTO v_found, v_next;
        IF v_found OR pg_catalog.clock_timestamp() >= v_deadline THEN
            RETURN v_found;
        END IF;
        PERFORM pg_catalog.pg_sleep(LEAST(v_poll_ms / 1000.0,
            GREATEST(EXTRACT(epoch FROM LEAST(v_deadline, COALESCE(v_next, v_deadline)) - pg_catalog.clock_timestamp()), 0)));
        v_poll_ms := LEAST(v_poll_ms * 2, 50);
    END LOOP;
END
$function$;
CREATE CAST (@extschema@.idem__outbox_wait_call AS pg_catalog.bool)
    WITH FUNCTION @extschema@.idem__outbox_wait(@extschema@.idem__outbox_wait_call);
-- @end

-- @symbol idem_outbox_wait
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, CURRENT_USER)::@extschema@.idem__outbox_wait_call::pg_catalog.bool;
END
$function$
-- @end

-- @before idem_outbox_backlog
CREATE TYPE @extschema@.idem__outbox_backlog_call AS (caller @extschema@.idem__caller);
CREATE TYPE @extschema@.idem__outbox_backlog_row AS (
    topic pg_catalog.text, state pg_catalog.text, events pg_catalog.int8,
    oldest_created_at pg_catalog.timestamptz, next_available_at pg_catalog.timestamptz);
-- The caller's unpublished events by topic and state; no payload, no key.
CREATE FUNCTION @extschema@.idem__outbox_backlog(args @extschema@.idem__outbox_backlog_call)
RETURNS @extschema@.idem__outbox_backlog_row[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    v_rows @extschema@.idem__outbox_backlog_row[];
BEGIN
    {{caller_scope(args.caller)}}
    SELECT pg_catalog.array_agg(ROW(b.topic, b.state, b.events, b.oldest, b.next)
                                ::@extschema@.idem__outbox_backlog_row ORDER BY b.topic, b.state)
      INTO v_rows
      FROM (SELECT o.topic, s.state, pg_catalog.count(*) AS events, pg_catalog.min(o.created_at) AS oldest,
                   pg_catalog.min(o.available_at) AS next
              FROM (SELECT q.topic, q.state, q.created_at, q.available_at, q.claim_token, q.scope
                      FROM @extschema@.idem_outbox_queue q
                    UNION ALL
                    SELECT c.topic, c.state, c.created_at, c.available_at, c.claim_token, c.scope
                      FROM @extschema@.idem_outbox_claimed c
                     WHERE c.state = 'pending' OR c.state = 'dead') o,
                   LATERAL (SELECT CASE WHEN o.state = 'dead' THEN 'dead'
                                        WHEN o.available_at <= pg_catalog.clock_timestamp() THEN 'ready'
                                        WHEN o.claim_token IS NOT NULL THEN 'leased'
                                        ELSE 'delayed' END AS state) s
             WHERE o.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid]) AND o.state IN ('pending', 'dead')
             GROUP BY o.topic, s.state) b;
    RETURN COALESCE(v_rows, '{}');
END
$function$;
CREATE CAST (@extschema@.idem__outbox_backlog_call AS @extschema@.idem__outbox_backlog_row[])
    WITH FUNCTION @extschema@.idem__outbox_backlog(@extschema@.idem__outbox_backlog_call);
-- @end

-- @symbol idem_outbox_backlog
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN QUERY SELECT b.* FROM pg_catalog.unnest(ROW(CURRENT_USER)
                 ::@extschema@.idem__outbox_backlog_call::@extschema@.idem__outbox_backlog_row[]) AS b;
END
$function$
-- @end

-- Hand edits through the idem_outbox view land where the row is (the
-- queue, or idem_outbox_claimed: the same columns).  The extension never
-- writes through the view; its callers need the tables' privileges.
-- @symbol idem_outbox_view_write
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF TG_WHEN <> 'INSTEAD OF' OR TG_LEVEL <> 'ROW' OR TG_OP = 'INSERT' THEN
        RAISE EXCEPTION USING ERRCODE = 'trigger_protocol_violated',
            MESSAGE = 'idem_outbox_view_write must fire INSTEAD OF UPDATE OR DELETE FOR EACH ROW',
            DETAIL = 'It is the idem_outbox view''s trigger.';
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM @extschema@.idem_outbox_queue q WHERE q.id = OLD.id;
        IF NOT FOUND THEN
            DELETE FROM @extschema@.idem_outbox_claimed c WHERE c.id = OLD.id;
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
        END IF;
        RETURN OLD;
    END IF;
    UPDATE @extschema@.idem_outbox_queue q
       SET id = NEW.id, topic = NEW.topic, message_key = NEW.message_key, key_hash = NEW.key_hash,
           payload = NEW.payload, payload_bytes = NEW.payload_bytes, headers = NEW.headers, state = NEW.state,
           attempts = NEW.attempts, last_error = NEW.last_error, available_at = NEW.available_at,
           claim_token = NEW.claim_token, created_at = NEW.created_at, published_at = NEW.published_at,
           dead_at = NEW.dead_at, scope = NEW.scope
     WHERE q.id = OLD.id;
    IF NOT FOUND THEN
        UPDATE @extschema@.idem_outbox_claimed c
           SET id = NEW.id, topic = NEW.topic, message_key = NEW.message_key, key_hash = NEW.key_hash,
               payload = NEW.payload, payload_bytes = NEW.payload_bytes, headers = NEW.headers, state = NEW.state,
               attempts = NEW.attempts, last_error = NEW.last_error, available_at = NEW.available_at,
               claim_token = NEW.claim_token, created_at = NEW.created_at, published_at = NEW.published_at,
               dead_at = NEW.dead_at, scope = NEW.scope
         WHERE c.id = OLD.id;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN NEW;
END
$function$
-- @end
