/*-------------------------------------------------------------------------
 *
 * outbox_claim.c
 *	  The outbox's drainer side, part one: the claim.  Acks and nacks are
 *	  in outbox_ack.c, the archive's prune in outbox_prune.c.
 *
 * Drainers claim batches in short transactions of their own and publish
 * with no transaction open.  A claim leases at most batch claimable
 * events to a random claim token, counts the attempt, and returns them.
 * The lease is stored in available_at, the column that also holds the
 * staging delay and the nack backoff: "claimable" is then a single range
 * condition, state = 'pending' AND available_at <= now, served by one
 * partial index on (scope, available_at, id), and a drainer that dies
 * simply lets its rows' leases run out.
 *
 * The claim runs on the direct path (table/direct_table.c): no planner and
 * no executor per call, so every plan is the index-driven one.  It does
 * what its SQL form (0.4.0's) did, row by row:
 *
 *	WITH own AS MATERIALIZED (SELECT id FROM idem_outbox_queue
 *	    WHERE scope = <caller's> AND <claimable as of the call's start>
 *	    ORDER BY available_at, id LIMIT batch FOR UPDATE SKIP LOCKED),
 *	  shared AS MATERIALIZED (the same for scope 0, up to the batch)
 *	UPDATE idem_outbox_queue SET <lease, or dead> WHERE id IN (own, shared)
 *
 * that is: walk idem_outbox_claimable from the caller's scope's earliest
 * due event, skip a row whose key has an earlier pending event (the probe
 * of idem_outbox_key_order), lock the rest FOR UPDATE SKIP LOCKED (a row
 * another drainer is claiming is skipped, never waited for; a row changed
 * since the snapshot is locked in its newest version and checked again,
 * as EvalPlanQual would), until the batch is full; then events staged
 * before 0.3.0 (the shared scope, 0), which every scope shares.  Then each
 * locked row, in id order, is leased, or goes dead when its attempts are
 * used up.  The time that bounds the scan is the call's start, so rows
 * leased by this claim (available_at in the future) never come back into
 * it.
 *
 * Per-key order is per (scope, key): a row is claimable only if no
 * earlier row of the same scope and key is still pending (waiting, leased
 * or backing off).  Dead rows do not block their key.  Keys are
 * caller-controlled strings, so only their SHA-256 is indexed.
 *
 * Attempts are counted at claim time, in the claim's own committed
 * transaction, so a drainer killed mid-batch still uses up an attempt: a
 * row whose last attempt's lease ran out is marked dead by the next claim
 * that meets it, never handed out again.
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
#include "outbox/outbox_queue.h"

#include "access/nbtree.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_outbox_claim);

#define OUTBOX_MAX_BATCH		10000

/* Columns of idem_outbox_claim's result, in the order the SQL declares. */
#define CLAIM_NCOLUMNS 10

/* A row the claim locked, newest version. */
typedef struct LockedRow
{
	int64		id;
	HeapTuple	tuple;
} LockedRow;

/* One claim's state: what every row of it is checked against. */
typedef struct Claim
{
	DirectTable *queue;
	TimestampTz now;			/* the call's start: the scan's bound */
	Oid			scope_type;
	Datum	   *values;			/* a row being checked, deformed */
	bool	   *nulls;
	LockedRow  *rows;			/* the locked rows */
	int			nrows;
	int			batch;
} Claim;

#define COLUMN(claim, c) (direct_attnum((claim)->queue, (c)) - 1)

/*
 * Does an event of this scope and key, earlier than id, still hold the
 * key (is it pending)?  As seen by the claim's snapshot.
 */
