-- The SQL edition of multi-step attempts, part one (attempts/
-- attempts_names.c, attempts_open.c): names, object keys, intent hashes,
-- kinds and the replay decision table.  The transitions, the reconciler
-- and the guards are in 61_sql_attempt_transitions.sql.  The state
-- machine is the protocol's (protocol.toml), filled in by build.py where
-- a body names it.

-- Targets and key prefixes become object-key path segments, checked, not
-- rewritten: segments of [A-Za-z0-9._-] joined by '/', none empty, none
-- "." or "..".  The first problem met, byte by byte, is reported.  Host
-- declares p_len, p_start, p_seg int4 and p_c text.
-- @snippet check_path(what, path, max_bytes)
IF pg_catalog.octet_length(%path%) > %max_bytes% THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = pg_catalog.format('%s must be at most %s bytes', %what%, %max_bytes%),
        DETAIL = pg_catalog.format('The %s given is %s bytes long.', %what%, pg_catalog.octet_length(%path%));
END IF;
p_len := pg_catalog.length(%path%);
p_start := 1;
FOR p_i IN 1 .. p_len + 1 LOOP
    p_c := CASE WHEN p_i <= p_len THEN pg_catalog.substr(%path%, p_i, 1) END;
    IF p_c IS NULL OR p_c = '/' THEN
        p_seg := p_i - p_start;
        IF p_seg = 0 OR pg_catalog.substr(%path%, p_start, p_seg) IN ('.', '..') THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = pg_catalog.format('invalid %s "%s"', %what%, %path%),
                DETAIL = 'A path segment is empty, "." or "..".',
                HINT = 'Use segments of letters, digits, ''.'', ''-'' and ''_'' joined by ''/''.';
        END IF;
        p_start := p_i + 1;
    ELSIF p_c !~ '^[A-Za-z0-9._-]$' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('invalid %s "%s"', %what%, %path%),
            DETAIL = pg_catalog.format('The byte at offset %s is not a letter, digit, ''.'', ''-'', ''_'' or ''/''.',
                                       pg_catalog.octet_length(pg_catalog.substr(%path%, 1, p_i - 1))),
            HINT = 'Use segments of letters, digits, ''.'', ''-'' and ''_'' joined by ''/''.';
    END IF;
END LOOP;
-- @end

-- A non-NULL text argument that must not be empty.
-- @snippet text_arg(arg, position, name, function)
{{null_arg(%arg%, %position%, %name%, %function%)}}
IF %arg% = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = '%name% must not be empty';
END IF;
-- @end

-- A kind is a lower-case identifier: it becomes part of event topics.
-- @snippet check_kind(kind)
IF %kind% !~ '^[a-z][a-z0-9_]{0,62}$' OR pg_catalog.octet_length(%kind%) > 63 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = pg_catalog.format('invalid attempt kind "%s"', %kind%),
        DETAIL = 'A kind is a lower-case letter followed by up to 62 lower-case letters, digits or underscores.';
END IF;
-- @end

-- A client's file name as one safe object-key segment (attempts_names.c):
-- its last '/' or '\' segment, every character outside [A-Za-z0-9.-]
-- made '_' (runs collapsed), no leading or trailing dots, at most 100
-- bytes with a short extension kept.  target text := of name text.
-- Host declares n_kept text, n_ext text.
-- @snippet safe_name(target, name)
IF pg_catalog.octet_length(%name%) = 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'object name must not be empty';
END IF;
n_kept := pg_catalog.regexp_replace(pg_catalog.regexp_replace(
              pg_catalog.regexp_replace(%name%, '^.*[/\\]', ''), '[^A-Za-z0-9.-]', '_', 'g'), '_+', '_', 'g');
n_kept := pg_catalog.ltrim(n_kept, '.');
IF pg_catalog.length(n_kept) > 100 THEN
    n_ext := pg_catalog.substring(n_kept, '(\.[^.]*)$');
    IF n_ext IS NULL OR pg_catalog.length(n_ext) > 16 OR pg_catalog.length(n_ext) = pg_catalog.length(n_kept) THEN
        n_ext := '';
    END IF;
    n_kept := pg_catalog.left(n_kept, 100 - pg_catalog.length(n_ext)) || n_ext;
