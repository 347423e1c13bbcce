-- The SQL edition of keys/claim.c, keys/finish.c and keys/cleanup.c:
-- claims, lookups and the owner's calls, on plain SQL's guarantees.
--
-- The protocol stands on the same two facts of READ COMMITTED as the C
-- edition's: INSERT ... ON CONFLICT DO NOTHING waits for an in-flight
-- inserter of the same key, and an UPDATE re-checks its WHERE clause
-- against the newest row version after waiting.  A claim reads the key
-- (each statement of a VOLATILE PL/pgSQL function takes a fresh snapshot),
-- decides, and writes the very version it read (its ctid, with the
-- columns every write changes): if the key changed in between, the write
-- touches nothing and the claim reads again.  The owner's calls are one
-- UPDATE each, fenced by claim_id, state and scope in the WHERE clause.
--
-- Each request-path function (SECURITY INVOKER, as in the C edition)
-- hands its arguments and its current_user -- the role whose code calls
-- pg_idem, the scope -- to an internal PL/pgSQL function (idem__*) that
-- runs as the tables' owner (SECURITY DEFINER): idem_client never reads
-- or writes the tables itself.  The call goes through a cast, from a
-- composite of the arguments (idem__*_call) to the result type: a cast is
-- found by its types, which only the extension owns, never by a function
-- name that a role able to create in the schema could make ambiguous
-- with an overload of its own.  (A SQL body, BEGIN ATOMIC, binds its
-- calls too, but PostgreSQL before 18 plans it again at every call: about
-- 70 us a claim, measured; the cast costs about 5.)
--
-- The internal functions are executable by idem_client (the request-path
-- functions run as their caller), so a role could call one directly and
-- name another role as the caller.  It cannot: the caller's field is of
-- the domain idem__caller, whose check is that the value is the
-- current_user of the code that makes the value -- however it is made (a
-- ROW, a cast from text, jsonb_populate_record, a PL/pgSQL assignment).
-- Nobody but the owner has USAGE on the domain and on the idem__* types,
-- so no table, view, function or other type can keep a value made in
-- another role's context for later.  The scope is therefore exactly the
-- C edition's: the current_user of whoever calls, a SECURITY DEFINER
-- function's owner inside one.

-- A follower that waits (max_wait) polls: it sleeps 1 ms, doubling to
-- 50 ms, and reads again, until the winner's commit shows, the lease or
-- the cooldown ends, or max_wait is over.  (No shared memory to be woken
-- through; LISTEN cannot be received inside a statement, and NOTIFY would
-- serialize every finalize's commit.)

-- @symbol idem_key
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_encoding CONSTANT pg_catalog.text := pg_catalog.current_setting('server_encoding');
    v_key pg_catalog.bytea;
    v_out pg_catalog.bytea := pg_catalog.convert_to({{key_domain}}, 'UTF8');
    v_field pg_catalog.bytea;
BEGIN
    {{null_arg($1, 1, principal, 'idem_key')}}
    {{null_arg($2, 2, method, 'idem_key')}}
    {{null_arg($3, 3, target, 'idem_key')}}
    {{null_arg($4, 4, key, 'idem_key')}}
    -- The bytes as the database stores them, whatever the client's encoding.
    v_key := pg_catalog.convert_to($4, v_encoding);
    IF pg_catalog.octet_length(v_key) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'idempotency key must not be empty';
    END IF;
    IF pg_catalog.octet_length(v_key) > {{max_key_bytes}} THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'idempotency key must be at most {{max_key_bytes}} bytes',
            DETAIL = pg_catalog.format('The key given is %s bytes long.', pg_catalog.octet_length(v_key));
    END IF;
    IF v_encoding <> 'UTF8' THEN
        BEGIN
            PERFORM pg_catalog.convert_from(v_key, 'UTF8');
        EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = 'idempotency key must be valid UTF-8 without NUL bytes';
        END;
    END IF;
    -- Each field: its byte length (4 bytes, big-endian), then its bytes.
    FOR i IN 1 .. 4 LOOP
        v_field := pg_catalog.convert_to(CASE i WHEN 1 THEN $1 WHEN 2 THEN $2 WHEN 3 THEN $3 ELSE $4 END, v_encoding);
        v_out := v_out || pg_catalog.int4send(pg_catalog.octet_length(v_field)) || v_field;
    END LOOP;
    RETURN pg_catalog.sha256(v_out);
END
$function$
-- @end

-- @symbol idem_request_hash
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    {{null_arg($1, 1, body, 'idem_request_hash')}}
    RETURN pg_catalog.sha256($1);
END
$function$
-- @end

-- @symbol idem_claim
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, $4, false, CURRENT_USER)::@extschema@.idem__claim_call::@extschema@.idem_claim_result;
END
$function$
-- @end

