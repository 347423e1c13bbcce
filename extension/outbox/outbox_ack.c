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
 * Both act where the claim put the event: in idem_outbox_claimed, where a
 * claim moves it with idem.outbox_archive on (the default), or in the
 * queue, where it leases it in place with the archive off (and on
 * 0.5.0's tables: outbox_queue.c).  An ack marks the event published in
 * place, or deletes it with the archive off: idem_outbox_claimed keeps
 * half of each page free, so the new version goes on the row's own page
 * and its WAL record carries the changed bytes, not a second copy of the
 * event; its entry in the claimable index is left to VACUUM.  A nack
 * rewrites the row the same way: the backoff as available_at, the error,
 * no token.
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

/*
 * The call's view of the claimed events: the tables an event may be in
 * (the likelier first: where this session's claims put them), and the
 * row read last, with its table and columns.
 */
typedef struct Drain
{
	DirectTable *queue;			/* opened first, closed last */
	DirectTable *claimed;		/* NULL on 0.5.0's tables */
	DirectTable *tables[2];
	bool		fresh[2];		/* the next read of each takes a new snapshot */
	int			ntables;
	Oid			scope;
	pg_uuid_t  *token;
	DirectTable *table;			/* the table of the row read last */
	HeapTuple	row;			/* that row, deformed into values */
	Datum	   *values;
	bool	   *nulls;
} Drain;

#define COLUMN(drain, c) ((drain)->values[direct_attnum((drain)->table, (c)) - 1])
#define IS_NULL(drain, c) ((drain)->nulls[direct_attnum((drain)->table, (c)) - 1])

static void
drain_open(Drain *drain, FunctionCallInfo fcinfo, Oid namespace)
{
	DirectTable *queue;
	DirectTable *claimed;
	int			natts;

	/* The caller's scope: before the open, which acts as the table's owner. */
	drain->scope = idem_current_scope();
	queue = drain->queue = direct_open(&idem_outbox_queue, namespace, DIRECT_UPDATE);
	claimed = drain->claimed = idem_outbox_open_claimed(namespace, DIRECT_UPDATE);
	drain->ntables = claimed != NULL ? 2 : 1;
	if (claimed != NULL)
	{
		/* Both tables' writes one trigger query, as one statement's. */
		direct_begin_trigger_query(queue);
		direct_begin_trigger_query(claimed);
	}
	drain->tables[0] = claimed != NULL && idem_outbox_archive ? claimed : queue;
	drain->tables[1] = drain->tables[0] == queue ? claimed : queue;
	drain->fresh[0] = drain->fresh[1] = true;
	drain->token = PG_GETARG_UUID_P(0);
	natts = Max(direct_natts(queue), claimed != NULL ? direct_natts(claimed) : 0);
	drain->values = palloc(sizeof(Datum) * natts);
	drain->nulls = palloc(sizeof(bool) * natts);
	drain->table = NULL;
	drain->row = NULL;
}

/* In the reverse order of the opens: each close restores the user the open replaced. */
static void
drain_close(Drain *drain)
{
	if (drain->claimed != NULL)
		direct_close(drain->claimed);
	direct_close(drain->queue);
}

/* A concurrent transaction changed the row first: read again, afresh. */
static void
drain_read_afresh(Drain *drain)
{
	drain->fresh[0] = drain->fresh[1] = true;
}

/* Read the event with this id from whichever table holds it (ids are unique across both). */
static bool
read_event(Drain *drain, Datum id)
{
	int			i;

	for (i = 0; i < drain->ntables; i++)
	{
		DirectTable *table = drain->tables[i];

		direct_scan_begin(table, 1, &id, drain->fresh[i]);
		drain->fresh[i] = false;
		drain->row = direct_scan_next(table);
		direct_scan_end(table);
		if (drain->row != NULL)
		{
			drain->table = table;
			direct_deform(table, drain->row, drain->values, drain->nulls);
			return true;
		}
	}
	return false;
}

/*
 * Read the event with this id and check that the call's claim holds it:
 * its token, pending (a published event keeps its token: a second ack of
 * it is stale), and the caller's scope or the shared one.
 */
static bool
read_held(Drain *drain, Datum id)
{
	Oid			scope;

	if (!read_event(drain, id))
		return false;
	/*
	 * A NULL state or scope (a DBA's hand edit, NOT NULL dropped) is held
	 * by no claim: read as a value it crashed the backend, or gave the
	 * shared scope.
	 */
	if (IS_NULL(drain, QUEUE_STATE) || IS_NULL(drain, QUEUE_SCOPE) ||
		IS_NULL(drain, QUEUE_CLAIM_TOKEN) ||
		memcmp(DatumGetUUIDP(COLUMN(drain, QUEUE_CLAIM_TOKEN)), drain->token, UUID_LEN) != 0 ||
		!idem_outbox_state_is(COLUMN(drain, QUEUE_STATE), IDEM_OUTBOX_PENDING_NAME))
		return false;
	scope = DatumGetObjectId(COLUMN(drain, QUEUE_SCOPE));
	return scope == drain->scope || scope == IDEM_SHARED_SCOPE;
}

/*
 * Publish the event just read (drain->row): mark it published in place,
 * or delete it when the archive is off.
 */
static DirectWrite
publish(Drain *drain)
{
	ItemPointerData new_tid;

	if (!idem_outbox_archive)
		return direct_delete(drain->table, &drain->row->t_self);
	(void) direct_new_row(drain->table, drain->row);
	direct_set(drain->table, QUEUE_STATE, CStringGetTextDatum(IDEM_OUTBOX_PUBLISHED_NAME), false);
	direct_set(drain->table, QUEUE_PUBLISHED_AT, TimestampTzGetDatum(GetCurrentTimestamp()), false);
	return direct_update(drain->table, &drain->row->t_self, &new_tid);
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
 * claim still holds (mark them published, or delete them); returns how
 * many.  A stale
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
	for (i = 0; i < n; i++)
	{
		Datum		id = Int64GetDatum(sorted[i]);

		if (i > 0 && sorted[i] == sorted[i - 1])
			continue;
		requested++;
		while (read_held(&drain, id))
		{
			if (publish(&drain) == DIRECT_WRITTEN)
			{
				acked++;
				break;
			}
			/* Changed first by a concurrent transaction: read its newest version. */
			drain_read_afresh(&drain);
		}
	}
	drain_close(&drain);

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

		(void) direct_new_row(drain.table, drain.row);
		direct_set(drain.table, QUEUE_LAST_ERROR, PG_GETARG_DATUM(2), false);
		direct_set(drain.table, QUEUE_CLAIM_TOKEN, (Datum) 0, true);
		if (is_dead)
		{
			direct_set(drain.table, QUEUE_STATE, CStringGetTextDatum(IDEM_OUTBOX_DEAD_NAME), false);
			direct_set(drain.table, QUEUE_DEAD_AT, TimestampTzGetDatum(now), false);
		}
		else
			direct_set(drain.table, QUEUE_AVAILABLE_AT,
					   TimestampTzGetDatum(idem_time_plus(now, backoff)), false);
		if (direct_update(drain.table, &drain.row->t_self, &new_tid) != DIRECT_WRITTEN)
		{
			/* Changed first by a concurrent transaction: read its newest version. */
			drain_read_afresh(&drain);
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
	drain_close(&drain);
	if (outcome == IDEM_NACK_STALE)
		idem_count(IDEM_STAT_OUTBOX_ACK_STALE, 1);

	result[0] = CStringGetTextDatum(idem_nack_outcomes[outcome]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), result, resnull)));
}
