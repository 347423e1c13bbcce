-- The SQL edition of the inbox (inbox/inbox.c, inbox_failure.c): each
-- delivered message processed once, in the consumer's transaction, with a
-- cap on attempts and dead letters staged in the outbox.
--
-- idem_inbox_begin inserts the row, or takes a failed one over, with
-- state = 'processing'; that write holds the row until the consumer's
-- transaction ends, so a concurrent delivery of the same message waits on
-- it (ON CONFLICT waits for an in-flight inserter, an UPDATE for an
-- in-flight updater) and then sees the outcome: done (duplicate), or
-- rolled back (it processes).
--
-- The cap, and what it counts.  Everything begin writes rolls back with a
-- failed attempt, so a failure is counted only by a write that commits:
-- idem_inbox_fail's, which the clients make in the attempt's own
-- transaction after ROLLBACK TO a savepoint taken after begin (the row
-- stays locked by that transaction throughout, so no concurrent delivery
-- starts from a count that misses it), or in a transaction of its own
-- after a rollback.  The C edition also records, from shared memory, an
-- attempt whose session ended first (a client that crashed, a connection
-- that dropped, a terminated backend) and holds the message for it in
-- between; plain SQL keeps nothing that survives the attempt's rollback
-- (a session's settings roll back with it), so here such an attempt is
-- not counted, and the message runs once more.  The guide's table
-- (docs/guides/managed-postgresql.md) states it.
--
-- After a rollback the failure's recording does not know the max_attempts
-- the attempt began with (that write rolled back too) unless an earlier
-- attempt left it on the row: reaching the cap is then found by the next
-- begin, which answers dead and stages the dead letter; the message never
-- runs past its cap either way.

-- The inbox key: SHA-256 of the domain tag and the two length-prefixed
-- strings (their bytes as the database stores them).  Host declares
-- v_key, i_consumer, i_message bytea.
-- @snippet inbox_key(consumer, message_id)
i_consumer := pg_catalog.convert_to(%consumer%, pg_catalog.current_setting('server_encoding'));
i_message := pg_catalog.convert_to(%message_id%, pg_catalog.current_setting('server_encoding'));
v_key := pg_catalog.sha256(pg_catalog.convert_to('pg_idem inbox v1', 'UTF8')
                           || pg_catalog.int4send(pg_catalog.octet_length(i_consumer)) || i_consumer
                           || pg_catalog.int4send(pg_catalog.octet_length(i_message)) || i_message);
-- @end

-- The (consumer, message_id) arguments, checked; v_key := their key.
-- Host declares v_key, i_consumer, i_message bytea.
-- @snippet message_args(consumer, message_id, function)
{{null_arg(%consumer%, 1, consumer, %function%)}}
{{null_arg(%message_id%, 2, message_id, %function%)}}
IF %consumer% = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'consumer must not be empty';
END IF;
IF %message_id% = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'message_id must not be empty';
END IF;
{{inbox_key(%consumer%, %message_id%)}}
-- @end

-- The scope of a message's row: the caller's, or the shared scope of a
-- message delivered before 0.3.0 (such rows are shared by every role).
-- Host declares s_scope, v_scope oid.
-- @snippet message_scope()
v_scope := COALESCE((SELECT m.scope FROM @extschema@.idem_inbox m
                      WHERE m.inbox_key = v_key AND m.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid])
                      ORDER BY m.scope = s_scope DESC LIMIT 1), s_scope);
-- @end

-- Stage an inbox message's dead letter in the outbox, in the caller's
-- scope (inbox.c, dead_letter()).  Host declares s_scope.
-- @snippet dead_letter(consumer, message_id, error_count, last_error)
INSERT INTO @extschema@.idem_outbox_queue (topic, payload, available_at, scope)
VALUES ('idem.inbox.dead',
        pg_catalog.jsonb_build_object('consumer', %consumer%, 'message_id', %message_id%,
                                      'error_count', %error_count%, 'last_error', %last_error%),
        pg_catalog.clock_timestamp(), s_scope);
-- @end

-- @before idem_inbox_begin
CREATE TYPE @extschema@.idem__inbox_begin_call AS (
    consumer pg_catalog.text, message_id pg_catalog.text, payload_hash pg_catalog.bytea,
    max_attempts pg_catalog.int4, caller @extschema@.idem__caller);
-- process, duplicate, dead or mismatch, inside the consumer's transaction:
-- write to take the message, and if that touched nothing, read why.
CREATE FUNCTION @extschema@.idem__inbox_begin(args @extschema@.idem__inbox_begin_call)
RETURNS pg_catalog.text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    v_scope pg_catalog.oid;
    v_key pg_catalog.bytea;
    i_consumer pg_catalog.bytea;
    i_message pg_catalog.bytea;
    v_row record;
