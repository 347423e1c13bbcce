/*-------------------------------------------------------------------------
 *
 * attempts_guards.c
 *	  Attempts: the state machine, and the triggers that hold it for every write
 *	  (see attempts.h for the state machine).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/errors.h"
#include "core/protocol.h"
#include "core/statements.h"
#include "attempts/attempts.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_attempts_transition_guard);
PG_FUNCTION_INFO_V1(idem_attempts_promotion_published);
PG_FUNCTION_INFO_V1(idem_attempt_targets_guard);

/* ----------------------------------------------------------------
 * The state machine
 * ----------------------------------------------------------------
 */

/* "failed(reaped_no_blob)", or the bare status. */
static const char *
state_name(AttemptState s)
{
	return s.reason && strcmp(s.status, "failed") == 0 ?
		psprintf("%s(%s)", s.status, s.reason) : s.status;
}

/* Is s the state a transition's end names (a NULL reason: any, or none)? */
static bool
state_matches(AttemptState s, const char *status, const char *reason)
{
	if (strcmp(s.status, status) != 0)
		return false;
	return reason == NULL || (s.reason != NULL && strcmp(s.reason, reason) == 0);
}

/* Can a failed attempt with this reason be reopened (a new generation)? */
bool
attempt_is_reopenable(const char *reason)
{
	AttemptState failed = {"failed", reason};
	int			i;

	for (i = 0; i < IDEM_ATTEMPT_NTRANSITIONS; i++)
	{
		const IdemAttemptTransition *t = &idem_attempt_transitions[i];

		if (t->next_generation && state_matches(failed, t->from_status, t->from_reason))
			return true;
	}
	return false;
}

/* Is from -> to one of the protocol's transitions? */
bool
attempt_legal_transition(AttemptState from, AttemptState to)
{
	int			i;

	for (i = 0; i < IDEM_ATTEMPT_NTRANSITIONS; i++)
	{
		const IdemAttemptTransition *t = &idem_attempt_transitions[i];

		if (state_matches(from, t->from_status, t->from_reason) &&
			state_matches(to, t->to_status, t->to_reason))
			return true;
	}
	return false;
}

/*
 * Can state s follow state from within one generation (by one or more
 * transitions that keep the generation)?  Then a CAS that expected from
 * and found s lost a race and is stale, not illegal.  The machine is
 * small and acyclic within a generation: a depth-first walk.
 */
static bool
reachable(AttemptState from, AttemptState s, int depth)
{
	int			i;

	if (depth > IDEM_ATTEMPT_NTRANSITIONS)
		return false;
	for (i = 0; i < IDEM_ATTEMPT_NTRANSITIONS; i++)
	{
		const IdemAttemptTransition *t = &idem_attempt_transitions[i];
		AttemptState next = {t->to_status, t->to_reason};

		if (t->next_generation || !state_matches(from, t->from_status, t->from_reason))
			continue;
		if (state_matches(s, t->to_status, t->to_reason) || reachable(next, s, depth + 1))
			return true;
	}
	return false;
}

bool
attempt_comes_after(AttemptState from, AttemptState s)
{
	return reachable(from, s, 0);
}

/* Raise IL005 for from -> to. */
void
attempt_report_illegal(const char *attempt, AttemptState from, AttemptState to)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
			 errmsg("illegal attempt transition"),
			 errdetail("Attempt %s cannot go from %s to %s.",
					   attempt, state_name(from), state_name(to)),
			 errhint("The legal transitions are: %s.", IDEM_ATTEMPT_TRANSITIONS_TEXT)));
}

static IdemStatement check_published = {
	"SELECT a.status IN ('promoted', 'superseded'), a.event_id,"
	"  o.id IS NOT NULL, o.payload ->> 'attempt_id' = a.attempt_id::text"
	" FROM @extschema@.idem_attempts a"
	" LEFT JOIN @extschema@.idem_outbox o ON o.id = a.event_id"
	" WHERE a.attempt_id = $1",
	1, {UUIDOID}
};

/* ----------------------------------------------------------------
 * Triggers
 * ----------------------------------------------------------------
 */

/* Refuse a trigger call that is not BEFORE/AFTER UPDATE FOR EACH ROW. */
static TriggerData *
update_trigger(FunctionCallInfo fcinfo, const char *name, bool before)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"%s\" was not called by trigger manager", name)));
	if ((before ? !TRIGGER_FIRED_BEFORE(trigdata->tg_event) :
		 !TRIGGER_FIRED_AFTER(trigdata->tg_event)) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"%s\" must be fired %s UPDATE FOR EACH ROW",
						name, before ? "BEFORE" : "AFTER")));
	return trigdata;
}

