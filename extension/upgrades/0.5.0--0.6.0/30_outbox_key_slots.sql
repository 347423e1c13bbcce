-- Per-key commit order (issue 33): the slot rows a stager of a keyed event
-- locks before it draws the event's id (install/40_outbox.sql says why a
-- fixed set of rows).  Until this runs, the library of 0.6.0 stages
-- without them, as 0.5.0 did: a key's ids follow staging order.
-- Privileges: 90_privileges, as for every table of the extension.
CREATE TABLE @extschema@.idem_outbox_key_slots (
    slot pg_catalog.int4 NOT NULL,
    CONSTRAINT idem_outbox_key_slots_pkey PRIMARY KEY (slot)
);
INSERT INTO @extschema@.idem_outbox_key_slots (slot)
    SELECT pg_catalog.generate_series(0, 16383);
COMMENT ON TABLE @extschema@.idem_outbox_key_slots IS
    'pg_idem: rows a stager of a keyed outbox event locks until its commit, so that a key''s ids follow commit order (never written)';
