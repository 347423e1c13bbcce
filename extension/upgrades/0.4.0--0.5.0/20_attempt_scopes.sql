-- Attempts get a scope like keys, messages and events: role B neither
-- resumes, fails nor squats on role A's attempt, and never learns whether
-- it exists.  The request's unique key and a replace-kind target's
-- current pointer are per scope.  Attempts and pointers from before 0.5.0
-- had none: they get the shared scope (0), usable by every role as they
-- were (created_by still separates principals) until they are pruned.

ALTER TABLE @extschema@.idem_attempts
    ADD COLUMN scope pg_catalog.regrole NOT NULL DEFAULT 0,
    DROP CONSTRAINT idem_attempts_request_unique,
    ADD CONSTRAINT idem_attempts_request_unique UNIQUE (kind, target, client_request_id, scope);
COMMENT ON COLUMN @extschema@.idem_attempts.scope IS
    'the role whose attempt this is, by OID (role isolation: a renamed role keeps it; shown, dumped and replicated by name); 0 for attempts opened before 0.5.0, shared by every role';
COMMENT ON COLUMN @extschema@.idem_attempts.created_by IS
    'the caller''s principal, as it says: separates principals inside one role''s scope (forbidden), no boundary between roles';

ALTER TABLE @extschema@.idem_attempt_targets
    ADD COLUMN scope pg_catalog.regrole NOT NULL DEFAULT 0,
    DROP CONSTRAINT idem_attempt_targets_pkey,
    ADD CONSTRAINT idem_attempt_targets_pkey PRIMARY KEY (kind, target, scope);
COMMENT ON TABLE @extschema@.idem_attempt_targets IS
    'pg_idem: current promoted attempt of each replace-kind target, per scope';