-- @symbol idem_claim/5
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    a_us pg_catalog.numeric;
    a_saved pg_catalog.text;
    a_result @extschema@.idem_claim_result;
BEGIN
    {{lock_wait_arg($5)}}
    a_result := ROW($1, $2, $3, $4, false, CURRENT_USER)::@extschema@.idem__claim_call::@extschema@.idem_claim_result;
    {{lock_wait_restore()}}
    RETURN a_result;
END
$function$
-- @end

-- @symbol idem_lookup
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, CURRENT_USER)::@extschema@.idem__lookup_call::@extschema@.idem_claim_result;
END
$function$
-- @end

-- @symbol idem_renew
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, CURRENT_USER)::@extschema@.idem__renew_call::pg_catalog.timestamptz;
END
$function$
-- @end

-- @symbol idem_renew/4
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    a_us pg_catalog.numeric;
    a_saved pg_catalog.text;
    a_result pg_catalog.timestamptz;
BEGIN
    {{lock_wait_arg($4)}}
    a_result := ROW($1, $2, $3, CURRENT_USER)::@extschema@.idem__renew_call::pg_catalog.timestamptz;
    {{lock_wait_restore()}}
    RETURN a_result;
END
$function$
-- @end

-- @symbol idem_finalize
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, $4, $5, $6, CURRENT_USER)::@extschema@.idem__finalize_call::pg_catalog.bool;
END
$function$
-- @end

-- @symbol idem_release
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, CURRENT_USER)::@extschema@.idem__release_call::pg_catalog.bool;
END
$function$
-- @end

-- @symbol idem_fail
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, CURRENT_USER)::@extschema@.idem__fail_call::pg_catalog.bool;
END
$function$
-- @end

-- What a row says to a request, without writing (claim.c, decide()):
-- sets v_outcome and v_verdict ('answer', 'waitable', 'steal'), and for a
-- waitable one v_out's lease_expires_at and retry_after.  Host declares
-- v_row, v_now, v_ttl_s, v_after_ttl, v_out, v_same, v_left, v_outcome,
-- v_verdict.
-- @snippet decide(request_hash)
v_now := pg_catalog.clock_timestamp();
v_same := v_row.request_hash IS NULL OR v_row.request_hash = %request_hash%;
v_left := CASE WHEN v_row.lease_expires_at > v_now
               THEN pg_catalog.make_interval(secs => EXTRACT(epoch FROM v_row.lease_expires_at - v_now))
               ELSE '0'::pg_catalog.interval END;
v_verdict := 'answer';
IF v_row.state = 'completed' AND v_now - v_row.created_at <= pg_catalog.make_interval(secs => v_ttl_s) THEN
    v_outcome := CASE WHEN NOT v_same THEN {{outcome:mismatch}}
                      WHEN v_row.replayable THEN {{outcome:replay}} ELSE {{outcome:not_replayable}} END;
ELSIF v_row.state IN ('completed', 'expired') THEN
    v_outcome := NULL;   -- past idem.ttl: below
ELSIF v_left > '0'::pg_catalog.interval THEN
    IF NOT v_same THEN
        v_outcome := {{outcome:mismatch}};
    ELSE
        v_verdict := 'waitable';
        v_out.lease_expires_at := v_row.lease_expires_at;
        IF v_row.state = 'pending' THEN
            v_outcome := {{outcome:in_progress}};
            v_out.retry_after := LEAST(v_left, '1 second'::pg_catalog.interval);
        ELSE
            v_outcome := {{outcome:cooldown}};
            v_out.retry_after := v_left;
        END IF;
    END IF;
