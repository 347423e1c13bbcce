-- The SQL edition of multi-step attempts, part two (attempts/
-- attempts_transitions.c, attempts_reconciler.c, attempts_guards.c):
-- store, promote, fail and reopen, each a status + generation CAS whose
-- UPDATE re-states the expected status and generation (READ COMMITTED
-- re-checks them against the newest version); the reconciler's side; the
-- triggers that hold the state machine for every write.

-- An attempt state's name: "failed(reason)", or the bare status.
-- @snippet state_name(status, reason)
CASE WHEN %status% = 'failed' AND %reason% IS NOT NULL THEN %status% || '(' || %reason% || ')' ELSE %status% END
-- @end

-- Is from -> to one of the protocol's transitions?
-- @snippet legal(from_status, from_reason, to_status, to_reason)
EXISTS (SELECT FROM {{attempt_transitions}}
         WHERE transition.from_status = %from_status%
           AND (transition.from_reason IS NULL OR transition.from_reason = %from_reason%)
           AND transition.to_status = %to_status%
           AND (transition.to_reason IS NULL OR transition.to_reason = %to_reason%))
-- @end

-- Can state (status, reason) follow (from_status, from_reason) within one
-- generation, by transitions that keep it?  Then a CAS that expected from
-- and found it lost a race (stale), not an illegal move.
-- @snippet comes_after(from_status, from_reason, status, reason)
EXISTS (WITH RECURSIVE t AS (SELECT * FROM {{attempt_transitions}} WHERE NOT transition.next_generation),
             reach(status, reason, depth) AS (
                 SELECT t.to_status, t.to_reason, 1 FROM t
                  WHERE t.from_status = %from_status% AND (t.from_reason IS NULL OR t.from_reason = %from_reason%)
                 UNION ALL
                 SELECT t.to_status, t.to_reason, r.depth + 1 FROM reach r JOIN t
                     ON t.from_status = r.status AND (t.from_reason IS NULL OR t.from_reason = r.reason)
                  WHERE r.depth < 16)
        SELECT FROM reach WHERE reach.status = %status% AND (reach.reason IS NULL OR reach.reason = %reason%))
-- @end

-- Refuse another role's attempt as one that does not exist.  Host
-- declares s_scope.
-- @snippet require_own(attempt_id)
IF NOT EXISTS (SELECT FROM @extschema@.idem_attempts a
                WHERE a.attempt_id = %attempt_id% AND a.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid])) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = pg_catalog.format('attempt %s does not exist', %attempt_id%),
        DETAIL = 'It was never opened, or it was pruned after its retention.';
END IF;
-- @end

-- A CAS from one of sources (an array of "status" or "failed(reason)")
-- to the state to_name missed: stale (m_stale := true) if the attempt
-- moved to another generation or past an expected state, IL005 if the
-- move can never follow the state it is in; m_stale := false if it is
-- still in a source state (for the caller to explain).  Host declares
-- m_row record, m_stale bool.
-- @snippet explain_miss(attempt_id, generation, sources, to_name)
SELECT a.generation, a.status, a.failure_reason, a.declared_digest INTO m_row
  FROM @extschema@.idem_attempts a WHERE a.attempt_id = %attempt_id%;
IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = pg_catalog.format('attempt %s does not exist', %attempt_id%),
        DETAIL = 'It was never opened, or it was pruned after its retention.';
END IF;
IF m_row.generation <> %generation% THEN
    m_stale := true;
ELSIF EXISTS (SELECT FROM pg_catalog.unnest(%sources%) AS src(s)
               WHERE src.s = m_row.status OR src.s = {{state_name(m_row.status, m_row.failure_reason)}}) THEN
    m_stale := false;
ELSIF EXISTS (SELECT FROM pg_catalog.unnest(%sources%) AS src(s)
               WHERE {{comes_after(pg_catalog.split_part(src.s, '(', 1), NULLIF(pg_catalog.rtrim(pg_catalog.split_part(src.s, '(', 2), ')'), ''), m_row.status, m_row.failure_reason)}}) THEN
    m_stale := true;
