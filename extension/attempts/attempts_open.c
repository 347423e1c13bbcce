/*-------------------------------------------------------------------------
 *
 * attempts_open.c
 *	  Attempts: registered kinds and the replay decision table of open
 *	  (see attempts.h for the state machine).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/hashing.h"
#include "core/scope.h"
#include "core/statements.h"
#include "core/stats.h"
#include "attempts/attempts.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_attempt_register_kind);
PG_FUNCTION_INFO_V1(idem_attempt_open);
PG_FUNCTION_INFO_V1(idem_attempt_current);

/* ----------------------------------------------------------------
 * Statements
 * ----------------------------------------------------------------
 */

static IdemStatement select_kind = {
	"SELECT mode, key_prefix FROM @extschema@.idem_attempt_kinds WHERE kind = $1",
	1, {TEXTOID}
};

static IdemStatement insert_kind = {
	"INSERT INTO @extschema@.idem_attempt_kinds (kind, mode, key_prefix)"
	" VALUES ($1, $2, $3) ON CONFLICT (kind) DO NOTHING",
	3, {TEXTOID, TEXTOID, TEXTOID}
};

/* Columns read by select_request. */
enum
{
	REQ_ATTEMPT_ID = 1,
	REQ_CREATED_BY,
	REQ_INTENT_HASH,
	REQ_GENERATION,
	REQ_STATUS,
	REQ_FAILURE_REASON,
	REQ_OBJECT_KEY,
	REQ_DECLARED_DIGEST,
	REQ_CREATED_AT,
	REQ_SUPERSEDED_BY,
	REQ_SCOPE
};

/*
 * The caller's attempt of the request ($4: its scope), else one opened
 * before 0.5.0 (the shared scope); another role's is never read, so it
 * neither answers nor waits for anything of it.
 */
static IdemStatement select_request = {
	"SELECT attempt_id, created_by, intent_hash, generation, status,"
	" failure_reason, object_key, declared_digest, created_at, superseded_by, scope"
	" FROM @extschema@.idem_attempts"
	" WHERE kind = $1 AND target = $2 AND client_request_id = $3"
	"  AND scope = ANY (ARRAY[$4, 0::pg_catalog.oid])"
	" ORDER BY scope = $4 DESC LIMIT 1",
	4, {TEXTOID, TEXTOID, TEXTOID, OIDOID}
};

/*
 * The intent hash and the object key are computed in C and passed in: the
 * statement calls no function of the extension's schema, where another
 * role may have planted a better-matching overload.
 */
static IdemStatement insert_attempt = {
	"INSERT INTO @extschema@.idem_attempts"
	" (attempt_id, kind, target, client_request_id, created_by, intent,"
	"  intent_hash, declared_digest, object_name, object_key, scope)"
	" VALUES ($1, $2, $3, $4, $5, $6, $9, $7, $8, $10, $11)"
	" ON CONFLICT (kind, target, client_request_id, scope) DO NOTHING"
	" RETURNING created_at, object_key",
	11, {UUIDOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID, BYTEAOID, TEXTOID,
	BYTEAOID, TEXTOID, OIDOID}
};

/* A target's pointer in scope $3, else the shared one from before 0.5.0. */
static IdemStatement select_current = {
	"SELECT current_attempt_id FROM @extschema@.idem_attempt_targets"
	" WHERE kind = $1 AND target = $2 AND scope = ANY (ARRAY[$3, 0::pg_catalog.oid])"
	" ORDER BY scope = $3 DESC LIMIT 1",
	3, {TEXTOID, TEXTOID, OIDOID}
};

/* ----------------------------------------------------------------
 * Kinds
 * ----------------------------------------------------------------
 */

/*
 * idem_attempt_register_kind(kind, mode, key_prefix): true when registered
 * now, false when already registered the same way.  A kind's mode and
 * prefix never change: old generations' keys are derived from them.
 */
