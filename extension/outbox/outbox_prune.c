/*-------------------------------------------------------------------------
 *
 * outbox_prune.c
 *	  The outbox's maintenance: prune published events from the archive
 *	  (and dead ones, and published ones edited in by hand, from the
 *	  queue) once they are older than the retention.  A batch at a time,
 *	  through SQL (a maintenance call, not the drainers' hot path).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/protocol.h"
#include "core/statements.h"
#include "core/stats.h"
#include "outbox/outbox.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(idem_outbox_prune);

#define PRUNE_MAX_BATCH			1000000

/* Prune the archive: published longer than $2 ago, at most $1 rows. */
static IdemStatement prune_archive = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT id FROM @extschema@.idem_outbox_archive"
	"   WHERE published_at < pg_catalog.clock_timestamp() - $2"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_outbox_archive a"
	"  WHERE a.id = ANY (ARRAY(SELECT id FROM batch))"
	"    AND a.published_at < pg_catalog.clock_timestamp() - $2",
	2, {INT4OID, INTERVALOID}
};
/* Prune the queue: dead events (and published ones edited in by hand). */
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
 * dead events finished more than older_than ago, archived ones first.
 */
Datum
idem_outbox_prune(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	int32		batch;
	int			deleted;

	values[1] = IntervalPGetDatum(idem_outbox_interval_arg(fcinfo, 0, "older_than"));
	batch = idem_outbox_batch_arg(fcinfo, 1, PRUNE_MAX_BATCH);
	values[0] = Int32GetDatum(batch);

	SPI_connect();
	deleted = idem_execute(&prune_archive, namespace, values, NULL, false, 0);
	if (deleted < batch)
	{
		values[0] = Int32GetDatum(batch - deleted);
		deleted += idem_execute(&prune_queue, namespace, values, NULL, false, 0);
	}
	SPI_finish();
	idem_count(IDEM_STAT_OUTBOX_PRUNED, deleted);
	PG_RETURN_INT64(deleted);
}