ELSIF v_row.request_hash IS NULL THEN
    v_outcome := {{outcome:claimed}};
    v_verdict := 'steal';
ELSIF v_same THEN
    v_outcome := {{outcome:recovered_abandoned}};
    v_verdict := 'steal';
ELSIF v_row.state = 'failed' AND v_now - v_row.created_at > pg_catalog.make_interval(secs => v_ttl_s) THEN
    v_outcome := NULL;
ELSE
    v_outcome := {{outcome:mismatch}};
END IF;
IF v_outcome IS NULL THEN
    -- A finished key past idem.ttl: expired, or run again with 'rerun'.
    IF v_after_ttl = 'rerun' THEN
        v_outcome := {{outcome:recovered_ttl}};
        v_verdict := 'steal';
    ELSE
        v_outcome := {{outcome:expired}};
    END IF;
END IF;
-- @end

-- idem.ttl and idem.after_ttl, as decide() needs them.  Host declares
-- v_ttl_s bigint and v_after_ttl text.
-- @snippet ttl_settings()
{{setting_int(v_ttl_s, idem.ttl)}}
v_after_ttl := pg_catalog.lower(COALESCE(NULLIF(pg_catalog.current_setting('idem.after_ttl', true), ''), 'refuse'));
IF v_after_ttl NOT IN ('refuse', 'rerun') THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = pg_catalog.format('invalid value for parameter "%s": "%s"', 'idem.after_ttl',
                                    pg_catalog.current_setting('idem.after_ttl', true)),
        HINT = 'Available values: refuse, rerun.';
END IF;
-- @end

-- A follower's answer from the row it read: the stored response for the
-- outcomes that carry it (only the status past idem.ttl).
-- @snippet answer_from_row()
IF v_outcome = ANY ({{outcomes_with_response}}) THEN
    v_out.response_status := v_row.response_status;
    IF v_outcome <> {{outcome:expired}} THEN
        v_out.response_headers := v_row.response_headers;
        v_out.response_body := v_row.response_body;
    END IF;
END IF;
-- @end

-- The claim loop of idem_claim and idem_begin (claim.c, claim_key()).
-- @before idem_claim
CREATE DOMAIN @extschema@.idem__caller AS pg_catalog.name
    CHECK (VALUE OPERATOR(pg_catalog.=) CURRENT_USER);
CREATE TYPE @extschema@.idem__claim_call AS (cache_key pg_catalog.bytea, request_hash pg_catalog.bytea, lease pg_catalog.interval, max_wait pg_catalog.interval, in_transaction pg_catalog.bool, caller @extschema@.idem__caller);
CREATE FUNCTION @extschema@.idem__claim(args @extschema@.idem__claim_call)
RETURNS @extschema@.idem_claim_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_cache_key CONSTANT pg_catalog.bytea := args.cache_key;
    p_request_hash CONSTANT pg_catalog.bytea := args.request_hash;
    p_lease CONSTANT pg_catalog.interval := args.lease;
    p_max_wait CONSTANT pg_catalog.interval := args.max_wait;
    p_in_transaction CONSTANT pg_catalog.bool := args.in_transaction;
    p_caller CONSTANT pg_catalog.name := args.caller;
    v_fn CONSTANT pg_catalog.text := CASE WHEN p_in_transaction THEN 'idem_begin' ELSE 'idem_claim' END;
    s_scope pg_catalog.oid;
    a_max_ms pg_catalog.int8;
    a_us pg_catalog.numeric;
    a_text pg_catalog.text;
    g_value pg_catalog.int8;
    g_base pg_catalog.int8;
    g_highest pg_catalog.int8;
    v_lease pg_catalog.interval;
    v_wait_us pg_catalog.numeric;
    v_max_wait_ms pg_catalog.int8;
    v_deadline pg_catalog.timestamptz;
    v_ttl_s pg_catalog.int8;
    v_after_ttl pg_catalog.text;
    v_row record;
    v_now pg_catalog.timestamptz;
    v_same pg_catalog.bool;
    v_left pg_catalog.interval;
    v_outcome pg_catalog.text;
    v_verdict pg_catalog.text;
    v_out @extschema@.idem_claim_result;
    v_claim_id pg_catalog.uuid;
    v_generation pg_catalog.int8;
    v_attempts pg_catalog.int4 := 0;
    v_waiting pg_catalog.bool := false;
    v_poll_ms pg_catalog.int4 := 1;
    v_written pg_catalog.bool;