ELSE
    RAISE EXCEPTION USING ERRCODE = {{sqlstate:illegal_transition}}, MESSAGE = 'illegal attempt transition',
        DETAIL = pg_catalog.format('Attempt %s cannot go from %s to %s.', %attempt_id%,
                                   {{state_name(m_row.status, m_row.failure_reason)}}, %to_name%),
        HINT = pg_catalog.format('The legal transitions are: %s.', {{attempt_transitions_text}});
END IF;
-- @end

-- @snippet digest_mismatch(attempt_id, declared, given)
RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
    MESSAGE = 'digest does not match the attempt''s declared digest',
    DETAIL = pg_catalog.format('Attempt %s declared %s; the blob''s digest is %s.', %attempt_id%, %declared%, %given%),
    HINT = 'Never promote a blob whose digest differs: record it with idem_attempt_fail(attempt_id, generation, ''digest_mismatch'') while the attempt is pending.';
-- @end

-- Stage an attempt's outbox event (topic, payload, key kind/target: one
-- target's events publish in order) in the caller's scope; e_id := its id.
-- Its key's slot is locked first (39_sql_outbox.sql, lock_key_slots), as
-- idem_outbox_stage_event does.  Host declares s_scope, c_highest, e_id,
-- k_slots int4[] and k_locked int8.
-- @snippet stage_attempt_event(topic, payload, key)
{{lock_key_slots(ARRAY[%key%])}}
{{outbox_ids_catch_up()}}
INSERT INTO @extschema@.idem_outbox_queue AS q (topic, message_key, key_hash, payload, available_at, scope)
VALUES (%topic%, %key%, {{key_hash(%key%)}}, %payload%, pg_catalog.clock_timestamp(), s_scope)
RETURNING q.id INTO e_id;
-- @end

-- @before idem_attempt_store
CREATE TYPE @extschema@.idem__attempt_store_call AS (
    attempt_id pg_catalog.uuid, generation pg_catalog.int8, digest pg_catalog.bytea, caller @extschema@.idem__caller);
-- pending -> stored once the blob is in place with the declared digest
-- (an attempt opened without one, an export, declares it here).
CREATE FUNCTION @extschema@.idem__attempt_store(args @extschema@.idem__attempt_store_call)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    m_row record;
    m_stale pg_catalog.bool;
BEGIN
    {{null_arg(args.attempt_id, 1, attempt_id, 'idem_attempt_store')}}
    {{generation_arg(args.generation, 2, 'idem_attempt_store')}}
    {{digest_arg(args.digest, 3, digest, 'idem_attempt_store')}}
    {{caller_scope(args.caller)}}
    {{require_own(args.attempt_id)}}
    UPDATE @extschema@.idem_attempts AS a
       SET status = 'stored', declared_digest = COALESCE(a.declared_digest, args.digest),
           updated_at = pg_catalog.clock_timestamp()
     WHERE a.attempt_id = args.attempt_id AND a.generation = args.generation AND a.status = 'pending'
       AND (a.declared_digest IS NULL OR a.declared_digest = args.digest);
    IF FOUND THEN
        RETURN true;
    END IF;
    {{explain_miss(args.attempt_id, args.generation, ARRAY['pending'], 'stored')}}
    IF NOT m_stale THEN
        {{digest_mismatch(args.attempt_id, m_row.declared_digest, args.digest)}}
    END IF;
    RETURN false;
END
$function$;
CREATE CAST (@extschema@.idem__attempt_store_call AS pg_catalog.bool)
    WITH FUNCTION @extschema@.idem__attempt_store(@extschema@.idem__attempt_store_call);
-- @end

-- @symbol idem_attempt_store
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, CURRENT_USER)::@extschema@.idem__attempt_store_call::pg_catalog.bool;
END
$function$
-- @end

-- @before idem_attempt_promote
CREATE TYPE @extschema@.idem__attempt_promote_call AS (
    attempt_id pg_catalog.uuid, generation pg_catalog.int8, digest pg_catalog.bytea,
    event_topic pg_catalog.text, event_payload pg_catalog.jsonb, caller @extschema@.idem__caller);