BEGIN
    {{message_args(args.consumer, args.message_id, 'idem_inbox_begin')}}
    {{digest_arg(args.payload_hash, 3, payload_hash, 'idem_inbox_begin')}}
    {{null_arg(args.max_attempts, 4, max_attempts, 'idem_inbox_begin')}}
    IF args.max_attempts < 1 OR args.max_attempts > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'max_attempts must be between 1 and 1000',
            DETAIL = pg_catalog.format('The max_attempts given is %s.', args.max_attempts);
    END IF;
    {{caller_scope(args.caller)}}
    {{message_scope()}}
    FOR round IN 1 .. 16 LOOP
        -- A first delivery; waits for an in-flight first delivery.
        INSERT INTO @extschema@.idem_inbox AS m
               (inbox_key, consumer, message_id, payload_hash, state, max_attempts, received_at,
                attempt_started_at, scope)
        VALUES (v_key, args.consumer, args.message_id, args.payload_hash, 'processing', args.max_attempts,
                pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp(), v_scope)
        ON CONFLICT (inbox_key, scope) DO NOTHING;
        IF FOUND THEN
            RETURN 'process';
        END IF;
        -- A retry; waits for an in-flight attempt of the same message.
        UPDATE @extschema@.idem_inbox AS m
           SET state = 'processing', attempt_started_at = pg_catalog.clock_timestamp(),
               max_attempts = args.max_attempts, payload_hash = COALESCE(m.payload_hash, args.payload_hash)
         WHERE m.inbox_key = v_key AND m.scope = v_scope AND m.state = 'failed'
           AND (m.payload_hash IS NULL OR m.payload_hash = args.payload_hash)
           AND m.error_count < args.max_attempts;
        IF FOUND THEN
            RETURN 'process';
        END IF;
        SELECT m.state, m.payload_hash, m.error_count INTO v_row
          FROM @extschema@.idem_inbox m WHERE m.inbox_key = v_key AND m.scope = v_scope;
        CONTINUE WHEN NOT FOUND;   -- pruned, or its first delivery rolled back
        IF v_row.payload_hash IS NOT NULL AND v_row.payload_hash <> args.payload_hash THEN
            RETURN 'mismatch';
        ELSIF v_row.state = 'done' THEN
            RETURN 'duplicate';
        ELSIF v_row.state = 'dead' THEN
            RETURN 'dead';
        ELSIF v_row.state = 'processing' THEN
            RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state',
                MESSAGE = 'inbox message is already being processed in this transaction';
        ELSIF v_row.state = 'failed' AND v_row.error_count >= args.max_attempts THEN
            -- The cap was reached by recorded failures: dead, with its letter.
            UPDATE @extschema@.idem_inbox AS m
               SET state = 'dead', dead_at = pg_catalog.clock_timestamp(), retry_at = NULL,
                   max_attempts = args.max_attempts
             WHERE m.inbox_key = v_key AND m.scope = v_scope AND m.state = 'failed'
               AND m.error_count >= args.max_attempts
            RETURNING m.consumer, m.message_id, m.error_count, m.last_error INTO v_row;
            IF FOUND THEN
                {{dead_letter(v_row.consumer, v_row.message_id, v_row.error_count, v_row.last_error)}}
                RETURN 'dead';
            END IF;
        END IF;
        -- It changed between our write and our read: decide again.
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
        MESSAGE = 'could not begin inbox message: it changed concurrently 16 times',
        HINT = 'The transaction might succeed if retried.';
END
$function$;
CREATE CAST (@extschema@.idem__inbox_begin_call AS pg_catalog.text)
    WITH FUNCTION @extschema@.idem__inbox_begin(@extschema@.idem__inbox_begin_call);
-- @end

-- @symbol idem_inbox_begin
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, $4, CURRENT_USER)::@extschema@.idem__inbox_begin_call::pg_catalog.text;
END
$function$
-- @end

-- @before idem_inbox_done
CREATE TYPE @extschema@.idem__inbox_done_call AS (
    consumer pg_catalog.text, message_id pg_catalog.text, caller @extschema@.idem__caller);
-- The message begun in this transaction is processed (a processing row
-- is visible only to the transaction that began it).
CREATE FUNCTION @extschema@.idem__inbox_done(args @extschema@.idem__inbox_done_call)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    v_key pg_catalog.bytea;
    i_consumer pg_catalog.bytea;
    i_message pg_catalog.bytea;
BEGIN
    {{message_args(args.consumer, args.message_id, 'idem_inbox_done')}}
    {{caller_scope(args.caller)}}
    UPDATE @extschema@.idem_inbox AS m
       SET state = 'done', processed_at = pg_catalog.clock_timestamp(), retry_at = NULL
     WHERE m.inbox_key = v_key AND m.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid]) AND m.state = 'processing';
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'inbox message was not begun in this transaction',
            HINT = 'Call idem_inbox_done in the transaction whose idem_inbox_begin answered process.';
    END IF;
    RETURN true;