Datum
idem_attempt_register_kind(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	char	   *kind = attempt_text_arg(fcinfo, 0, "kind");
	char	   *mode = attempt_text_arg(fcinfo, 1, "mode");
	char	   *prefix = attempt_text_arg(fcinfo, 2, "key_prefix");
	Datum		values[3];
	bool		inserted;

	attempt_check_kind(kind);
	if (strcmp(mode, "append") != 0 && strcmp(mode, "replace") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid attempt mode \"%s\"", mode),
				 errdetail("The mode is append (the caller inserts an entity per promotion) or replace (a current pointer per target flips).")));
	attempt_check_path("key prefix", prefix, KEY_PREFIX_MAX_BYTES);

	values[0] = CStringGetTextDatum(kind);
	values[1] = CStringGetTextDatum(mode);
	values[2] = CStringGetTextDatum(prefix);
	SPI_connect();
	inserted = idem_execute(&insert_kind, namespace, values, NULL, false, 0) == 1;
	if (!inserted)
	{
		char	   *old_mode;
		char	   *old_prefix;

		idem_execute(&select_kind, namespace, values, NULL, false, 1);
		old_mode = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		old_prefix = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
		if (strcmp(old_mode, mode) != 0 || strcmp(old_prefix, prefix) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("attempt kind \"%s\" is already registered differently", kind),
					 errdetail("It is registered with mode %s and key prefix \"%s\".",
							   old_mode, old_prefix),
					 errhint("A kind's mode and prefix never change; register a new kind.")));
	}
	SPI_finish();
	PG_RETURN_BOOL(inserted);
}

/* ----------------------------------------------------------------
 * Open: the replay decision table
 * ----------------------------------------------------------------
 */

/* Columns of idem_attempt_decision. */
enum
{
	DEC_DECISION,
	DEC_ATTEMPT_ID,
	DEC_GENERATION,
	DEC_STATUS,
	DEC_FAILURE_REASON,
	DEC_NEXT_STEP,
	DEC_OBJECT_KEY,
	DEC_DECLARED_DIGEST,
	DEC_CURRENT_ATTEMPT_ID,
	DEC_CREATED_AT,
	DEC_NATTS
};

/* What open decided; values point into SPI memory until formed. */
typedef struct Decision
{
	Datum		values[DEC_NATTS];
	bool		nulls[DEC_NATTS];
} Decision;

static void
set_value(Decision *d, int column, Datum value)
{
	d->values[column] = value;
	d->nulls[column] = false;
}

/* Fill the decision's columns from the row select_request returned. */
static void
describe_row(Decision *d, HeapTuple tuple, TupleDesc desc)
{
	static const int map[][2] = {
		{DEC_ATTEMPT_ID, REQ_ATTEMPT_ID},
		{DEC_GENERATION, REQ_GENERATION},
		{DEC_STATUS, REQ_STATUS},
		{DEC_FAILURE_REASON, REQ_FAILURE_REASON},
		{DEC_OBJECT_KEY, REQ_OBJECT_KEY},
		{DEC_DECLARED_DIGEST, REQ_DECLARED_DIGEST},
		{DEC_CREATED_AT, REQ_CREATED_AT},
	};
	int			i;

	for (i = 0; i < (int) lengthof(map); i++)
		d->values[map[i][0]] = SPI_getbinval(tuple, desc, map[i][1],
											 &d->nulls[map[i][0]]);
}

/* The current attempt of a replace-kind target, or NULL. */
static bool
current_attempt(Oid namespace, Datum kind, Datum target, Datum scope, Datum *current)
{
	Datum		values[3] = {kind, target, scope};
	bool		isnull;

	if (idem_execute(&select_current, namespace, values, NULL, false, 1) == 0)
		return false;
	*current = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return !isnull;
}

