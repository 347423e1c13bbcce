-- pg_idem on PL/Proxy: the router database.
--
-- Every pg_idem call names one key, so the router forwards it to the
-- partition that owns the key.  The router holds no pg_idem state: only
-- PL/Proxy functions with pg_idem's names and result types, the hash that
-- picks the partition, and the cluster configuration (the SQL/MED server
-- "idem", created by deploy step 2 below, not by this file).
--
-- Deploy (tests/scaleout/t/Scaleout.pm does exactly this):
--   1. on every partition database:  CREATE EXTENSION pg_idem;
--   2. on the router database:       CREATE EXTENSION plproxy;
--        CREATE SERVER idem FOREIGN DATA WRAPPER plproxy
--            OPTIONS (connection_lifetime '1800',
--                     p0 'host=... port=... dbname=...',
--                     p1 'host=... port=... dbname=...');   -- a power of 2 of them
--        CREATE USER MAPPING FOR PUBLIC SERVER idem OPTIONS (user '...');
--        GRANT USAGE ON FOREIGN SERVER idem TO <the service role>;
--   3. on the router database:       \i router.sql
--
-- Routing (the same hash everywhere; C++: idem/partition.hpp):
--   claims    idem_partition_hash(cache_key): the first 4 bytes of the
--             SHA-256 cache key as a big-endian int4.  SHA-256 is uniform,
--             so its bytes spread keys evenly without hashing them again.
--   inbox     the hash of SHA-256(uint32_be(len(consumer)) || consumer ||
--             message_id): every delivery of one message meets the same row.
--   outbox    an event with a key goes by the hash of SHA-256(key), so one
--             key's events stay on one partition and keep their order; a
--             keyless event goes to a random partition (no order to keep).
--   attempts  the hash of SHA-256(target): a target's attempts and its
--             current pointer are on one partition.
-- PL/Proxy maps a hash to a partition as hash & (partitions - 1), or
-- abs(hash % partitions) with the server option modular_mapping '1'.
--
-- What cannot go through the proxy: PL/Proxy runs each call in its own
-- autocommit transaction on the partition.  So idem_begin (in-transaction
-- mode), the inbox (begin, done and fail share the handler's transaction)
-- and fenced mode's strict finalize together with the handler's writes must
-- run on a connection to the owning partition: idem_partition_map() and the
-- idem_*_partition() functions tell a client which one.  idem_outbox_stage
-- through the proxy commits at once, not with the caller's transaction.

CREATE SCHEMA IF NOT EXISTS idem_router;

-- The result types of the partitions' functions, column for column.
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
CREATE TYPE idem_outbox_nack_result AS (outcome text, attempts integer, retry_after interval);
CREATE TYPE idem_attempt_decision AS (
    decision           text,
    attempt_id         uuid,
    generation         bigint,
    status             text,
    failure_reason     text,
    next_step          text,
    object_key         text,
    declared_digest    bytea,
    current_attempt_id uuid,
    created_at         timestamptz
);

---------------------------------------------------------------------------
-- The partition map: one definition, read by PL/Proxy and by clients.
---------------------------------------------------------------------------

-- The hash of a cache key: its first 4 bytes as a big-endian int4.  A NULL
-- or short key hashes to 0, so the partition refuses it with pg_idem's own
-- error (22004 or 22023).
CREATE FUNCTION idem_partition_hash(cache_key bytea)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN octet_length(cache_key) OPERATOR(pg_catalog.>=) 4
                THEN (pg_catalog.get_byte(cache_key, 0) OPERATOR(pg_catalog.<<) 24)
                     OPERATOR(pg_catalog.|) (pg_catalog.get_byte(cache_key, 1) OPERATOR(pg_catalog.<<) 16)
                     OPERATOR(pg_catalog.|) (pg_catalog.get_byte(cache_key, 2) OPERATOR(pg_catalog.<<) 8)
                     OPERATOR(pg_catalog.|) pg_catalog.get_byte(cache_key, 3)
                ELSE 0 END
$$;

-- The routing digest of a text (outbox key, attempt target).
CREATE FUNCTION idem_partition_text_hash(value text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT public.idem_partition_hash(pg_catalog.sha256(pg_catalog.convert_to(value, 'UTF8'))) $$;

-- The routing hash of an inbox message: consumer and message id, length-prefixed.
CREATE FUNCTION idem_inbox_hash(consumer text, message_id text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT public.idem_partition_hash(pg_catalog.sha256(
        pg_catalog.int4send(pg_catalog.octet_length(pg_catalog.convert_to(consumer, 'UTF8')))
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(consumer, 'UTF8')
        OPERATOR(pg_catalog.||) pg_catalog.convert_to(message_id, 'UTF8')))
$$;

-- The routing hash of an outbox event: its key's, or a random one for a keyless event.
CREATE FUNCTION idem_outbox_hash(key text)
RETURNS integer
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN key IS NULL
                THEN (pg_catalog.random() OPERATOR(pg_catalog.*) 2147483647)::integer
                ELSE public.idem_partition_text_hash(key) END
$$;

-- The partitions of the cluster "idem" as PL/Proxy reads them from the
-- SQL/MED server: number, connection string (as the router reaches it; a
-- client adds its own user and password), the partition count and the
-- mapping (false: hash & (count - 1); true: abs(hash % count)).
CREATE FUNCTION idem_partition_map(OUT partition integer, OUT conninfo text,
                                   OUT partitions integer, OUT modular boolean)
RETURNS SETOF record
LANGUAGE sql STABLE
AS $$
    WITH opts AS (
        SELECT pg_catalog.split_part(o, '=', 1) AS name,
               pg_catalog.substr(o, pg_catalog.strpos(o, '=') OPERATOR(pg_catalog.+) 1) AS value
          FROM pg_catalog.pg_foreign_server s, pg_catalog.unnest(s.srvoptions) AS o
         WHERE s.srvname OPERATOR(pg_catalog.=) 'idem'),
    parts AS (
        SELECT pg_catalog.substr(name, 2)::integer AS partition, value AS conninfo
          FROM opts WHERE name OPERATOR(pg_catalog.~) '^p[0-9]+$')
    SELECT p.partition, p.conninfo,
           (SELECT pg_catalog.count(*)::integer FROM parts),
           coalesce((SELECT value OPERATOR(pg_catalog.=) '1' FROM opts
                      WHERE name OPERATOR(pg_catalog.=) 'modular_mapping'), false)
      FROM parts p ORDER BY p.partition
$$;

-- The partition number a hash maps to, exactly as PL/Proxy maps it.
CREATE FUNCTION idem_partition_of_hash(hash integer)
RETURNS integer
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN m.modular THEN pg_catalog.abs(hash OPERATOR(pg_catalog.%) m.partitions)
                ELSE hash OPERATOR(pg_catalog.&) (m.partitions OPERATOR(pg_catalog.-) 1) END
      FROM public.idem_partition_map() m LIMIT 1
$$;

-- Which partition a client connects to for a key, a message or an attempt's target.
CREATE FUNCTION idem_key_partition(cache_key bytea) RETURNS integer LANGUAGE sql STABLE
AS $$ SELECT public.idem_partition_of_hash(public.idem_partition_hash(cache_key)) $$;
CREATE FUNCTION idem_inbox_partition(consumer text, message_id text) RETURNS integer LANGUAGE sql STABLE
AS $$ SELECT public.idem_partition_of_hash(public.idem_inbox_hash(consumer, message_id)) $$;
CREATE FUNCTION idem_attempt_partition(target text) RETURNS integer LANGUAGE sql STABLE
AS $$ SELECT public.idem_partition_of_hash(public.idem_partition_text_hash(target)) $$;

---------------------------------------------------------------------------
-- Claims: by the cache key.
---------------------------------------------------------------------------

-- Pure: any partition computes the same key.
CREATE FUNCTION idem_key(principal text, method text, target text, key text)
RETURNS bytea LANGUAGE plproxy AS $$ CLUSTER 'idem'; RUN ON ANY; $$;
CREATE FUNCTION idem_request_hash(body bytea)
RETURNS bytea LANGUAGE plproxy AS $$ CLUSTER 'idem'; RUN ON ANY; $$;

CREATE FUNCTION idem_claim(cache_key bytea, request_hash bytea, lease interval DEFAULT NULL)
RETURNS idem_claim_result LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

-- pg_idem 0.3.0's follower wait: blocks on the partition up to max_wait
-- (the router backend and its PL/Proxy connection wait with it).  Needs
-- partitions with 0.3.0; the 3-argument form works with 0.2.0 and 0.3.0.
CREATE FUNCTION idem_claim(cache_key bytea, request_hash bytea, lease interval, max_wait interval)
RETURNS idem_claim_result LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

-- pg_idem 0.6.0's lock_wait: the longest each wait on another
-- transaction's lock on the key may last, applied on the partition, where
-- the claim waits (lock_timeout set on the router would bound nothing
-- there).  The clients pass it when the router has this form; needs
-- partitions with 0.6.0.
CREATE FUNCTION idem_claim(cache_key bytea, request_hash bytea, lease interval, max_wait interval,
                           lock_wait interval)
RETURNS idem_claim_result LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

CREATE FUNCTION idem_lookup(cache_key bytea, request_hash bytea)
RETURNS idem_claim_result LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

CREATE FUNCTION idem_renew(cache_key bytea, claim_id uuid, lease interval DEFAULT NULL)
RETURNS timestamptz LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

CREATE FUNCTION idem_renew(cache_key bytea, claim_id uuid, lease interval, lock_wait interval)
RETURNS timestamptz LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

CREATE FUNCTION idem_finalize(cache_key bytea, claim_id uuid, status integer, headers jsonb,
                              body bytea, strict boolean DEFAULT false)
RETURNS boolean LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

CREATE FUNCTION idem_release(cache_key bytea, claim_id uuid)
RETURNS boolean LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

CREATE FUNCTION idem_fail(cache_key bytea, claim_id uuid, cooldown interval DEFAULT NULL)
RETURNS boolean LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

-- Admin: forget one key.
CREATE FUNCTION idem_evict(cache_key bytea)
RETURNS boolean LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_hash(cache_key); $$;

---------------------------------------------------------------------------
-- Outbox: staged by key (or at random), drained per partition or from all.
---------------------------------------------------------------------------

CREATE FUNCTION idem_outbox_stage(topic text, payload jsonb, key text DEFAULT NULL,
                                  headers jsonb DEFAULT NULL, delay interval DEFAULT '0')
RETURNS bigint LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_outbox_hash(key); $$;
CREATE FUNCTION idem_outbox_stage(topic text, payload bytea, key text DEFAULT NULL,
                                  headers jsonb DEFAULT NULL, delay interval DEFAULT '0')
RETURNS bigint LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_outbox_hash(key); $$;

-- One partition's drainer: claim, ack, nack and wait on partition `partition`.
CREATE FUNCTION idem_outbox_claim_on(partition integer, batch integer, lease interval DEFAULT NULL)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, payload_bytes bytea,
               headers jsonb, attempts integer, created_at timestamptz,
               claim_token uuid, lease_expires_at timestamptz)
LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON partition; SELECT * FROM public.idem_outbox_claim(batch, lease); $$;
CREATE FUNCTION idem_outbox_ack_on(partition integer, token uuid, ids bigint[])
RETURNS integer LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON partition; SELECT public.idem_outbox_ack(token, ids); $$;
CREATE FUNCTION idem_outbox_nack_on(partition integer, token uuid, id bigint, error text)
RETURNS idem_outbox_nack_result LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON partition; SELECT * FROM public.idem_outbox_nack(token, id, error); $$;
CREATE FUNCTION idem_outbox_wait_on(partition integer, timeout interval)
RETURNS boolean LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON partition; SELECT public.idem_outbox_wait(timeout); $$;

-- A drainer of every partition at once: at most `batch` events from each
-- partition, one token per partition.  A token lives on one partition
-- only, so ack and nack ask every partition and add up the answers.
CREATE FUNCTION idem_outbox_claim(batch integer, lease interval DEFAULT NULL)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, payload_bytes bytea,
               headers jsonb, attempts integer, created_at timestamptz,
               claim_token uuid, lease_expires_at timestamptz)
LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON ALL; $$;

CREATE FUNCTION idem_router.outbox_ack_all(token uuid, ids bigint[])
RETURNS SETOF integer LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON ALL; SELECT public.idem_outbox_ack(token, ids); $$;
CREATE FUNCTION idem_outbox_ack(token uuid, ids bigint[])
RETURNS integer LANGUAGE sql
AS $$ SELECT coalesce(pg_catalog.sum(n), 0)::integer FROM idem_router.outbox_ack_all(token, ids) n $$;

CREATE FUNCTION idem_router.outbox_nack_all(token uuid, id bigint, error text)
RETURNS SETOF idem_outbox_nack_result LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON ALL; SELECT * FROM public.idem_outbox_nack(token, id, error); $$;
-- The partition that holds the token answers retry or dead; the others stale.
CREATE FUNCTION idem_outbox_nack(token uuid, id bigint, error text)
RETURNS idem_outbox_nack_result LANGUAGE sql
AS $$
    SELECT r FROM idem_router.outbox_nack_all(token, id, error) r
     ORDER BY (r.outcome OPERATOR(pg_catalog.=) 'stale') LIMIT 1
$$;

---------------------------------------------------------------------------
-- Attempts: by target.  The calls that name only an attempt id
-- (store, promote, fail, reopen) run on the target's partition through a
-- connection the client routes with idem_attempt_partition(target).
---------------------------------------------------------------------------

CREATE FUNCTION idem_router.attempt_register_kind_all(kind text, mode text, key_prefix text)
RETURNS SETOF boolean LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON ALL; SELECT public.idem_attempt_register_kind(kind, mode, key_prefix); $$;
-- Admin: a kind exists on every partition.
CREATE FUNCTION idem_attempt_register_kind(kind text, mode text, key_prefix text)
RETURNS boolean LANGUAGE sql
AS $$ SELECT pg_catalog.bool_and(r) FROM idem_router.attempt_register_kind_all(kind, mode, key_prefix) r $$;

CREATE FUNCTION idem_attempt_open(kind text, target text, client_request_id text,
                                  created_by text, intent jsonb,
                                  object_name text DEFAULT 'object',
                                  declared_digest bytea DEFAULT NULL)
RETURNS idem_attempt_decision LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_text_hash(target); $$;

CREATE FUNCTION idem_attempt_current(kind text, target text)
RETURNS uuid LANGUAGE plproxy
AS $$ CLUSTER 'idem'; RUN ON public.idem_partition_text_hash(target); $$;