END
$function$;
CREATE CAST (@extschema@.idem__inbox_done_call AS pg_catalog.bool)
    WITH FUNCTION @extschema@.idem__inbox_done(@extschema@.idem__inbox_done_call);
-- @end

-- @symbol idem_inbox_done
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    PERFORM ROW($1, $2, CURRENT_USER)::@extschema@.idem__inbox_done_call::pg_catalog.bool;
END
$function$
-- @end

-- @before idem_inbox_fail
CREATE TYPE @extschema@.idem__inbox_fail_call AS (
    consumer pg_catalog.text, message_id pg_catalog.text, error pg_catalog.text, caller @extschema@.idem__caller);
-- Record a failed attempt (inbox_failure.c's statement): retry with the
-- delay before the next attempt, dead at the cap with its dead letter, or
-- duplicate when another delivery processed the message meanwhile.  A
-- second recording in the same transaction is refused: the session keeps
-- the keys recorded in its current transaction in idem_sql.inbox_recorded
-- (rolled back with it, as a recording is).
CREATE FUNCTION @extschema@.idem__inbox_fail(args @extschema@.idem__inbox_fail_call)
RETURNS @extschema@.idem_inbox_fail_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    v_scope pg_catalog.oid;
    v_key pg_catalog.bytea;
    i_consumer pg_catalog.bytea;
    i_message pg_catalog.bytea;
    v_base_ms pg_catalog.int8;
    v_max_ms pg_catalog.int8;
    v_base pg_catalog.interval;
    v_cap pg_catalog.interval;
    v_mark pg_catalog.text;
    v_recorded pg_catalog.text;
    v_row record;
    v_out @extschema@.idem_inbox_fail_result;
BEGIN
    {{message_args(args.consumer, args.message_id, 'idem_inbox_fail')}}
    {{null_arg(args.error, 3, error, 'idem_inbox_fail')}}
    {{caller_scope(args.caller)}}
    v_mark := pg_catalog.pg_current_xact_id()::pg_catalog.text || ':' || pg_catalog.encode(v_key, 'hex');
    v_recorded := COALESCE(pg_catalog.current_setting('idem_sql.inbox_recorded', true), '');
    IF v_mark = ANY (pg_catalog.string_to_array(v_recorded, ',')) THEN
        RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = 'the failure of this inbox attempt is already recorded',
            DETAIL = 'idem_inbox_fail was called for it earlier in this transaction.',
            HINT = 'Commit the transaction.';
    END IF;
    {{message_scope()}}
    {{setting_int(v_base_ms, idem.inbox_backoff_base)}}
    {{setting_int(v_max_ms, idem.inbox_backoff_max)}}
    v_base := pg_catalog.make_interval(secs => v_base_ms / 1000.0);
    v_cap := pg_catalog.make_interval(secs => v_max_ms / 1000.0);
    WITH now AS (SELECT pg_catalog.clock_timestamp() AS t)
    INSERT INTO @extschema@.idem_inbox AS m
           (inbox_key, consumer, message_id, state, error_count, last_error, received_at, failed_at,
            retry_at, scope)
    SELECT v_key, args.consumer, args.message_id, 'failed', 1, args.error, now.t, now.t,
           now.t + LEAST(v_base, v_cap), v_scope
      FROM now
    ON CONFLICT (inbox_key, scope) DO UPDATE SET
        error_count = m.error_count + 1,
        last_error = excluded.last_error,
        failed_at = excluded.failed_at,
        state = CASE WHEN m.error_count + 1 >= m.max_attempts THEN 'dead' ELSE 'failed' END,
        dead_at = CASE WHEN m.error_count + 1 >= m.max_attempts THEN excluded.failed_at END,
        retry_at = CASE WHEN m.error_count + 1 >= m.max_attempts THEN NULL
                        ELSE excluded.failed_at + LEAST(v_base * pg_catalog.power(2, LEAST(m.error_count, 30))::pg_catalog.float8, v_cap) END
     WHERE m.state IN ('failed', 'processing')
    RETURNING m.state, m.error_count, m.retry_at - m.failed_at AS delay, m.last_error INTO v_row;
    IF NOT FOUND THEN
        -- Done or dead by now (processed by another delivery, or revived).
        SELECT m.state, m.error_count INTO v_row
          FROM @extschema@.idem_inbox m WHERE m.inbox_key = v_key AND m.scope = v_scope;
        v_out.outcome := CASE WHEN v_row.state = 'done' THEN 'duplicate' ELSE 'dead' END;
        v_out.error_count := v_row.error_count;
    ELSIF v_row.state = 'dead' THEN
        {{dead_letter(args.consumer, args.message_id, v_row.error_count, v_row.last_error)}}
        v_out.outcome := 'dead';
        v_out.error_count := v_row.error_count;
    ELSE
        v_out.outcome := 'retry';
        v_out.error_count := v_row.error_count;
        v_out.retry_after := pg_catalog.make_interval(secs => EXTRACT(epoch FROM v_row.delay));
    END IF;
    PERFORM pg_catalog.set_config('idem_sql.inbox_recorded',
        (SELECT COALESCE(pg_catalog.string_agg(x, ',') || ',', '') FROM pg_catalog.unnest(pg_catalog.string_to_array(v_recorded, ',')) AS r(x)
          WHERE pg_catalog.split_part(x, ':', 1) = pg_catalog.split_part(v_mark, ':', 1))
        || v_mark, false);
    RETURN v_out;
END
$function$;
CREATE CAST (@extschema@.idem__inbox_fail_call AS @extschema@.idem_inbox_fail_result)
    WITH FUNCTION @extschema@.idem__inbox_fail(@extschema@.idem__inbox_fail_call);
-- @end

-- @symbol idem_inbox_fail
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, CURRENT_USER)::@extschema@.idem__inbox_fail_call::@extschema@.idem_inbox_fail_result;
END
$function$
-- @end