END IF;
n_kept := pg_catalog.rtrim(n_kept, '.');
IF n_kept = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = pg_catalog.format('object name "%s" has no usable characters', %name%),
        DETAIL = 'Names keep letters, digits, ''.'', ''-'' and ''_'' of their last path segment, without leading or trailing dots.';
END IF;
%target% := n_kept;
-- @end

-- The SHA-256 of an intent's jsonb text (canonical: keys sorted, no
-- duplicates, fixed whitespace; 1.0 and 1 differ).
-- @snippet intent_hash(intent)
pg_catalog.sha256(pg_catalog.convert_to(%intent%::pg_catalog.text, pg_catalog.current_setting('server_encoding')))
-- @end

-- @symbol idem_intent_hash
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    {{null_arg($1, 1, intent, 'idem_intent_hash')}}
    RETURN {{intent_hash($1)}};
END
$function$
-- @end

-- @symbol idem_attempt_safe_name
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    n_kept pg_catalog.text;
    n_ext pg_catalog.text;
    v_name pg_catalog.text;
BEGIN
    {{null_arg($1, 1, name, 'idem_attempt_safe_name')}}
    {{safe_name(v_name, $1)}}
    RETURN v_name;
END
$function$
-- @end

-- {key_prefix}/{target}/{attempt_id}/g{generation}/{safe name}.
-- @snippet object_key(prefix, target, attempt_id, generation, safe)
(%prefix%) || '/' || (%target%) || '/' || (%attempt_id%)::pg_catalog.text || '/g' || (%generation%)::pg_catalog.text || '/' || (%safe%)
-- @end

-- @symbol idem_attempt_object_key
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_len pg_catalog.int4;
    p_start pg_catalog.int4;
    p_seg pg_catalog.int4;
    p_c pg_catalog.text;
    n_kept pg_catalog.text;
    n_ext pg_catalog.text;
    v_name pg_catalog.text;
BEGIN
    {{text_arg($1, 1, key_prefix, 'idem_attempt_object_key')}}
    {{text_arg($2, 2, target, 'idem_attempt_object_key')}}
    {{check_path('key prefix', $1, 255)}}
    {{check_path('target', $2, 512)}}
    {{null_arg($3, 3, attempt_id, 'idem_attempt_object_key')}}
    {{generation_arg($4, 4, 'idem_attempt_object_key')}}
    {{null_arg($5, 5, name, 'idem_attempt_object_key')}}
    {{safe_name(v_name, $5)}}
    RETURN {{object_key($1, $2, $3, $4, v_name)}};
END
$function$
-- @end

-- A generation argument: not NULL, at least 1.
-- @snippet generation_arg(arg, position, function)
{{null_arg(%arg%, %position%, generation, %function%)}}
IF %arg% < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'generation must be at least 1',
        DETAIL = pg_catalog.format('The generation given is %s.', %arg%);
END IF;
-- @end

-- Register a kind (admin): true when registered now, false when already
-- registered the same way; a kind's mode and prefix never change.
-- @symbol idem_attempt_register_kind
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    p_len pg_catalog.int4;
    p_start pg_catalog.int4;
    p_seg pg_catalog.int4;
    p_c pg_catalog.text;
    v_old record;
