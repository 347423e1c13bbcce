/*-------------------------------------------------------------------------
 *
 * outbox_ack.c
 *	  The outbox's drainer side, part two: the ack of published events and
 *	  the nack of a failed publish (the claim is in outbox_claim.c).
 *
 * Both are fenced by the claim token (set only on pending rows) and by
 * the caller's scope (a token that leaks to another role acks nothing);
 * a re-claim replaces the token, so a drainer whose lease expired and
 * whose rows were taken over changes nothing.
 *
 * An ack moves the event out of the queue into idem_outbox_archive (or
 * deletes it, idem.outbox_archive = off): a delete and an insert-only
 * append, so the queue's rows and index entries are never rewritten to
 * say "published" and the queue stays as small as the backlog.  What that
 * writes per event is the least the design allows: the queue row's delete
 * (a small WAL record: the row's place and its xmax; its index entries are
 * left to VACUUM), and with the archive the archived row and its primary
 * key entry.  A nack rewrites the row: a new version with the backoff as
 * available_at, and its index entries.
 *
 * Both run on the direct path (table/direct_table.c), row by row as their
 * SQL forms (0.4.0's) did: each id is probed in the primary key with the
 * call's snapshot, checked (token, not dead, scope), and deleted or
 * updated; a row a concurrent transaction changed first (a re-claim, a
 * nack) is read again, in its newest committed version, and checked
 * again, which is what the SQL statements' EvalPlanQual gave.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/compat.h"
#include "core/protocol.h"
#include "core/scope.h"
#include "core/settings.h"
#include "core/statements.h"
#include "core/stats.h"
#include "core/wakeup.h"
#include "outbox/outbox.h"
#include "outbox/outbox_queue.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_outbox_ack);
PG_FUNCTION_INFO_V1(idem_outbox_nack);

/* The call's view of the queue: the open table and a row's columns. */
typedef struct Drain
{
	DirectTable *queue;
	Oid			scope;
	pg_uuid_t  *token;
	bool		fresh;			/* the next read takes a new snapshot */
	Datum	   *values;
	bool	   *nulls;
	HeapTuple	row;			/* the row read last, deformed into values */
} Drain;

#define COLUMN(drain, c) ((drain)->values[direct_attnum((drain)->queue, (c)) - 1])
#define IS_NULL(drain, c) ((drain)->nulls[direct_attnum((drain)->queue, (c)) - 1])

static void
drain_open(Drain *drain, FunctionCallInfo fcinfo, Oid namespace)
{
	/* The caller's scope: before the open, which acts as the table's owner. */
	drain->scope = idem_current_scope();
	drain->queue = direct_open(&idem_outbox_queue, namespace, DIRECT_UPDATE);
	drain->token = PG_GETARG_UUID_P(0);
	drain->fresh = true;
	drain->values = palloc(sizeof(Datum) * direct_natts(drain->queue));
	drain->nulls = palloc(sizeof(bool) * direct_natts(drain->queue));
	drain->row = NULL;
}

/*
 * Read the event with this id and check that the call's claim holds it:
 * its token, not dead, and the caller's scope or the shared one.
 */
static bool
read_held(Drain *drain, Datum id)
{
	Oid			scope;

	direct_scan_begin(drain->queue, 1, &id, drain->fresh);
	drain->fresh = false;
	drain->row = direct_scan_next(drain->queue);
	direct_scan_end(drain->queue);
	if (drain->row == NULL)
		return false;
	direct_deform(drain->queue, drain->row, drain->values, drain->nulls);
	/*
	 * A NULL state or scope (a DBA's hand edit, NOT NULL dropped) is held
	 * by no claim: read as a value it crashed the backend, or gave the
	 * shared scope.
	 */
	if (IS_NULL(drain, QUEUE_STATE) || IS_NULL(drain, QUEUE_SCOPE) ||
		IS_NULL(drain, QUEUE_CLAIM_TOKEN) ||
		memcmp(DatumGetUUIDP(COLUMN(drain, QUEUE_CLAIM_TOKEN)), drain->token, UUID_LEN) != 0 ||
		idem_outbox_state_is(COLUMN(drain, QUEUE_STATE), IDEM_OUTBOX_DEAD_NAME))
		return false;
	scope = DatumGetObjectId(COLUMN(drain, QUEUE_SCOPE));
	return scope == drain->scope || scope == IDEM_SHARED_SCOPE;
}

