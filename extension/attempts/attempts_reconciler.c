/*-------------------------------------------------------------------------
 *
 * attempts_reconciler.c
 *	  Attempts: the reconciler's batches, the sweep of abandoned keys, the prune
 *	  (see attempts.h for the state machine).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/statements.h"
#include "attempts/attempts.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idem_attempt_reconcile_batch);
PG_FUNCTION_INFO_V1(idem_attempt_sweep_batch);
PG_FUNCTION_INFO_V1(idem_attempt_swept);
PG_FUNCTION_INFO_V1(idem_attempt_prune);

/* ----------------------------------------------------------------
 * Statements
 * ----------------------------------------------------------------
 */

/*
 * Idle live attempts, locked so that concurrent reconcilers take disjoint
 * batches; checked_at spaces out re-checks of one that stays put.  The
 * batch is picked in a MATERIALIZED CTE: SKIP LOCKED under IN (...) may
 * return more than the limit.
 */
static IdemStatement reconcile_batch = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT attempt_id FROM @extschema@.idem_attempts"
	"   WHERE status IN ('pending', 'stored')"
	"     AND GREATEST(updated_at, checked_at) < clock_timestamp() - $1"
	"   ORDER BY GREATEST(updated_at, checked_at)"
	"   LIMIT $2 FOR UPDATE SKIP LOCKED)"
	" UPDATE @extschema@.idem_attempts a SET checked_at = clock_timestamp()"
	"  FROM batch, @extschema@.idem_attempt_kinds k"
	" WHERE a.attempt_id = batch.attempt_id AND k.kind = a.kind"
	"   AND a.status IN ('pending', 'stored')"
	" RETURNING a.attempt_id, a.generation, a.status, a.kind, k.mode,"
	"  a.target, a.object_key, a.declared_digest",
	2, {INTERVALOID, INT4OID}
};

#define ABANDONED_THROUGH \
	"CASE WHEN status = 'failed' THEN generation ELSE generation - 1 END"

/*
 * The sweep answers the parts of each abandoned generation's key; the key
 * is derived in C (attempt_key_of), not by calling the SQL function.
 */
static IdemStatement sweep_batch = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT attempt_id FROM @extschema@.idem_attempts"
	"   WHERE swept_through < " ABANDONED_THROUGH
	"     AND updated_at < clock_timestamp() - $1"
	"   ORDER BY updated_at"
	"   LIMIT $2 FOR UPDATE SKIP LOCKED)"
	" SELECT a.attempt_id, g.generation, k.key_prefix, a.target, a.object_name"
	" FROM batch JOIN @extschema@.idem_attempts a USING (attempt_id)"
	" JOIN @extschema@.idem_attempt_kinds k ON k.kind = a.kind"
	" CROSS JOIN LATERAL generate_series(a.swept_through + 1,"
	"  CASE WHEN a.status = 'failed' THEN a.generation ELSE a.generation - 1 END)"
	"  AS g(generation)"
	" ORDER BY a.attempt_id, g.generation",
	2, {INTERVALOID, INT4OID}
};

static IdemStatement mark_swept = {
	"UPDATE @extschema@.idem_attempts SET swept_through = $2"
	" WHERE attempt_id = $1 AND swept_through < $2"
	"   AND $2 <= " ABANDONED_THROUGH,
	2, {UUIDOID, INT8OID}
};

static IdemStatement select_abandoned = {
	"SELECT " ABANDONED_THROUGH " FROM @extschema@.idem_attempts"
	" WHERE attempt_id = $1",
	1, {UUIDOID}
};

/*
 * The predicate stands in the DELETE too, and the rows are written by TID
 * rather than by a probe of their random attempt_id, as in cleanup.c.
 */
#define PRUNABLE(a) \
	a "status IN ('promoted', 'superseded', 'failed')" \
	" AND " a "updated_at < clock_timestamp() - $1" \
	" AND " a "swept_through >= CASE WHEN " a "status = 'failed'" \
	" THEN " a "generation ELSE " a "generation - 1 END"

static IdemStatement prune_attempts = {
	IDEM_BATCH_BY_TID("DELETE FROM @extschema@.idem_attempts a", "a", "idem_attempts", PRUNABLE, "$2"),
	2, {INTERVALOID, INT4OID},
	.by_tid = true
};

/* ----------------------------------------------------------------
 * The reconciler's side
 * ----------------------------------------------------------------
 */

