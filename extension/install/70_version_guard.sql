-- Row-version guard (version_guard.c): If-Match style optimistic
-- concurrency for the application's own tables.
--
--   ALTER TABLE docs ADD COLUMN version bigint NOT NULL DEFAULT 1;
--   CREATE TRIGGER docs_version BEFORE INSERT OR UPDATE ON docs
--       FOR EACH ROW EXECUTE FUNCTION idem_version_guard();
--
--   UPDATE docs SET body = $2, version = $3 WHERE id = $1 RETURNING version;
--
-- A write whose version is not the row's raises IL004 (stale row version)
-- and writes nothing; every write bumps the version by one.  The trigger's
-- optional argument names another column: idem_version_guard('revision').

CREATE FUNCTION idem_version_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_version_guard'
LANGUAGE C;
COMMENT ON FUNCTION idem_version_guard() IS
    'BEFORE INSERT OR UPDATE trigger: a stale version raises IL004, every write bumps it';
