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
 * of idem_outbox_key_order), and take the rest until the batch is full:
 * lock each FOR UPDATE SKIP LOCKED (a row another transaction holds is
 * skipped, never waited for; a row changed since the snapshot is locked in
 * its newest version, which is checked again, as EvalPlanQual would), and
 * lease it (or mark it dead when its attempts are used up).  Then events
 * staged before 0.3.0 (the shared scope, 0), which every scope shares.
 * The leased rows are returned in id order.  The time that bounds the scan
 * and starts the lease is read once the queue is open and locked (not
 * before a wait for a DBA's lock), and the claim's own new versions are
 * invisible to its snapshot, so rows it leased never come back into it.  (Leasing by a
 * no-wait update instead of a lock is not an option: heapam does not
 * support heap_update without waiting.)
 *
 * WAL: a lease's new version goes where the table has room (the queue's
 * pages are full, so another page: the record carries the whole row, and
 * a Heap/LOCK record marks the old version first, after the FOR UPDATE's
 * own), and an entry in each index: pgmq's read writes the same records.
 * docs/benchmarks.md's outbox section has the account by record type, and
 * why the queue keeps the default fillfactor.
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
#include "core/protocol.h"
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

/* An event the claim leased: its result row, and its id to sort by. */
typedef struct LeasedRow
{
	int64		id;
	HeapTuple	result;
} LeasedRow;

/* One claim's state: what every row of it is checked against. */
typedef struct Claim
{
	DirectTable *queue;
	TimestampTz now;			/* once the queue is locked: the scan's bound */
	TimestampTz leased_until;
	Datum		token;
	TupleDesc	result_desc;
	Datum	   *values;			/* a row being checked, deformed */
	bool	   *nulls;
	LeasedRow  *leased;
	int			nleased;
	int			taken;			/* leased or gone dead: what the batch counts */
	int			batch;
	int64		dead;
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
		/* NULLs (a DBA's hand edit, NOT NULL dropped) hold nothing. */
		held = !nulls[COLUMN(claim, QUEUE_STATE)] && !nulls[COLUMN(claim, QUEUE_SCOPE)] &&
			idem_outbox_state_is(values[COLUMN(claim, QUEUE_STATE)], IDEM_OUTBOX_PENDING_NAME) &&
			DatumGetObjectId(values[COLUMN(claim, QUEUE_SCOPE)]) == scope;
		heap_freetuple(row);
	}
	direct_index_scan_end(scan);
	pfree(values);
	pfree(nulls);
	return held;
}

/*
 * Is this version of a row of the given scope claimable now?  A row with
 * a NULL state, due time or scope is not: the columns are NOT NULL, but a
 * DBA can drop that and edit rows by hand, and with an index of no
 * predicate (which is accepted) such a row reaches the claim (reading its
 * state crashed the backend).
 */
static bool
claimable(Claim *claim, HeapTuple row, Oid scope)
{
	Datum	   *v = claim->values;
	bool	   *n = claim->nulls;

	direct_deform(claim->queue, row, v, n);
	if (n[COLUMN(claim, QUEUE_STATE)] || n[COLUMN(claim, QUEUE_AVAILABLE_AT)] ||
		n[COLUMN(claim, QUEUE_SCOPE)] ||
		!idem_outbox_state_is(v[COLUMN(claim, QUEUE_STATE)], IDEM_OUTBOX_PENDING_NAME) ||
		DatumGetTimestampTz(v[COLUMN(claim, QUEUE_AVAILABLE_AT)]) > claim->now ||
		DatumGetObjectId(v[COLUMN(claim, QUEUE_SCOPE)]) != scope)
		return false;
	return n[COLUMN(claim, QUEUE_KEY_HASH)] ||
		!key_held_before(claim, v[COLUMN(claim, QUEUE_KEY_HASH)], v[COLUMN(claim, QUEUE_ID)], scope);
}

/*
 * Lease a claimable version of an event to the claim, or, if its attempts
 * are used up (its last attempt's lease ran out), mark it dead, never to
 * be handed out again.  The row is locked by the claim (direct_lock), so
 * no concurrent write can come first.
 */
