/*-------------------------------------------------------------------------
 *
 * operations.c
 *	  Operator actions on single keys.
 *
 *-------------------------------------------------------------------------
 */
#include "pg_idem.h"

#include "catalog/pg_type.h"

PG_FUNCTION_INFO_V1(idem_evict);

static IdemStatement evict_key = {
	IDEM_TOMBSTONE_SET
	" WHERE cache_key = $1"
	" AND NOT (state = 'failed' AND request_hash IS NULL AND claim_id IS NULL)",
	1, {BYTEAOID}
};

/*
 * idem_evict(cache_key): forget one key whatever its state, e.g. a cached
 * response that must not be replayed any more.  What is left is a
 * tombstone without response, hash or owner: a live owner's later finalize
 * changes nothing (its fence no longer matches), and the next request
 * claims the key afresh with a higher generation.
 */
Datum
idem_evict(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[1];
	int			evicted;

	values[0] = PointerGetDatum(idem_digest_arg(fcinfo, 0, "cache_key"));
	SPI_connect();
	evicted = idem_execute(&evict_key, namespace, values, NULL, false, 1);
	SPI_finish();
	idem_count(IDEM_STAT_EVICTED, evicted);
	PG_RETURN_BOOL(evicted == 1);
}
