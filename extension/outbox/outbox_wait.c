/*-------------------------------------------------------------------------
 *
 * outbox_wait.c
 *	  What an idle drainer and an operator see of the outbox: the wait for
 *	  claimable work, the backlog of the caller's scope, and hand edits
 *	  through the idem_outbox view.
 *
 * idem_outbox_wait sleeps on the outbox's wake-up channel (wakeup.c):
 * every stage, ack, nack and dead-marking claim broadcasts it when its
 * transaction commits, never before, so a drainer learns of a committed
 * event at once and an uncommitted one never wakes it for good.  Each
 * check is one index probe with a snapshot of its own (a fresh one per
 * probe, none held across the sleep); the probe also reads when the next
 * delayed, backing-off or leased event of the scope becomes due, and the
 * sleep ends then.  Without shared_preload_libraries there are no
 * condition variables and wakeup.c polls (1 ms doubling to 50 ms).
 *
 * The probe and the backlog read the idem_outbox view, the union of the
 * outbox's tables in every version the library serves (0.5.0's queue
 * and archive, the queue and idem_outbox_claimed since): their conditions
 * go down into each table's own partial indexes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/protocol.h"
#include "core/scope.h"
#include "core/settings.h"
#include "core/statements.h"
#include "core/wakeup.h"
#include "outbox/outbox.h"
#include "outbox/outbox_queue.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idem_outbox_wait);
PG_FUNCTION_INFO_V1(idem_outbox_backlog);
PG_FUNCTION_INFO_V1(idem_outbox_view_write);

/* Is the row eligible for a claim?  The claim's test (outbox_claim.c). */
#define OUTBOX_CLAIMABLE(alias, now) \
	alias ".state = " IDEM_SQL(IDEM_OUTBOX_PENDING_NAME) " AND " alias ".available_at <= " now \
	" AND (" alias ".key_hash IS NULL OR NOT EXISTS (" \
	"  SELECT 1 FROM @extschema@.idem_outbox e" \
	"   WHERE e.key_hash = " alias ".key_hash AND e.state = " IDEM_SQL(IDEM_OUTBOX_PENDING_NAME) \
	"     AND e.scope = " alias ".scope AND e.id < " alias ".id))"

/*
 * The wake-up probe: is anything of scope $1 (or shared, 0) claimable at
 * $2 (now), and when is the next pending event of those scopes due?
 */
static IdemStatement probe_work = {
	"SELECT EXISTS (SELECT 1 FROM @extschema@.idem_outbox o"
	"                WHERE o.scope = ANY (ARRAY[$1, 0::pg_catalog.oid]) AND " OUTBOX_CLAIMABLE("o", "$2") "),"
	" least((SELECT pg_catalog.min(available_at) FROM @extschema@.idem_outbox"
	"         WHERE scope = $1 AND state = " IDEM_SQL(IDEM_OUTBOX_PENDING_NAME) " AND available_at > $2),"
	"       (SELECT pg_catalog.min(available_at) FROM @extschema@.idem_outbox"
	"         WHERE scope = 0::pg_catalog.oid AND state = " IDEM_SQL(IDEM_OUTBOX_PENDING_NAME)
	" AND available_at > $2))",
	2, {OIDOID, TIMESTAMPTZOID}
};

/*
 * The backlog of scope $1 (and the shared 0): unpublished events by
 * topic and state; no payload, no key.
 */
static IdemStatement backlog = {
	"SELECT topic, s.state, pg_catalog.count(*), pg_catalog.min(created_at), pg_catalog.min(available_at)"
	"  FROM @extschema@.idem_outbox o,"
	"       LATERAL (SELECT CASE"
	"         WHEN o.state = " IDEM_SQL(IDEM_OUTBOX_DEAD_NAME) " THEN " IDEM_SQL(IDEM_OUTBOX_BACKLOG_DEAD)
	"         WHEN o.available_at <= pg_catalog.clock_timestamp() THEN " IDEM_SQL(IDEM_OUTBOX_BACKLOG_READY)
	"         WHEN o.claim_token IS NOT NULL THEN " IDEM_SQL(IDEM_OUTBOX_BACKLOG_LEASED)
	"         ELSE " IDEM_SQL(IDEM_OUTBOX_BACKLOG_DELAYED) " END AS state) s"
	" WHERE o.scope = ANY (ARRAY[$1, 0::pg_catalog.oid]) AND o.state IN ("
	IDEM_SQL(IDEM_OUTBOX_PENDING_NAME) ", " IDEM_SQL(IDEM_OUTBOX_DEAD_NAME) ")"
	" GROUP BY topic, s.state ORDER BY topic, s.state",
	1, {OIDOID}
};

/*
 * idem_outbox_wait(timeout): true as soon as an event of the caller's
 * scope is claimable, false when the timeout passes first.  A signal, a
 * cancel or postmaster death ends the wait at once.
 */
