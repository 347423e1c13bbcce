/*-------------------------------------------------------------------------
 *
 * outbox_prune.c
 *	  The outbox's maintenance: prune published and dead events from
 *	  idem_outbox_claimed (and such rows edited into the queue by hand)
 *	  once they are older than the retention.  A batch at a time, through
 *	  SQL (a maintenance call, not the drainers' hot path).  On 0.5.0's
 *	  tables (until ALTER EXTENSION UPDATE) the archive and the queue.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/protocol.h"
#include "core/statements.h"
#include "core/stats.h"
#include "outbox/outbox.h"
#include "outbox/outbox_queue.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(idem_outbox_prune);

#define PRUNE_MAX_BATCH			1000000

/*
 * Prune idem_outbox_claimed: published longer than $2 ago (the BRIN on
 * published_at serves it), at most $1 rows.
 */
static IdemStatement prune_published = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT id FROM @extschema@.idem_outbox_claimed"
	"   WHERE published_at < pg_catalog.clock_timestamp() - $2"
	"     AND state = " IDEM_SQL(IDEM_OUTBOX_PUBLISHED_NAME)
	"   LIMIT $1 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_outbox_claimed c"
	"  WHERE c.id = ANY (ARRAY(SELECT id FROM batch))"
	"    AND c.published_at < pg_catalog.clock_timestamp() - $2"
	"    AND c.state = " IDEM_SQL(IDEM_OUTBOX_PUBLISHED_NAME),
	2, {INT4OID, INTERVALOID}
};
/* Then its dead events (idem_outbox_claimed_dead serves it). */
static IdemStatement prune_dead = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT id FROM @extschema@.idem_outbox_claimed"
	"   WHERE state = " IDEM_SQL(IDEM_OUTBOX_DEAD_NAME)
	"     AND dead_at < pg_catalog.clock_timestamp() - $2"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_outbox_claimed c"
	"  WHERE c.id = ANY (ARRAY(SELECT id FROM batch))"
	"    AND c.state = " IDEM_SQL(IDEM_OUTBOX_DEAD_NAME)
	"    AND c.dead_at < pg_catalog.clock_timestamp() - $2",
	2, {INT4OID, INTERVALOID}
};
/*
 * On 0.5.0's tables: the archive, published longer than $2 ago.  After
 * the queue, as the update to 0.6.0 locks them, so that a prune and the
 * update wait for each other, never deadlock.
 */
static IdemStatement prune_archive_0_5 = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT id FROM @extschema@.idem_outbox_archive"
	"   WHERE published_at < pg_catalog.clock_timestamp() - $2"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_outbox_archive a"
	"  WHERE a.id = ANY (ARRAY(SELECT id FROM batch))"
	"    AND a.published_at < pg_catalog.clock_timestamp() - $2",
	2, {INT4OID, INTERVALOID}
};
/*
 * Prune the queue: what a hand edit made published or dead there (and,
 * on 0.5.0's tables, the dead events and those this library's acks
 * marked published in place).
 */
static IdemStatement prune_queue = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT id FROM @extschema@.idem_outbox_queue"
	"   WHERE state IN (" IDEM_SQL(IDEM_OUTBOX_PUBLISHED_NAME) ", " IDEM_SQL(IDEM_OUTBOX_DEAD_NAME) ")"
	"     AND coalesce(published_at, dead_at) < pg_catalog.clock_timestamp() - $2"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_outbox_queue o"
	"  WHERE o.id = ANY (ARRAY(SELECT id FROM batch))"
	"    AND o.state IN (" IDEM_SQL(IDEM_OUTBOX_PUBLISHED_NAME) ", " IDEM_SQL(IDEM_OUTBOX_DEAD_NAME) ")"
	"    AND coalesce(o.published_at, o.dead_at) < pg_catalog.clock_timestamp() - $2",
	2, {INT4OID, INTERVALOID}
};

/*
 * idem_outbox_prune(older_than, batch): delete at most batch published or
 * dead events finished more than older_than ago, published ones first.
 */
Datum
idem_outbox_prune(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	int32		batch;
	int			deleted = 0;
	IdemStatement *steps[3] = {NULL, NULL, NULL};
	int			i;

	values[1] = IntervalPGetDatum(idem_outbox_interval_arg(fcinfo, 0, "older_than"));
	batch = idem_outbox_batch_arg(fcinfo, 1, PRUNE_MAX_BATCH);

	SPI_connect();
	if (idem_outbox_has_claimed(namespace))
		steps[0] = &prune_published, steps[1] = &prune_dead, steps[2] = &prune_queue;
	else
		steps[0] = &prune_queue, steps[1] = &prune_archive_0_5;
	for (i = 0; i < (int) lengthof(steps) && steps[i] != NULL && deleted < batch; i++)
	{
		values[0] = Int32GetDatum(batch - deleted);
		deleted += idem_execute(steps[i], namespace, values, NULL, false, 0);
	}
	SPI_finish();
	idem_count(IDEM_STAT_OUTBOX_PRUNED, deleted);
	PG_RETURN_INT64(deleted);
}
