/*-------------------------------------------------------------------------
 *
 * attempts_transitions.c
 *	  Attempts: the store, promote, fail and reopen transitions
 *	  (see attempts.h for the state machine).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/scope.h"
#include "core/statements.h"
#include "core/stats.h"
#include "attempts/attempts.h"
#include "outbox/outbox.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_attempt_store);
PG_FUNCTION_INFO_V1(idem_attempt_promote);
PG_FUNCTION_INFO_V1(idem_attempt_fail);
PG_FUNCTION_INFO_V1(idem_attempt_reopen);

/* ----------------------------------------------------------------
 * Statements
 * ----------------------------------------------------------------
 */

/*
 * Is the attempt the caller's: of its scope, or of the shared scope of
 * attempts opened before 0.5.0?  Another role's attempt id, however it
 * leaked, is answered as one that does not exist.
 */
static IdemStatement select_own = {
	"SELECT 1 FROM @extschema@.idem_attempts"
	" WHERE attempt_id = $1 AND scope = ANY (ARRAY[$2, 0::pg_catalog.oid])",
	2, {UUIDOID, OIDOID}
};

static IdemStatement select_state = {
	"SELECT generation, status, failure_reason, declared_digest"
	" FROM @extschema@.idem_attempts WHERE attempt_id = $1",
	1, {UUIDOID}
};

/* What the object key of a generation is derived from. */
static IdemStatement select_key_parts = {
	"SELECT k.key_prefix, a.target, a.object_name"
	" FROM @extschema@.idem_attempts a"
	" JOIN @extschema@.idem_attempt_kinds k ON k.kind = a.kind"
	" WHERE a.attempt_id = $1",
	1, {UUIDOID}
};

/*
 * The new generation rotates the key: same name, g{n+1}.  The key ($3) is
 * derived in C from the parts just read, which the CAS re-states.
 */
static IdemStatement reopen_attempt = {
	"UPDATE @extschema@.idem_attempts a"
	" SET status = 'pending', failure_reason = NULL,"
	"  generation = a.generation + 1, object_key = $3,"
	"  updated_at = clock_timestamp()"
	" WHERE a.attempt_id = $1 AND a.generation = $2"
	"  AND a.target = $4 AND a.object_name = $5"
	"  AND a.status = 'failed'"
	"  AND a.failure_reason IN ('reaped_no_blob', 'digest_mismatch')"
	" RETURNING a.generation, a.object_key",
	5, {UUIDOID, INT8OID, TEXTOID, TEXTOID, TEXTOID}
};

/* A declared digest must match; exports declare theirs here. */
static IdemStatement store_attempt = {
	"UPDATE @extschema@.idem_attempts"
	" SET status = 'stored', declared_digest = COALESCE(declared_digest, $3),"
	"  updated_at = clock_timestamp()"
	" WHERE attempt_id = $1 AND generation = $2 AND status = 'pending'"
	"  AND (declared_digest IS NULL OR declared_digest = $3)",
	3, {UUIDOID, INT8OID, BYTEAOID}
};

/*
 * The failure, answering its event's topic, payload and key; the event is
 * staged at once (idem_outbox_stage_event).  Events of one target share the outbox key
 * kind/target, so they are published in order.
 */
static IdemStatement fail_attempt = {
	"UPDATE @extschema@.idem_attempts"
	" SET status = 'failed', failure_reason = $3, updated_at = clock_timestamp()"
	" WHERE attempt_id = $1 AND generation = $2 AND status = ANY ($4)"
	" RETURNING kind || '.failed',"
	"  COALESCE($5, '{}'::jsonb) || jsonb_build_object("
	"   'attempt_id', attempt_id, 'kind', kind, 'target', target,"
	"   'generation', generation, 'status', 'failed',"
	"   'reason', failure_reason, 'object_key', object_key),"
	"  kind || '/' || target",
	5, {UUIDOID, INT8OID, TEXTOID, TEXTARRAYOID, JSONBOID}
};