/* A column of a trigger tuple by name. */
static Datum
column(TriggerData *trigdata, HeapTuple tuple, const char *name, bool *isnull)
{
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	int			attnum = SPI_fnumber(desc, name);

	if (attnum <= 0)
		elog(ERROR, "column \"%s\" of \"%s\" is missing", name,
			 RelationGetRelationName(trigdata->tg_relation));
	return heap_getattr(tuple, attnum, desc, isnull);
}

/* A text column of a trigger tuple as a C string, or NULL. */
static char *
column_text(TriggerData *trigdata, HeapTuple tuple, const char *name)
{
	bool		isnull;
	Datum		d = column(trigdata, tuple, name, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * BEFORE UPDATE on idem_attempts: every write, the functions' or anyone
 * else's, follows the legal transitions; the generation grows by one on a
 * reopen and never otherwise; what identifies the attempt never changes.
 */
Datum
idem_attempts_transition_guard(PG_FUNCTION_ARGS)
{
	static const char *const identity[] = {
		"attempt_id", "kind", "target", "client_request_id", "created_by",
		"intent", "intent_hash", "created_at"
	};
	TriggerData *trigdata = update_trigger(fcinfo, "idem_attempts_transition_guard", true);
	HeapTuple	old = trigdata->tg_trigtuple;
	HeapTuple	new = trigdata->tg_newtuple;
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	AttemptState from;
	AttemptState to;
	int64		old_gen;
	int64		new_gen;
	bool		isnull;
	bool		reopen = false;
	int			i;

	for (i = 0; i < (int) lengthof(identity); i++)
	{
		int			attnum = SPI_fnumber(desc, identity[i]);
		Form_pg_attribute att = TupleDescAttr(desc, attnum - 1);
		bool		old_null;
		bool		new_null;
		Datum		a = heap_getattr(old, attnum, desc, &old_null);
		Datum		b = heap_getattr(new, attnum, desc, &new_null);

		if (old_null != new_null ||
			(!old_null && !datum_image_eq(a, b, att->attbyval, att->attlen)))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
					 errmsg("attempt column \"%s\" cannot change", identity[i]),
					 errdetail("An attempt's identity is fixed when it is opened."),
					 errtablecol(trigdata->tg_relation, attnum)));
	}

	from.status = column_text(trigdata, old, "status");
	from.reason = column_text(trigdata, old, "failure_reason");
	to.status = column_text(trigdata, new, "status");
	to.reason = column_text(trigdata, new, "failure_reason");
	old_gen = DatumGetInt64(column(trigdata, old, "generation", &isnull));
	new_gen = DatumGetInt64(column(trigdata, new, "generation", &isnull));
	if (from.status == NULL || to.status == NULL)
		return PointerGetDatum(new);	/* NOT NULL refuses it */

	/* A write that keeps the state (checked_at, swept_through) is no transition. */
	if (strcmp(from.status, to.status) != 0 ||
		(from.reason == NULL) != (to.reason == NULL) ||
		(from.reason && strcmp(from.reason, to.reason) != 0))
	{
		if (!attempt_legal_transition(from, to))
			attempt_report_illegal(attempt_uuid_text(column(trigdata, old, "attempt_id", &isnull)), from, to);
		reopen = strcmp(from.status, "failed") == 0;
	}

	if (reopen && new_gen != old_gen + 1)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
				 errmsg("illegal attempt generation change"),
				 errdetail("Attempt %s is reopened from generation " INT64_FORMAT ", so its generation must become " INT64_FORMAT ", not " INT64_FORMAT ".",
						   attempt_uuid_text(column(trigdata, old, "attempt_id", &isnull)),
						   old_gen, old_gen + 1, new_gen),
				 errhint("The generation grows by one on a reopen and never changes otherwise.")));
	if (!reopen && new_gen != old_gen)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
				 errmsg("illegal attempt generation change"),
				 errdetail("Attempt %s cannot change its generation from " INT64_FORMAT " to " INT64_FORMAT " outside a reopen.",
						   attempt_uuid_text(column(trigdata, old, "attempt_id", &isnull)),
						   old_gen, new_gen),
				 errhint("The generation grows by one on a reopen and never changes otherwise.")));
	return PointerGetDatum(new);
}

