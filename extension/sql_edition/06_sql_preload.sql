-- The SQL edition has no library to preload: the C edition's install
-- script calls idem_preload_notice() (core/preload.c) to say what a
-- server without the preload lacks; the SQL edition lacks it by design
-- (see docs/guides/managed-postgresql.md) and says nothing.

-- @symbol idem_preload_notice
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT;
END
-- @end
