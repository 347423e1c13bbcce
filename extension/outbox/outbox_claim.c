/*-------------------------------------------------------------------------
 *
 * outbox_claim.c
 *	  The outbox's drainer side: claim, ack, nack and prune.
 *
 * Drainers claim batches in short transactions of their own and publish
 * with no transaction open.  A claim takes rows with FOR UPDATE SKIP
 * LOCKED in a MATERIALIZED CTE (a plain IN (SELECT ... LIMIT n) can hand
 * out more than n rows under concurrency), stamps them with a random
 * claim token and a lease, and counts the attempt.  The lease is stored
 * in available_at, the column that also holds the staging delay and the
 * nack backoff: "claimable" is then a single range condition,
 * state = 'pending' AND available_at <= clock_timestamp(), served by one
 * partial index on (scope, available_at, id), and a drainer that dies
 * simply lets its rows' leases run out.
 *
 * The claim is index-driven under every plan: its batch size is a literal
 * of the statement (one kept plan per batch size, a few sizes kept), so
 * a generic plan knows the LIMIT, and the UPDATE finds the chosen rows by
 * primary key (id = ANY (ARRAY(...))), never by a join the planner could
 * turn into a scan of the whole queue.  With LIMIT $1 a generic plan
 * assumed 10 % of the table and hashed a sequential scan of it.
 *
 * Scopes: a claim hands out only events of the caller's scope, then, if
 * the batch is not full, events staged before 0.3.0 (the shared scope,
 * 0), which every scope shares.  Per-key order is per (scope, key): a row is
 * claimable only if no earlier row of the same scope and key is still
 * pending (waiting, leased or backing off).  Dead rows do not block their
 * key.  Keys are caller-controlled strings, so only their SHA-256 is
 * indexed.
 *
 * Ack and nack are fenced by the claim token (set only on pending rows)
 * and by the caller's scope (a token that leaks to another role acks
 * nothing); a re-claim replaces the token, so a drainer whose lease
 * expired and whose rows were taken over changes nothing.  An ack moves the event out of
 * the queue into idem_outbox_archive (or deletes it, idem.outbox_archive
 * = off): a DELETE and an insert-only append, so the queue's rows and
 * index entries are never rewritten to say "published" and the queue
 * stays as small as the backlog.  Attempts are counted at claim time, in
 * the claim's own committed transaction, so a drainer killed mid-batch
 * still uses up an attempt: a row whose last attempt's lease ran out is
 * marked dead by the next claim that meets it, never handed out again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/scope.h"
#include "core/settings.h"
#include "core/statements.h"
#include "core/stats.h"
#include "core/wakeup.h"
#include "outbox/outbox.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "nodes/parsenodes.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_outbox_claim);
PG_FUNCTION_INFO_V1(idem_outbox_ack);
PG_FUNCTION_INFO_V1(idem_outbox_nack);
PG_FUNCTION_INFO_V1(idem_outbox_prune);

#define OUTBOX_MAX_BATCH		10000
#define PRUNE_MAX_BATCH			1000000

/* Columns of idem_outbox_claim's result, in the order the SQL declares. */
#define CLAIM_NCOLUMNS 10

/* Batch sizes whose claim plans a backend keeps at once. */
#define CLAIM_PLANS 8

/*
 * Is the row eligible for a claim?  Shared by the claim and the wake-up
 * probe (outbox_wait.c has its own copy of the test: keep them alike).
 */
#define OUTBOX_CLAIMABLE(alias, now) \
	alias ".state = 'pending' AND " alias ".available_at <= " now \
	" AND (" alias ".key_hash IS NULL OR NOT EXISTS (" \
	"  SELECT 1 FROM @extschema@.idem_outbox_queue e" \
	"   WHERE e.key_hash = " alias ".key_hash AND e.state = 'pending'" \
	"     AND e.scope = " alias ".scope AND e.id < " alias ".id))"

/*
 * One claim of at most %d rows (twice: the literal batch): pick the
 * caller's claimable rows ($5) as of $6 (the time, a parameter so that it
 * bounds the index scan: clock_timestamp() could only filter it), then
 * shared rows (scope 0, from before 0.3.0) up to the batch; lease them to token $2 for $3 and count the attempt.  A picked
 * row whose attempts are used up ($4) goes dead instead; only the leased
 * rows are returned.
 */