BEGIN
    {{text_arg($1, 1, kind, 'idem_attempt_register_kind')}}
    {{text_arg($2, 2, mode, 'idem_attempt_register_kind')}}
    {{text_arg($3, 3, key_prefix, 'idem_attempt_register_kind')}}
    {{check_kind($1)}}
    IF $2 NOT IN ('append', 'replace') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('invalid attempt mode "%s"', $2),
            DETAIL = 'The mode is append (the caller inserts an entity per promotion) or replace (a current pointer per target flips).';
    END IF;
    {{check_path('key prefix', $3, 255)}}
    INSERT INTO @extschema@.idem_attempt_kinds AS k (kind, mode, key_prefix) VALUES ($1, $2, $3)
    ON CONFLICT ON CONSTRAINT idem_attempt_kinds_pkey DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT k.mode, k.key_prefix INTO v_old FROM @extschema@.idem_attempt_kinds k WHERE k.kind = $1;
    IF v_old.mode <> $2 OR v_old.key_prefix <> $3 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('attempt kind "%s" is already registered differently', $1),
            DETAIL = pg_catalog.format('It is registered with mode %s and key prefix "%s".', v_old.mode, v_old.key_prefix),
            HINT = 'A kind''s mode and prefix never change; register a new kind.';
    END IF;
    RETURN false;
END
$function$
-- @end

-- Can a failed attempt with reason be reopened (a new generation)?
-- @snippet reopenable(reason)
EXISTS (SELECT FROM {{attempt_transitions}}
         WHERE transition.next_generation AND transition.from_status = 'failed'
           AND (transition.from_reason IS NULL OR transition.from_reason = %reason%))
-- @end

-- The reopen CAS (attempts_transitions.c, attempt_reopen_cas):
-- failed(reaped_no_blob | digest_mismatch) at generation -> pending at
-- generation + 1 under the generation's new key.  Sets FOUND; on a hit
-- r_generation and r_key.  Host declares r_parts record, r_generation
-- int8, r_key text, n_kept, n_ext, v_name text, p_len, p_start, p_seg
-- int4, p_c text.
-- @snippet reopen_cas(attempt_id, generation)
r_generation := NULL;
r_key := NULL;
SELECT k.key_prefix, a.target, a.object_name INTO r_parts
  FROM @extschema@.idem_attempts a JOIN @extschema@.idem_attempt_kinds k ON k.kind = a.kind
 WHERE a.attempt_id = %attempt_id%;
IF FOUND THEN
    {{check_path('key prefix', r_parts.key_prefix, 255)}}
    {{check_path('target', r_parts.target, 512)}}
    {{safe_name(v_name, r_parts.object_name)}}
    UPDATE @extschema@.idem_attempts AS a
       SET status = 'pending', failure_reason = NULL, generation = a.generation + 1,
           object_key = {{object_key(r_parts.key_prefix, r_parts.target, %attempt_id%, %generation% + 1, v_name)}},
           updated_at = pg_catalog.clock_timestamp()
     WHERE a.attempt_id = %attempt_id% AND a.generation = %generation%
       AND a.target = r_parts.target AND a.object_name = r_parts.object_name
       AND a.status = 'failed' AND a.failure_reason IN ('reaped_no_blob', 'digest_mismatch')
    RETURNING a.generation, a.object_key INTO r_generation, r_key;
END IF;
-- @end

-- @before idem_attempt_open
CREATE TYPE @extschema@.idem__attempt_open_call AS (
    kind pg_catalog.text, target pg_catalog.text, client_request_id pg_catalog.text, created_by pg_catalog.text,
    intent pg_catalog.jsonb, object_name pg_catalog.text, declared_digest pg_catalog.bytea, caller @extschema@.idem__caller);
-- The replay decision table (attempts_open.c): another role's attempt is
-- never read; no row: new; another created_by: forbidden; another intent
-- (or declared digest): mismatch; pending or stored: resume; promoted or
-- superseded: with the current attempt; failed and reopenable: reopened,
-- a new generation; failed otherwise: gone.
CREATE FUNCTION @extschema@.idem__attempt_open(args @extschema@.idem__attempt_open_call)
RETURNS @extschema@.idem_attempt_decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
    p_len pg_catalog.int4;
    p_start pg_catalog.int4;
    p_seg pg_catalog.int4;
    p_c pg_catalog.text;
    n_kept pg_catalog.text;
    n_ext pg_catalog.text;
    v_name pg_catalog.text;
    v_hash pg_catalog.bytea;
    v_kind record;
    v_row record;
    v_id pg_catalog.uuid;
    r_parts record;
    r_generation pg_catalog.int8;
    r_key pg_catalog.text;
    d @extschema@.idem_attempt_decision;