-- stored -> promoted in the caller's transaction: a replace kind's target
-- pointer flips to the attempt unless a newer (created_at, attempt_id)
-- holds it (then the attempt is superseded at once), and the attempt the
-- pointer leaves is superseded; the outbox event is staged in the same
-- transaction (the deferred trigger refuses a commit without it).
CREATE FUNCTION @extschema@.idem__attempt_promote(args @extschema@.idem__attempt_promote_call)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    c_highest pg_catalog.int8;
    m_row record;
    m_stale pg_catalog.bool;
    v_locked record;
    v_target record;
    v_current pg_catalog.uuid;
    v_previous pg_catalog.uuid;
    v_event record;
    e_id pg_catalog.int8;
    k_slots pg_catalog.int4[];
    k_locked pg_catalog.int8;
    v_flipped pg_catalog.bool := false;
    v_pointed pg_catalog.bool := false;
BEGIN
    {{null_arg(args.attempt_id, 1, attempt_id, 'idem_attempt_promote')}}
    {{generation_arg(args.generation, 2, 'idem_attempt_promote')}}
    {{digest_arg(args.digest, 3, digest, 'idem_attempt_promote')}}
    IF args.event_topic IS NOT NULL AND args.event_topic = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'event_topic must not be empty';
    END IF;
    IF args.event_payload IS NOT NULL AND pg_catalog.jsonb_typeof(args.event_payload) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'event_payload must be a JSON object';
    END IF;
    {{caller_scope(args.caller)}}
    {{require_own(args.attempt_id)}}
    SELECT a.kind, k.mode, a.target, a.created_at, a.declared_digest, a.scope INTO v_locked
      FROM @extschema@.idem_attempts a JOIN @extschema@.idem_attempt_kinds k ON k.kind = a.kind
     WHERE a.attempt_id = args.attempt_id AND a.generation = args.generation AND a.status = 'stored'
       FOR UPDATE OF a;
    IF NOT FOUND THEN
        {{explain_miss(args.attempt_id, args.generation, ARRAY['stored'], 'promoted')}}
        RETURN false;
    END IF;
    IF v_locked.declared_digest <> args.digest THEN
        {{digest_mismatch(args.attempt_id, v_locked.declared_digest, args.digest)}}
    END IF;
    v_current := args.attempt_id;
    IF v_locked.mode = 'replace' THEN
        -- Flip the target's pointer forward only, in (created_at, attempt_id) order.
        FOR round IN 1 .. 16 LOOP
            SELECT t.current_attempt_id, t.current_created_at INTO v_target
              FROM @extschema@.idem_attempt_targets t
             WHERE t.kind = v_locked.kind AND t.target = v_locked.target AND t.scope = v_locked.scope
               FOR UPDATE;
            IF NOT FOUND THEN
                INSERT INTO @extschema@.idem_attempt_targets AS t (kind, target, current_attempt_id, current_created_at, scope)
                VALUES (v_locked.kind, v_locked.target, args.attempt_id, v_locked.created_at, v_locked.scope)
                ON CONFLICT (kind, target, scope) DO NOTHING;
                IF FOUND THEN
                    v_pointed := true;
                    EXIT;
                END IF;
                CONTINUE;   -- a concurrent promotion created it: lock theirs
            END IF;
            v_previous := v_target.current_attempt_id;
            UPDATE @extschema@.idem_attempt_targets AS t
               SET current_attempt_id = args.attempt_id, current_created_at = v_locked.created_at,
                   flipped_at = pg_catalog.clock_timestamp()
             WHERE t.kind = v_locked.kind AND t.target = v_locked.target AND t.scope = v_locked.scope
               AND (t.current_created_at, t.current_attempt_id) < (v_locked.created_at, args.attempt_id);
            IF FOUND THEN
                v_flipped := true;
            ELSE
                v_current := v_previous;   -- a newer attempt holds it: keep it
            END IF;
            v_pointed := true;
            EXIT;
        END LOOP;
        IF NOT v_pointed THEN
            RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                MESSAGE = 'could not flip the current attempt: the target changed concurrently 16 times',
                HINT = 'The transaction might succeed if retried.';
        END IF;
    END IF;
    SELECT COALESCE(args.event_topic, a.kind || '.promoted') AS topic,
           COALESCE(args.event_payload, '{}'::pg_catalog.jsonb) || pg_catalog.jsonb_build_object(
               'attempt_id', a.attempt_id, 'kind', a.kind, 'target', a.target,
               'generation', a.generation, 'status', 'promoted', 'object_key', a.object_key,
               'digest', pg_catalog.encode(a.declared_digest, 'hex'), 'intent', a.intent,
               'current_attempt_id', v_current) AS payload,
           a.kind || '/' || a.target AS key
      INTO v_event
      FROM @extschema@.idem_attempts a
     WHERE a.attempt_id = args.attempt_id AND a.generation = args.generation AND a.status = 'stored';
    {{stage_attempt_event(v_event.topic, v_event.payload, v_event.key)}}
    UPDATE @extschema@.idem_attempts AS a
       SET status = 'promoted', updated_at = pg_catalog.clock_timestamp(), event_id = e_id
     WHERE a.attempt_id = args.attempt_id AND a.generation = args.generation AND a.status = 'stored';
    IF v_current <> args.attempt_id THEN
        -- Lost to a newer attempt: promoted and superseded at once.
        UPDATE @extschema@.idem_attempts AS a
           SET status = 'superseded', superseded_by = v_current, updated_at = pg_catalog.clock_timestamp()
         WHERE a.attempt_id = args.attempt_id AND a.status = 'promoted';
    ELSIF v_flipped THEN
        -- The displaced attempt (it may have been pruned meanwhile).
        UPDATE @extschema@.idem_attempts AS a
           SET status = 'superseded', superseded_by = args.attempt_id, updated_at = pg_catalog.clock_timestamp()
         WHERE a.attempt_id = v_previous AND a.status = 'promoted';
    END IF;
    RETURN true;
