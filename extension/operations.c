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

static IdemStatement delete_key = {
	"DELETE FROM @extschema@.idem_keys WHERE cache_key = $1",
	1, {BYTEAOID}
};

/*
 * idem_evict(cache_key): forget one key whatever its state, e.g. a cached
 * response that must not be replayed any more.  A live owner's later
 * finalize then changes nothing (its fence no longer matches), and the
 * next request claims the key afresh with a higher generation.
 */
Datum
idem_evict(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[1];
	int			deleted;

	values[0] = PointerGetDatum(idem_digest_arg(fcinfo, 0, "cache_key"));
	SPI_connect();
	deleted = idem_execute(&delete_key, namespace, values, NULL, false, 1);
	SPI_finish();
	idem_count(IDEM_STAT_EVICTED, deleted);
	PG_RETURN_BOOL(deleted == 1);
}