static const char claim_template[] =
	"WITH own AS MATERIALIZED ("
	"  SELECT o.id FROM @extschema@.idem_outbox_queue o"
	"   WHERE o.scope = $5 AND " OUTBOX_CLAIMABLE("o", "$6")
	"   ORDER BY o.available_at, o.id"
	"   LIMIT %d FOR UPDATE OF o SKIP LOCKED),"
	" shared AS MATERIALIZED ("
	"  SELECT o.id FROM @extschema@.idem_outbox_queue o"
	"   WHERE o.scope = 0::pg_catalog.oid AND " OUTBOX_CLAIMABLE("o", "$6")
	"   ORDER BY o.available_at, o.id"
	"   LIMIT (%d - (SELECT pg_catalog.count(*) FROM own)) FOR UPDATE OF o SKIP LOCKED),"
	" taken AS ("
	"  UPDATE @extschema@.idem_outbox_queue o SET"
	"   state = CASE WHEN o.attempts >= $4 THEN 'dead' ELSE 'pending' END,"
	"   dead_at = CASE WHEN o.attempts >= $4 THEN pg_catalog.clock_timestamp() END,"
	"   last_error = CASE WHEN o.attempts >= $4 AND o.claim_token IS NOT NULL"
	"     THEN 'lease expired during the last attempt' ELSE o.last_error END,"
	"   attempts = CASE WHEN o.attempts >= $4 THEN o.attempts ELSE o.attempts + 1 END,"
	"   claim_token = CASE WHEN o.attempts >= $4 THEN NULL ELSE $2 END,"
	"   available_at = CASE WHEN o.attempts >= $4 THEN o.available_at"
	"     ELSE pg_catalog.clock_timestamp() + $3 END"
	"  WHERE o.id = ANY (ARRAY(SELECT id FROM own UNION ALL SELECT id FROM shared))"
	"  RETURNING o.id, o.topic, o.message_key, o.payload, o.payload_bytes,"
	"   o.headers, o.attempts, o.created_at, o.claim_token, o.available_at, o.state)"
	" SELECT id, topic, message_key, payload, payload_bytes, headers, attempts,"
	"  created_at, claim_token, available_at, state = 'dead'"
	" FROM taken ORDER BY id";

/*
 * The drainer's statements find rows by primary key or walk the claimable
 * index, whatever the statistics say: a plan made while the queue was
 * empty (and kept) must not become a scan of a million rows later.  The
 * statements' WHERE clauses never imply a partial index's predicate where
 * the primary key is meant (state <> 'dead', not state = 'pending'; a
 * claim token is only ever set on pending rows), and they are planned
 * with sequential, bitmap, hash and merge plans disabled, set around
 * their execution only.
 */
static const char *const planner_off[] = {
	"enable_seqscan", "enable_bitmapscan", "enable_hashjoin", "enable_mergejoin"
};

/* The kept claim statements, one per recent batch size. */
typedef struct ClaimPlan
{
	int32		batch;			/* 0: free slot */
	IdemStatement stmt;
} ClaimPlan;

static ClaimPlan claim_plans[CLAIM_PLANS];
static int	claim_plan_next = 0;

/* Move a published event out of the queue into the archive. */
static IdemStatement ack_archive = {
	"WITH moved AS ("
	"  DELETE FROM @extschema@.idem_outbox_queue o"
	"   WHERE o.id = ANY ($2) AND o.claim_token = $1 AND o.state <> 'dead'"
	"     AND o.scope = ANY (ARRAY[$3, 0::pg_catalog.oid])"
	"  RETURNING o.*)"
	" INSERT INTO @extschema@.idem_outbox_archive"
	"  (id, topic, message_key, key_hash, payload, payload_bytes, headers,"
	"   attempts, last_error, available_at, claim_token, created_at, published_at, scope)"
	" SELECT id, topic, message_key, key_hash, payload, payload_bytes, headers,"
	"  attempts, last_error, available_at, claim_token, created_at,"
	"  pg_catalog.clock_timestamp(), scope"
	" FROM moved",
	3, {UUIDOID, INT8ARRAYOID, OIDOID}
};