/* Columns read by lock_stored. */
enum
{
	LOCK_KIND = 1,
	LOCK_MODE,
	LOCK_TARGET,
	LOCK_CREATED_AT,
	LOCK_DECLARED_DIGEST,
	LOCK_SCOPE
};

static IdemStatement lock_stored = {
	"SELECT a.kind, k.mode, a.target, a.created_at, a.declared_digest, a.scope"
	" FROM @extschema@.idem_attempts a"
	" JOIN @extschema@.idem_attempt_kinds k ON k.kind = a.kind"
	" WHERE a.attempt_id = $1 AND a.generation = $2 AND a.status = 'stored'"
	" FOR UPDATE OF a",
	2, {UUIDOID, INT8OID}
};

static IdemStatement lock_target = {
	"SELECT current_attempt_id, current_created_at"
	" FROM @extschema@.idem_attempt_targets WHERE kind = $1 AND target = $2 AND scope = $5"
	" FOR UPDATE",
	5, {TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, OIDOID}
};

static IdemStatement insert_target = {
	"INSERT INTO @extschema@.idem_attempt_targets"
	" (kind, target, current_attempt_id, current_created_at, scope)"
	" VALUES ($1, $2, $3, $4, $5) ON CONFLICT (kind, target, scope) DO NOTHING",
	5, {TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, OIDOID}
};

/* Forward only, in (created_at, attempt_id) order; the row is locked. */
static IdemStatement flip_target = {
	"UPDATE @extschema@.idem_attempt_targets"
	" SET current_attempt_id = $3, current_created_at = $4,"
	"  flipped_at = clock_timestamp()"
	" WHERE kind = $1 AND target = $2 AND scope = $5"
	"  AND (current_created_at, current_attempt_id) < ($4, $3)",
	5, {TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, OIDOID}
};

/* The promotion's event: topic, payload and key; the row is locked. */
static IdemStatement promotion_event = {
	"SELECT COALESCE($3, a.kind || '.promoted'),"
	"  COALESCE($4, '{}'::jsonb) || jsonb_build_object("
	"   'attempt_id', a.attempt_id, 'kind', a.kind, 'target', a.target,"
	"   'generation', a.generation, 'status', 'promoted',"
	"   'object_key', a.object_key,"
	"   'digest', encode(a.declared_digest, 'hex'),"
	"   'intent', a.intent, 'current_attempt_id', $5::uuid),"
	"  a.kind || '/' || a.target"
	" FROM @extschema@.idem_attempts a"
	" WHERE a.attempt_id = $1 AND a.generation = $2 AND a.status = 'stored'",
	5, {UUIDOID, INT8OID, TEXTOID, JSONBOID, UUIDOID}
};

/* The promotion, naming the event just staged ($3); the row is locked. */
static IdemStatement promote_attempt = {
	"UPDATE @extschema@.idem_attempts"
	" SET status = 'promoted', updated_at = clock_timestamp(), event_id = $3"
	" WHERE attempt_id = $1 AND generation = $2 AND status = 'stored'",
	3, {UUIDOID, INT8OID, INT8OID}
};

static IdemStatement supersede_attempt = {
	"UPDATE @extschema@.idem_attempts"
	" SET status = 'superseded', superseded_by = $2, updated_at = clock_timestamp()"
	" WHERE attempt_id = $1 AND status = 'promoted'",
	2, {UUIDOID, UUIDOID}
};

/*
 * Copy the event a statement answered (topic, payload, key in columns 1-3
 * of its only row) out of the statement's result, and stage it.
 */
static int64
stage_answered_event(Oid namespace)
{
	HeapTuple	row = SPI_tuptable->vals[0];
	TupleDesc	desc = SPI_tuptable->tupdesc;
	bool		isnull;
	Datum		topic = SPI_getbinval(row, desc, 1, &isnull);
	Datum		payload = SPI_getbinval(row, desc, 2, &isnull);
	Datum		key = SPI_getbinval(row, desc, 3, &isnull);

	return idem_outbox_stage_event(namespace, DatumGetTextPP(topic), DatumGetJsonbP(payload),
								   DatumGetTextPP(key), NULL, NULL);
}