BEGIN
    {{digest_arg(p_cache_key, 1, cache_key, v_fn)}}
    {{digest_arg(p_request_hash, 2, request_hash, v_fn)}}
    {{lease_arg(v_lease, p_lease, lease, false, idem.lease)}}
    -- The wait: clamped to idem.max_wait; READ COMMITTED only, where each
    -- read sees what committed meanwhile.
    IF p_max_wait IS NOT NULL THEN
        {{interval_us(v_wait_us, p_max_wait)}}
        IF v_wait_us < 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = 'max_wait must be zero or positive', DETAIL = 'The max_wait given is negative.';
        END IF;
        {{setting_int(v_max_wait_ms, idem.max_wait)}}
        v_wait_us := LEAST(v_wait_us, v_max_wait_ms * 1000);
        IF v_wait_us > 0 THEN
            IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION USING ERRCODE = 'active_sql_transaction',
                    MESSAGE = 'max_wait needs a READ COMMITTED transaction',
                    DETAIL = 'Under REPEATABLE READ or SERIALIZABLE a waiting claim could never see the winner''s commit.',
                    HINT = 'Claim outside an explicit transaction, or pass max_wait => NULL.';
            END IF;
            v_deadline := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => v_wait_us / 1000000.0);
        END IF;
    END IF;
    {{caller_scope(p_caller)}}
    {{ttl_settings()}}

    LOOP
        IF v_attempts >= 16 THEN
            RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                MESSAGE = 'could not claim idempotency key: it changed concurrently 16 times',
                HINT = 'The transaction might succeed if retried.';
        END IF;
        v_out := NULL;
        -- The caller's row of the key, else one from before scopes (shared).
        SELECT k.*, k.ctid AS row_ctid INTO v_row
          FROM @extschema@.idem_keys k
         WHERE k.cache_key = p_cache_key AND k.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid])
         ORDER BY k.scope = s_scope DESC
         LIMIT 1;
        IF NOT FOUND THEN
            v_claim_id := pg_catalog.gen_random_uuid();
            {{next_generation(v_generation, 0)}}
            v_now := pg_catalog.clock_timestamp();
            INSERT INTO @extschema@.idem_keys AS k
                   (cache_key, state, request_hash, claim_id, generation, lease_expires_at, created_at,
                    in_transaction, scope)
            VALUES (p_cache_key, 'pending', p_request_hash, v_claim_id, v_generation, v_now + v_lease, v_now,
                    p_in_transaction, s_scope)
            ON CONFLICT (cache_key, scope) DO NOTHING
            RETURNING k.lease_expires_at INTO v_out.lease_expires_at;
            IF FOUND THEN
                v_out.outcome := {{outcome:claimed}};
                v_out.claim_id := v_claim_id;
                v_out.generation := v_generation;
                RETURN v_out;
            END IF;
            v_attempts := v_attempts + 1;   -- someone inserted it first: read theirs
            CONTINUE;
        END IF;

        {{decide(p_request_hash)}}
        -- Arriving during a cooldown is answered at once; only a follower
        -- that already waited for the winner waits the cooldown out.
        IF v_verdict = 'waitable' AND v_deadline IS NOT NULL AND NOT v_waiting
           AND v_outcome = {{outcome:cooldown}} THEN
            EXIT;
        END IF;
        IF v_verdict = 'waitable' AND v_deadline IS NOT NULL AND v_now < v_deadline THEN
            IF v_waiting THEN
                PERFORM pg_catalog.pg_sleep(LEAST(v_poll_ms / 1000.0,
                    GREATEST(EXTRACT(epoch FROM LEAST(v_deadline, v_out.lease_expires_at + '1 ms'::pg_catalog.interval)
                                                - pg_catalog.clock_timestamp()), 0)));
                v_poll_ms := LEAST(v_poll_ms * 2, 50);
            END IF;
            v_waiting := true;
            CONTINUE;
        END IF;
        EXIT WHEN v_verdict <> 'steal';

        -- A take-over of exactly the version read (the row keeps its scope).
        v_claim_id := pg_catalog.gen_random_uuid();
        {{next_generation(v_generation, v_row.generation)}}
        v_now := pg_catalog.clock_timestamp();
        {{fenced(v_written, UPDATE @extschema@.idem_keys AS k
           SET state = 'pending', request_hash = p_request_hash, claim_id = v_claim_id,
               generation = v_generation, lease_expires_at = v_now + v_lease, created_at = v_now,
               finished_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL,
               replayable = true, in_transaction = p_in_transaction
         WHERE k.ctid = v_row.row_ctid AND k.cache_key = p_cache_key AND k.scope = v_row.scope
           AND k.generation = v_row.generation AND k.state = v_row.state
         RETURNING k.lease_expires_at INTO v_out.lease_expires_at)}}
        IF v_written THEN
            v_out.outcome := v_outcome;
            v_out.retry_after := NULL;
            v_out.claim_id := v_claim_id;
            v_out.generation := v_generation;
            RETURN v_out;
        END IF;
        v_attempts := v_attempts + 1;   -- the key changed between our read and our write
    END LOOP;

    v_out.outcome := v_outcome;
    {{answer_from_row()}}
    RETURN v_out;
