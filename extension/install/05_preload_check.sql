-- Say at CREATE EXTENSION (and ALTER EXTENSION UPDATE) what pg_idem
-- without shared_preload_libraries costs: no cleanup worker, no counters,
-- polling waits (core/preload.c).  Only the library knows whether it was
-- preloaded, so a C function asks it; it is dropped again at once and the
-- extension keeps no trace of it.
CREATE FUNCTION idem_preload_notice() RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idem_preload_notice'
LANGUAGE C VOLATILE;
SELECT idem_preload_notice();
DROP FUNCTION idem_preload_notice();