END
$function$;
CREATE CAST (@extschema@.idem__attempt_promote_call AS pg_catalog.bool)
    WITH FUNCTION @extschema@.idem__attempt_promote(@extschema@.idem__attempt_promote_call);
-- @end

-- @symbol idem_attempt_promote
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, $4, $5, CURRENT_USER)::@extschema@.idem__attempt_promote_call::pg_catalog.bool;
END
$function$
-- @end

-- @before idem_attempt_fail
CREATE TYPE @extschema@.idem__attempt_fail_call AS (
    attempt_id pg_catalog.uuid, generation pg_catalog.int8, reason pg_catalog.text,
    event_payload pg_catalog.jsonb, caller @extschema@.idem__caller);
-- pending -> failed(reaped_no_blob | digest_mismatch | target_gone), or
-- stored -> failed(target_gone), with its '<kind>.failed' event.
CREATE FUNCTION @extschema@.idem__attempt_fail(args @extschema@.idem__attempt_fail_call)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    c_highest pg_catalog.int8;
    m_row record;
    m_stale pg_catalog.bool;
    v_gone pg_catalog.bool;
    v_event record;
    e_id pg_catalog.int8;
    k_slots pg_catalog.int4[];
    k_locked pg_catalog.int8;
BEGIN
    {{text_arg(args.reason, 3, reason, 'idem_attempt_fail')}}
    v_gone := args.reason = 'target_gone';
    IF NOT v_gone AND NOT {{reopenable(args.reason)}} THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('invalid failure reason "%s"', args.reason),
            DETAIL = 'The reason is reaped_no_blob, digest_mismatch or target_gone.';
    END IF;
    {{null_arg(args.attempt_id, 1, attempt_id, 'idem_attempt_fail')}}
    {{generation_arg(args.generation, 2, 'idem_attempt_fail')}}
    IF args.event_payload IS NOT NULL AND pg_catalog.jsonb_typeof(args.event_payload) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'event_payload must be a JSON object';
    END IF;
    {{caller_scope(args.caller)}}
    {{require_own(args.attempt_id)}}
    UPDATE @extschema@.idem_attempts AS a
       SET status = 'failed', failure_reason = args.reason, updated_at = pg_catalog.clock_timestamp()
     WHERE a.attempt_id = args.attempt_id AND a.generation = args.generation
       AND a.status = ANY (CASE WHEN v_gone THEN ARRAY['pending', 'stored'] ELSE ARRAY['pending'] END)
    RETURNING a.kind || '.failed' AS topic,
              COALESCE(args.event_payload, '{}'::pg_catalog.jsonb) || pg_catalog.jsonb_build_object(
                  'attempt_id', a.attempt_id, 'kind', a.kind, 'target', a.target,
                  'generation', a.generation, 'status', 'failed',
                  'reason', a.failure_reason, 'object_key', a.object_key) AS payload,
              a.kind || '/' || a.target AS key
      INTO v_event;
    IF FOUND THEN
        {{stage_attempt_event(v_event.topic, v_event.payload, v_event.key)}}
        RETURN true;
    END IF;
    {{explain_miss(args.attempt_id, args.generation, CASE WHEN v_gone THEN ARRAY['pending', 'stored'] ELSE ARRAY['pending'] END, 'failed(' || args.reason || ')')}}
    RETURN false;