END
$function$;
CREATE CAST (@extschema@.idem__claim_call AS @extschema@.idem_claim_result) WITH FUNCTION @extschema@.idem__claim(@extschema@.idem__claim_call);
-- @end

-- What a claim would answer, writing nothing (claim.c, idem_lookup).
-- @before idem_lookup
CREATE TYPE @extschema@.idem__lookup_call AS (cache_key pg_catalog.bytea, request_hash pg_catalog.bytea, caller @extschema@.idem__caller);
CREATE FUNCTION @extschema@.idem__lookup(args @extschema@.idem__lookup_call)
RETURNS @extschema@.idem_claim_result
-- VOLATILE only for the security-restricted operation probe (UNLISTEN);
-- it writes nothing.
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_cache_key CONSTANT pg_catalog.bytea := args.cache_key;
    p_request_hash CONSTANT pg_catalog.bytea := args.request_hash;
    p_caller CONSTANT pg_catalog.name := args.caller;
    s_scope pg_catalog.oid;
    v_ttl_s pg_catalog.int8;
    v_after_ttl pg_catalog.text;
    v_row record;
    v_now pg_catalog.timestamptz;
    v_same pg_catalog.bool;
    v_left pg_catalog.interval;
    v_outcome pg_catalog.text;
    v_verdict pg_catalog.text;
    v_out @extschema@.idem_claim_result;
BEGIN
    {{digest_arg(p_cache_key, 1, cache_key, 'idem_lookup')}}
    {{digest_arg(p_request_hash, 2, request_hash, 'idem_lookup')}}
    {{caller_scope(p_caller)}}
    {{ttl_settings()}}
    SELECT k.* INTO v_row
      FROM @extschema@.idem_keys k
     WHERE k.cache_key = p_cache_key AND k.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid])
     ORDER BY k.scope = s_scope DESC
     LIMIT 1;
    IF NOT FOUND THEN
        v_out.outcome := {{outcome:absent}};
        RETURN v_out;
    END IF;
    {{decide(p_request_hash)}}
    IF v_verdict = 'steal' THEN
        v_out := NULL;
        v_out.outcome := {{outcome:claimable}};
        RETURN v_out;
    END IF;
    v_out.outcome := v_outcome;
    {{answer_from_row()}}
    RETURN v_out;
