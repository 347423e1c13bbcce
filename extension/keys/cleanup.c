/*-------------------------------------------------------------------------
 *
 * cleanup.c
 *	  The two horizons of a key's life (core/settings.c): dropping responses
 *	  past idem.ttl and deleting rows past idem.tombstone_ttl.
 *
 * Past idem.ttl a completed key's response headers and body are dropped
 * and it becomes "expired": its fingerprint (request hash, status,
 * generation, times) stays, so that a late retry is told so instead of
 * silently running again.  Past idem.tombstone_ttl (or idem.ttl, if that
 * is longer) every finished key is deleted.  A pending key is never
 * touched: its owner may still be running (see idem_stuck).
 *
 * The pick locks each key's newest version and re-checks the age and
 * state predicate against it: a key re-claimed, renewed or finalized
 * since the statement began survives (the bug in the seed's original
 * cleanup).  The predicate stands in the write too, as a guard.  The
 * batch is picked with the same predicate,
 * so failed keys still in their cooldown cannot fill every batch and
 * stall the cleanup.  SKIP LOCKED lets several sessions clean at once
 * without waiting on one another or on a key that is being written.
 *
 * The write finds the picked rows by their TIDs (a TID scan), not by their
 * keys.  A key's primary-key probe lands on a random leaf of an index that,
 * at 10 M keys, no longer fits in shared_buffers: joined by key, a paced
 * cleanup read about 25 k more blocks per 10 s than the claims alone did,
 * and the claims' p99 rose to 1.3-1.9 x quiet; by TID it reads none more
 * and the claims' p99 stayed at 0.9-1.4 x (two runs, docs/benchmarks.md).  The TIDs
 * are those of the versions the pick locked, which no one else can change
 * before this statement ends; a version committed after the statement's
 * snapshot is not visible at its TID and is left for a later batch (the
 * key join would have followed it and deleted it now).  Such a batch
 * comes back short although keys are left, and the worker's pass stops
 * there: rare (a key still deletable after a concurrent write, e.g. an
 * eviction's tombstone), and the next pass takes them.  The TID scan is
 * the plan even where a session turned enable_tidscan off
 * (core/statements.c pins it).
 *
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/arguments.h"
#include "core/protocol.h"
#include "core/settings.h"
#include "core/scope.h"
#include "core/statements.h"
#include "core/stats.h"
#include "catalog/pg_type.h"

PG_FUNCTION_INFO_V1(idem_cleanup);

/* Largest batch one call may handle: bounds the statement's duration. */
#define CLEANUP_MAX_BATCH 1000000

#define DELETABLE(k) \
	k "state IN (" IDEM_SQL(IDEM_KEY_COMPLETED_NAME) ", " IDEM_SQL(IDEM_KEY_FAILED_NAME) ", " \
	IDEM_SQL(IDEM_KEY_EXPIRED_NAME) ")" \
	" AND " k "created_at < clock_timestamp() - $2" \
	" AND (" k "state <> " IDEM_SQL(IDEM_KEY_FAILED_NAME) " OR " k "lease_expires_at < clock_timestamp())"

static IdemStatement delete_finished = {
	IDEM_BATCH_BY_TID("DELETE FROM @extschema@.idem_keys k", "k", "idem_keys", DELETABLE, "$1"),
	2, {INT4OID, INTERVALOID},
	.by_tid = true
};

#define EXPIRABLE(k) \
	k "state = " IDEM_SQL(IDEM_KEY_COMPLETED_NAME) " AND " k "created_at < clock_timestamp() - $2"

static IdemStatement expire_responses = {
	IDEM_BATCH_BY_TID("UPDATE @extschema@.idem_keys k"
					  " SET state = " IDEM_SQL(IDEM_KEY_EXPIRED_NAME) ", response_headers = NULL,"
					  " response_body = NULL",
					  "k", "idem_keys", EXPIRABLE, "$1"),
	2, {INT4OID, INTERVALOID},
	.by_tid = true
};

/* Run one cleanup statement over at most batch keys older than age_s. */
static int
clean(Oid namespace, IdemStatement *stmt, int32 batch, int age_s)
{
	Datum		values[2];

	values[0] = Int32GetDatum(batch);
	values[1] = IntervalPGetDatum(idem_ms_interval((int64) age_s * 1000));
	return idem_execute(stmt, namespace, values, NULL, false, 0);
}

/*
 * idem_cleanup(batch): delete finished keys past the tombstone horizon and
 * drop the responses of completed keys past idem.ttl, at most batch keys
 * in all; returns how many keys it deleted or expired.
 */
Datum
idem_cleanup(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	int32		batch;
	int			deleted;
	int			expired = 0;
	int			delete_after_s = Max(idem_ttl_s, idem_tombstone_ttl_s);

	idem_require_arg(fcinfo, 0, "batch");
	batch = PG_GETARG_INT32(0);
	if (batch < 1 || batch > CLEANUP_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", CLEANUP_MAX_BATCH),
				 errdetail("The batch given is %d.", batch)));

	SPI_connect();
	deleted = clean(namespace, &delete_finished, batch, delete_after_s);
	if (deleted < batch && delete_after_s > idem_ttl_s)
		expired = clean(namespace, &expire_responses, batch - deleted, idem_ttl_s);
	SPI_finish();
	idem_count(IDEM_STAT_CLEANUP_DELETED, deleted);
	idem_count(IDEM_STAT_CLEANUP_EXPIRED, expired);
	PG_RETURN_INT64(deleted + expired);
}