static bool
key_held_before(Claim *claim, Datum key_hash, Datum id, Oid scope)
{
	DirectScanKey keys[2] = {
		{0, BTEqualStrategyNumber, key_hash},
		{1, BTLessStrategyNumber, id},
	};
	DirectIndexScan *scan;
	HeapTuple	row;
	bool		held = false;
	Datum	   *values = palloc(sizeof(Datum) * direct_natts(claim->queue));
	bool	   *nulls = palloc(sizeof(bool) * direct_natts(claim->queue));

	scan = direct_index_scan_begin(claim->queue, QUEUE_INDEX_KEY_ORDER, 2, keys, false);
	while (!held && (row = direct_index_scan_next(scan)) != NULL)
	{
		direct_deform(claim->queue, row, values, nulls);
		held = idem_outbox_state_is(values[COLUMN(claim, QUEUE_STATE)], "pending") &&
			idem_scope_of_value(values[COLUMN(claim, QUEUE_SCOPE)], claim->scope_type) == scope;
		heap_freetuple(row);
	}
	direct_index_scan_end(scan);
	pfree(values);
	pfree(nulls);
	return held;
}

/* Is this version of a row of the given scope claimable now? */
static bool
claimable(Claim *claim, HeapTuple row, Oid scope)
{
	Datum	   *v = claim->values;
	bool	   *n = claim->nulls;

	direct_deform(claim->queue, row, v, n);
	if (!idem_outbox_state_is(v[COLUMN(claim, QUEUE_STATE)], "pending") ||
		DatumGetTimestampTz(v[COLUMN(claim, QUEUE_AVAILABLE_AT)]) > claim->now ||
		idem_scope_of_value(v[COLUMN(claim, QUEUE_SCOPE)], claim->scope_type) != scope)
		return false;
	return n[COLUMN(claim, QUEUE_KEY_HASH)] ||
		!key_held_before(claim, v[COLUMN(claim, QUEUE_KEY_HASH)], v[COLUMN(claim, QUEUE_ID)], scope);
}

/*
 * Lock claimable rows of one scope, in claim order, until the batch is
 * full (FOR UPDATE SKIP LOCKED).  fresh: the claim's first read.
 */
static void
lock_claimable(Claim *claim, Oid scope, bool fresh)
{
	DirectScanKey keys[2] = {
		{0, BTEqualStrategyNumber, idem_scope_value(scope, claim->scope_type)},
		{1, BTLessEqualStrategyNumber, TimestampTzGetDatum(claim->now)},
	};
	DirectIndexScan *scan;
	HeapTuple	row;

	if (claim->nrows >= claim->batch)
		return;
	scan = direct_index_scan_begin(claim->queue, QUEUE_INDEX_CLAIMABLE, 2, keys, fresh);
	while (claim->nrows < claim->batch && (row = direct_index_scan_next(scan)) != NULL)
	{
		HeapTuple	locked;

		if (!claimable(claim, row, scope) ||
			(locked = direct_lock(claim->queue, &row->t_self, true)) == NULL)
		{
			heap_freetuple(row);
			continue;
		}
		/* The locked version may be newer than the one read: check it again. */
		if (!claimable(claim, locked, scope))
		{
			heap_freetuple(locked);
			heap_freetuple(row);
			continue;
		}
		heap_freetuple(row);
		/* claimable() deformed the locked version last. */
		claim->rows[claim->nrows].id = DatumGetInt64(claim->values[COLUMN(claim, QUEUE_ID)]);
		claim->rows[claim->nrows++].tuple = locked;
	}
	direct_index_scan_end(scan);
}