END
$function$;
CREATE CAST (@extschema@.idem__attempt_fail_call AS pg_catalog.bool)
    WITH FUNCTION @extschema@.idem__attempt_fail(@extschema@.idem__attempt_fail_call);
-- @end

-- @symbol idem_attempt_fail
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, $4, CURRENT_USER)::@extschema@.idem__attempt_fail_call::pg_catalog.bool;
END
$function$
-- @end

-- @before idem_attempt_reopen
CREATE TYPE @extschema@.idem__attempt_reopen_call AS (
    attempt_id pg_catalog.uuid, generation pg_catalog.int8, caller @extschema@.idem__caller);
-- failed(reaped_no_blob | digest_mismatch) -> pending under generation +
-- 1 and its new key; the new generation, NULL when stale.
CREATE FUNCTION @extschema@.idem__attempt_reopen(args @extschema@.idem__attempt_reopen_call)
RETURNS pg_catalog.int8
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    m_row record;
    m_stale pg_catalog.bool;
    r_parts record;
    r_generation pg_catalog.int8;
    r_key pg_catalog.text;
    n_kept pg_catalog.text;
    n_ext pg_catalog.text;
    v_name pg_catalog.text;
    p_len pg_catalog.int4;
    p_start pg_catalog.int4;
    p_seg pg_catalog.int4;
    p_c pg_catalog.text;
BEGIN
    {{null_arg(args.attempt_id, 1, attempt_id, 'idem_attempt_reopen')}}
    {{generation_arg(args.generation, 2, 'idem_attempt_reopen')}}
    {{caller_scope(args.caller)}}
    {{require_own(args.attempt_id)}}
    {{reopen_cas(args.attempt_id, args.generation)}}
    IF r_generation IS NOT NULL THEN
        RETURN r_generation;
    END IF;
    {{explain_miss(args.attempt_id, args.generation, ARRAY['failed(reaped_no_blob)', 'failed(digest_mismatch)'], 'pending')}}
    IF NOT m_stale THEN
        RAISE EXCEPTION 'reopen of attempt % missed a reopenable row', args.attempt_id;
    END IF;
    RETURN NULL;
END
$function$;
CREATE CAST (@extschema@.idem__attempt_reopen_call AS pg_catalog.int8)
    WITH FUNCTION @extschema@.idem__attempt_reopen(@extschema@.idem__attempt_reopen_call);
-- @end

-- @symbol idem_attempt_reopen
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, CURRENT_USER)::@extschema@.idem__attempt_reopen_call::pg_catalog.int8;
END
$function$
-- @end

-- The reconciler's side (admin: every scope's attempts, as the tables'
-- owner).  A grace or retention argument and a batch size, checked.
-- @snippet batch_args(age, age_name, batch, function)
{{null_arg(%age%, 1, %age_name%, %function%)}}
IF %age% < '0'::pg_catalog.interval THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = '%age_name% must not be negative';
END IF;
{{null_arg(%batch%, 2, batch, %function%)}}
IF %batch% < 1 OR %batch% > 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'batch must be between 1 and 1000000',
        DETAIL = pg_catalog.format('The batch given is %s.', %batch%);
END IF;
-- @end