/*
 * Deferred constraint trigger, queued for every promotion: at commit the
 * attempt, if still promoted or superseded, must name an outbox event
 * that exists and names the attempt.  Reads the attempt's newest version,
 * so a promotion that was superseded later in the transaction is checked
 * with the event it kept.
 */
Datum
idem_attempts_promotion_published(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = update_trigger(fcinfo, "idem_attempts_promotion_published", false);
	Oid			namespace = idem_function_namespace(fcinfo);
	bool		isnull;
	Datum		attempt_id = column(trigdata, trigdata->tg_newtuple, "attempt_id", &isnull);
	bool		ok = true;
	char	   *why = NULL;
	MemoryContext outer = CurrentMemoryContext;

	SPI_connect();
	if (idem_execute(&check_published, namespace, &attempt_id, NULL, false, 1) == 1)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		promoted = DatumGetBool(SPI_getbinval(row, desc, 1, &isnull));
		bool		no_event;
		bool		found;
		bool		names;
		bool		names_null;

		SPI_getbinval(row, desc, 2, &no_event);
		found = DatumGetBool(SPI_getbinval(row, desc, 3, &isnull));
		names = DatumGetBool(SPI_getbinval(row, desc, 4, &names_null));
		if (promoted)
		{
			if (no_event)
				why = "it has no outbox event";
			else if (!found)
			{
				/* In the caller's memory: SPI_finish frees SPI's. */
				MemoryContext spi = MemoryContextSwitchTo(outer);

				why = psprintf("its outbox event %s does not exist",
							   SPI_getvalue(row, desc, 2));
				MemoryContextSwitchTo(spi);
			}
			else if (names_null || !names)
				why = "its outbox event does not name it in its payload's \"attempt_id\"";
			ok = why == NULL;
		}
	}
	SPI_finish();

	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_PROMOTION_UNPUBLISHED),
				 errmsg("attempt promotion committed without its outbox event"),
				 errdetail("Attempt %s is promoted, but %s.", attempt_uuid_text(attempt_id), why),
				 errhint("Promote with idem_attempt_promote(), which stages the event in the same statement."),
				 errtableconstraint(trigdata->tg_relation, "idem_attempts_promotion_published")));
	return PointerGetDatum(NULL);
}

/*
 * BEFORE UPDATE on idem_attempt_targets: the current pointer never moves
 * back to an older (created_at, attempt_id), and stays on its target.
 * (NOT NULL keeps it from going NULL.)
 */
Datum
idem_attempt_targets_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = update_trigger(fcinfo, "idem_attempt_targets_guard", true);
	HeapTuple	old = trigdata->tg_trigtuple;
	HeapTuple	new = trigdata->tg_newtuple;
	bool		isnull;
	char	   *old_kind = column_text(trigdata, old, "kind");
	char	   *new_kind = column_text(trigdata, new, "kind");
	char	   *old_target = column_text(trigdata, old, "target");
	char	   *new_target = column_text(trigdata, new, "target");
	Datum		old_id = column(trigdata, old, "current_attempt_id", &isnull);
	Datum		new_id;
	bool		new_null;
	TimestampTz old_at = DatumGetTimestampTz(column(trigdata, old, "current_created_at", &isnull));
	TimestampTz new_at;
	int			cmp;

	if (new_kind == NULL || new_target == NULL ||
		strcmp(old_kind, new_kind) != 0 || strcmp(old_target, new_target) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
				 errmsg("the current pointer cannot move to another target"),
				 errtable(trigdata->tg_relation)));
	new_id = column(trigdata, new, "current_attempt_id", &new_null);
	new_at = DatumGetTimestampTz(column(trigdata, new, "current_created_at", &isnull));
	if (new_null || isnull || DatumGetPointer(old_id) == NULL)
		return PointerGetDatum(new);	/* NOT NULL refuses it */

	cmp = new_at < old_at ? -1 : new_at > old_at ? 1 :
		memcmp(DatumGetUUIDP(new_id)->data, DatumGetUUIDP(old_id)->data, UUID_LEN);
	if (cmp < 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
				 errmsg("the current pointer cannot move back"),
				 errdetail("Target %s/%s points at attempt %s; attempt %s is older in (created_at, attempt_id) order.",
						   old_kind, old_target, attempt_uuid_text(old_id), attempt_uuid_text(new_id)),
				 errtable(trigdata->tg_relation)));
	return PointerGetDatum(new);
}