/* qsort comparator: locked rows by id. */
static int
compare_rows(const void *a, const void *b)
{
	int64		x = ((const LockedRow *) a)->id;
	int64		y = ((const LockedRow *) b)->id;

	return x < y ? -1 : x > y ? 1 : 0;
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
	Interval   *lease = idem_lease_argument(fcinfo, 1, "lease", false, idem_lease_ms);
	Oid			scope = idem_current_scope(namespace);
	Datum		token = DirectFunctionCall1(gen_random_uuid, (Datum) 0);
	Claim		claim = {0};
	TimestampTz leased_until;
	int64		claimed = 0;
	int64		dead = 0;
	int			i;

	claim.now = GetCurrentTimestamp();
	claim.batch = batch;
	idem_require_current_schema(namespace);

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != CLAIM_NCOLUMNS)
		elog(ERROR, "idem_outbox_claim must return %d columns", CLAIM_NCOLUMNS);

	claim.queue = direct_open(&idem_outbox_queue, namespace, DIRECT_UPDATE);
	claim.scope_type = direct_column_type(claim.queue, QUEUE_SCOPE);
	claim.values = palloc(sizeof(Datum) * direct_natts(claim.queue));
	claim.nulls = palloc(sizeof(bool) * direct_natts(claim.queue));
	claim.rows = palloc(sizeof(LockedRow) * batch);
	lock_claimable(&claim, scope, true);
	if (scope != IDEM_SHARED_SCOPE)
		lock_claimable(&claim, IDEM_SHARED_SCOPE, false);
	qsort(claim.rows, claim.nrows, sizeof(LockedRow), compare_rows);

	leased_until = idem_time_plus(GetCurrentTimestamp(), lease);
	for (i = 0; i < claim.nrows; i++)
	{
		HeapTuple	row = claim.rows[i].tuple;
		TupleTableSlot *slot = direct_new_row(claim.queue, row);
		Datum	   *v = slot->tts_values;
		bool	   *n = slot->tts_isnull;
		int32		attempts = DatumGetInt32(v[COLUMN(&claim, QUEUE_ATTEMPTS)]);
		bool		used_up = attempts >= idem_outbox_max_attempts;
		ItemPointerData new_tid;

		if (used_up)
		{
			/* Its last attempt's lease ran out: dead, not handed out again. */
			direct_set(claim.queue, QUEUE_STATE, CStringGetTextDatum("dead"), false);
			direct_set(claim.queue, QUEUE_DEAD_AT, TimestampTzGetDatum(GetCurrentTimestamp()), false);
			if (!n[COLUMN(&claim, QUEUE_CLAIM_TOKEN)])
				direct_set(claim.queue, QUEUE_LAST_ERROR,
						   CStringGetTextDatum("lease expired during the last attempt"), false);
			direct_set(claim.queue, QUEUE_CLAIM_TOKEN, (Datum) 0, true);
		}
		else
		{
			direct_set(claim.queue, QUEUE_ATTEMPTS, Int32GetDatum(attempts + 1), false);
			direct_set(claim.queue, QUEUE_CLAIM_TOKEN, token, false);
			direct_set(claim.queue, QUEUE_AVAILABLE_AT, TimestampTzGetDatum(leased_until), false);
		}
		/* Locked above, so no concurrent write can have come first. */
		if (direct_update(claim.queue, &row->t_self, &new_tid) != DIRECT_WRITTEN)
			elog(ERROR, "pg_idem: a locked outbox event changed under its claim");
		if (used_up)
		{
			dead++;
			continue;
		}
		{
			static const int result_columns[CLAIM_NCOLUMNS] = {
				QUEUE_ID, QUEUE_TOPIC, QUEUE_MESSAGE_KEY, QUEUE_PAYLOAD, QUEUE_PAYLOAD_BYTES,
				QUEUE_HEADERS, QUEUE_ATTEMPTS, QUEUE_CREATED_AT, QUEUE_CLAIM_TOKEN,
				QUEUE_AVAILABLE_AT
			};
			Datum		out[CLAIM_NCOLUMNS];
			bool		outnull[CLAIM_NCOLUMNS];
			int			col;

			for (col = 0; col < CLAIM_NCOLUMNS; col++)
			{
				out[col] = v[COLUMN(&claim, result_columns[col])];
				outnull[col] = n[COLUMN(&claim, result_columns[col])];
			}
			/* putvalues copies into the tuplestore's own memory. */
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, outnull);
		}
		claimed++;
	}
	direct_close(claim.queue);

	idem_count(IDEM_STAT_OUTBOX_CLAIMED, claimed);
	if (dead > 0)
	{
		idem_count(IDEM_STAT_OUTBOX_DEAD, dead);
		/* A dead head no longer holds back its key's next event. */
		idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	}
	return (Datum) 0;
}