/* The row as the last miss found it. */
typedef struct AttemptRow
{
	int64		generation;
	AttemptState state;
	bytea	   *declared_digest;	/* NULL if none */
} AttemptRow;

/* Raise as for an attempt that does not exist. */
static void
report_no_attempt(Datum attempt_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("attempt %s does not exist", attempt_uuid_text(attempt_id)),
			 errdetail("It was never opened, or it was pruned after its retention.")));
}

/*
 * Refuse another role's attempt as one that does not exist (an attempt's
 * scope never changes, so the check holds for the whole call).  The
 * caller is connected to SPI.
 */
static void
require_own(Oid namespace, Datum attempt_id)
{
	Datum		values[2];

	values[0] = attempt_id;
	values[1] = ObjectIdGetDatum(idem_current_scope());
	if (idem_execute(&select_own, namespace, values, NULL, false, 1) == 0)
		report_no_attempt(attempt_id);
}

/* Read an attempt's state, or raise when there is no such attempt. */
static void
read_state(Oid namespace, Datum attempt_id, AttemptRow *row)
{
	bool		isnull;
	Datum		d;

	if (idem_execute(&select_state, namespace, &attempt_id, NULL, false, 1) == 0)
		report_no_attempt(attempt_id);
	row->generation = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												  SPI_tuptable->tupdesc, 1, &isnull));
	row->state.status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	row->state.reason = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4, &isnull);
	row->declared_digest = isnull ? NULL : DatumGetByteaPP(d);
}

/*
 * A CAS from one of sources to `to` missed: stale (false) if the attempt
 * moved to another generation or past the expected state; IL005 if the
 * transition can never follow the state it is in.  A row still in a
 * source state is returned as true for the caller to explain.
 */
static bool
explain_miss(Oid namespace, Datum attempt_id, int64 generation,
			 const AttemptState *sources, int nsources, AttemptState to,
			 AttemptRow *row)
{
	int			i;

	read_state(namespace, attempt_id, row);
	if (row->generation != generation)
	{
		idem_count(IDEM_STAT_ATTEMPT_STALE, 1);
		return false;
	}
	for (i = 0; i < nsources; i++)
	{
		if (strcmp(row->state.status, sources[i].status) == 0 &&
			(sources[i].reason == NULL ||
			 (row->state.reason && strcmp(row->state.reason, sources[i].reason) == 0)))
			return true;
	}
	for (i = 0; i < nsources; i++)
	{
		if (attempt_comes_after(sources[i], row->state))
		{
			idem_count(IDEM_STAT_ATTEMPT_STALE, 1);
			return false;
		}
	}
	attempt_report_illegal(attempt_uuid_text(attempt_id), row->state, to);
	return false;				/* not reached */
}

/* Raise: the blob's digest is not the one the attempt declared. */
static void
report_digest_mismatch(Datum attempt_id, bytea *declared, bytea *given)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("digest does not match the attempt's declared digest"),
			 errdetail("Attempt %s declared %s; the blob's digest is %s.",
					   attempt_uuid_text(attempt_id),
					   DatumGetCString(DirectFunctionCall1(byteaout, PointerGetDatum(declared))),
					   DatumGetCString(DirectFunctionCall1(byteaout, PointerGetDatum(given)))),
			 errhint("Never promote a blob whose digest differs: record it with idem_attempt_fail(attempt_id, generation, 'digest_mismatch') while the attempt is pending.")));
}


/* ----------------------------------------------------------------
 * Transitions
 * ----------------------------------------------------------------
 */

/*
 * idem_attempt_store(attempt_id, generation, digest): the blob is at the
 * generation's key and its digest, read back from the store, is digest.
 * pending -> stored; an attempt opened without a digest (an export)
 * declares it here.  False when stale.
 */
