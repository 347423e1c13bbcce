-- idem_edition(): 'c' for the C library, 'sql' for the SQL edition, which
-- 0.6.0 adds (docs/guides/managed-postgresql.md); the clients' first-use
-- check says which edition it found.
CREATE FUNCTION @extschema@.idem_edition()
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_edition'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.idem_edition() IS
    'the edition of pg_idem: c (the C library) or sql (the SQL edition)';