/* Append the event just deleted (drain->values) to the archive. */
static void
archive_event(Drain *drain, DirectTable *archive)
{
	static const struct
	{
		int			archive;
		int			queue;
	}			copied[] = {
		{ARCHIVE_ID, QUEUE_ID}, {ARCHIVE_TOPIC, QUEUE_TOPIC},
		{ARCHIVE_MESSAGE_KEY, QUEUE_MESSAGE_KEY}, {ARCHIVE_KEY_HASH, QUEUE_KEY_HASH},
		{ARCHIVE_PAYLOAD, QUEUE_PAYLOAD}, {ARCHIVE_PAYLOAD_BYTES, QUEUE_PAYLOAD_BYTES},
		{ARCHIVE_HEADERS, QUEUE_HEADERS}, {ARCHIVE_ATTEMPTS, QUEUE_ATTEMPTS},
		{ARCHIVE_LAST_ERROR, QUEUE_LAST_ERROR}, {ARCHIVE_AVAILABLE_AT, QUEUE_AVAILABLE_AT},
		{ARCHIVE_CLAIM_TOKEN, QUEUE_CLAIM_TOKEN}, {ARCHIVE_CREATED_AT, QUEUE_CREATED_AT},
		{ARCHIVE_SCOPE, QUEUE_SCOPE},
	};
	ItemPointerData tid;
	int			i;

	(void) direct_new_row(archive, NULL);
	for (i = 0; i < (int) lengthof(copied); i++)
		direct_set(archive, copied[i].archive, COLUMN(drain, copied[i].queue),
				   IS_NULL(drain, copied[i].queue));
	direct_set(archive, ARCHIVE_PUBLISHED_AT, TimestampTzGetDatum(GetCurrentTimestamp()), false);
	/* A BEFORE INSERT trigger may skip the row, as it could the SQL INSERT. */
	(void) direct_insert(archive, false, &tid);
}

/* qsort comparator for int64 ids. */
static int
compare_ids(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
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
	Datum	   *elems;
	int64	   *sorted;
	int			n;
	int			i;
	int			requested = 0;
	int			acked = 0;
	Drain		drain;
	DirectTable *archive = NULL;

	idem_require_arg(fcinfo, 0, "token");
	idem_require_arg(fcinfo, 1, "ids");
	ids = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(ids) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("ids must be a one-dimensional array"),
				 errdetail("The array given has %d dimensions.", ARR_NDIM(ids))));
	if (array_contains_nulls(ids))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not contain nulls"),
				 errdetail("An element of the array given is null: an event id is never null.")));
	deconstruct_array(ids, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE, &elems, NULL, &n);
	sorted = palloc(sizeof(int64) * Max(n, 1));
	for (i = 0; i < n; i++)
		sorted[i] = DatumGetInt64(elems[i]);
	/* In id order, as the SQL DELETE's index scan of id = ANY (ids) went. */
	qsort(sorted, n, sizeof(int64), compare_ids);

	drain_open(&drain, fcinfo, namespace);
	if (idem_outbox_archive)
		archive = direct_open(&idem_outbox_archive_table, namespace, DIRECT_INSERT);
	for (i = 0; i < n; i++)
	{
		Datum		id = Int64GetDatum(sorted[i]);

		if (i > 0 && sorted[i] == sorted[i - 1])
			continue;
		requested++;
		while (read_held(&drain, id))
		{
			DirectWrite done = direct_delete(drain.queue, &drain.row->t_self);

			if (done == DIRECT_WRITTEN)
			{
				if (archive != NULL)
					archive_event(&drain, archive);
				acked++;
				break;
			}
			/* Changed first by a concurrent transaction: read its newest version. */
			drain.fresh = true;
		}
	}
	if (archive != NULL)
		direct_close(archive);
	direct_close(drain.queue);

	idem_count(IDEM_STAT_OUTBOX_ACKED, acked);
	if (requested > acked)
		idem_count(IDEM_STAT_OUTBOX_ACK_STALE, requested - acked);
	/* A published head lets its key's next event be claimed. */
	if (acked > 0)
		idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	PG_RETURN_INT32(acked);
}