Datum
idem_attempt_store(PG_FUNCTION_ARGS)
{
	static const AttemptState sources[] = {{"pending", NULL}};
	static const AttemptState to = {"stored", NULL};
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[3];
	AttemptRow	row;
	bool		done;

	idem_require_arg(fcinfo, 0, "attempt_id");
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int64GetDatum(attempt_generation_arg(fcinfo, 1));
	values[2] = PointerGetDatum(idem_digest_arg(fcinfo, 2, "digest"));

	SPI_connect();
	require_own(namespace, values[0]);
	done = idem_execute(&store_attempt, namespace, values, NULL, false, 0) == 1;
	if (!done &&
		explain_miss(namespace, values[0], DatumGetInt64(values[1]), sources, 1, to, &row))
		report_digest_mismatch(values[0], row.declared_digest,
							   DatumGetByteaPP(values[2]));
	SPI_finish();
	if (done)
		idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, 1);
	PG_RETURN_BOOL(done);
}

/*
 * Flip a replace-kind target's pointer to the attempt if it is the newer
 * (created_at, attempt_id).  Sets *current to the pointer's value after
 * the flip and *previous to the attempt it displaced (if any).
 */
static void
flip_pointer(Oid namespace, Datum kind, Datum target, Datum attempt_id,
			 Datum created_at, Datum scope, Datum *current, Datum *previous,
			 bool *has_previous)
{
	Datum		values[5] = {kind, target, attempt_id, created_at, scope};
	int			i;

	*has_previous = false;
	for (i = 0; i < OPEN_MAX_ATTEMPTS; i++)
	{
		bool		isnull;

		if (idem_execute(&lock_target, namespace, values, NULL, false, 1) == 0)
		{
			if (idem_execute(&insert_target, namespace, values, NULL, false, 0) == 1)
			{
				*current = attempt_id;
				return;
			}
			continue;			/* a concurrent promotion created it: lock theirs */
		}
		*previous = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (idem_execute(&flip_target, namespace, values, NULL, false, 0) == 1)
		{
			*has_previous = true;
			*current = attempt_id;
		}
		else
			*current = *previous;	/* a newer attempt holds it: keep it */
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not flip the current attempt: the target changed concurrently %d times",
					OPEN_MAX_ATTEMPTS),
			 errhint("The transaction might succeed if retried.")));
}

/*
 * idem_attempt_promote(attempt_id, generation, digest, event_topic,
 * event_payload): stored -> promoted in the caller's transaction, which
 * also inserts the caller's entity (append kinds).  A replace kind's
 * target pointer flips to the attempt unless a newer (created_at,
 * attempt_id) holds it, in which case the attempt is superseded at once;
 * the attempt the pointer leaves is superseded.  The outbox event
 * (topic default '<kind>.promoted', payload naming the attempt) is staged
 * in the same statement; the deferred trigger refuses a commit without it.
 * digest is the one the caller verified on the blob: never promote on
 * bare existence.  False when stale.
 */