-- Idle live attempts, locked FOR UPDATE SKIP LOCKED until the caller's
-- transaction ends, so that reconcilers take disjoint batches.
-- @symbol idem_attempt_reconcile_batch
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    {{batch_args($1, grace, $2, 'idem_attempt_reconcile_batch')}}
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT a.attempt_id FROM @extschema@.idem_attempts a
         WHERE a.status IN ('pending', 'stored') AND GREATEST(a.updated_at, a.checked_at) < pg_catalog.clock_timestamp() - $1
         ORDER BY GREATEST(a.updated_at, a.checked_at)
         LIMIT $2 FOR UPDATE SKIP LOCKED)
    UPDATE @extschema@.idem_attempts a SET checked_at = pg_catalog.clock_timestamp()
      FROM picked, @extschema@.idem_attempt_kinds k
     WHERE a.attempt_id = picked.attempt_id AND k.kind = a.kind AND a.status IN ('pending', 'stored')
    RETURNING a.attempt_id, a.generation, a.status, a.kind, k.mode, a.target, a.object_key, a.declared_digest;
END
$function$
-- @end

-- The keys of abandoned generations (every one before the current, and
-- the current one of a failed attempt) not yet swept.
-- @symbol idem_attempt_sweep_batch
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_row record;
    n_kept pg_catalog.text;
    n_ext pg_catalog.text;
    v_name pg_catalog.text;
    p_len pg_catalog.int4;
    p_start pg_catalog.int4;
    p_seg pg_catalog.int4;
    p_c pg_catalog.text;
BEGIN
    {{batch_args($1, grace, $2, 'idem_attempt_sweep_batch')}}
    FOR v_row IN
        WITH picked AS MATERIALIZED (
            SELECT a.attempt_id FROM @extschema@.idem_attempts a
             WHERE a.swept_through < CASE WHEN a.status = 'failed' THEN a.generation ELSE a.generation - 1 END
               AND a.updated_at < pg_catalog.clock_timestamp() - $1
             ORDER BY a.updated_at
             LIMIT $2 FOR UPDATE SKIP LOCKED)
        SELECT a.attempt_id, g.generation, k.key_prefix, a.target, a.object_name
          FROM picked p JOIN @extschema@.idem_attempts a ON a.attempt_id = p.attempt_id
          JOIN @extschema@.idem_attempt_kinds k ON k.kind = a.kind
         CROSS JOIN LATERAL pg_catalog.generate_series(a.swept_through + 1,
               CASE WHEN a.status = 'failed' THEN a.generation ELSE a.generation - 1 END) AS g(generation)
         ORDER BY a.attempt_id, g.generation
    LOOP
        {{check_path('key prefix', v_row.key_prefix, 255)}}
        {{check_path('target', v_row.target, 512)}}
        {{safe_name(v_name, v_row.object_name)}}
        attempt_id := v_row.attempt_id;
        generation := v_row.generation;
        object_key := {{object_key(v_row.key_prefix, v_row.target, v_row.attempt_id, v_row.generation, v_name)}};
        RETURN NEXT;
    END LOOP;
END
$function$
-- @end

-- The blobs of generations up to generation are deleted; false when
-- already recorded.
-- @symbol idem_attempt_swept
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_through pg_catalog.int8;
BEGIN
    {{null_arg($1, 1, attempt_id, 'idem_attempt_swept')}}
    {{generation_arg($2, 2, 'idem_attempt_swept')}}
    UPDATE @extschema@.idem_attempts a SET swept_through = $2
     WHERE a.attempt_id = $1 AND a.swept_through < $2
       AND $2 <= CASE WHEN a.status = 'failed' THEN a.generation ELSE a.generation - 1 END;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT CASE WHEN a.status = 'failed' THEN a.generation ELSE a.generation - 1 END INTO v_through
      FROM @extschema@.idem_attempts a WHERE a.attempt_id = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('attempt %s does not exist', $1),
            DETAIL = 'It was never opened, or it was pruned after its retention.';
    END IF;
    IF $2 > v_through THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('generation %s is not abandoned', $2),
            DETAIL = pg_catalog.format('The abandoned generations of attempt %s end at %s.', $1, v_through),
            HINT = 'Only keys returned by idem_attempt_sweep_batch may be deleted.';
    END IF;
    RETURN false;