BEGIN
    {{text_arg(args.kind, 1, kind, 'idem_attempt_open')}}
    {{text_arg(args.target, 2, target, 'idem_attempt_open')}}
    {{text_arg(args.client_request_id, 3, client_request_id, 'idem_attempt_open')}}
    {{text_arg(args.created_by, 4, created_by, 'idem_attempt_open')}}
    {{null_arg(args.intent, 5, intent, 'idem_attempt_open')}}
    IF pg_catalog.jsonb_typeof(args.intent) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'intent must be a JSON object';
    END IF;
    v_hash := {{intent_hash(args.intent)}};
    {{check_kind(args.kind)}}
    {{check_path('target', args.target, 512)}}
    IF pg_catalog.octet_length(args.client_request_id) > {{max_key_bytes}} THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'client_request_id must be at most {{max_key_bytes}} bytes',
            DETAIL = pg_catalog.format('The client_request_id given is %s bytes long.', pg_catalog.octet_length(args.client_request_id));
    END IF;
    {{null_arg(args.object_name, 6, object_name, 'idem_attempt_open')}}
    {{safe_name(v_name, args.object_name)}}
    IF args.declared_digest IS NOT NULL THEN
        {{digest_arg(args.declared_digest, 7, declared_digest, 'idem_attempt_open')}}
    END IF;
    SELECT k.mode, k.key_prefix INTO v_kind FROM @extschema@.idem_attempt_kinds k WHERE k.kind = args.kind;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = pg_catalog.format('attempt kind "%s" is not registered', args.kind),
            HINT = 'Register it with idem_attempt_register_kind(kind, mode, key_prefix).';
    END IF;
    {{caller_scope(args.caller)}}

    FOR round IN 1 .. 16 LOOP
        d := NULL;
        SELECT a.attempt_id, a.created_by, a.intent_hash, a.generation, a.status, a.failure_reason,
               a.object_key, a.declared_digest, a.created_at, a.superseded_by, a.scope
          INTO v_row
          FROM @extschema@.idem_attempts a
         WHERE a.kind = args.kind AND a.target = args.target AND a.client_request_id = args.client_request_id
           AND a.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid])
         ORDER BY a.scope = s_scope DESC LIMIT 1;
        IF NOT FOUND THEN
            v_id := pg_catalog.gen_random_uuid();
            {{check_path('key prefix', v_kind.key_prefix, 255)}}
            INSERT INTO @extschema@.idem_attempts AS a
                   (attempt_id, kind, target, client_request_id, created_by, intent, intent_hash,
                    declared_digest, object_name, object_key, scope)
            VALUES (v_id, args.kind, args.target, args.client_request_id, args.created_by, args.intent, v_hash,
                    args.declared_digest, v_name,
                    {{object_key(v_kind.key_prefix, args.target, v_id, 1, v_name)}}, s_scope)
            ON CONFLICT (kind, target, client_request_id, scope) DO NOTHING
            RETURNING a.created_at, a.object_key INTO d.created_at, d.object_key;
            IF FOUND THEN
                d.decision := 'new';
                d.attempt_id := v_id;
                d.generation := 1;
                d.status := 'pending';
                d.next_step := 'upload';
                d.declared_digest := args.declared_digest;
                RETURN d;
            END IF;
            CONTINUE;   -- a concurrent open inserted it: read theirs
        END IF;
        -- Another principal of the caller's own service: say nothing of it.
        IF v_row.created_by <> args.created_by THEN
            d.decision := 'forbidden';
            RETURN d;
        END IF;
        d.attempt_id := v_row.attempt_id;
        d.generation := v_row.generation;
        d.status := v_row.status;
        d.failure_reason := v_row.failure_reason;
        d.object_key := v_row.object_key;
        d.declared_digest := v_row.declared_digest;
        d.created_at := v_row.created_at;
        IF v_row.intent_hash <> v_hash
           OR (args.declared_digest IS NOT NULL
               AND (v_row.declared_digest IS NULL OR v_row.declared_digest <> args.declared_digest)) THEN
            d.decision := 'mismatch';
        ELSIF v_row.status IN ('pending', 'stored') THEN
            d.decision := 'resume';
            d.next_step := CASE v_row.status WHEN 'pending' THEN 'upload' ELSE 'promote' END;
        ELSIF v_row.status = 'promoted' THEN
            d.decision := 'promoted';
            d.current_attempt_id := v_row.attempt_id;
        ELSIF v_row.status = 'superseded' THEN
            d.decision := 'superseded';
            d.current_attempt_id := CASE WHEN v_kind.mode = 'replace' THEN
                (SELECT t.current_attempt_id FROM @extschema@.idem_attempt_targets t
                  WHERE t.kind = args.kind AND t.target = args.target
                    AND t.scope = ANY (ARRAY[v_row.scope::pg_catalog.oid, 0::pg_catalog.oid])
                  ORDER BY t.scope = v_row.scope DESC LIMIT 1) END;
            d.current_attempt_id := COALESCE(d.current_attempt_id, v_row.superseded_by);
        ELSIF NOT {{reopenable(v_row.failure_reason)}} THEN
            d.decision := 'gone';
        ELSE
            {{reopen_cas(v_row.attempt_id, v_row.generation)}}
            IF r_generation IS NULL THEN
                CONTINUE;   -- reopened concurrently: read it again
            END IF;
            d.decision := 'reopened';
            d.generation := r_generation;
            d.object_key := r_key;
            d.status := 'pending';
            d.failure_reason := NULL;
            d.next_step := 'upload';
        END IF;
        RETURN d;
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
        MESSAGE = 'could not open attempt: it changed concurrently 16 times',
        HINT = 'The transaction might succeed if retried.';