Datum
idem_attempt_promote(PG_FUNCTION_ARGS)
{
	static const AttemptState sources[] = {{"stored", NULL}};
	static const AttemptState to = {"promoted", NULL};
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[5];
	char		nulls[5];
	bytea	   *digest;
	AttemptRow	row;
	HeapTuple	locked;
	TupleDesc	desc;
	bool		isnull;
	Datum		current;
	Datum		previous = (Datum) 0;
	bool		has_previous = false;
	int			transitions = 1;
	Datum		attempt_id;
	Datum		kind;
	Datum		target;

	idem_require_arg(fcinfo, 0, "attempt_id");
	attempt_id = PG_GETARG_DATUM(0);
	values[0] = attempt_id;
	values[1] = Int64GetDatum(attempt_generation_arg(fcinfo, 1));
	digest = idem_digest_arg(fcinfo, 2, "digest");
	memset(nulls, ' ', sizeof(nulls));
	if (PG_ARGISNULL(3))
		nulls[2] = 'n';
	else
	{
		char	   *topic = attempt_text_arg(fcinfo, 3, "event_topic");

		values[2] = CStringGetTextDatum(topic);
	}
	if (attempt_object_arg(fcinfo, 4, "event_payload", true) == NULL)
		nulls[3] = 'n';
	else
		values[3] = PG_GETARG_DATUM(4);

	SPI_connect();
	require_own(namespace, attempt_id);
	if (idem_execute(&lock_stored, namespace, values, NULL, false, 1) == 0)
	{
		explain_miss(namespace, attempt_id, DatumGetInt64(values[1]), sources, 1, to, &row);
		SPI_finish();			/* explain_miss raised unless stale */
		PG_RETURN_BOOL(false);
	}
	locked = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	if (!attempt_bytea_equal(DatumGetByteaPP(SPI_getbinval(locked, desc, LOCK_DECLARED_DIGEST, &isnull)),
					 digest))
		report_digest_mismatch(attempt_id,
							   DatumGetByteaPP(SPI_getbinval(locked, desc, LOCK_DECLARED_DIGEST, &isnull)),
							   digest);

	kind = SPI_getbinval(locked, desc, LOCK_KIND, &isnull);
	target = SPI_getbinval(locked, desc, LOCK_TARGET, &isnull);
	current = attempt_id;
	if (strcmp(SPI_getvalue(locked, desc, LOCK_MODE), "replace") == 0)
		flip_pointer(namespace, kind, target, attempt_id,
					 SPI_getbinval(locked, desc, LOCK_CREATED_AT, &isnull),
					 SPI_getbinval(locked, desc, LOCK_SCOPE, &isnull),
					 &current, &previous, &has_previous);

	values[4] = current;
	if (idem_execute(&promotion_event, namespace, values, nulls, false, 1) != 1)
		elog(ERROR, "attempt %s changed while locked", attempt_uuid_text(attempt_id));
	values[2] = Int64GetDatum(stage_answered_event(namespace));
	if (idem_execute(&promote_attempt, namespace, values, NULL, false, 0) != 1)
		elog(ERROR, "attempt %s changed while locked", attempt_uuid_text(attempt_id));

	if (DatumGetUUIDP(current) != DatumGetUUIDP(attempt_id) &&
		memcmp(DatumGetUUIDP(current)->data, DatumGetUUIDP(attempt_id)->data, UUID_LEN) != 0)
	{
		/* Lost to a newer attempt: promoted and superseded at once. */
		Datum		sup[2] = {attempt_id, current};

		if (idem_execute(&supersede_attempt, namespace, sup, NULL, false, 0) == 1)
			transitions++;
	}
	else if (has_previous)
	{
		Datum		sup[2] = {previous, attempt_id};

		/* The displaced attempt may have been pruned meanwhile. */
		if (idem_execute(&supersede_attempt, namespace, sup, NULL, false, 0) == 1)
			transitions++;
	}
	SPI_finish();
	idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, transitions);
	PG_RETURN_BOOL(true);
}

/*
 * idem_attempt_fail(attempt_id, generation, reason, event_payload):
 * pending -> failed(reaped_no_blob | digest_mismatch | target_gone) or
 * stored -> failed(target_gone), with the '<kind>.failed' outbox event in
 * the same statement.  False when stale.
 */