/* idem.outbox_archive = off: a published event is simply gone. */
static IdemStatement ack_delete = {
	"DELETE FROM @extschema@.idem_outbox_queue o"
	" WHERE o.id = ANY ($2) AND o.claim_token = $1 AND o.state <> 'dead'"
	"   AND o.scope = ANY (ARRAY[$3, 0::pg_catalog.oid])",
	3, {UUIDOID, INT8ARRAYOID, OIDOID}
};

/*
 * A failed publish: back off by the schedule entry for the attempt just
 * made ($4, the last entry repeating), or go dead after the last attempt.
 */
static IdemStatement nack_event = {
	"UPDATE @extschema@.idem_outbox_queue SET"
	" last_error = $3, claim_token = NULL,"
	" state = CASE WHEN attempts >= $5 THEN 'dead' ELSE 'pending' END,"
	" dead_at = CASE WHEN attempts >= $5 THEN pg_catalog.clock_timestamp() END,"
	" available_at = CASE WHEN attempts >= $5 THEN available_at"
	"   ELSE pg_catalog.clock_timestamp() + $4[least(attempts, pg_catalog.cardinality($4))] END"
	" WHERE id = $2 AND claim_token = $1 AND state <> 'dead'"
	"   AND scope = ANY (ARRAY[$6, 0::pg_catalog.oid])"
	" RETURNING state, attempts, $4[least(attempts, pg_catalog.cardinality($4))]",
	6, {UUIDOID, INT8OID, TEXTOID, INTERVALARRAYOID, INT4OID, OIDOID}
};

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
	"   WHERE state IN ('published', 'dead')"
	"     AND coalesce(published_at, dead_at) < pg_catalog.clock_timestamp() - $2"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_outbox_queue o"
	"  WHERE o.id = ANY (ARRAY(SELECT id FROM batch))"
	"    AND o.state IN ('published', 'dead')"
	"    AND coalesce(o.published_at, o.dead_at) < pg_catalog.clock_timestamp() - $2",
	2, {INT4OID, INTERVALOID}
};

/* The claim statement for this batch size, kept across calls. */
static IdemStatement *
claim_statement(int32 batch)
{
	ClaimPlan  *slot;
	int			i;

	for (i = 0; i < CLAIM_PLANS; i++)
		if (claim_plans[i].batch == batch)
			return &claim_plans[i].stmt;

	/* Round robin: a drainer uses one or two sizes; churn only costs planning. */
	slot = &claim_plans[claim_plan_next];
	claim_plan_next = (claim_plan_next + 1) % CLAIM_PLANS;
	if (slot->batch != 0)
	{
		if (slot->stmt.plan != NULL)
			SPI_freeplan(slot->stmt.plan);
		pfree((char *) slot->stmt.sql);
	}
	memset(slot, 0, sizeof(ClaimPlan));
	slot->stmt.sql = MemoryContextStrdup(TopMemoryContext,
										 psprintf(claim_template, batch, batch));
	slot->stmt.nargs = 6;
	slot->stmt.argtypes[0] = INT4OID;	/* unused: keeps $n numbering */
	slot->stmt.argtypes[1] = UUIDOID;
	slot->stmt.argtypes[2] = INTERVALOID;
	slot->stmt.argtypes[3] = INT4OID;
	slot->stmt.argtypes[4] = OIDOID;
	slot->stmt.argtypes[5] = TIMESTAMPTZOID;
	slot->batch = batch;
	return &slot->stmt;
}

/*
 * Prepare a drainer statement for a generic plan, kept across calls: its
 * shape does not depend on the parameters (the batch is a literal, the
 * plans above are disabled), so planning it at every call (a custom plan,
 * 0.3 ms for the claim, more than its execution) buys nothing.
 */
