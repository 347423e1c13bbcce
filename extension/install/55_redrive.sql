-- Dead letters you can redrive (issue 33): dead outbox events and dead
-- inbox messages made deliverable again, each call recorded in
-- idem_redrive_log, and the operators' views of what is stuck.
--
-- One definition for both editions: plain SQL and PL/pgSQL, no C symbol
-- (a redrive is an operator's rare act, not a hot path).  The two public
-- functions are SECURITY INVOKER, granted to idem_client (90_privileges):
-- they hand their arguments and their CURRENT_USER -- the role whose code
-- calls, the scope, as core/scope.c decides it -- to an internal function
-- (idem__*) that runs as the tables' owner, since idem_client may neither
-- read nor write the tables (no grant can serve: it would open every
-- scope's rows).  The call goes through a cast between two of the
-- extension's own types, never by a function name that a role able to
-- create in this schema could make ambiguous; the caller's field is of the
-- domain idem__redrive_caller, whose check is that the value is the
-- current_user of the code that makes it, so a role that calls the
-- internal function itself cannot name another.  (The SQL edition's
-- request path does the same: sql_edition/21_sql_claims.sql.)
--
-- Every name in the bodies is schema-qualified or resolved with the
-- search_path pinned to pg_catalog, pg_temp (operators and functions are
-- never looked up in pg_temp).
--
-- What a redrive does:
--  * A dead outbox event becomes pending from a clean slate: attempts 0
--    (idem.outbox_max_attempts counts again), no claim token, due now,
--    where it is: in idem_outbox_claimed (a claim or a nack killed it
--    there), or in the queue (a hand edit put it there).
--    It keeps its id -- consumers that deduplicate by it (an inbox keyed
--    by the event's id) see the same message -- and last_error, its
--    history, until a new failure replaces it.
--  * Per-key order: a keyed event keeps its place by id, so it is redriven
--    only when no later event of its key is unpublished (pending, leased
--    or backing off); otherwise it stays dead and the answer names that
--    event (held_by).  The redrive first locks its keys' slots
--    (idem_outbox_key_slots) as a stager does, so that an event of the key
--    staged meanwhile gets a higher id, drawn after the redrive commits,
--    and every claim that sees that event also sees the redriven one,
--    earlier, pending.  A redriven event is therefore never handed out
--    beside or after a later event of its key that was unpublished when
--    it was redriven; events of its key published while it was dead
--    (a dead event does not block its key) stay published before it.
--  * A dead inbox message becomes failed with no failures counted (the
--    cap counts again) and no retry delay: the next delivery processes it.
--    pg_idem cannot deliver it: the broker's dead-letter queue replays it.
--  * Only the caller's scope: a role redrives its own rows (or, with
--    idem.scope, its group role's), never another's, and never the shared
--    scope's rows from before 0.3.0.  idem_admin is no exception: it acts
--    in its own scope like every role (it may read every scope's dead
--    letters in the views, and revive one inbox message of any scope with
--    idem_inbox_retry).

CREATE SEQUENCE @extschema@.idem_redrive_log_id_seq AS pg_catalog.int8;

-- One row per call, written in the redrive's transaction: who, when, with
-- which filter, and what was redriven.  Nothing prunes it: idem_admin may
-- DELETE its old rows (docs/guides/inbox-outbox.md).
CREATE TABLE @extschema@.idem_redrive_log (
    id           pg_catalog.int8        NOT NULL DEFAULT pg_catalog.nextval('@extschema@.idem_redrive_log_id_seq'::pg_catalog.regclass),
    redriven_at  pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    redriven_by  pg_catalog.regrole     NOT NULL,
    scope        pg_catalog.regrole     NOT NULL,
    source       pg_catalog.text        NOT NULL,
    filter       pg_catalog.jsonb       NOT NULL,
    redriven     pg_catalog.int4        NOT NULL,
    held         pg_catalog.int4        NOT NULL,
    items        pg_catalog.jsonb       NOT NULL,
    CONSTRAINT idem_redrive_log_pkey PRIMARY KEY (id),
    CONSTRAINT idem_redrive_log_source CHECK (source OPERATOR(pg_catalog.=) ANY (ARRAY['outbox', 'inbox']::pg_catalog.text[]))
);
ALTER SEQUENCE @extschema@.idem_redrive_log_id_seq OWNED BY @extschema@.idem_redrive_log.id;
COMMENT ON TABLE @extschema@.idem_redrive_log IS
    'pg_idem: every idem_outbox_redrive and idem_inbox_redrive call, written in its transaction';
COMMENT ON COLUMN @extschema@.idem_redrive_log.redriven_by IS
    'the role whose code called (current_user)';
COMMENT ON COLUMN @extschema@.idem_redrive_log.scope IS
    'the scope whose rows were redriven';
COMMENT ON COLUMN @extschema@.idem_redrive_log.items IS
    'outbox: the ids redriven; inbox: [consumer, message_id] of each message redriven';
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_redrive_log'::pg_catalog.regclass, '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_redrive_log_id_seq'::pg_catalog.regclass, '');

CREATE TYPE @extschema@.idem_outbox_redrive_result AS (
    id       pg_catalog.int8,
    topic    pg_catalog.text,
    key      pg_catalog.text,
    redriven pg_catalog.bool,
    held_by  pg_catalog.int8
);

CREATE TYPE @extschema@.idem_inbox_redrive_result AS (
    consumer   pg_catalog.text,
    message_id pg_catalog.text
);

CREATE DOMAIN @extschema@.idem__redrive_caller AS pg_catalog.name
    CHECK (VALUE OPERATOR(pg_catalog.=) CURRENT_USER);

CREATE TYPE @extschema@.idem__outbox_redrive_call AS (
    id pg_catalog.int8, topic pg_catalog.text, key pg_catalog.text,
    dead_since pg_catalog.timestamptz, dead_before pg_catalog.timestamptz,
    all_dead pg_catalog.bool, caller @extschema@.idem__redrive_caller);

CREATE TYPE @extschema@.idem__inbox_redrive_call AS (
    consumer pg_catalog.text, message_id pg_catalog.text,
    dead_since pg_catalog.timestamptz, dead_before pg_catalog.timestamptz,
    all_dead pg_catalog.bool, caller @extschema@.idem__redrive_caller);

-- The caller's scope, as core/scope.c decides it (the same errors): never
-- inside a security-restricted operation (UNLISTEN is refused there and
-- nowhere else), idem.scope only for a member of that role.  Then the
-- filters: a NULL all_dead, no filter without all_dead, a filter with it,
-- an empty range of dead_at.  The scope's OID.  Reached through a cast
-- from the internal functions (no name to make ambiguous); SECURITY
-- INVOKER: it reads nothing but the catalog, so whoever calls it directly
-- learns only what pg_roles tells everyone.
CREATE TYPE @extschema@.idem__redrive_check AS (
    role_name pg_catalog.name, fn pg_catalog.text, filters pg_catalog.jsonb, all_dead pg_catalog.bool);
CREATE FUNCTION @extschema@.idem__redrive_scope(args @extschema@.idem__redrive_check)
RETURNS pg_catalog.oid
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    caller CONSTANT pg_catalog.name := args.role_name;
    fn CONSTANT pg_catalog.text := args.fn;
    filters CONSTANT pg_catalog.jsonb := args.filters;
    all_dead CONSTANT pg_catalog.bool := args.all_dead;
    s_setting CONSTANT pg_catalog.text := pg_catalog.current_setting('idem.scope', true);
    s_scope pg_catalog.oid;
    v_given pg_catalog.text := (SELECT pg_catalog.string_agg(f.key, ', ' ORDER BY f.key)
                                  FROM pg_catalog.jsonb_each(filters) AS f
                                 WHERE f.value <> 'null'::pg_catalog.jsonb);
BEGIN
    BEGIN
        UNLISTEN pg_idem_restricted_operation_probe;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'pg_idem cannot be used inside a security-restricted operation',
            DETAIL = pg_catalog.format('The call runs as role "%s" inside an index expression, a materialized view''s query '
                                       'or maintenance (ANALYZE, VACUUM, CLUSTER, REINDEX, CREATE INDEX, REFRESH MATERIALIZED VIEW, '
                                       'autovacuum), where one role''s code runs on behalf of another.', caller),
            HINT = 'Call pg_idem from ordinary statements, functions and triggers only.';
    END;
    IF caller IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'pg_idem''s internal functions are called by its own functions only';
    END IF;
    IF s_setting IS NULL OR s_setting = '' THEN
        s_scope := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = caller);
    ELSE
        s_scope := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = s_setting);
        IF s_scope IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'undefined_object',
                MESSAGE = 'idem.scope names a role that does not exist',
                DETAIL = pg_catalog.format('idem.scope is "%s".', s_setting),
                HINT = 'Set idem.scope to a role the session is a member of, or to '''' for its own role.';
        END IF;
        IF NOT pg_catalog.pg_has_role(caller, s_scope, 'USAGE') THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = pg_catalog.format('permission denied for idempotency scope "%s"', s_setting),
                DETAIL = pg_catalog.format('Role "%s" does not have the privileges of role "%s".', caller, s_setting),
                HINT = pg_catalog.format('Only members of a role may use its keys: GRANT %s TO %s.',
                                         pg_catalog.quote_ident(s_setting), pg_catalog.quote_ident(caller));
        END IF;
    END IF;
    IF all_dead IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'all_dead must not be null',
            DETAIL = pg_catalog.format('The argument all_dead of %s is null.', fn);
    ELSIF all_dead AND v_given IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'all_dead excludes the filters',
            DETAIL = pg_catalog.format('all_dead is true and %s given (%s).',
                                       CASE WHEN v_given LIKE '%,%' THEN 'filters are' ELSE 'a filter is' END, v_given),
            HINT = 'Pass either the filters or all_dead => true.';
    ELSIF NOT all_dead AND v_given IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'no dead letters chosen',
            DETAIL = pg_catalog.format('Every filter of %s (%s) is null, and all_dead is false.', fn,
                                       (SELECT pg_catalog.string_agg(f.key, ', ' ORDER BY f.key)
                                          FROM pg_catalog.jsonb_each(filters) AS f)),
            HINT = 'Name what to redrive, or pass all_dead => true for every dead letter of your scope.';
    END IF;
    IF (filters->>'dead_since')::pg_catalog.timestamptz >= (filters->>'dead_before')::pg_catalog.timestamptz THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'dead_since must be earlier than dead_before',
            DETAIL = pg_catalog.format('dead_since is %s and dead_before is %s: no time is in between.',
                                       (filters->>'dead_since')::pg_catalog.timestamptz,
                                       (filters->>'dead_before')::pg_catalog.timestamptz);
    END IF;
    RETURN s_scope;
END
$function$;
CREATE CAST (@extschema@.idem__redrive_check AS pg_catalog.oid)
    WITH FUNCTION @extschema@.idem__redrive_scope(@extschema@.idem__redrive_check);

-- Redrive the dead outbox events of the caller's scope that the filters
-- choose (the opening comment says how, and why a keyed event may be held).
CREATE FUNCTION @extschema@.idem__outbox_redrive(args @extschema@.idem__outbox_redrive_call)
RETURNS @extschema@.idem_outbox_redrive_result[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_filter CONSTANT pg_catalog.jsonb := pg_catalog.jsonb_build_object(
        'id', args.id, 'topic', args.topic, 'key', args.key,
        'dead_since', args.dead_since, 'dead_before', args.dead_before);
    v_hash CONSTANT pg_catalog.bytea := pg_catalog.sha256(pg_catalog.convert_to(args.key,
                                            pg_catalog.current_setting('server_encoding')));
    s_scope pg_catalog.oid;
    v_slots pg_catalog.int4[];
    v_out @extschema@.idem_outbox_redrive_result[];
    v_ids pg_catalog.int8[];
BEGIN
    s_scope := ROW(args.caller, 'idem_outbox_redrive', v_filter, args.all_dead)::@extschema@.idem__redrive_check::pg_catalog.oid;
    -- The held check must see every event committed before the key slots
    -- were taken: a statement snapshot taken after the lock.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
            MESSAGE = 'idem_outbox_redrive runs only in a read committed transaction',
            DETAIL = pg_catalog.format('The transaction''s isolation level is %s.',
                                       pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Call it in a READ COMMITTED transaction (the default) of its own.';
    END IF;
    -- The chosen events' key slots, locked in ascending order as stagers
    -- lock them (40_outbox.sql, idem_outbox_key_slots).
    v_slots := ARRAY(SELECT DISTINCT ((((pg_catalog.get_byte(q.key_hash, 0) << 8) | pg_catalog.get_byte(q.key_hash, 1))
                                       # (s_scope::pg_catalog.int8 & 16383)::pg_catalog.int4) & 16383)
                       FROM (SELECT d.id, d.topic, d.key_hash, d.dead_at, d.scope, d.state
                               FROM @extschema@.idem_outbox_claimed d
                             UNION ALL
                             SELECT d.id, d.topic, d.key_hash, d.dead_at, d.scope, d.state
                               FROM @extschema@.idem_outbox_queue d) q
                      WHERE q.scope = s_scope AND q.state = 'dead' AND q.key_hash IS NOT NULL
                        AND (args.id IS NULL OR q.id = args.id) AND (args.topic IS NULL OR q.topic = args.topic)
                        AND (args.key IS NULL OR q.key_hash = v_hash)
                        AND (args.dead_since IS NULL OR q.dead_at >= args.dead_since)
                        AND (args.dead_before IS NULL OR q.dead_at < args.dead_before)
                      ORDER BY 1);
    PERFORM FROM @extschema@.idem_outbox_key_slots ks WHERE ks.slot = ANY (v_slots) ORDER BY ks.slot FOR UPDATE;
    -- The chosen events locked, in each table (a concurrent redrive or
    -- prune of one goes first or waits: the newest version must still be
    -- dead), each with the earliest later unpublished event of its key in
    -- either table, which holds it.
    WITH chosen_claimed AS MATERIALIZED (
        SELECT q.id, q.topic, q.message_key, q.key_hash FROM @extschema@.idem_outbox_claimed q
         WHERE q.scope = s_scope AND q.state = 'dead'
           AND (args.id IS NULL OR q.id = args.id) AND (args.topic IS NULL OR q.topic = args.topic)
           AND (args.key IS NULL OR q.key_hash = v_hash)
           AND (args.dead_since IS NULL OR q.dead_at >= args.dead_since)
           AND (args.dead_before IS NULL OR q.dead_at < args.dead_before)
           AND (q.key_hash IS NULL
                OR ((((pg_catalog.get_byte(q.key_hash, 0) << 8) | pg_catalog.get_byte(q.key_hash, 1))
                     # (s_scope::pg_catalog.int8 & 16383)::pg_catalog.int4) & 16383) = ANY (v_slots))
         ORDER BY q.id FOR UPDATE),
    chosen_queue AS MATERIALIZED (
        SELECT q.id, q.topic, q.message_key, q.key_hash FROM @extschema@.idem_outbox_queue q
         WHERE q.scope = s_scope AND q.state = 'dead'
           AND (args.id IS NULL OR q.id = args.id) AND (args.topic IS NULL OR q.topic = args.topic)
           AND (args.key IS NULL OR q.key_hash = v_hash)
           AND (args.dead_since IS NULL OR q.dead_at >= args.dead_since)
           AND (args.dead_before IS NULL OR q.dead_at < args.dead_before)
           AND (q.key_hash IS NULL
                OR ((((pg_catalog.get_byte(q.key_hash, 0) << 8) | pg_catalog.get_byte(q.key_hash, 1))
                     # (s_scope::pg_catalog.int8 & 16383)::pg_catalog.int4) & 16383) = ANY (v_slots))
         ORDER BY q.id FOR UPDATE),
    chosen AS (SELECT c.* FROM chosen_claimed c UNION ALL SELECT c.* FROM chosen_queue c)
    SELECT ARRAY(SELECT ROW(c.id, c.topic, c.message_key, h.held_by IS NULL, h.held_by)::@extschema@.idem_outbox_redrive_result
                   FROM chosen c
                   LEFT JOIN LATERAL (SELECT pg_catalog.min(l.id) AS held_by
                                        FROM (SELECT p.id FROM @extschema@.idem_outbox_claimed p
                                               WHERE p.key_hash = c.key_hash AND p.id > c.id
                                                 AND p.state = 'pending' AND p.scope = s_scope
                                              UNION ALL
                                              SELECT p.id FROM @extschema@.idem_outbox_queue p
                                               WHERE p.key_hash = c.key_hash AND p.id > c.id
                                                 AND p.state = 'pending' AND p.scope = s_scope) l
                                       WHERE c.key_hash IS NOT NULL) h ON true
                  ORDER BY c.id)
      INTO v_out;
    v_ids := ARRAY(SELECT o.id FROM pg_catalog.unnest(v_out) AS o WHERE o.redriven ORDER BY o.id);
    UPDATE @extschema@.idem_outbox_claimed q
       SET state = 'pending', attempts = 0, claim_token = NULL, dead_at = NULL,
           available_at = pg_catalog.clock_timestamp()
     WHERE q.id = ANY (v_ids) AND q.scope = s_scope AND q.state = 'dead';
    UPDATE @extschema@.idem_outbox_queue q
       SET state = 'pending', attempts = 0, claim_token = NULL, dead_at = NULL,
           available_at = pg_catalog.clock_timestamp()
     WHERE q.id = ANY (v_ids) AND q.scope = s_scope AND q.state = 'dead';
    INSERT INTO @extschema@.idem_redrive_log (redriven_by, scope, source, filter, redriven, held, items)
    VALUES ((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = args.caller), s_scope, 'outbox',
            v_filter || pg_catalog.jsonb_build_object('all_dead', args.all_dead),
            pg_catalog.cardinality(v_ids), pg_catalog.cardinality(v_out) - pg_catalog.cardinality(v_ids),
            pg_catalog.to_jsonb(v_ids));
    RETURN v_out;
END
$function$;

-- Redrive the dead inbox messages of the caller's scope that the filters
-- choose: failed, with no failure counted and no delay.
CREATE FUNCTION @extschema@.idem__inbox_redrive(args @extschema@.idem__inbox_redrive_call)
RETURNS @extschema@.idem_inbox_redrive_result[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_filter CONSTANT pg_catalog.jsonb := pg_catalog.jsonb_build_object(
        'consumer', args.consumer, 'message_id', args.message_id,
        'dead_since', args.dead_since, 'dead_before', args.dead_before);
    s_scope pg_catalog.oid;
    i_consumer pg_catalog.bytea;
    i_message pg_catalog.bytea;
    v_key pg_catalog.bytea;
    v_out @extschema@.idem_inbox_redrive_result[];
BEGIN
    s_scope := ROW(args.caller, 'idem_inbox_redrive', v_filter, args.all_dead)::@extschema@.idem__redrive_check::pg_catalog.oid;
    IF args.message_id IS NOT NULL AND args.consumer IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'message_id needs its consumer',
            DETAIL = pg_catalog.format('message_id is %s and consumer is null.', pg_catalog.quote_literal(args.message_id)),
            HINT = 'A message id is unique within its consumer only: pass consumer too.';
    END IF;
    IF args.message_id IS NOT NULL THEN
        -- The primary key's probe (inbox.c's message key).
        i_consumer := pg_catalog.convert_to(args.consumer, pg_catalog.current_setting('server_encoding'));
        i_message := pg_catalog.convert_to(args.message_id, pg_catalog.current_setting('server_encoding'));
        v_key := pg_catalog.sha256(pg_catalog.convert_to('pg_idem inbox v1', 'UTF8')
                                   || pg_catalog.int4send(pg_catalog.octet_length(i_consumer)) || i_consumer
                                   || pg_catalog.int4send(pg_catalog.octet_length(i_message)) || i_message);
    END IF;
    WITH revived AS (
        UPDATE @extschema@.idem_inbox m
           SET state = 'failed', error_count = 0, dead_at = NULL, retry_at = NULL
         WHERE m.scope = s_scope AND m.state = 'dead'
           AND (v_key IS NULL OR m.inbox_key = v_key)
           AND (args.consumer IS NULL OR m.consumer = args.consumer)
           AND (args.dead_since IS NULL OR m.dead_at >= args.dead_since)
           AND (args.dead_before IS NULL OR m.dead_at < args.dead_before)
        RETURNING m.consumer, m.message_id)
    SELECT ARRAY(SELECT ROW(r.consumer, r.message_id)::@extschema@.idem_inbox_redrive_result
                   FROM revived r ORDER BY r.consumer, r.message_id)
      INTO v_out;
    INSERT INTO @extschema@.idem_redrive_log (redriven_by, scope, source, filter, redriven, held, items)
    VALUES ((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = args.caller), s_scope, 'inbox',
            v_filter || pg_catalog.jsonb_build_object('all_dead', args.all_dead),
            pg_catalog.cardinality(v_out), 0,
            COALESCE((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(o.consumer, o.message_id))
                        FROM pg_catalog.unnest(v_out) AS o), '[]'::pg_catalog.jsonb));
    RETURN v_out;
END
$function$;
CREATE CAST (@extschema@.idem__outbox_redrive_call AS @extschema@.idem_outbox_redrive_result[])
    WITH FUNCTION @extschema@.idem__outbox_redrive(@extschema@.idem__outbox_redrive_call);
CREATE CAST (@extschema@.idem__inbox_redrive_call AS @extschema@.idem_inbox_redrive_result[])
    WITH FUNCTION @extschema@.idem__inbox_redrive(@extschema@.idem__inbox_redrive_call);

CREATE FUNCTION @extschema@.idem_outbox_redrive(id pg_catalog.int8 DEFAULT NULL,
                                                topic pg_catalog.text DEFAULT NULL,
                                                key pg_catalog.text DEFAULT NULL,
                                                dead_since pg_catalog.timestamptz DEFAULT NULL,
                                                dead_before pg_catalog.timestamptz DEFAULT NULL,
                                                all_dead pg_catalog.bool DEFAULT false)
RETURNS SETOF @extschema@.idem_outbox_redrive_result
LANGUAGE plpgsql VOLATILE ROWS 10 SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN QUERY SELECT r.* FROM pg_catalog.unnest(ROW($1, $2, $3, $4, $5, $6, CURRENT_USER)
        ::@extschema@.idem__outbox_redrive_call::@extschema@.idem_outbox_redrive_result[]) AS r;
END
$function$;
COMMENT ON FUNCTION @extschema@.idem_outbox_redrive(pg_catalog.int8, pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz, pg_catalog.timestamptz, pg_catalog.bool) IS
    'make the caller''s dead outbox events that the filters choose (or all_dead) pending again, audited; a keyed one a later unpublished event of its key holds stays dead';

CREATE FUNCTION @extschema@.idem_inbox_redrive(consumer pg_catalog.text DEFAULT NULL,
                                               message_id pg_catalog.text DEFAULT NULL,
                                               dead_since pg_catalog.timestamptz DEFAULT NULL,
                                               dead_before pg_catalog.timestamptz DEFAULT NULL,
                                               all_dead pg_catalog.bool DEFAULT false)
RETURNS SETOF @extschema@.idem_inbox_redrive_result
LANGUAGE plpgsql VOLATILE ROWS 10 SET search_path = pg_catalog, pg_temp
AS $function$
BEGIN
    RETURN QUERY SELECT r.* FROM pg_catalog.unnest(ROW($1, $2, $3, $4, $5, CURRENT_USER)
        ::@extschema@.idem__inbox_redrive_call::@extschema@.idem_inbox_redrive_result[]) AS r;
END
$function$;
COMMENT ON FUNCTION @extschema@.idem_inbox_redrive(pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz, pg_catalog.timestamptz, pg_catalog.bool) IS
    'make the caller''s dead inbox messages that the filters choose (or all_dead) processable again, audited';

-- What is stuck, for operators (idem_admin, like the other operator
-- views): every scope's rows, each named by its scope, from both tables
-- of the outbox (not the published events idem_outbox_claimed keeps).
-- Per topic and key (the key itself: admins read the tables anyway), the
-- unpublished events: dead ones, waiting ones (due and not leased:
-- claimable, or held back by an earlier event of their key), leases that
-- ran out (a drainer that died or stalled: due again), leased and delayed
-- ones, and how long the longest overdue has been due.  A key with dead
-- events and later ones waiting is where a redrive is held.
CREATE VIEW @extschema@.idem_outbox_stuck AS
SELECT q.scope::pg_catalog.regrole AS scope, q.topic, q.message_key AS key,
       pg_catalog.count(*) FILTER (WHERE q.state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text) AS dead,
       pg_catalog.count(*) FILTER (WHERE q.state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
                                     AND q.claim_token IS NULL
                                     AND q.available_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS waiting,
       pg_catalog.count(*) FILTER (WHERE q.state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
                                     AND q.claim_token IS NOT NULL
                                     AND q.available_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()) AS lease_expired,
       pg_catalog.count(*) FILTER (WHERE q.state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
                                     AND q.claim_token IS NOT NULL
                                     AND q.available_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS leased,
       pg_catalog.count(*) FILTER (WHERE q.state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
                                     AND q.claim_token IS NULL
                                     AND q.available_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS delayed,
       pg_catalog.min(q.created_at) AS oldest_created_at,
       pg_catalog.min(q.dead_at) AS oldest_dead_at,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
           pg_catalog.min(q.available_at) FILTER (WHERE q.state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
                                                    AND q.available_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
           AS longest_due_for
  FROM (SELECT u.scope, u.topic, u.message_key, u.state, u.claim_token, u.available_at, u.created_at, u.dead_at
          FROM @extschema@.idem_outbox_queue u
        UNION ALL
        SELECT c.scope, c.topic, c.message_key, c.state, c.claim_token, c.available_at, c.created_at, c.dead_at
          FROM @extschema@.idem_outbox_claimed c
         WHERE c.state OPERATOR(pg_catalog.=) 'pending'::pg_catalog.text
            OR c.state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text) q
 GROUP BY q.scope, q.topic, q.message_key;
COMMENT ON VIEW @extschema@.idem_outbox_stuck IS
    'unpublished outbox events per scope, topic and key: dead, waiting, lease expired, leased, delayed, and the longest overdue';

-- Per consumer: dead messages, failed ones waiting for their next
-- delivery (and whether that is overdue), the highest failure count.
CREATE VIEW @extschema@.idem_inbox_stuck AS
SELECT m.scope::pg_catalog.regrole AS scope, m.consumer,
       pg_catalog.count(*) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'dead'::pg_catalog.text) AS dead,
       pg_catalog.count(*) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text) AS failed,
       pg_catalog.max(m.error_count) AS most_failures,
       pg_catalog.min(m.dead_at) AS oldest_dead_at,
       pg_catalog.min(m.failed_at) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text) AS oldest_failed_at,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
           pg_catalog.min(m.retry_at) FILTER (WHERE m.state OPERATOR(pg_catalog.=) 'failed'::pg_catalog.text
                                                AND m.retry_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
           AS longest_overdue_for
  FROM @extschema@.idem_inbox m
 WHERE m.state OPERATOR(pg_catalog.=) ANY (ARRAY['dead', 'failed']::pg_catalog.text[])
 GROUP BY m.scope, m.consumer;
COMMENT ON VIEW @extschema@.idem_inbox_stuck IS
    'inbox messages per scope and consumer that are dead or failed and waiting for a delivery';