Datum
idem_attempt_fail(PG_FUNCTION_ARGS)
{
	static const AttemptState pending_only[] = {{"pending", NULL}};
	static const AttemptState pending_or_stored[] = {{"pending", NULL}, {"stored", NULL}};
	Oid			namespace = idem_function_namespace(fcinfo);
	char	   *reason = attempt_text_arg(fcinfo, 2, "reason");
	bool		gone = strcmp(reason, "target_gone") == 0;
	AttemptState to = {"failed", reason};
	Datum		values[5];
	char		nulls[5];
	Datum		sources[2];
	AttemptRow	row;
	bool		done;

	if (!gone && !attempt_is_reopenable(reason))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid failure reason \"%s\"", reason),
				 errdetail("The reason is reaped_no_blob, digest_mismatch or target_gone.")));
	idem_require_arg(fcinfo, 0, "attempt_id");
	memset(nulls, ' ', sizeof(nulls));
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int64GetDatum(attempt_generation_arg(fcinfo, 1));
	values[2] = CStringGetTextDatum(reason);
	sources[0] = CStringGetTextDatum("pending");
	sources[1] = CStringGetTextDatum("stored");
	values[3] = PointerGetDatum(construct_array(sources, gone ? 2 : 1, TEXTOID,
												-1, false, TYPALIGN_INT));
	if (attempt_object_arg(fcinfo, 3, "event_payload", true) == NULL)
		nulls[4] = 'n';
	else
		values[4] = PG_GETARG_DATUM(3);

	SPI_connect();
	require_own(namespace, values[0]);
	done = idem_execute(&fail_attempt, namespace, values, nulls, false, 0) == 1;
	if (done)
		stage_answered_event(namespace);
	else
		explain_miss(namespace, values[0], DatumGetInt64(values[1]),
					 gone ? pending_or_stored : pending_only, gone ? 2 : 1, to, &row);
	SPI_finish();
	if (done)
		idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, 1);
	PG_RETURN_BOOL(done);
}

/*
 * The reopen CAS: failed(reaped_no_blob | digest_mismatch) at generation
 * -> pending at generation + 1 under the generation's new key.  False when
 * it missed; else *new_generation and *new_key (SPI memory) are set.
 */
bool
attempt_reopen_cas(Oid namespace, Datum attempt_id, int64 generation,
				   Datum *new_generation, Datum *new_key)
{
	Datum		values[5];
	HeapTuple	row;
	TupleDesc	desc;
	char	   *prefix;
	char	   *target;
	char	   *name;
	bool		isnull;

	values[0] = attempt_id;
	values[1] = Int64GetDatum(generation);
	if (idem_execute(&select_key_parts, namespace, values, NULL, false, 1) != 1)
		return false;			/* explain_miss says it does not exist */
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	prefix = SPI_getvalue(row, desc, 1);
	target = SPI_getvalue(row, desc, 2);
	name = SPI_getvalue(row, desc, 3);
	values[2] = CStringGetTextDatum(attempt_key_of(prefix, target, attempt_id,
												   generation + 1, name));
	values[3] = CStringGetTextDatum(target);
	values[4] = CStringGetTextDatum(name);
	if (idem_execute(&reopen_attempt, namespace, values, NULL, false, 1) != 1)
		return false;
	*new_generation = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	*new_key = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	return true;
}

/*
 * idem_attempt_reopen(attempt_id, generation): failed(reaped_no_blob |
 * digest_mismatch) -> pending under generation + 1 and its new key; the
 * new generation, NULL when stale.  idem_attempt_open reopens by itself;
 * this is for callers that hold the attempt id.
 */
Datum
idem_attempt_reopen(PG_FUNCTION_ARGS)
{
	static const AttemptState sources[] = {{"failed", "reaped_no_blob"},
	{"failed", "digest_mismatch"}};
	static const AttemptState to = {"pending", NULL};
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	AttemptRow	row;
	int64		generation = 0;
	Datum		new_generation;
	Datum		new_key;
	bool		done;

	idem_require_arg(fcinfo, 0, "attempt_id");
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int64GetDatum(attempt_generation_arg(fcinfo, 1));

	SPI_connect();
	require_own(namespace, values[0]);
	done = attempt_reopen_cas(namespace, values[0], DatumGetInt64(values[1]),
							  &new_generation, &new_key);
	if (done)
		generation = DatumGetInt64(new_generation);
	else if (explain_miss(namespace, values[0], DatumGetInt64(values[1]), sources, 2, to, &row))
		elog(ERROR, "reopen of attempt %s missed a reopenable row", attempt_uuid_text(values[0]));
	SPI_finish();
	if (!done)
		PG_RETURN_NULL();
	idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, 1);
	PG_RETURN_INT64(generation);
}

