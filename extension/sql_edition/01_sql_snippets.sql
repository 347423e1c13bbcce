-- The SQL edition: what its PL/pgSQL bodies share, expanded into each of
-- them by build.py (where a body names one in double braces), since a body that called a
-- shared function by name could be made to call another role's overload
-- (a role that may create in the extension's schema plants one with the
-- same arguments and one more defaulted parameter: the call becomes
-- ambiguous).  Each snippet says which variables its host declares.
--
-- The checks and messages are the C edition's (core/arguments.c,
-- core/scope.c, core/settings.c): the same SQLSTATE, message and detail.

-- A NULL argument is an error naming it, never a silent default.
-- @snippet null_arg(arg, position, name, function)
IF %arg% IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed',
        MESSAGE = '%name% must not be null',
        DETAIL = pg_catalog.format('Argument %s of %s, %s, is null.', %position%, %function%, '%name%');
END IF;
-- @end

-- A non-NULL bytea argument that must be a SHA-256 digest.
-- @snippet digest_arg(arg, position, name, function)
{{null_arg(%arg%, %position%, %name%, %function%)}}
IF pg_catalog.octet_length(%arg%) <> 32 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = '%name% must be a 32-byte SHA-256 digest',
        DETAIL = pg_catalog.format('The value given is %s bytes long.', pg_catalog.octet_length(%arg%)),
        HINT = 'Compute it with idem_key() or idem_request_hash().';
END IF;
-- @end

-- A duration in the units SHOW uses: the largest of d, h, min, s, ms that
-- divides it ("1h", "90s"); target text := of ms bigint.
-- @snippet format_ms(target, ms)
%target% := CASE
    WHEN %ms% <> 0 AND %ms% % 86400000 = 0 THEN (%ms% / 86400000)::pg_catalog.text || 'd'
    WHEN %ms% <> 0 AND %ms% % 3600000 = 0 THEN (%ms% / 3600000)::pg_catalog.text || 'h'
    WHEN %ms% <> 0 AND %ms% % 60000 = 0 THEN (%ms% / 60000)::pg_catalog.text || 'min'
    WHEN %ms% <> 0 AND %ms% % 1000 = 0 THEN (%ms% / 1000)::pg_catalog.text || 's'
    ELSE %ms%::pg_catalog.text || 'ms' END;
-- @end

-- An integer setting (idem.*) in its base unit: the server knows none of
-- them (no library defines them), so a value set with SET, ALTER ROLE or
-- ALTER DATABASE is a placeholder string, read and checked here as the
-- C edition's definition would (core/settings.c: default, range, unit),
-- with the messages PostgreSQL gives for a bad value of a defined one.
-- Host declares nothing; target is a bigint variable.
-- @snippet setting_int(target, name)
DECLARE
    s_raw CONSTANT pg_catalog.text := pg_catalog.current_setting('%name%', true);
    s_unit CONSTANT pg_catalog.text := {{setting:%name%:unit}};
    s_m pg_catalog.text[];
    s_value pg_catalog.numeric;
BEGIN
    IF s_raw IS NULL OR s_raw = '' THEN
        %target% := {{setting:%name%:default}};
    ELSE
        s_m := pg_catalog.regexp_match(s_raw, '^\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*([a-zA-Z]*)\s*$');
        IF s_m IS NULL OR (s_unit = '' AND s_m[4] <> '') THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = pg_catalog.format('invalid value for parameter "%s": "%s"', '%name%', s_raw);
        END IF;
        s_value := s_m[1]::pg_catalog.numeric * CASE s_unit
            WHEN 'ms' THEN CASE s_m[4] WHEN '' THEN 1 WHEN 'us' THEN 0.001 WHEN 'ms' THEN 1 WHEN 's' THEN 1000
                                       WHEN 'min' THEN 60000 WHEN 'h' THEN 3600000 WHEN 'd' THEN 86400000 END
            WHEN 's' THEN CASE s_m[4] WHEN '' THEN 1 WHEN 'us' THEN 0.000001 WHEN 'ms' THEN 0.001 WHEN 's' THEN 1
                                      WHEN 'min' THEN 60 WHEN 'h' THEN 3600 WHEN 'd' THEN 86400 END
            WHEN 'B' THEN CASE s_m[4] WHEN '' THEN 1 WHEN 'B' THEN 1 WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
                                      WHEN 'GB' THEN 1073741824 WHEN 'TB' THEN 1099511627776 END
            ELSE 1 END;
        IF s_value IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = pg_catalog.format('invalid value for parameter "%s": "%s"', '%name%', s_raw),
                HINT = CASE s_unit WHEN 'B' THEN 'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".'
                       ELSE 'Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".' END;
        END IF;
        s_value := pg_catalog.round(s_value);
        IF s_value < {{setting:%name%:min}} OR s_value > {{setting:%name%:max}} THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = pg_catalog.format('%s%s is outside the valid range for parameter "%s" (%s .. %s)',
                                            s_value, CASE WHEN s_unit = '' THEN '' ELSE ' ' || s_unit END, '%name%',
                                            {{setting:%name%:min}}, {{setting:%name%:max}});
        END IF;
        %target% := s_value;
    END IF;