Datum
idem_outbox_wait(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Interval   *timeout;
	TimestampTz deadline;
	Datum		args[2];
	IdemWaiter	waiter;
	bool		found = false;

	idem_require_arg(fcinfo, 0, "timeout");
	timeout = idem_lease_argument(fcinfo, 0, "timeout", true, 0);
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("idem_outbox_wait must run in a READ COMMITTED transaction"),
				 errdetail("Under REPEATABLE READ or SERIALIZABLE the wait could never see new events."),
				 errhint("Call it outside an explicit transaction block.")));
	args[0] = ObjectIdGetDatum(idem_current_scope());
	deadline = GetCurrentTimestamp() + timeout->time;

	/* Prepared before the first probe: a commit after it is not missed. */
	idem_wake_prepare(&waiter, IDEM_OUTBOX_CHANNEL());
	SPI_connect();
	for (;;)
	{
		TimestampTz until = deadline;
		bool		isnull;

		CHECK_FOR_INTERRUPTS();
		/* Volatile: a fresh snapshot for this probe only. */
		args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
		idem_execute(&probe_work, namespace, args, NULL, false, 1);
		found = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1, &isnull));
		if (!found)
		{
			Datum		next = SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 2, &isnull);

			if (!isnull && DatumGetTimestampTz(next) < until)
				until = DatumGetTimestampTz(next);
		}
		SPI_freetuptable(SPI_tuptable);
		if (found || GetCurrentTimestamp() >= deadline)
			break;
		idem_wake_sleep(&waiter, until);
	}
	SPI_finish();
	idem_wake_done(&waiter);
	PG_RETURN_BOOL(found);
}

/*
 * idem_outbox_backlog(): the caller's unpublished events, counted by topic
 * and state (ready, leased, delayed, dead), for a client role's dashboard.
 */
Datum
idem_outbox_backlog(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		scope = ObjectIdGetDatum(idem_current_scope());
	uint64		i;

	InitMaterializedSRF(fcinfo, 0);
	SPI_connect();
	idem_execute(&backlog, namespace, &scope, NULL, true, 0);
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		out[5];
		bool		outnull[5];
		int			col;

		for (col = 0; col < 5; col++)
			out[col] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									 col + 1, &outnull[col]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, outnull);
	}
	SPI_finish();
	return (Datum) 0;
}

/* Columns of the idem_outbox view, in its order, and their types. */
#define VIEW_NCOLUMNS 16
static const char *const view_columns[VIEW_NCOLUMNS] = {
	"id", "topic", "message_key", "key_hash", "payload", "payload_bytes", "headers",
	"state", "attempts", "last_error", "available_at", "claim_token", "created_at",
	"published_at", "dead_at", "scope"
};
static const Oid view_types[VIEW_NCOLUMNS] = {
	INT8OID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID, BYTEAOID, JSONBOID, TEXTOID,
	INT4OID, TEXTOID, TIMESTAMPTZOID, UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, OIDOID
};

/* The view's columns 0.5.0's archive does not have (every archived row is published). */
#define VIEW_STATE		7
#define VIEW_DEAD_AT	14

/*
 * Apply a hand edit of idem_outbox to the table that holds the row:
 * new == NULL deletes.  Returns whether a row was changed.
 */
static bool
edit_row(const char *schema, const char *table, bool archive, HeapTuple old,
		 HeapTuple new, TupleDesc desc)
{
	Datum		values[VIEW_NCOLUMNS + 1];
	Oid			types[VIEW_NCOLUMNS + 1];
	char		nulls[VIEW_NCOLUMNS + 1];
	bool		isnull;
	StringInfoData sql;
	int			i;
	int			n = 0;
	int			rc;

	initStringInfo(&sql);
	if (new == NULL)
		appendStringInfo(&sql, "DELETE FROM %s.%s", schema, table);
	else
	{
		appendStringInfo(&sql, "UPDATE %s.%s SET ", schema, table);
		for (i = 0; i < VIEW_NCOLUMNS; i++)
		{
			if (archive && (i == VIEW_STATE || i == VIEW_DEAD_AT))
				continue;
			values[n] = heap_getattr(new, i + 1, desc, &isnull);
			nulls[n] = isnull ? 'n' : ' ';
			types[n] = view_types[i];
			n++;
			appendStringInfo(&sql, "%s%s = $%d", n == 1 ? "" : ", ", view_columns[i], n);
		}
	}
	values[n] = heap_getattr(old, 1, desc, &isnull);
	nulls[n] = ' ';
	types[n] = INT8OID;
	n++;
	appendStringInfo(&sql, " WHERE id OPERATOR(pg_catalog.=) $%d", n);
	rc = SPI_execute_with_args(sql.data, n, types, values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_with_args failed for \"%s\": %s",
			 sql.data, SPI_result_code_string(rc));
	return SPI_processed > 0;
}

/*
 * INSTEAD OF UPDATE OR DELETE trigger of the idem_outbox view: the row is
 * in the queue or in idem_outbox_claimed (ids are unique across both); on
 * 0.5.0's tables, in the queue or in the archive.
 */
Datum
idem_outbox_view_write(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const char *schema;
	HeapTuple	old;
	HeapTuple	new;
	TupleDesc	desc;
	bool		has_claimed;
	bool		changed;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_INSTEAD(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_outbox_view_write must fire INSTEAD OF UPDATE OR DELETE FOR EACH ROW"),
				 errdetail("It is the idem_outbox view's trigger.")));
	desc = RelationGetDescr(trigdata->tg_relation);
	if (desc->natts != VIEW_NCOLUMNS)
		elog(ERROR, "idem_outbox must have %d columns", VIEW_NCOLUMNS);
	old = trigdata->tg_trigtuple;
	new = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ? trigdata->tg_newtuple : NULL;
	schema = quote_identifier(get_namespace_name(idem_function_namespace(fcinfo)));

	SPI_connect();
	has_claimed = idem_outbox_has_claimed(idem_function_namespace(fcinfo));
	changed = edit_row(schema, "idem_outbox_queue", false, old, new, desc) ||
		(has_claimed ? edit_row(schema, "idem_outbox_claimed", false, old, new, desc) :
		 edit_row(schema, "idem_outbox_archive", true, old, new, desc));
	SPI_finish();
	if (!changed)
		return PointerGetDatum(NULL);
	return PointerGetDatum(new != NULL ? new : old);
}
