-- PostgreSQL 18 records NOT NULL constraints in pg_constraint, named after
-- the table when the column got them.  idem_outbox_queue was idem_outbox
-- before 0.3.0, so an installation created before 0.3.0 on PostgreSQL 18
-- has idem_outbox_<column>_not_null where a fresh install has
-- idem_outbox_queue_<column>_not_null.  Rename them, so that the upgraded
-- catalog equals a fresh install's (tests/t/050_upgrade.pl).  Before 18
-- there are no such rows and this does nothing.
DO $not_null_names$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT con.conname,
               pg_catalog.concat('idem_outbox_queue_', att.attname, '_not_null') AS wanted
          FROM pg_catalog.pg_constraint con
          JOIN pg_catalog.pg_attribute att
            ON att.attrelid OPERATOR(pg_catalog.=) con.conrelid
           AND att.attnum OPERATOR(pg_catalog.=) con.conkey[1]
         WHERE con.conrelid OPERATOR(pg_catalog.=) '@extschema@.idem_outbox_queue'::pg_catalog.regclass
           AND con.contype OPERATOR(pg_catalog.=) 'n'
           AND con.conname OPERATOR(pg_catalog.=) pg_catalog.concat('idem_outbox_', att.attname, '_not_null')
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE @extschema@.idem_outbox_queue RENAME CONSTRAINT %I TO %I',
                                  c.conname, c.wanted);
    END LOOP;
END
$not_null_names$;