END;
-- @end

-- An interval's length in microseconds, a month counted as 30 days and a
-- day as 24 hours (core/arguments.c, idem_interval_usecs); numeric, so a
-- huge one is compared, not overflowed.  target is a numeric variable.
-- An infinite interval (PostgreSQL 17 and later), whose fields EXTRACT
-- answers NULL for, is +/-Infinity, refused or capped as the C edition's
-- largest values are.
-- @snippet interval_us(target, arg)
IF NOT pg_catalog.isfinite(%arg%) THEN
    %target% := CASE WHEN %arg% OPERATOR(pg_catalog.>) '0'::pg_catalog.interval
                     THEN 'Infinity' ELSE '-Infinity' END::pg_catalog.numeric;
ELSE
    %target% := ((EXTRACT(year FROM %arg%) * 12 + EXTRACT(month FROM %arg%)) * 30 + EXTRACT(day FROM %arg%)) * 86400000000
                + (EXTRACT(hour FROM %arg%) * 3600 + EXTRACT(minute FROM %arg%) * 60) * 1000000
                + EXTRACT(microseconds FROM %arg%);
END IF;
-- @end

-- A lease or cooldown argument as a pure duration (core/arguments.c,
-- idem_lease_argument): NULL means the setting default_setting; the
-- bound is idem.max_lease, for the default too.  Host declares
-- a_max_ms bigint, a_us numeric and a_text text; target is an interval.
-- @snippet lease_arg(target, arg, what, allow_zero, default_setting)
{{setting_int(a_max_ms, idem.max_lease)}}
IF %arg% IS NULL THEN
    DECLARE
        a_default_ms pg_catalog.int8;
    BEGIN
        {{setting_int(a_default_ms, %default_setting%)}}
        a_us := a_default_ms * 1000;
    END;
ELSE
    {{interval_us(a_us, %arg%)}}
END IF;
IF a_us < (CASE WHEN %allow_zero% THEN 0 ELSE 1000 END) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = CASE WHEN %allow_zero% THEN '%what% must be zero or positive'
                       ELSE '%what% must be at least 1 millisecond' END,
        DETAIL = pg_catalog.format('The %s given is %s.', '%what%',
                                   CASE WHEN a_us < 0 THEN 'negative' WHEN a_us = 0 THEN 'zero'
                                        ELSE 'shorter than 1 millisecond' END);
END IF;
IF a_us > a_max_ms * 1000 THEN
    {{format_ms(a_text, a_max_ms)}}
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = pg_catalog.format('%s must not exceed idem.max_lease (%s)', '%what%', a_text),
        DETAIL = pg_catalog.format(CASE WHEN %arg% IS NULL THEN 'No %s was given, and the default is %s.'
                                        ELSE 'The %s given is %s.' END, '%what%',
                                   CASE WHEN a_us >= 9223372036854775807 THEN 'over 290000 years'
                                        WHEN a_us % 1000 = 0 THEN (SELECT f FROM (SELECT CASE
                                            WHEN (a_us / 1000) % 86400000 = 0 THEN (a_us / 86400000000)::pg_catalog.int8::pg_catalog.text || 'd'
                                            WHEN (a_us / 1000) % 3600000 = 0 THEN (a_us / 3600000000)::pg_catalog.int8::pg_catalog.text || 'h'
                                            WHEN (a_us / 1000) % 60000 = 0 THEN (a_us / 60000000)::pg_catalog.int8::pg_catalog.text || 'min'
                                            WHEN (a_us / 1000) % 1000 = 0 THEN (a_us / 1000000)::pg_catalog.int8::pg_catalog.text || 's'
                                            ELSE (a_us / 1000)::pg_catalog.int8::pg_catalog.text || 'ms' END AS f) x)
                                        ELSE pg_catalog.to_char(a_us / 1000.0, 'FM999999999999990.000') || 'ms' END),
        HINT = 'Renew a lease while the work runs instead of asking for a long one.';
