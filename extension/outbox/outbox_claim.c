/*-------------------------------------------------------------------------
 *
 * outbox_claim.c
 *	  The outbox's drainer side, part one: the claim.  Acks and nacks are
 *	  in outbox_ack.c, the prune in outbox_prune.c.
 *
 * Drainers claim batches in short transactions of their own and publish
 * with no transaction open.  A claim leases at most batch claimable
 * events to a random claim token, counts the attempt, and returns them.
 * The lease is stored in available_at, the column that also holds the
 * staging delay and the nack backoff: "claimable" is then a single range
 * condition, state = 'pending' AND available_at <= now, served by a
 * partial index on (scope, available_at, id) of each of the outbox's two
 * tables, and a drainer that dies
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
 * due event, merged with idem_outbox_claimed_claimable (the events of
 * idem_outbox_claimed due again: an expired lease, a nack's backoff) by
 * (available_at, id), skip a row whose key has an earlier pending event
 * in either table (the probes of both key order indexes), and take the
 * rest until the batch is full:
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
 * Where the lease goes: an event of the queue moves to idem_outbox_claimed
 * (idem.outbox_archive on, the default): its row there, the whole event,
 * with an entry in each of that table's indexes, and the queue row's
 * delete, a small record; pgmq's read writes about as much (a new version
 * on another page).  The ack then marks it published on its own page
 * (outbox_ack.c), with no second copy.  With the archive off, and for an
 * event already in idem_outbox_claimed, the lease is a new version of the
 * row where it is.  docs/benchmarks.md's outbox section has the account
 * by record type, and why the queue keeps the default fillfactor.
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

/*
 * One of the two tables a claim takes events from, walked in claim order:
 * its open scan of the claimable index and the row at the scan's head.
 */
typedef struct Source
{
	DirectTable *table;
	DirectIndexScan *scan;
	HeapTuple	head;			/* NULL: this source is done */
	TimestampTz head_at;		/* the head's available_at and id, */
	int64		head_id;		/* what the two sources merge by */
} Source;