END
$function$;
CREATE CAST (@extschema@.idem__lookup_call AS @extschema@.idem_claim_result) WITH FUNCTION @extschema@.idem__lookup(@extschema@.idem__lookup_call);
-- @end

-- The owner's calls (finish.c): one UPDATE each, of the caller's row of
-- the key (or a shared one from before scopes) pending under claim_id;
-- READ COMMITTED re-checks the fence against the newest version.
-- Host declares s_scope.
-- @snippet fence_args(function)
{{digest_arg(p_cache_key, 1, cache_key, %function%)}}
{{null_arg(p_claim_id, 2, claim_id, %function%)}}
-- @end

-- @snippet owned(alias)
%alias%.cache_key = p_cache_key AND %alias%.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid])
AND %alias%.state = 'pending' AND %alias%.claim_id = p_claim_id
-- @end

-- @before idem_renew
CREATE TYPE @extschema@.idem__renew_call AS (cache_key pg_catalog.bytea, claim_id pg_catalog.uuid, lease pg_catalog.interval, caller @extschema@.idem__caller);
CREATE FUNCTION @extschema@.idem__renew(args @extschema@.idem__renew_call)
RETURNS pg_catalog.timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_cache_key CONSTANT pg_catalog.bytea := args.cache_key;
    p_claim_id CONSTANT pg_catalog.uuid := args.claim_id;
    p_lease CONSTANT pg_catalog.interval := args.lease;
    p_caller CONSTANT pg_catalog.name := args.caller;
    s_scope pg_catalog.oid;
    a_max_ms pg_catalog.int8;
    a_us pg_catalog.numeric;
    a_text pg_catalog.text;
    v_lease pg_catalog.interval;
    v_until pg_catalog.timestamptz;
    v_written pg_catalog.bool;
BEGIN
    {{fence_args('idem_renew')}}
    {{lease_arg(v_lease, p_lease, lease, false, idem.lease)}}
    {{caller_scope(p_caller)}}
    {{fenced(v_written, UPDATE @extschema@.idem_keys AS k SET lease_expires_at = pg_catalog.clock_timestamp() + v_lease
     WHERE {{owned(k)}}
     RETURNING k.lease_expires_at INTO v_until)}}
    RETURN CASE WHEN v_written THEN v_until END;
END
$function$;
CREATE CAST (@extschema@.idem__renew_call AS pg_catalog.timestamptz) WITH FUNCTION @extschema@.idem__renew(@extschema@.idem__renew_call);
-- @end

-- @before idem_finalize
CREATE TYPE @extschema@.idem__finalize_call AS (cache_key pg_catalog.bytea, claim_id pg_catalog.uuid, status pg_catalog.int4, headers pg_catalog.jsonb, body pg_catalog.bytea, strict_only pg_catalog.bool, caller @extschema@.idem__caller);
CREATE FUNCTION @extschema@.idem__finalize(args @extschema@.idem__finalize_call)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_cache_key CONSTANT pg_catalog.bytea := args.cache_key;
    p_claim_id CONSTANT pg_catalog.uuid := args.claim_id;
    p_status CONSTANT pg_catalog.int4 := args.status;
    p_headers CONSTANT pg_catalog.jsonb := args.headers;
    p_body CONSTANT pg_catalog.bytea := args.body;
    p_strict CONSTANT pg_catalog.bool := args.strict_only;
    p_caller CONSTANT pg_catalog.name := args.caller;
    s_scope pg_catalog.oid;
    v_max_bytes pg_catalog.int8;
    v_body pg_catalog.bytea;
    v_written pg_catalog.bool;
