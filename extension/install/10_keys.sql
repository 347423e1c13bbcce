-- State of every idempotency key: one row per key and scope (the role it
-- belongs to), keyed by a SHA-256 digest so that no caller-controlled
-- string ever reaches the index.
--
-- Only the primary key is indexed: renew and finalize change no indexed
-- column, so with the fillfactor headroom they are HOT updates.
CREATE TABLE idem_keys (
    cache_key        bytea       NOT NULL,
    state            text        NOT NULL,
    request_hash     bytea,
    claim_id         uuid,
    generation       bigint      NOT NULL,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at      timestamptz,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    replayable       boolean     NOT NULL DEFAULT true,
    in_transaction   boolean     NOT NULL DEFAULT false,
    scope            regrole     NOT NULL DEFAULT 0,
    CONSTRAINT idem_keys_pkey PRIMARY KEY (cache_key, scope),
    CONSTRAINT idem_keys_state CHECK (state IN ('pending', 'completed', 'failed', 'expired')),
    CONSTRAINT idem_keys_cache_key_length CHECK (octet_length(cache_key) = 32),
    CONSTRAINT idem_keys_request_hash_length
        CHECK (request_hash IS NULL OR octet_length(request_hash) = 32),
    CONSTRAINT idem_keys_completed_has_response
        CHECK (state <> 'completed' OR NOT replayable
               OR (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT idem_keys_pending_has_claim
        CHECK (state <> 'pending'
               OR (request_hash IS NOT NULL AND claim_id IS NOT NULL
                   AND lease_expires_at IS NOT NULL)),
    CONSTRAINT idem_keys_failed_has_cooldown
        CHECK (state <> 'failed' OR lease_expires_at IS NOT NULL),
    CONSTRAINT idem_keys_status_range
        CHECK (response_status IS NULL OR response_status BETWEEN 100 AND 599)
) WITH (fillfactor = 70);

COMMENT ON TABLE idem_keys IS
    'pg_idem: one row per idempotency key; written only through the idem_* functions';
COMMENT ON COLUMN idem_keys.generation IS
    'fencing number: strictly increases with every successful claim or steal of the key';
COMMENT ON COLUMN idem_keys.scope IS
    'the role whose key this is, by OID (role isolation: a renamed role keeps it; shown, dumped and replicated by name); 0 for keys written before 0.3.0, shared by every role';
COMMENT ON COLUMN idem_keys.state IS
    'pending (claimed), completed (response kept), failed (cooldown), expired (past idem.ttl: response dropped, fingerprint kept)';
COMMENT ON COLUMN idem_keys.in_transaction IS
    'claimed by idem_begin: must be finished before its transaction commits';

-- Generations come from one sequence so that a key's generation never goes
-- back, not even after its row was released, cleaned up or evicted.
CREATE SEQUENCE idem_generation_seq AS bigint;

-- Keep the cached responses in pg_dump output: restoring a database without
-- them would re-run every request retried after the restore.
SELECT pg_catalog.pg_extension_config_dump('idem_keys', '');
SELECT pg_catalog.pg_extension_config_dump('idem_generation_seq', '');

-- What idem_claim, idem_begin and idem_lookup answer.
CREATE TYPE idem_claim_result AS (
    outcome          text,
    claim_id         uuid,
    generation       bigint,
    lease_expires_at timestamptz,
    retry_after      interval,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea
);