-- Revive a dead message on purpose (admin, any scope), fresh count.
-- @symbol idem_inbox_retry
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_key pg_catalog.bytea;
    i_consumer pg_catalog.bytea;
    i_message pg_catalog.bytea;
BEGIN
    {{message_args($1, $2, 'idem_inbox_retry')}}
    UPDATE @extschema@.idem_inbox AS m
       SET state = 'failed', error_count = 0, dead_at = NULL, retry_at = NULL
     WHERE m.inbox_key = v_key AND m.state = 'dead';
    RETURN FOUND;
END
$function$
-- @end

-- Delete at most batch done or dead messages older than older_than (the
-- dedup window): admin, as the tables' owner.
-- @symbol idem_inbox_prune
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET enable_tidscan = on
AS $function$
DECLARE
    v_older_than ALIAS FOR $1;
    v_batch ALIAS FOR $2;
    v_deleted pg_catalog.int8;
BEGIN
    {{null_arg(v_older_than, 1, older_than, 'idem_inbox_prune')}}
    IF v_older_than < '0'::pg_catalog.interval THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'older_than must not be negative';
    END IF;
    {{null_arg(v_batch, 2, batch, 'idem_inbox_prune')}}
    IF v_batch < 1 OR v_batch > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'batch must be between 1 and 1000000',
            DETAIL = pg_catalog.format('The batch given is %s.', v_batch);
    END IF;
    -- Written by TID, not by a probe of the hashed key (keys/cleanup.c).
    DELETE FROM @extschema@.idem_inbox m
     WHERE m.ctid = ANY (ARRAY(
           SELECT p.ctid FROM @extschema@.idem_inbox p
            WHERE (p.state = 'done' AND p.processed_at < pg_catalog.clock_timestamp() - v_older_than)
               OR (p.state = 'dead' AND p.dead_at < pg_catalog.clock_timestamp() - v_older_than)
            LIMIT v_batch FOR UPDATE SKIP LOCKED))
       AND ((m.state = 'done' AND m.processed_at < pg_catalog.clock_timestamp() - v_older_than)
            OR (m.state = 'dead' AND m.dead_at < pg_catalog.clock_timestamp() - v_older_than));
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$function$
-- @end

-- The deferred constraint trigger, queued only for rows begin set
-- processing: a message still processing at commit was neither marked
-- done nor had its failure recorded.  Reads the table: as its owner.
-- @symbol idem_inbox_message_done
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('INSERT', 'UPDATE') THEN
        RAISE EXCEPTION USING ERRCODE = 'trigger_protocol_violated',
            MESSAGE = 'function "idem_inbox_message_done" must be fired AFTER INSERT OR UPDATE FOR EACH ROW';
    END IF;
    -- Marked done or failed later in the transaction: fine.
    IF EXISTS (SELECT FROM @extschema@.idem_inbox m
                WHERE m.inbox_key = NEW.inbox_key AND m.scope = NEW.scope AND m.state = 'processing') THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:message_unfinished}},
            MESSAGE = 'inbox message begun in this transaction was not marked done',
            DETAIL = pg_catalog.format('Message %s of consumer %s is still processing at commit.',
                                       pg_catalog.quote_literal(NEW.message_id), pg_catalog.quote_literal(NEW.consumer)),
            HINT = 'Call idem_inbox_done before COMMIT, or roll back and call idem_inbox_fail.',
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, CONSTRAINT = 'idem_inbox_message_done';
    END IF;
    RETURN NULL;
END
$function$
-- @end