BEGIN
    {{fence_args('idem_finalize')}}
    {{null_arg(p_status, 3, status, 'idem_finalize')}}
    IF p_status < 100 OR p_status > 599 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'status must be an HTTP status code between 100 and 599',
            DETAIL = pg_catalog.format('The status given is %s.', p_status);
    END IF;
    {{null_arg(p_strict, 6, strict, 'idem_finalize')}}
    -- Headers are what a replay sends: an object of strings.
    IF p_headers IS NOT NULL THEN
        IF pg_catalog.jsonb_typeof(p_headers) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = 'headers must be a JSON object',
                DETAIL = 'Headers are stored as {"name": "value", ...}.';
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.jsonb_each(p_headers) AS h(name, value)
                    WHERE pg_catalog.jsonb_typeof(h.value) <> 'string') THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = 'header values must be JSON strings', HINT = 'Join repeated headers with ", ".';
        END IF;
    END IF;
    {{setting_int(v_max_bytes, idem.max_response_bytes)}}
    -- No body (204, say) replays as an empty one; one over the cap is
    -- recorded as completed, not what it was.
    v_body := CASE WHEN p_body IS NULL THEN '\x'::pg_catalog.bytea
                   WHEN pg_catalog.octet_length(p_body) > v_max_bytes THEN NULL ELSE p_body END;
    {{caller_scope(p_caller)}}
    {{fenced(v_written, UPDATE @extschema@.idem_keys AS k
       SET state = 'completed', response_status = p_status, response_headers = p_headers,
           response_body = v_body, replayable = v_body IS NOT NULL,
           finished_at = pg_catalog.clock_timestamp(), lease_expires_at = NULL
     WHERE {{owned(k)}})}}
    IF v_written THEN
        RETURN true;
    END IF;
    IF p_strict THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:lease_lost}},
            MESSAGE = 'idempotency claim is no longer owned',
            DETAIL = pg_catalog.format('Could not finalize: key %s is not pending under claim %s.', p_cache_key, p_claim_id),
            HINT = 'Roll back: the lease expired and another request now owns the key, or the claim was already finished.';
    END IF;
    RETURN false;
END
$function$;
CREATE CAST (@extschema@.idem__finalize_call AS pg_catalog.bool) WITH FUNCTION @extschema@.idem__finalize(@extschema@.idem__finalize_call);
-- @end

-- Release and eviction leave a tombstone: failed, its cooldown over, with
-- neither hash nor owner, so that any request claims the key at once and
-- the key keeps its place in the generation order (finish.c).
-- @snippet tombstone()
state = 'failed', request_hash = NULL, claim_id = NULL,
lease_expires_at = pg_catalog.clock_timestamp(), finished_at = pg_catalog.clock_timestamp(),
response_status = NULL, response_headers = NULL, response_body = NULL, replayable = true
-- @end

-- @before idem_release
CREATE TYPE @extschema@.idem__release_call AS (cache_key pg_catalog.bytea, claim_id pg_catalog.uuid, caller @extschema@.idem__caller);
CREATE FUNCTION @extschema@.idem__release(args @extschema@.idem__release_call)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_cache_key CONSTANT pg_catalog.bytea := args.cache_key;
    p_claim_id CONSTANT pg_catalog.uuid := args.claim_id;
    p_caller CONSTANT pg_catalog.name := args.caller;
    s_scope pg_catalog.oid;
    v_written pg_catalog.bool;
BEGIN
    {{fence_args('idem_release')}}
    {{caller_scope(p_caller)}}
    {{fenced(v_written, UPDATE @extschema@.idem_keys AS k SET {{tombstone()}} WHERE {{owned(k)}})}}
    RETURN v_written;
END
$function$;
CREATE CAST (@extschema@.idem__release_call AS pg_catalog.bool) WITH FUNCTION @extschema@.idem__release(@extschema@.idem__release_call);
-- @end

-- @before idem_fail
CREATE TYPE @extschema@.idem__fail_call AS (cache_key pg_catalog.bytea, claim_id pg_catalog.uuid, cooldown pg_catalog.interval, caller @extschema@.idem__caller);
CREATE FUNCTION @extschema@.idem__fail(args @extschema@.idem__fail_call)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_cache_key CONSTANT pg_catalog.bytea := args.cache_key;
    p_claim_id CONSTANT pg_catalog.uuid := args.claim_id;
    p_cooldown CONSTANT pg_catalog.interval := args.cooldown;
    p_caller CONSTANT pg_catalog.name := args.caller;
    s_scope pg_catalog.oid;
    a_max_ms pg_catalog.int8;
    a_us pg_catalog.numeric;
    a_text pg_catalog.text;
    v_cooldown pg_catalog.interval;
    v_written pg_catalog.bool;
