-- The SQL edition of the row-version guard (guards/version_guard.c):
-- If-Match style optimistic concurrency for the application's own
-- tables, a BEFORE INSERT OR UPDATE trigger that runs as the writer.  A
-- write states the version it read by setting the column to it; a
-- different one raises IL004, the same one goes through and the version
-- becomes one more.  READ COMMITTED re-evaluates a writer that waited
-- against the newest version, so of two writers of one version exactly
-- one succeeds.  The column is read and set by name (to_jsonb,
-- jsonb_populate_record): PL/pgSQL has no access by a name held in a
-- variable.

-- @symbol idem_version_guard
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $function$
DECLARE
    v_column CONSTANT pg_catalog.text := COALESCE(TG_ARGV[0], 'version');
    v_type pg_catalog.regtype;
    v_max pg_catalog.numeric;
    v_current pg_catalog.numeric;
    v_expected pg_catalog.numeric;
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('INSERT', 'UPDATE') THEN
        RAISE EXCEPTION USING ERRCODE = 'trigger_protocol_violated',
            MESSAGE = 'function "idem_version_guard" must be fired BEFORE INSERT OR UPDATE FOR EACH ROW';
    END IF;
    IF TG_NARGS > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'idem_version_guard takes at most one argument, the version column''s name';
    END IF;
    SELECT a.atttypid INTO v_type FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = TG_RELID AND a.attname = v_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'undefined_column',
            MESSAGE = pg_catalog.format('column "%s" of relation "%s" does not exist', v_column, TG_TABLE_NAME),
            HINT = pg_catalog.format('Add a column "%s bigint NOT NULL DEFAULT 1", or name the version column in the trigger''s argument.', v_column);
    END IF;
    v_max := CASE v_type WHEN 'pg_catalog.int2'::pg_catalog.regtype THEN 32767
                         WHEN 'pg_catalog.int4'::pg_catalog.regtype THEN 2147483647
                         WHEN 'pg_catalog.int8'::pg_catalog.regtype THEN 9223372036854775807 END;
    IF v_max IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'datatype_mismatch',
            MESSAGE = pg_catalog.format('version column "%s" of relation "%s" must be smallint, integer or bigint', v_column, TG_TABLE_NAME),
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = v_column;
    END IF;
    IF TG_OP = 'INSERT' THEN
        -- A given version is kept (copies and restores keep what clients hold).
        IF pg_catalog.to_jsonb(NEW) -> v_column <> 'null'::pg_catalog.jsonb THEN
            RETURN NEW;
        END IF;
        RETURN pg_catalog.jsonb_populate_record(NEW, pg_catalog.jsonb_build_object(v_column, 1));
    END IF;
    v_current := (pg_catalog.to_jsonb(OLD) ->> v_column)::pg_catalog.numeric;
    v_expected := (pg_catalog.to_jsonb(NEW) ->> v_column)::pg_catalog.numeric;
    IF v_current IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed',
            MESSAGE = pg_catalog.format('version column "%s" of relation "%s" holds a null', v_column, TG_TABLE_NAME),
            HINT = 'Declare it NOT NULL DEFAULT 1.',
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = v_column;
    END IF;
    IF v_expected IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed',
            MESSAGE = 'expected row version must not be null',
            DETAIL = pg_catalog.format('The write set column "%s" of "%s" to null.', v_column, TG_TABLE_NAME),
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = v_column;
    END IF;
    IF v_expected <> v_current THEN
        RAISE EXCEPTION USING ERRCODE = {{sqlstate:stale_version}}, MESSAGE = 'stale row version',
            DETAIL = pg_catalog.format('The row of "%s" is at version %s; the write expected version %s.',
                                       TG_TABLE_NAME, v_current, v_expected),
            HINT = 'Read the row again and retry with its current version (HTTP 412 Precondition Failed).',
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = v_column;
    END IF;
    IF v_current >= v_max THEN
        RAISE EXCEPTION USING ERRCODE = 'numeric_value_out_of_range', MESSAGE = 'row version is out of range',
            DETAIL = pg_catalog.format('Version %s of a row of "%s" cannot be bumped.', v_current, TG_TABLE_NAME),
            SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, COLUMN = v_column;
    END IF;
    RETURN pg_catalog.jsonb_populate_record(NEW, pg_catalog.jsonb_build_object(v_column, v_current + 1));
END
$function$
-- @end