END
$function$;
CREATE CAST (@extschema@.idem__attempt_open_call AS @extschema@.idem_attempt_decision)
    WITH FUNCTION @extschema@.idem__attempt_open(@extschema@.idem__attempt_open_call);
-- @end

-- @symbol idem_attempt_open
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, $3, $4, $5, $6, $7, CURRENT_USER)::@extschema@.idem__attempt_open_call
           ::@extschema@.idem_attempt_decision;
END
$function$
-- @end

-- @before idem_attempt_current
CREATE TYPE @extschema@.idem__attempt_current_call AS (kind pg_catalog.text, target pg_catalog.text, caller @extschema@.idem__caller);
-- A replace-kind target's current attempt in the caller's scope (else
-- the shared one from before 0.5.0), or NULL.
CREATE FUNCTION @extschema@.idem__attempt_current(args @extschema@.idem__attempt_current_call)
RETURNS pg_catalog.uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    s_scope pg_catalog.oid;
BEGIN
    {{null_arg(args.kind, 1, kind, 'idem_attempt_current')}}
    {{null_arg(args.target, 2, target, 'idem_attempt_current')}}
    {{caller_scope(args.caller)}}
    RETURN (SELECT t.current_attempt_id FROM @extschema@.idem_attempt_targets t
             WHERE t.kind = args.kind AND t.target = args.target AND t.scope = ANY (ARRAY[s_scope, 0::pg_catalog.oid])
             ORDER BY t.scope = s_scope DESC LIMIT 1);
END
$function$;
CREATE CAST (@extschema@.idem__attempt_current_call AS pg_catalog.uuid)
    WITH FUNCTION @extschema@.idem__attempt_current(@extschema@.idem__attempt_current_call);
-- @end

-- @symbol idem_attempt_current
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN ROW($1, $2, CURRENT_USER)::@extschema@.idem__attempt_current_call::pg_catalog.uuid;
END
$function$
-- @end