static void
prepare_generic(IdemStatement *stmt, Oid namespace)
{
	const char *schema;
	const char *token = "@extschema@";
	StringInfoData sql;
	const char *p;
	const char *hit;
	SPIPlanPtr	plan;

	if (stmt->plan != NULL && stmt->namespace == namespace)
		return;
	if (stmt->plan != NULL)
	{
		SPI_freeplan(stmt->plan);
		stmt->plan = NULL;
	}
	schema = quote_identifier(get_namespace_name(namespace));
	initStringInfo(&sql);
	for (p = stmt->sql; (hit = strstr(p, token)) != NULL; p = hit + strlen(token))
	{
		appendBinaryStringInfo(&sql, p, hit - p);
		appendStringInfoString(&sql, schema);
	}
	appendStringInfoString(&sql, p);
	plan = SPI_prepare_cursor(sql.data, stmt->nargs, stmt->argtypes,
							  CURSOR_OPT_GENERIC_PLAN);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare_cursor failed for \"%s\": %s",
			 stmt->sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	stmt->plan = plan;
	stmt->namespace = namespace;
}

/*
 * Run a drainer statement with the plans above disabled (a GUC nesting
 * level, undone at once, or by the abort on error), from a generic plan.
 */
static int
execute_indexed(IdemStatement *stmt, Oid namespace, Datum *values, long count)
{
	int			level = NewGUCNestLevel();
	int			i;
	int			processed;
	IdemOwnerSwitch save;

	for (i = 0; i < (int) lengthof(planner_off); i++)
		(void) set_config_option(planner_off[i], "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	/* Prepared as idem_execute prepares (statements.c): as the owner. */
	idem_as_owner(namespace, &save);
	prepare_generic(stmt, namespace);
	idem_as_caller(&save);
	processed = idem_execute(stmt, namespace, values, NULL, false, count);
	AtEOXact_GUC(true, level);
	return processed;
}

/* The claim token: a random (version 4) UUID. */
static Datum
new_claim_token(void)
{
	return DirectFunctionCall1(gen_random_uuid, (Datum) 0);
}

/*
 * idem_outbox_claim(batch, lease): lease at most batch claimable events of
 * the caller's scope to a fresh claim token.  Call it in a transaction of
 * its own and publish after it committed.
 */
Datum
idem_outbox_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			namespace = idem_function_namespace(fcinfo);
	int32		batch = idem_outbox_batch_arg(fcinfo, 0, OUTBOX_MAX_BATCH);
	Datum		values[6];
	uint64		i;
	int64		claimed = 0;
	int64		dead = 0;

	values[0] = Int32GetDatum(batch);
	values[1] = new_claim_token();
	values[2] = IntervalPGetDatum(idem_lease_argument(fcinfo, 1, "lease", false,
													  idem_lease_ms));
	values[3] = Int32GetDatum(idem_outbox_max_attempts);
	values[4] = ObjectIdGetDatum(idem_current_scope(namespace));
	values[5] = TimestampTzGetDatum(GetCurrentTimestamp());
	idem_require_current_schema(namespace);

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != CLAIM_NCOLUMNS)
		elog(ERROR, "idem_outbox_claim must return %d columns", CLAIM_NCOLUMNS);

	SPI_connect();
	execute_indexed(claim_statement(batch), namespace, values, 0);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		Datum		out[CLAIM_NCOLUMNS];
		bool		outnull[CLAIM_NCOLUMNS];
		bool		isnull;
		int			col;

		if (DatumGetBool(SPI_getbinval(row, desc, CLAIM_NCOLUMNS + 1, &isnull)))
		{
			dead++;
			continue;
		}
		for (col = 0; col < CLAIM_NCOLUMNS; col++)
			out[col] = SPI_getbinval(row, desc, col + 1, &outnull[col]);
		/* putvalues copies into the tuplestore's own memory. */
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, outnull);
		claimed++;
	}
	SPI_finish();

	idem_count(IDEM_STAT_OUTBOX_CLAIMED, claimed);
	if (dead > 0)
	{
		idem_count(IDEM_STAT_OUTBOX_DEAD, dead);
		/* A dead head no longer holds back its key's next event. */
		idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	}
	return (Datum) 0;
}