END IF;
%target% := pg_catalog.make_interval(secs => a_us / 1000000.0);
-- @end

-- The caller's scope, as core/scope.c decides it, checked here because
-- this body runs as the tables' owner (SECURITY DEFINER), where the
-- caller's role is no longer current_user.  caller is the role the
-- request-path function (SECURITY INVOKER) ran as: its current_user, the
-- role whose code calls pg_idem -- the domain idem__caller guarantees it
-- (21_sql_claims.sql).  Never inside a security-restricted operation (an
-- index expression or a materialized view's query run by maintenance),
-- where one role's code runs on behalf of another: UNLISTEN is refused
-- there, and nowhere else.
-- Host declares s_scope oid; caller is a name.
-- @snippet caller_scope(caller)
DECLARE
    s_setting CONSTANT pg_catalog.text := pg_catalog.current_setting('idem.scope', true);
BEGIN
    BEGIN
        UNLISTEN pg_idem_restricted_operation_probe;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'pg_idem cannot be used inside a security-restricted operation',
            DETAIL = pg_catalog.format('The call runs as role "%s" inside an index expression, a materialized view''s query '
                                       'or maintenance (ANALYZE, VACUUM, CLUSTER, REINDEX, CREATE INDEX, REFRESH MATERIALIZED VIEW, '
                                       'autovacuum), where one role''s code runs on behalf of another.', %caller%),
            HINT = 'Call pg_idem from ordinary statements, functions and triggers only.';
    END;
    IF %caller% IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'pg_idem''s internal functions are called by its own functions only';
    END IF;
    IF s_setting IS NULL OR s_setting = '' THEN
        s_scope := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = %caller%);
    ELSE
        s_scope := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = s_setting);
        IF s_scope IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_object',
                MESSAGE = 'idem.scope names a role that does not exist',
                DETAIL = pg_catalog.format('idem.scope is "%s".', s_setting),
                HINT = 'Set idem.scope to a role the session is a member of, or to '''' for its own role.';
        END IF;
        IF NOT pg_catalog.pg_has_role(%caller%, s_scope, 'USAGE') THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = pg_catalog.format('permission denied for idempotency scope "%s"', s_setting),
                DETAIL = pg_catalog.format('Role "%s" does not have the privileges of role "%s".', %caller%, s_setting),
                HINT = pg_catalog.format('Only members of a role may use its keys: GRANT %s TO %s.',
                                         pg_catalog.quote_ident(s_setting), pg_catalog.quote_ident(%caller%));
        END IF;
    END IF;
END;
-- @end

-- The generation of a new owner of a key whose row has generation
-- row_generation (0 for a new key), as keys/claim.c draws it: the
-- sequence's next value plus (timeline - 1) << 40, so that a promoted
-- standby's generations are above every one the old primary handed out;
-- the sequence first (on a standby it refuses with 25006 before the
-- timeline is read).  While the sequence is young, or when the row is not
-- below the value drawn, the sequence is caught up with the table
-- (core/sequences.c: after a logical-replication cut-over it starts below
-- the replicated rows).  The timeline is read once per session: a
-- session's server never changes timeline under it while it can write.
-- Host declares g_value, g_base, g_highest bigint; target is a bigint.
-- @snippet next_generation(target, row_generation)
g_value := pg_catalog.nextval('@extschema@.idem_generation_seq'::pg_catalog.regclass);
g_base := NULLIF(pg_catalog.current_setting('idem_sql.timeline_base', true), '')::pg_catalog.int8;
IF g_base IS NULL THEN
    BEGIN
        g_base := (('x' || pg_catalog.left(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 8))::pg_catalog.bit(32)::pg_catalog.int8 - 1) << 40;
    EXCEPTION WHEN feature_not_supported OR insufficient_privilege OR undefined_function THEN
        g_base := 0;   -- a service that hides its WAL: one timeline as far as pg_idem can tell
    END;
    PERFORM pg_catalog.set_config('idem_sql.timeline_base', g_base::pg_catalog.text, false);
END IF;
%target% := g_value + g_base;
IF g_value <= 1000 OR %target% <= %row_generation% THEN
    SELECT pg_catalog.max(k.generation) INTO g_highest FROM @extschema@.idem_keys k;
    IF g_highest >= %target% THEN
        -- Catch-ups wait for one another, so that none moves the sequence back.
        LOCK TABLE @extschema@.idem_keys IN SHARE UPDATE EXCLUSIVE MODE;
        SELECT pg_catalog.max(k.generation) INTO g_highest FROM @extschema@.idem_keys k;
        IF COALESCE(pg_catalog.pg_sequence_last_value('@extschema@.idem_generation_seq'::pg_catalog.regclass), 0) < g_highest THEN
            PERFORM pg_catalog.setval('@extschema@.idem_generation_seq'::pg_catalog.regclass, g_highest + 1000000);
            RAISE LOG 'pg_idem advanced sequence "idem_generation_seq" past %', g_highest
                USING DETAIL = 'Its position was not above what its tables hold, as after a logical-replication cut-over.';
        END IF;
        g_value := pg_catalog.nextval('@extschema@.idem_generation_seq'::pg_catalog.regclass);
        %target% := g_value + g_base;
    END IF;
END IF;
%target% := GREATEST(%target%, %row_generation% + 1);
-- @end

-- A fenced write (an UPDATE whose WHERE clause states what it expects of
-- the row) that keeps no lock when it writes nothing.  Under READ
-- COMMITTED an UPDATE that waited for another transaction's write locks
-- the newest version before it checks its WHERE clause again, and keeps
-- that lock when the check fails, until its transaction ends: a stale
-- owner inside a longer transaction would stall the new owner's renew and
-- finalize.  Run in a subtransaction that is rolled back when nothing was
-- written, the lock goes with it (the C edition reads the row again
-- without locking it).  Sets written bool.
-- @snippet fenced(written, statement)
%written% := false;
BEGIN
    %statement%;
    %written% := FOUND;
    IF NOT %written% THEN
        RAISE EXCEPTION USING ERRCODE = 'no_data_found';
    END IF;
EXCEPTION WHEN no_data_found THEN
    %written% := false;
END;
-- @end

-- The lock_wait argument (keys/lock_wait.c): lock_timeout for the call
-- only.  The value is set for the transaction (set_config's is_local)
-- and the caller's value, saved in a_saved, set back when the call
-- returns (lock_wait_restore); when the call fails, the abort of the
-- (sub)transaction puts it back.  (A SET clause cannot: SET lock_timeout
-- FROM CURRENT would take the value current at CREATE FUNCTION, and a
-- call with NULL must keep the caller's.)  NULL keeps the session's; 0
-- waits a millisecond (lock_timeout's own 0 would mean no limit).  Host
-- declares a_us numeric and a_saved text.  (LEAST and GREATEST are
-- expressions of the grammar, not functions a role could shadow.)
-- @snippet lock_wait_arg(arg)
IF %arg% IS NOT NULL THEN
    a_saved := pg_catalog.current_setting('lock_timeout');
    {{interval_us(a_us, %arg%)}}
    IF a_us < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'lock_wait must be zero or positive',
            DETAIL = 'The lock_wait given is negative.',
            HINT = 'Pass NULL to keep the session''s lock_timeout.';
    END IF;
    PERFORM pg_catalog.set_config('lock_timeout',
        LEAST(GREATEST(pg_catalog.ceil(a_us / 1000), 1), 2147483647)::pg_catalog.int8::pg_catalog.text || 'ms',
        true);
END IF;
-- @end

-- The caller's lock_timeout back after a call that applied lock_wait.
-- @snippet lock_wait_restore()
IF a_saved IS NOT NULL THEN
    PERFORM pg_catalog.set_config('lock_timeout', a_saved, true);
END IF;
-- @end