BEGIN
    {{fence_args('idem_fail')}}
    {{lease_arg(v_cooldown, p_cooldown, cooldown, true, idem.failure_cooldown)}}
    {{caller_scope(p_caller)}}
    {{fenced(v_written, UPDATE @extschema@.idem_keys AS k
       SET state = 'failed', lease_expires_at = pg_catalog.clock_timestamp() + v_cooldown,
           finished_at = pg_catalog.clock_timestamp()
     WHERE {{owned(k)}})}}
    RETURN v_written;
END
$function$;
CREATE CAST (@extschema@.idem__fail_call AS pg_catalog.bool) WITH FUNCTION @extschema@.idem__fail(@extschema@.idem__fail_call);
-- @end

-- The two horizons (cleanup.c): the pick locks each key's newest version
-- and re-checks the predicate, so a key re-claimed or finalized since the
-- statement began survives; the write finds the picked rows by TID (with
-- enable_tidscan pinned on); SKIP LOCKED lets several sessions clean.
-- Admin only (EXECUTE for idem_admin): it runs as the tables' owner.
-- @symbol idem_cleanup
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET enable_tidscan = on
AS $function$
DECLARE
    v_batch ALIAS FOR $1;
    v_ttl_s pg_catalog.int8;
    v_tombstone_s pg_catalog.int8;
    v_delete_after pg_catalog.interval;
    v_ttl pg_catalog.interval;
    v_deleted pg_catalog.int8;
    v_expired pg_catalog.int8 := 0;
BEGIN
    {{null_arg(v_batch, 1, batch, 'idem_cleanup')}}
    IF v_batch < 1 OR v_batch > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'batch must be between 1 and 1000000',
            DETAIL = pg_catalog.format('The batch given is %s.', v_batch);
    END IF;
    {{setting_int(v_ttl_s, idem.ttl)}}
    {{setting_int(v_tombstone_s, idem.tombstone_ttl)}}
    v_ttl := pg_catalog.make_interval(secs => v_ttl_s);
    v_delete_after := pg_catalog.make_interval(secs => GREATEST(v_ttl_s, v_tombstone_s));
    -- The picked rows are written by their TIDs, not looked up by key (see
    -- the C edition's keys/cleanup.c): a key's index probe is a random leaf.
    DELETE FROM @extschema@.idem_keys k
     WHERE k.ctid = ANY (ARRAY(
           SELECT p.ctid FROM @extschema@.idem_keys p
            WHERE p.state IN ('completed', 'failed', 'expired')
              AND p.created_at < pg_catalog.clock_timestamp() - v_delete_after
              AND (p.state <> 'failed' OR p.lease_expires_at < pg_catalog.clock_timestamp())
            LIMIT v_batch FOR UPDATE SKIP LOCKED))
       AND k.state IN ('completed', 'failed', 'expired')
       AND k.created_at < pg_catalog.clock_timestamp() - v_delete_after
       AND (k.state <> 'failed' OR k.lease_expires_at < pg_catalog.clock_timestamp());
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    IF v_deleted < v_batch AND v_tombstone_s > v_ttl_s THEN
        UPDATE @extschema@.idem_keys k
           SET state = 'expired', response_headers = NULL, response_body = NULL
         WHERE k.ctid = ANY (ARRAY(
               SELECT p.ctid FROM @extschema@.idem_keys p
                WHERE p.state = 'completed' AND p.created_at < pg_catalog.clock_timestamp() - v_ttl
                LIMIT v_batch - v_deleted FOR UPDATE SKIP LOCKED))
           AND k.state = 'completed' AND k.created_at < pg_catalog.clock_timestamp() - v_ttl;
        GET DIAGNOSTICS v_expired = ROW_COUNT;
    END IF;
    RETURN v_deleted + v_expired;
END
$function$
-- @end
