-- Inbox: role scopes, as for keys (messages from 0.2.0 stay shared).
ALTER TABLE @extschema@.idem_inbox ADD COLUMN scope text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE @extschema@.idem_inbox DROP CONSTRAINT idem_inbox_pkey,
    ADD CONSTRAINT idem_inbox_pkey PRIMARY KEY (inbox_key, scope);
COMMENT ON COLUMN @extschema@.idem_inbox.scope IS
    'the role whose message this is (role isolation); empty for messages delivered before 0.3.0, shared by every role';
