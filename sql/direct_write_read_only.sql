-- Pins a fix from the review of the direct path (keys/key_table.c): the direct writes skip the executor's
-- read-only check (ExecCheckXactReadOnly / PreventCommandIfReadOnly), so a
-- READ ONLY transaction (or default_transaction_read_only, or a hot
-- standby: there "cannot assign TransactionIds during recovery", XX000,
-- for an owner and a silent "not owned" for anyone else) renews,
-- finalizes, releases, fails and evicts keys.  0.3.0's SPI statements
-- raised 25006 (read_only_sql_transaction) for every write, owned or not.

CREATE FUNCTION pg_temp.sqlstate_of(sql text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'no error';
EXCEPTION WHEN others THEN
    RETURN SQLSTATE;
END $$;

SELECT claim_id AS c FROM idem_claim(idem_key('read_only', 'POST', '/ro', 'k1'),
                                     idem_request_hash('x'), '1 hour') \gset

BEGIN READ ONLY;
SELECT pg_temp.sqlstate_of(format('SELECT idem_renew(%L, %L)',
           idem_key('read_only', 'POST', '/ro', 'k1'), :'c')) AS renew;
SELECT pg_temp.sqlstate_of(format('SELECT idem_finalize(%L, %L, 200, NULL, %L)',
           idem_key('read_only', 'POST', '/ro', 'k1'), :'c', 'body'::bytea)) AS finalize;
SELECT pg_temp.sqlstate_of(format('SELECT idem_fail(%L, %L)',
           idem_key('read_only', 'POST', '/ro', 'k1'), :'c')) AS fail;
SELECT pg_temp.sqlstate_of(format('SELECT idem_release(%L, %L)',
           idem_key('read_only', 'POST', '/ro', 'k1'), :'c')) AS release;
SELECT pg_temp.sqlstate_of(format('SELECT idem_evict(%L)',
           idem_key('read_only', 'POST', '/ro', 'k1'))) AS evict;
-- a stale token writes nothing, but the statement was a write all the same
SELECT pg_temp.sqlstate_of(format('SELECT idem_renew(%L, %L)',
           idem_key('read_only', 'POST', '/ro', 'k1'), gen_random_uuid())) AS renew_not_owned;
SELECT pg_temp.sqlstate_of(format('SELECT idem_claim(%L, %L)',
           idem_key('read_only', 'POST', '/ro', 'k2'), idem_request_hash('x'))) AS claim_new_key;
COMMIT;

-- nothing changed
SELECT state, lease_expires_at > clock_timestamp() + interval '50 minutes' AS lease_as_claimed
  FROM idem_keys WHERE cache_key = idem_key('read_only', 'POST', '/ro', 'k1');

SELECT idem_release(idem_key('read_only', 'POST', '/ro', 'k1'), :'c') AS released;
DELETE FROM idem_keys WHERE cache_key = idem_key('read_only', 'POST', '/ro', 'k1');
