/*-------------------------------------------------------------------------
 *
 * cleanup.c
 *	  Deleting finished keys past idem.ttl.
 *
 * The age and state predicate stands in the DELETE itself, not only in the
 * subquery that picks the batch: a key re-claimed, renewed or finalized
 * between the pick and the delete is re-checked against its newest version
 * and survives (the bug in the seed's original cleanup).  The batch is
 * picked with the same predicate, so failed keys still in their cooldown
 * cannot fill every batch and stall the cleanup.  SKIP LOCKED lets
 * several sessions clean at once without waiting on one another or on a
 * key that is being written.
 *
 *-------------------------------------------------------------------------
 */
#include "pg_idem.h"

#include "catalog/pg_type.h"

PG_FUNCTION_INFO_V1(idem_cleanup);

/* Largest batch one call may delete: bounds the statement's duration. */
#define CLEANUP_MAX_BATCH 1000000

static IdemStatement delete_expired = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT cache_key FROM @extschema@.idem_keys"
	"   WHERE state IN ('completed', 'failed')"
	"     AND created_at < clock_timestamp() - $2"
	"     AND (state = 'completed' OR lease_expires_at < clock_timestamp())"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_keys k USING batch"
	"  WHERE k.cache_key = batch.cache_key"
	"    AND k.state IN ('completed', 'failed')"
	"    AND k.created_at < clock_timestamp() - $2"
	"    AND (k.state = 'completed' OR k.lease_expires_at < clock_timestamp())",
	2, {INT4OID, INTERVALOID}
};

/* idem_cleanup(batch): delete at most batch finished keys older than idem.ttl. */
Datum
idem_cleanup(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	int32		batch;
	Datum		values[2];
	int			deleted;

	idem_require_arg(fcinfo, 0, "batch");
	batch = PG_GETARG_INT32(0);
	if (batch < 1 || batch > CLEANUP_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", CLEANUP_MAX_BATCH),
				 errdetail("The batch given is %d.", batch)));

	values[0] = Int32GetDatum(batch);
	values[1] = IntervalPGetDatum(idem_ms_interval((int64) idem_ttl_s * 1000));
	SPI_connect();
	deleted = idem_execute(&delete_expired, namespace, values, NULL, false, 0);
	SPI_finish();
	idem_count(IDEM_STAT_CLEANUP_DELETED, deleted);
	PG_RETURN_INT64(deleted);
}
