/*-------------------------------------------------------------------------
 *
 * evict.c
 *	  Operator actions on single keys.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/statements.h"
#include "core/stats.h"
#include "keys/key_table.h"

#include "miscadmin.h"

PG_FUNCTION_INFO_V1(idem_evict);

/*
 * idem_evict(cache_key): forget one key whatever its state, e.g. a cached
 * response that must not be replayed any more.  What is left is a
 * tombstone without response, hash or owner: a live owner's later finalize
 * changes nothing (its fence no longer matches), and the next request
 * claims the key afresh with a higher generation.  A key used by several
 * scopes loses every scope's row.
 */
Datum
idem_evict(PG_FUNCTION_ARGS)
{
	bytea	   *cache_key = idem_digest_arg(fcinfo, 0, "cache_key");
	KeyTable   *table = key_table_open(idem_function_namespace(fcinfo), DIRECT_UPDATE);
	KeyRow		row;
	int64		evicted = 0;

	/* Every scope's row of the key: each read finds one not yet a tombstone. */
	while (key_table_read(table, cache_key, KEY_MATCH_LIVE, NULL, true, &row))
	{
		CHECK_FOR_INTERRUPTS();
		key_row_make_tombstone(&row);
		if (key_table_update(table, &row) == KEY_WRITTEN)
			evicted++;
	}
	key_table_close(table);
	idem_count(IDEM_STAT_EVICTED, evicted);
	PG_RETURN_BOOL(evicted > 0);
}