/*
 * Run a batch statement and return its rows as the function's result set.
 * With derive_key, the statement's columns 3-5 (key prefix, target, object
 * name) become the result's third column, the generation's object key.
 */
static Datum
batch_result(FunctionCallInfo fcinfo, IdemStatement *stmt, bool derive_key)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	uint64		i;

	values[0] = IntervalPGetDatum(attempt_age_arg(fcinfo, 0, "grace"));
	values[1] = Int32GetDatum(attempt_batch_arg(fcinfo, 1));
	InitMaterializedSRF(fcinfo, 0);

	SPI_connect();
	idem_execute(stmt, namespace, values, NULL, false, 0);
	for (i = 0; i < SPI_processed; i++)
	{
		int			natts = rsinfo->setDesc->natts;
		Datum	   *out = palloc(natts * sizeof(Datum));
		bool	   *isnull = palloc(natts * sizeof(bool));
		int			j;

		for (j = 0; j < natts; j++)
			out[j] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
								   j + 1, &isnull[j]);
		if (derive_key)
		{
			HeapTuple	row = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;

			out[2] = CStringGetTextDatum(attempt_key_of(SPI_getvalue(row, desc, 3),
														SPI_getvalue(row, desc, 4),
														out[0],
														DatumGetInt64(out[1]),
														SPI_getvalue(row, desc, 5)));
			isnull[2] = false;
		}
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, isnull);
	}
	SPI_finish();
	return (Datum) 0;
}

/*
 * idem_attempt_reconcile_batch(grace, batch): at most batch pending or
 * stored attempts idle for longer than grace, locked FOR UPDATE SKIP
 * LOCKED until the caller's transaction ends, so that several reconcilers
 * take disjoint batches.  The reconciler checks each blob and calls
 * store/promote/fail in the same transaction.
 */
Datum
idem_attempt_reconcile_batch(PG_FUNCTION_ARGS)
{
	return batch_result(fcinfo, &reconcile_batch, false);
}

/*
 * idem_attempt_sweep_batch(grace, batch): the keys of abandoned
 * generations (every generation before the current one, and the current
 * one of a failed attempt) not yet swept, of at most batch attempts idle
 * for longer than grace.  A put that lands after its key was swept is an
 * orphan no attempt will ever promote.
 */
Datum
idem_attempt_sweep_batch(PG_FUNCTION_ARGS)
{
	return batch_result(fcinfo, &sweep_batch, true);
}

/*
 * idem_attempt_swept(attempt_id, generation): the blobs of generations up
 * to generation are deleted.  False when already recorded.
 */
Datum
idem_attempt_swept(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	bool		done;

	idem_require_arg(fcinfo, 0, "attempt_id");
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int64GetDatum(attempt_generation_arg(fcinfo, 1));
	SPI_connect();
	done = idem_execute(&mark_swept, namespace, values, NULL, false, 0) == 1;
	if (!done)
	{
		bool		isnull;
		int64		through;

		if (idem_execute(&select_abandoned, namespace, values, NULL, false, 1) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("attempt %s does not exist", attempt_uuid_text(values[0])),
					 errdetail("It was never opened, or it was pruned after its retention.")));
		through = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull));
		if (DatumGetInt64(values[1]) > through)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("generation " INT64_FORMAT " is not abandoned",
							DatumGetInt64(values[1])),
					 errdetail("The abandoned generations of attempt %s end at " INT64_FORMAT ".",
							   attempt_uuid_text(values[0]), through),
					 errhint("Only keys returned by idem_attempt_sweep_batch may be deleted.")));
	}
	SPI_finish();
	PG_RETURN_BOOL(done);
}

/*
 * idem_attempt_prune(retention, batch): delete at most batch promoted,
 * superseded or failed attempts idle for longer than retention whose
 * abandoned blobs are swept.  An open after that is new: the documented
 * boundary of the decision table.
 */
Datum
idem_attempt_prune(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	int			deleted;

	values[0] = IntervalPGetDatum(attempt_age_arg(fcinfo, 0, "retention"));
	values[1] = Int32GetDatum(attempt_batch_arg(fcinfo, 1));
	SPI_connect();
	deleted = idem_execute(&prune_attempts, namespace, values, NULL, false, 0);
	SPI_finish();
	PG_RETURN_INT64(deleted);
}