END
$function$
-- @end

-- Delete at most batch finished, swept attempts idle for longer than
-- retention; the predicate stands in the DELETE too.
-- @symbol idem_attempt_prune
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET enable_tidscan = on
AS $function$
DECLARE
    v_deleted pg_catalog.int8;
BEGIN
    {{batch_args($1, retention, $2, 'idem_attempt_prune')}}
    -- Written by TID, not by a probe of the random attempt_id (keys/cleanup.c).
    DELETE FROM @extschema@.idem_attempts a
     WHERE a.ctid = ANY (ARRAY(
           SELECT p.ctid FROM @extschema@.idem_attempts p
            WHERE p.status IN ('promoted', 'superseded', 'failed') AND p.updated_at < pg_catalog.clock_timestamp() - $1
              AND p.swept_through >= CASE WHEN p.status = 'failed' THEN p.generation ELSE p.generation - 1 END
            LIMIT $2 FOR UPDATE SKIP LOCKED))
       AND a.status IN ('promoted', 'superseded', 'failed') AND a.updated_at < pg_catalog.clock_timestamp() - $1
       AND a.swept_through >= CASE WHEN a.status = 'failed' THEN a.generation ELSE a.generation - 1 END;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$function$
-- @end

-- BEFORE UPDATE on idem_attempts: every write, the functions' or anyone
-- else's, follows the legal transitions; the generation grows by one on
-- a reopen and never otherwise; what identifies the attempt never changes.
-- @symbol idem_attempts_transition_guard
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_column pg_catalog.text;
    v_reopen pg_catalog.bool := false;
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION USING ERRCODE = 'trigger_protocol_violated',
            MESSAGE = 'function "idem_attempts_transition_guard" must be fired BEFORE UPDATE FOR EACH ROW';
    END IF;
    v_column := CASE WHEN NEW.attempt_id IS DISTINCT FROM OLD.attempt_id THEN 'attempt_id'
                     WHEN NEW.kind IS DISTINCT FROM OLD.kind THEN 'kind'
                     WHEN NEW.target IS DISTINCT FROM OLD.target THEN 'target'
                     WHEN NEW.client_request_id IS DISTINCT FROM OLD.client_request_id THEN 'client_request_id'
                     WHEN NEW.created_by IS DISTINCT FROM OLD.created_by THEN 'created_by'
                     WHEN NEW.intent::pg_catalog.text IS DISTINCT FROM OLD.intent::pg_catalog.text THEN 'intent'
                     WHEN NEW.intent_hash IS DISTINCT FROM OLD.intent_hash THEN 'intent_hash'
                     WHEN NEW.created_at IS DISTINCT FROM OLD.created_at THEN 'created_at' END;
    IF v_column IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:illegal_transition}},
            MESSAGE = pg_catalog.format('attempt column "%s" cannot change', v_column),
            DETAIL = 'An attempt''s identity is fixed when it is opened.',
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = v_column;
    END IF;
    IF OLD.status IS NULL OR NEW.status IS NULL THEN
        RETURN NEW;   -- NOT NULL refuses it
    END IF;
    -- A write that keeps the state (checked_at, swept_through) is no transition.
    IF NEW.status IS DISTINCT FROM OLD.status OR NEW.failure_reason IS DISTINCT FROM OLD.failure_reason THEN
        IF NOT {{legal(OLD.status, OLD.failure_reason, NEW.status, NEW.failure_reason)}} THEN
            RAISE EXCEPTION USING ERRCODE = {{sqlstate:illegal_transition}}, MESSAGE = 'illegal attempt transition',
                DETAIL = pg_catalog.format('Attempt %s cannot go from %s to %s.', OLD.attempt_id,
                                           {{state_name(OLD.status, OLD.failure_reason)}},
                                           {{state_name(NEW.status, NEW.failure_reason)}}),
                HINT = pg_catalog.format('The legal transitions are: %s.', {{attempt_transitions_text}});
        END IF;
        v_reopen := OLD.status = 'failed';
    END IF;
    IF v_reopen AND NEW.generation IS DISTINCT FROM OLD.generation + 1 THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:illegal_transition}}, MESSAGE = 'illegal attempt generation change',
            DETAIL = pg_catalog.format('Attempt %s is reopened from generation %s, so its generation must become %s, not %s.',
                                       OLD.attempt_id, OLD.generation, OLD.generation + 1, NEW.generation),
            HINT = 'The generation grows by one on a reopen and never changes otherwise.';
    END IF;
    IF NOT v_reopen AND NEW.generation IS DISTINCT FROM OLD.generation THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:illegal_transition}}, MESSAGE = 'illegal attempt generation change',
            DETAIL = pg_catalog.format('Attempt %s cannot change its generation from %s to %s outside a reopen.',
                                       OLD.attempt_id, OLD.generation, NEW.generation),
            HINT = 'The generation grows by one on a reopen and never changes otherwise.';
    END IF;
    RETURN NEW;