static void
take(Claim *claim, HeapTuple row)
{
	static const int result_columns[CLAIM_NCOLUMNS] = {
		QUEUE_ID, QUEUE_TOPIC, QUEUE_MESSAGE_KEY, QUEUE_PAYLOAD, QUEUE_PAYLOAD_BYTES,
		QUEUE_HEADERS, QUEUE_ATTEMPTS, QUEUE_CREATED_AT, QUEUE_CLAIM_TOKEN,
		QUEUE_AVAILABLE_AT
	};
	TupleTableSlot *slot = direct_new_row(claim->queue, row);
	Datum	   *v = slot->tts_values;
	bool	   *n = slot->tts_isnull;
	int32		attempts = DatumGetInt32(v[COLUMN(claim, QUEUE_ATTEMPTS)]);
	bool		used_up = attempts >= idem_outbox_max_attempts;
	ItemPointerData new_tid;
	Datum		out[CLAIM_NCOLUMNS];
	bool		outnull[CLAIM_NCOLUMNS];
	int			col;

	if (used_up)
	{
		direct_set(claim->queue, QUEUE_STATE, CStringGetTextDatum(IDEM_OUTBOX_DEAD_NAME), false);
		direct_set(claim->queue, QUEUE_DEAD_AT, TimestampTzGetDatum(GetCurrentTimestamp()), false);
		if (!n[COLUMN(claim, QUEUE_CLAIM_TOKEN)])
			direct_set(claim->queue, QUEUE_LAST_ERROR,
					   CStringGetTextDatum("lease expired during the last attempt"), false);
		direct_set(claim->queue, QUEUE_CLAIM_TOKEN, (Datum) 0, true);
	}
	else
	{
		direct_set(claim->queue, QUEUE_ATTEMPTS, Int32GetDatum(attempts + 1), false);
		direct_set(claim->queue, QUEUE_CLAIM_TOKEN, claim->token, false);
		direct_set(claim->queue, QUEUE_AVAILABLE_AT, TimestampTzGetDatum(claim->leased_until),
				   false);
	}
	if (direct_update(claim->queue, &row->t_self, &new_tid) != DIRECT_WRITTEN)
		elog(ERROR, "pg_idem: a locked outbox event changed under its claim");
	claim->taken++;
	if (used_up)
	{
		claim->dead++;
		return;
	}
	for (col = 0; col < CLAIM_NCOLUMNS; col++)
	{
		out[col] = v[COLUMN(claim, result_columns[col])];
		outnull[col] = n[COLUMN(claim, result_columns[col])];
	}
	claim->leased[claim->nleased].id = DatumGetInt64(v[COLUMN(claim, QUEUE_ID)]);
	claim->leased[claim->nleased++].result = heap_form_tuple(claim->result_desc, out, outnull);
}

/*
 * Take claimable events of one scope, in claim order, until the batch is
 * full: lock each FOR UPDATE SKIP LOCKED (a row another transaction holds
 * is skipped, never waited for), check the locked version again (it is
 * the newest: a row changed since the snapshot is followed, as
 * EvalPlanQual would), and lease it.  fresh: the claim's first read.
 */
static void
take_claimable(Claim *claim, Oid scope, bool fresh)
{
	DirectScanKey keys[2] = {
		{0, BTEqualStrategyNumber, ObjectIdGetDatum(scope)},
		{1, BTLessEqualStrategyNumber, TimestampTzGetDatum(claim->now)},
	};
	DirectIndexScan *scan;
	HeapTuple	row;

	if (claim->taken >= claim->batch)
		return;
	scan = direct_index_scan_begin(claim->queue, QUEUE_INDEX_CLAIMABLE, 2, keys, fresh);
	while (claim->taken < claim->batch && (row = direct_index_scan_next(scan)) != NULL)
	{
		HeapTuple	locked;

		if (claimable(claim, row, scope) &&
			(locked = direct_lock(claim->queue, &row->t_self, true)) != NULL)
		{
			if (ItemPointerEquals(&locked->t_self, &row->t_self) || claimable(claim, locked, scope))
				take(claim, locked);
			heap_freetuple(locked);
		}
		heap_freetuple(row);
	}
	direct_index_scan_end(scan);
}

/* qsort comparator: leased rows by id. */
static int
compare_rows(const void *a, const void *b)
{
	int64		x = ((const LeasedRow *) a)->id;
	int64		y = ((const LeasedRow *) b)->id;

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
	Oid			scope = idem_current_scope();
	Datum		token = DirectFunctionCall1(gen_random_uuid, (Datum) 0);
	Claim		claim = {0};
	int			i;

	claim.token = token;
	claim.batch = batch;

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != CLAIM_NCOLUMNS)
		elog(ERROR, "idem_outbox_claim must return %d columns", CLAIM_NCOLUMNS);
	claim.result_desc = rsinfo->setDesc;

	claim.queue = direct_open(&idem_outbox_queue, namespace, DIRECT_UPDATE);
	/*
	 * The clock is read once the queue's locks are held: the open waits for
	 * any DDL, REINDEX or CREATE INDEX on the queue, and a lease reckoned
	 * from before that wait would be born expired when the wait outlasts
	 * it (another drainer could take the events at once, while this one
	 * publishes them).
	 */
	claim.now = GetCurrentTimestamp();
	claim.leased_until = idem_time_plus(claim.now, lease);
	claim.values = palloc(sizeof(Datum) * direct_natts(claim.queue));
	claim.nulls = palloc(sizeof(bool) * direct_natts(claim.queue));
	claim.leased = palloc(sizeof(LeasedRow) * batch);
	take_claimable(&claim, scope, true);
	if (scope != IDEM_SHARED_SCOPE)
		take_claimable(&claim, IDEM_SHARED_SCOPE, false);
	direct_close(claim.queue);

	/* In id order, as the SQL form returned them. */
	qsort(claim.leased, claim.nleased, sizeof(LeasedRow), compare_rows);
	for (i = 0; i < claim.nleased; i++)
		tuplestore_puttuple(rsinfo->setResult, claim.leased[i].result);

	idem_count(IDEM_STAT_OUTBOX_CLAIMED, claim.nleased);
	if (claim.dead > 0)
	{
		idem_count(IDEM_STAT_OUTBOX_DEAD, claim.dead);
		/* A dead head no longer holds back its key's next event. */
		idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	}
	return (Datum) 0;
}