/* One claim's state: what every row of it is checked against. */
typedef struct Claim
{
	DirectTable *queue;
	DirectTable *claimed;		/* idem_outbox_claimed; the queue on 0.5.0's tables */
	TimestampTz now;			/* once the tables are locked: the scan's bound */
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

#define COLUMN(table, c) (direct_attnum((table), (c)) - 1)

/*
 * Does an event of this scope and key, earlier than id, still hold the
 * key (is it pending) in this table?  As seen by the claim's snapshot.
 */
static bool
key_held_in(Claim *claim, DirectTable *table, Datum key_hash, Datum id, Oid scope)
{
	DirectScanKey keys[2] = {
		{0, BTEqualStrategyNumber, key_hash},
		{1, BTLessStrategyNumber, id},
	};
	DirectIndexScan *scan;
	HeapTuple	row;
	bool		held = false;
	Datum	   *values = palloc(sizeof(Datum) * direct_natts(table));
	bool	   *nulls = palloc(sizeof(bool) * direct_natts(table));

	scan = direct_index_scan_begin(table, QUEUE_INDEX_KEY_ORDER, 2, keys, false);
	while (!held && (row = direct_index_scan_next(scan)) != NULL)
	{
		direct_deform(table, row, values, nulls);
		/* NULLs (a DBA's hand edit, NOT NULL dropped) hold nothing. */
		held = !nulls[COLUMN(table, QUEUE_STATE)] && !nulls[COLUMN(table, QUEUE_SCOPE)] &&
			idem_outbox_state_is(values[COLUMN(table, QUEUE_STATE)], IDEM_OUTBOX_PENDING_NAME) &&
			DatumGetObjectId(values[COLUMN(table, QUEUE_SCOPE)]) == scope;
		heap_freetuple(row);
	}
	direct_index_scan_end(scan);
	pfree(values);
	pfree(nulls);
	return held;
}

/*
 * Does an earlier event of this scope and key still hold the key, in
 * either table?  An event moves from the queue to idem_outbox_claimed in
 * one transaction, and the claimed table's snapshot is taken after the
 * queue's (claim_scope), so whichever snapshot misses it in one table
 * sees it in the other.
 */
static bool
key_held_before(Claim *claim, Datum key_hash, Datum id, Oid scope)
{
	return key_held_in(claim, claim->queue, key_hash, id, scope) ||
		(claim->claimed != claim->queue &&
		 key_held_in(claim, claim->claimed, key_hash, id, scope));
}

/*
 * Is this version of a row of the given scope claimable now?  A row with
 * a NULL state, due time or scope is not: the columns are NOT NULL, but a
 * DBA can drop that and edit rows by hand, and with an index of no
 * predicate (which is accepted) such a row reaches the claim (reading its
 * state crashed the backend).  Leaves the row deformed in claim->values.
 */
static bool
claimable(Claim *claim, DirectTable *table, HeapTuple row, Oid scope)
{
	Datum	   *v = claim->values;
	bool	   *n = claim->nulls;

	direct_deform(table, row, v, n);
	if (n[COLUMN(table, QUEUE_STATE)] || n[COLUMN(table, QUEUE_AVAILABLE_AT)] ||
		n[COLUMN(table, QUEUE_SCOPE)] || n[COLUMN(table, QUEUE_ATTEMPTS)] ||
		!idem_outbox_state_is(v[COLUMN(table, QUEUE_STATE)], IDEM_OUTBOX_PENDING_NAME) ||
		DatumGetTimestampTz(v[COLUMN(table, QUEUE_AVAILABLE_AT)]) > claim->now ||
		DatumGetObjectId(v[COLUMN(table, QUEUE_SCOPE)]) != scope)
		return false;
	return n[COLUMN(table, QUEUE_KEY_HASH)] ||
		!key_held_before(claim, v[COLUMN(table, QUEUE_KEY_HASH)], v[COLUMN(table, QUEUE_ID)], scope);
}

/*
 * Where a taken event's new version goes: an event of the queue moves to
 * idem_outbox_claimed with the archive on, so that its ack writes no
 * second copy of it there (outbox_ack.c); with the archive off the ack
 * deletes it, and a move would only write it again (a TOASTed payload
 * too), so it is leased in place, as before 0.6.0.  An event of
 * idem_outbox_claimed stays there.
 */
static DirectTable *
destination(Claim *claim, DirectTable *from)
{
	return from == claim->queue && idem_outbox_archive ? claim->claimed : from;
}

/*
 * The new version of a taken event, in the table it will be in: a new
 * row of every column copied for a move, or the same row's next version.
 * claim->values holds the locked row, deformed (claimable's last call).
 */
static TupleTableSlot *
next_version(Claim *claim, DirectTable *from, DirectTable *to, HeapTuple row)
{
	TupleTableSlot *slot;
	int			c;

	if (from == to)
		return direct_new_row(from, row);
	slot = direct_new_row(to, NULL);
	for (c = 0; c < QUEUE_NCOLUMNS; c++)
		direct_set(to, c, claim->values[COLUMN(from, c)], claim->nulls[COLUMN(from, c)]);
	return slot;
}

/*
 * Lease a claimable version of an event to the claim, or, if its attempts
 * are used up (its last attempt's lease ran out), mark it dead, never to
 * be handed out again.  The row is locked by the claim (direct_lock), so
 * no concurrent write can come first.  An event that moves to
 * idem_outbox_claimed is deleted from the queue (a small record) and
 * inserted there (the whole event, once, as pgmq's read writes it).
 */
static void
take(Claim *claim, DirectTable *from, HeapTuple row)
{
	static const int result_columns[CLAIM_NCOLUMNS] = {
		QUEUE_ID, QUEUE_TOPIC, QUEUE_MESSAGE_KEY, QUEUE_PAYLOAD, QUEUE_PAYLOAD_BYTES,
		QUEUE_HEADERS, QUEUE_ATTEMPTS, QUEUE_CREATED_AT, QUEUE_CLAIM_TOKEN,
		QUEUE_AVAILABLE_AT
	};
	DirectTable *to = destination(claim, from);
	TupleTableSlot *slot = next_version(claim, from, to, row);
	Datum	   *v = slot->tts_values;
	bool	   *n = slot->tts_isnull;
	int32		attempts = DatumGetInt32(v[COLUMN(to, QUEUE_ATTEMPTS)]);
	bool		used_up = attempts >= idem_outbox_max_attempts;
	ItemPointerData new_tid;
	DirectWrite written;
	Datum		out[CLAIM_NCOLUMNS];
	bool		outnull[CLAIM_NCOLUMNS];
	int			col;

	if (used_up)
	{
		direct_set(to, QUEUE_STATE, CStringGetTextDatum(IDEM_OUTBOX_DEAD_NAME), false);
		direct_set(to, QUEUE_DEAD_AT, TimestampTzGetDatum(GetCurrentTimestamp()), false);
		if (!n[COLUMN(to, QUEUE_CLAIM_TOKEN)])
			direct_set(to, QUEUE_LAST_ERROR,
					   CStringGetTextDatum("lease expired during the last attempt"), false);
		direct_set(to, QUEUE_CLAIM_TOKEN, (Datum) 0, true);
	}
	else
	{
		direct_set(to, QUEUE_ATTEMPTS, Int32GetDatum(attempts + 1), false);
		direct_set(to, QUEUE_CLAIM_TOKEN, claim->token, false);
		direct_set(to, QUEUE_AVAILABLE_AT, TimestampTzGetDatum(claim->leased_until), false);
	}
	/*
	 * A move deletes the queue row, then inserts the event (which still
	 * reads a TOASTed value of the deleted row: TOAST's snapshot ignores
	 * the deletion).
	 */
	written = from == to ? direct_update(to, &row->t_self, &new_tid) :
		direct_delete(from, &row->t_self);
	if (written != DIRECT_WRITTEN)
		elog(ERROR, "pg_idem: a locked outbox event changed under its claim");
	if (from != to && direct_insert(to, false, &new_tid) != DIRECT_WRITTEN)
		ereport(ERROR,
				(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
				 errmsg("a BEFORE INSERT trigger on idem_outbox_claimed skipped an event a claim moved"),
				 errdetail("The claim of event %lld would have lost it.",
						   (long long) DatumGetInt64(v[COLUMN(to, QUEUE_ID)])),
				 errhint("Let the trigger return the row it is given.")));
	claim->taken++;
	if (used_up)
	{
		claim->dead++;
		return;
	}
	for (col = 0; col < CLAIM_NCOLUMNS; col++)
	{
		out[col] = v[COLUMN(to, result_columns[col])];
		outnull[col] = n[COLUMN(to, result_columns[col])];
	}
	claim->leased[claim->nleased].id = DatumGetInt64(v[COLUMN(to, QUEUE_ID)]);
	claim->leased[claim->nleased++].result = heap_form_tuple(claim->result_desc, out, outnull);
}

/* Read a source's next row in claim order (its index's). */
static void
advance(Claim *claim, Source *source)
{
	source->head = direct_index_scan_next(source->scan);
	if (source->head != NULL)
	{
		/* The scan's keys leave out a NULL available_at; ids are NOT NULL. */
		direct_deform(source->table, source->head, claim->values, claim->nulls);
		source->head_at = DatumGetTimestampTz(claim->values[COLUMN(source->table, QUEUE_AVAILABLE_AT)]);
		source->head_id = claim->nulls[COLUMN(source->table, QUEUE_ID)] ? 0 :
			DatumGetInt64(claim->values[COLUMN(source->table, QUEUE_ID)]);
	}
}

/* Of two sources' heads, the one to take first: earlier due, then lower id. */
static Source *
first_due(Source *a, Source *b)
{
	if (a->head == NULL)
		return b->head != NULL ? b : NULL;
	if (b->head == NULL)
		return a;
	if (a->head_at != b->head_at)
		return a->head_at < b->head_at ? a : b;
	return a->head_id <= b->head_id ? a : b;
}

/*
 * Take claimable events of one scope, in claim order, until the batch is
 * full: the queue's and the claimed table's claimable rows merged by
 * (available_at, id), each locked FOR UPDATE SKIP LOCKED (a row another
 * transaction holds is skipped, never waited for), checked again in its
 * locked version (it is the newest: a row changed since the snapshot is
 * followed, as EvalPlanQual would), and leased.  fresh: the claim's first
 * read; the queue's snapshot is taken first, the claimed table's after it
 * (key_held_before says why).
 */
static void
take_claimable(Claim *claim, Oid scope, bool fresh)
{
	DirectScanKey keys[2] = {
		{0, BTEqualStrategyNumber, ObjectIdGetDatum(scope)},
		{1, BTLessEqualStrategyNumber, TimestampTzGetDatum(claim->now)},
	};
	Source		sources[2] = {{claim->queue}, {claim->claimed}};
	int			nsources = claim->claimed != claim->queue ? 2 : 1;
	Source	   *next;
	int			i;

	if (claim->taken >= claim->batch)
		return;
	for (i = 0; i < nsources; i++)
	{
		sources[i].scan = direct_index_scan_begin(sources[i].table, QUEUE_INDEX_CLAIMABLE, 2,
												  keys, fresh);
		advance(claim, &sources[i]);
	}
	while (claim->taken < claim->batch && (next = first_due(&sources[0], &sources[1])) != NULL)
	{
		HeapTuple	row = next->head;
		HeapTuple	locked;

		if (claimable(claim, next->table, row, scope) &&
			(locked = direct_lock(next->table, &row->t_self, true)) != NULL)
		{
			if (ItemPointerEquals(&locked->t_self, &row->t_self) ||
				claimable(claim, next->table, locked, scope))
				take(claim, next->table, locked);
			heap_freetuple(locked);
		}
		heap_freetuple(row);
		advance(claim, next);
	}
	for (i = 0; i < nsources; i++)
	{
		if (sources[i].head != NULL)
			heap_freetuple(sources[i].head);
		direct_index_scan_end(sources[i].scan);
	}
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
	claim.claimed = idem_outbox_open_claimed(namespace, DIRECT_UPDATE);
	if (claim.claimed == NULL)
		claim.claimed = claim.queue;
	else
	{
		/* Both tables' writes one trigger query, as one statement's. */
		direct_begin_trigger_query(claim.queue);
		direct_begin_trigger_query(claim.claimed);
	}
	/*
	 * The clock is read once the tables' locks are held: the open waits for
	 * any DDL, REINDEX or CREATE INDEX on them, and a lease reckoned
	 * from before that wait would be born expired when the wait outlasts
	 * it (another drainer could take the events at once, while this one
	 * publishes them).
	 */
	claim.now = GetCurrentTimestamp();
	claim.leased_until = idem_time_plus(claim.now, lease);
	claim.values = palloc(sizeof(Datum) * Max(direct_natts(claim.queue), direct_natts(claim.claimed)));
	claim.nulls = palloc(sizeof(bool) * Max(direct_natts(claim.queue), direct_natts(claim.claimed)));
	claim.leased = palloc(sizeof(LeasedRow) * batch);
	take_claimable(&claim, scope, true);
	if (scope != IDEM_SHARED_SCOPE)
		take_claimable(&claim, IDEM_SHARED_SCOPE, false);
	if (claim.claimed != claim.queue)
		direct_close(claim.claimed);
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