/* What open was asked, checked, and the kind's registration. */
typedef struct OpenRequest
{
	Oid			namespace;
	char	   *target;
	char	   *created_by;
	char	   *name;			/* the object name, made safe */
	Jsonb	   *intent;
	bytea	   *hash;			/* the intent's */
	bytea	   *declared;		/* the declared digest, NULL if none */
	char	   *mode;			/* the kind's: append or replace */
	char	   *prefix;			/* the kind's key prefix */
	Datum		request[4];		/* select_request's arguments */
} OpenRequest;

/* The arguments, checked: everything open decides on but the stored rows. */
static void
open_arguments(FunctionCallInfo fcinfo, OpenRequest *req)
{
	char	   *kind = attempt_text_arg(fcinfo, 0, "kind");
	char	   *request_id;
	text	   *name;

	req->namespace = idem_function_namespace(fcinfo);
	req->target = attempt_text_arg(fcinfo, 1, "target");
	request_id = attempt_text_arg(fcinfo, 2, "client_request_id");
	req->created_by = attempt_text_arg(fcinfo, 3, "created_by");
	req->intent = attempt_object_arg(fcinfo, 4, "intent", false);
	req->hash = attempt_intent_hash(req->intent);
	attempt_check_kind(kind);
	attempt_check_path("target", req->target, TARGET_MAX_BYTES);
	if (strlen(request_id) > IDEM_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("client_request_id must be at most %d bytes", IDEM_MAX_KEY_BYTES),
				 errdetail("The client_request_id given is %d bytes long.",
						   (int) strlen(request_id))));
	idem_require_arg(fcinfo, 5, "object_name");
	name = PG_GETARG_TEXT_PP(5);
	req->name = attempt_safe_name(VARDATA_ANY(name), VARSIZE_ANY_EXHDR(name));
	req->declared = PG_ARGISNULL(6) ? NULL : idem_digest_arg(fcinfo, 6, "declared_digest");
	req->request[0] = CStringGetTextDatum(kind);
	req->request[1] = CStringGetTextDatum(req->target);
	req->request[2] = CStringGetTextDatum(request_id);
}

/* The kind's mode and key prefix; an unregistered kind is refused.  In SPI. */
static void
open_kind(OpenRequest *req)
{
	if (idem_execute(&select_kind, req->namespace, req->request, NULL, false, 1) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt kind \"%s\" is not registered",
						TextDatumGetCString(req->request[0])),
				 errhint("Register it with idem_attempt_register_kind(kind, mode, key_prefix).")));
	req->mode = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	req->prefix = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
}

/*
 * No attempt of the request yet: insert generation 1 and decide "new".
 * False when a concurrent open inserted it first: read theirs.
 */