END
$function$
-- @end

-- The deferred constraint trigger queued for every promotion: at commit
-- the attempt, if still promoted or superseded, must name an outbox event
-- that exists and names it.  Runs as the tables' owner: it reads
-- idem_outbox, which the committing role may not.
-- @symbol idem_attempts_promotion_published
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_row record;
    v_why pg_catalog.text;
BEGIN
    IF TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION USING ERRCODE = 'trigger_protocol_violated',
            MESSAGE = 'function "idem_attempts_promotion_published" must be fired AFTER UPDATE FOR EACH ROW';
    END IF;
    SELECT a.status IN ('promoted', 'superseded') AS promoted, a.event_id, o.id IS NOT NULL AS found,
           o.payload ->> 'attempt_id' = a.attempt_id::pg_catalog.text AS names
      INTO v_row
      FROM @extschema@.idem_attempts a LEFT JOIN @extschema@.idem_outbox o ON o.id = a.event_id
     WHERE a.attempt_id = NEW.attempt_id;
    IF FOUND AND v_row.promoted THEN
        v_why := CASE WHEN v_row.event_id IS NULL THEN 'it has no outbox event'
                      WHEN NOT v_row.found THEN pg_catalog.format('its outbox event %s does not exist', v_row.event_id)
                      WHEN v_row.names IS NOT TRUE THEN 'its outbox event does not name it in its payload''s "attempt_id"' END;
        IF v_why IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = {{sqlstate:promotion_unpublished}},
                MESSAGE = 'attempt promotion committed without its outbox event',
                DETAIL = pg_catalog.format('Attempt %s is promoted, but %s.', NEW.attempt_id, v_why),
                HINT = 'Promote with idem_attempt_promote(), which stages the event in the same statement.',
                SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, CONSTRAINT = 'idem_attempts_promotion_published';
        END IF;
    END IF;
    RETURN NULL;
END
$function$
-- @end

-- BEFORE UPDATE on idem_attempt_targets: the current pointer never moves
-- back to an older (created_at, attempt_id), and stays on its target.
-- @symbol idem_attempt_targets_guard
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP <> 'UPDATE' THEN
        RAISE EXCEPTION USING ERRCODE = 'trigger_protocol_violated',
            MESSAGE = 'function "idem_attempt_targets_guard" must be fired BEFORE UPDATE FOR EACH ROW';
    END IF;
    IF NEW.kind IS DISTINCT FROM OLD.kind OR NEW.target IS DISTINCT FROM OLD.target THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:illegal_transition}},
            MESSAGE = 'the current pointer cannot move to another target',
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.current_attempt_id IS NOT NULL AND NEW.current_created_at IS NOT NULL AND OLD.current_attempt_id IS NOT NULL
       AND (NEW.current_created_at, NEW.current_attempt_id) < (OLD.current_created_at, OLD.current_attempt_id) THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:illegal_transition}},
            MESSAGE = 'the current pointer cannot move back',
            DETAIL = pg_catalog.format('Target %s/%s points at attempt %s; attempt %s is older in (created_at, attempt_id) order.',
                                       OLD.kind, OLD.target, OLD.current_attempt_id, NEW.current_attempt_id),
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$function$
-- @end