/*
 * The backoff after the attempt-th attempt: the schedule's entry for it,
 * the last entry repeating.
 */
static Interval *
backoff_after(int32 attempt)
{
	ArrayType  *schedule = idem_outbox_backoff_array();
	Datum	   *elems;
	int			n;

	deconstruct_array(schedule, INTERVALOID, sizeof(Interval), false, TYPALIGN_DOUBLE,
					  &elems, NULL, &n);
	if (n == 0)
		elog(ERROR, "pg_idem: the outbox's backoff schedule is empty");
	return DatumGetIntervalP(elems[Min(Max(attempt, 1), n) - 1]);
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
	TupleDesc	tupdesc;
	Datum		result[3];
	bool		resnull[3] = {false, true, true};
	IdemNackOutcome outcome = IDEM_NACK_STALE;
	Drain		drain;

	idem_require_arg(fcinfo, 0, "token");
	idem_require_arg(fcinfo, 1, "id");
	idem_require_arg(fcinfo, 2, "error");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	drain_open(&drain, fcinfo, namespace);
	while (read_held(&drain, PG_GETARG_DATUM(1)))
	{
		int32		attempts = DatumGetInt32(COLUMN(&drain, QUEUE_ATTEMPTS));
		bool		is_dead = attempts >= idem_outbox_max_attempts;
		Interval   *backoff = backoff_after(attempts);
		TimestampTz now = GetCurrentTimestamp();
		ItemPointerData new_tid;

		(void) direct_new_row(drain.queue, drain.row);
		direct_set(drain.queue, QUEUE_LAST_ERROR, PG_GETARG_DATUM(2), false);
		direct_set(drain.queue, QUEUE_CLAIM_TOKEN, (Datum) 0, true);
		if (is_dead)
		{
			direct_set(drain.queue, QUEUE_STATE, CStringGetTextDatum(IDEM_OUTBOX_DEAD_NAME), false);
			direct_set(drain.queue, QUEUE_DEAD_AT, TimestampTzGetDatum(now), false);
		}
		else
			direct_set(drain.queue, QUEUE_AVAILABLE_AT,
					   TimestampTzGetDatum(idem_time_plus(now, backoff)), false);
		if (direct_update(drain.queue, &drain.row->t_self, &new_tid) != DIRECT_WRITTEN)
		{
			/* Changed first by a concurrent transaction: read its newest version. */
			drain.fresh = true;
			continue;
		}
		result[1] = Int32GetDatum(attempts);
		resnull[1] = false;
		if (is_dead)
		{
			outcome = IDEM_NACK_DEAD;
			idem_count(IDEM_STAT_OUTBOX_DEAD, 1);
		}
		else
		{
			outcome = IDEM_NACK_RETRY;
			result[2] = IntervalPGetDatum(backoff);
			resnull[2] = false;
			idem_count(IDEM_STAT_OUTBOX_NACKED, 1);
		}
		/* Dead: the key is free; retry: the wait re-reads when it is due. */
		idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
		break;
	}
	direct_close(drain.queue);
	if (outcome == IDEM_NACK_STALE)
		idem_count(IDEM_STAT_OUTBOX_ACK_STALE, 1);

	result[0] = CStringGetTextDatum(idem_nack_outcomes[outcome]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), result, resnull)));
}