static bool
open_new(OpenRequest *req, Decision *d)
{
	Datum		id = attempt_new_id();
	Datum		ins[11];
	char		ins_nulls[11];
	bool		isnull;

	memset(ins_nulls, ' ', sizeof(ins_nulls));
	ins[0] = id;
	ins[1] = req->request[0];
	ins[2] = req->request[1];
	ins[3] = req->request[2];
	ins[4] = CStringGetTextDatum(req->created_by);
	ins[5] = JsonbPGetDatum(req->intent);
	ins[6] = PointerGetDatum(req->declared);
	if (req->declared == NULL)
		ins_nulls[6] = 'n';
	ins[7] = CStringGetTextDatum(req->name);
	ins[8] = PointerGetDatum(req->hash);
	ins[9] = CStringGetTextDatum(attempt_key_of(req->prefix, req->target, id, 1, req->name));
	ins[10] = req->request[3];
	if (idem_execute(&insert_attempt, req->namespace, ins, ins_nulls, false, 1) != 1)
		return false;
	set_value(d, DEC_DECISION, CStringGetTextDatum("new"));
	set_value(d, DEC_ATTEMPT_ID, id);
	set_value(d, DEC_GENERATION, Int64GetDatum(1));
	set_value(d, DEC_STATUS, CStringGetTextDatum("pending"));
	set_value(d, DEC_NEXT_STEP, CStringGetTextDatum("upload"));
	set_value(d, DEC_OBJECT_KEY,
			  SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	if (req->declared != NULL)
		set_value(d, DEC_DECLARED_DIGEST, PointerGetDatum(req->declared));
	set_value(d, DEC_CREATED_AT,
			  SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	idem_count(IDEM_STAT_ATTEMPT_OPENED, 1);
	return true;
}

/* Does the stored attempt answer another intent, or another declared digest? */
static bool
open_mismatch(OpenRequest *req, HeapTuple row, TupleDesc desc)
{
	bool		isnull;
	bool		declared_null;
	Datum		stored_hash = SPI_getbinval(row, desc, REQ_INTENT_HASH, &isnull);
	Datum		stored_declared = SPI_getbinval(row, desc, REQ_DECLARED_DIGEST, &declared_null);

	if (!attempt_bytea_equal(DatumGetByteaPP(stored_hash), req->hash))
		return true;
	return req->declared != NULL &&
		(declared_null || !attempt_bytea_equal(DatumGetByteaPP(stored_declared), req->declared));
}

/*
 * A superseded attempt: the target's current attempt, for a replace kind
 * from the target's pointer, else the attempt that superseded it.
 */
static void
open_superseded(OpenRequest *req, HeapTuple row, TupleDesc desc, Decision *d)
{
	Datum		current;
	bool		isnull;

	set_value(d, DEC_DECISION, CStringGetTextDatum("superseded"));
	if (strcmp(req->mode, "replace") == 0 &&
		current_attempt(req->namespace, req->request[0], req->request[1],
						SPI_getbinval(row, desc, REQ_SCOPE, &isnull), &current))
		set_value(d, DEC_CURRENT_ATTEMPT_ID, current);
	else
		d->values[DEC_CURRENT_ATTEMPT_ID] =
			SPI_getbinval(row, desc, REQ_SUPERSEDED_BY, &d->nulls[DEC_CURRENT_ATTEMPT_ID]);
}

/*
 * A failed attempt: "gone" when its reason is final, else reopened as the
 * next generation.  False when another open reopened it first: read again.
 */
static bool
open_failed(OpenRequest *req, HeapTuple row, TupleDesc desc, Decision *d)
{
	Datum		generation;
	Datum		key;

	if (!attempt_is_reopenable(SPI_getvalue(row, desc, REQ_FAILURE_REASON)))
	{
		set_value(d, DEC_DECISION, CStringGetTextDatum("gone"));
		return true;
	}
	if (!attempt_reopen_cas(req->namespace, d->values[DEC_ATTEMPT_ID],
							DatumGetInt64(d->values[DEC_GENERATION]), &generation, &key))
		return false;
	set_value(d, DEC_DECISION, CStringGetTextDatum("reopened"));
	set_value(d, DEC_GENERATION, generation);
	set_value(d, DEC_OBJECT_KEY, key);
	set_value(d, DEC_STATUS, CStringGetTextDatum("pending"));
	d->nulls[DEC_FAILURE_REASON] = true;
	set_value(d, DEC_NEXT_STEP, CStringGetTextDatum("upload"));
	idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, 1);
	return true;
}

/*
 * The decision on the request's stored attempt, the table's rows after
 * "no row": another principal, another intent, then by status.  False
 * when it must be read again.
 */
static bool
open_existing(OpenRequest *req, HeapTuple row, TupleDesc desc, Decision *d)
{
	char	   *status;

	/*
	 * Another principal of the caller's own service (created_by is the
	 * caller's label, not a boundary between roles: the scope is): say
	 * nothing about it.
	 */
	if (strcmp(SPI_getvalue(row, desc, REQ_CREATED_BY), req->created_by) != 0)
	{
		set_value(d, DEC_DECISION, CStringGetTextDatum("forbidden"));
		return true;
	}
	describe_row(d, row, desc);
	if (open_mismatch(req, row, desc))
	{
		set_value(d, DEC_DECISION, CStringGetTextDatum("mismatch"));
		return true;
	}
	status = SPI_getvalue(row, desc, REQ_STATUS);
	if (strcmp(status, "pending") == 0 || strcmp(status, "stored") == 0)
	{
		set_value(d, DEC_DECISION, CStringGetTextDatum("resume"));
		set_value(d, DEC_NEXT_STEP,
				  CStringGetTextDatum(status[0] == 'p' ? "upload" : "promote"));
		return true;
	}
	if (strcmp(status, "promoted") == 0)
	{
		set_value(d, DEC_DECISION, CStringGetTextDatum("promoted"));
		set_value(d, DEC_CURRENT_ATTEMPT_ID, d->values[DEC_ATTEMPT_ID]);
		return true;
	}
	if (strcmp(status, "superseded") == 0)
	{
		open_superseded(req, row, desc, d);
		return true;
	}
	return open_failed(req, row, desc, d);
}

/*
 * idem_attempt_open(kind, target, client_request_id, created_by, intent,
 * object_name, declared_digest): the replay decision table.
 *
 *	  (another role's attempt is never read: each scope has its own)
 *	  no row (or pruned)                         new: pending, generation 1
 *	  another created_by                         forbidden, nothing revealed
 *	  another intent (or declared digest)        mismatch, nothing written
 *	  pending / stored                           resume, with the next step
 *	  promoted / superseded                      promoted / superseded, with
 *												 the current attempt
 *	  failed(reaped_no_blob | digest_mismatch)   reopened: generation + 1
 *	  failed(target_gone)                        gone
 *
 * A row that changed between the read and the write (a concurrent open's
 * insert or reopen) is read again, up to OPEN_MAX_ATTEMPTS times.
 */
Datum
idem_attempt_open(PG_FUNCTION_ARGS)
{
	OpenRequest req;
	MemoryContext outer = CurrentMemoryContext;
	Decision	d;
	TupleDesc	tupdesc;
	HeapTuple	result;
	int			attempt;
	bool		decided = false;

	open_arguments(fcinfo, &req);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	SPI_connect();
	open_kind(&req);
	req.request[3] = ObjectIdGetDatum(idem_current_scope());
	for (attempt = 0; attempt < OPEN_MAX_ATTEMPTS && !decided; attempt++)
	{
		CHECK_FOR_INTERRUPTS();
		memset(&d, 0, sizeof(d));
		memset(d.nulls, true, sizeof(d.nulls));
		if (idem_execute(&select_request, req.namespace, req.request, NULL, false, 1) == 0)
			decided = open_new(&req, &d);
		else
			decided = open_existing(&req, SPI_tuptable->vals[0], SPI_tuptable->tupdesc, &d);
	}
	if (!decided)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not open attempt: it changed concurrently %d times",
						OPEN_MAX_ATTEMPTS),
				 errhint("The transaction might succeed if retried.")));

	/* heap_form_tuple copies every value, so the SPI memory may go. */
	{
		MemoryContext old = MemoryContextSwitchTo(outer);

		result = heap_form_tuple(BlessTupleDesc(tupdesc), d.values, d.nulls);
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	PG_RETURN_DATUM(HeapTupleGetDatum(result));
}


/* idem_attempt_current(kind, target): what a replace-kind target shows now. */
Datum
idem_attempt_current(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		current;
	bool		found;

	idem_require_arg(fcinfo, 0, "kind");
	idem_require_arg(fcinfo, 1, "target");
	SPI_connect();
	found = current_attempt(namespace, PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
							ObjectIdGetDatum(idem_current_scope()), &current);
	if (found)
		current = SPI_datumTransfer(current, false, UUID_LEN);
	SPI_finish();
	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(current);
}