/* qsort comparator for int64 ids. */
static int
compare_ids(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* Number of distinct ids in the ack's array (the stale count needs it). */
static int
distinct_ids(ArrayType *ids)
{
	Datum	   *elems;
	int			n;
	int			i;
	int			distinct = 0;
	int64	   *sorted;

	deconstruct_array(ids, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE,
					  &elems, NULL, &n);
	sorted = palloc(sizeof(int64) * Max(n, 1));
	for (i = 0; i < n; i++)
		sorted[i] = DatumGetInt64(elems[i]);
	qsort(sorted, n, sizeof(int64), compare_ids);
	for (i = 0; i < n; i++)
		if (i == 0 || sorted[i] != sorted[i - 1])
			distinct++;
	return distinct;
}

/*
 * idem_outbox_ack(token, ids): publish the events among ids that this
 * claim still holds (archive or delete them); returns how many.  A stale
 * token acks nothing.
 */
Datum
idem_outbox_ack(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	ArrayType  *ids;
	Datum		values[3];
	int			acked;
	int			requested;

	idem_require_arg(fcinfo, 0, "token");
	idem_require_arg(fcinfo, 1, "ids");
	ids = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(ids) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("ids must be a one-dimensional array")));
	if (array_contains_nulls(ids))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not contain nulls")));
	requested = distinct_ids(ids);

	values[0] = PG_GETARG_DATUM(0);
	values[1] = PointerGetDatum(ids);
	values[2] = ObjectIdGetDatum(idem_current_scope(namespace));
	SPI_connect();
	acked = execute_indexed(idem_outbox_archive ? &ack_archive : &ack_delete,
							namespace, values, 0);
	SPI_finish();

	idem_count(IDEM_STAT_OUTBOX_ACKED, acked);
	if (requested > acked)
		idem_count(IDEM_STAT_OUTBOX_ACK_STALE, requested - acked);
	/* A published head lets its key's next event be claimed. */
	if (acked > 0)
		idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	PG_RETURN_INT32(acked);
}

/*
 * idem_outbox_nack(token, id, error): a failed publish.  Answers retry
 * (with the backoff until the next attempt), dead (no attempts left), or
 * stale (the claim no longer holds the event; nothing changed).
 */
Datum
idem_outbox_nack(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	MemoryContext outer = CurrentMemoryContext;
	TupleDesc	tupdesc;
	Datum		values[6];
	Datum		result[3];
	bool		resnull[3] = {false, true, true};
	HeapTuple	tuple;
	const char *outcome;

	idem_require_arg(fcinfo, 0, "token");
	idem_require_arg(fcinfo, 1, "id");
	idem_require_arg(fcinfo, 2, "error");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	values[0] = PG_GETARG_DATUM(0);
	values[1] = PG_GETARG_DATUM(1);
	values[2] = PG_GETARG_DATUM(2);
	values[3] = PointerGetDatum(idem_outbox_backoff_array());
	values[4] = Int32GetDatum(idem_outbox_max_attempts);
	values[5] = ObjectIdGetDatum(idem_current_scope(namespace));

	SPI_connect();
	if (execute_indexed(&nack_event, namespace, values, 1) == 0)
	{
		outcome = "stale";
		idem_count(IDEM_STAT_OUTBOX_ACK_STALE, 1);
	}
	else
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *state = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
		bool		is_dead = strcmp(state, "dead") == 0;

		result[1] = SPI_getbinval(row, desc, 2, &isnull);
		resnull[1] = false;
		if (is_dead)
		{
			outcome = "dead";
			idem_count(IDEM_STAT_OUTBOX_DEAD, 1);
		}
		else
		{
			MemoryContext old = MemoryContextSwitchTo(outer);

			outcome = "retry";
			result[2] = datumCopy(SPI_getbinval(row, desc, 3, &isnull), false,
								  sizeof(Interval));
			resnull[2] = false;
			MemoryContextSwitchTo(old);
			idem_count(IDEM_STAT_OUTBOX_NACKED, 1);
		}
		/* Dead: the key is free; retry: the wait re-reads when it is due. */
		idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	}
	SPI_finish();

	/* Made after SPI_finish, which frees what was allocated inside SPI. */
	result[0] = CStringGetTextDatum(outcome);
	tuple = heap_form_tuple(BlessTupleDesc(tupdesc), result, resnull);
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

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
