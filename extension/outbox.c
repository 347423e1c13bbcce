/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The transactional outbox: its settings and staging.  Claims, acks,
 *	  nacks and prune are in outbox_claim.c; the wait, the backlog and the
 *	  idem_outbox view's writes in outbox_wait.c.
 *
 * An event is staged by a plain INSERT in the caller's transaction, so it
 * exists exactly when the domain change commits, and staging costs one
 * row and nothing else (no NOTIFY, no lock held to commit).  A batch of
 * events is one INSERT over arrays: one executor, its CHECK expressions
 * prepared once for the whole batch.  The stage registers the outbox's
 * wake-up channel: idle drainers (idem_outbox_wait) wake when the
 * stager's transaction commits, never before.
 *
 * Every event carries the stager's scope (scope.c): drainers claim only
 * their own scope's events (and those staged before 0.3.0, scope '').
 *
 *-------------------------------------------------------------------------
 */
#include "messages.h"

#include "access/xact.h"
#include "access/tupdesc.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idem_outbox_stage_json);
PG_FUNCTION_INFO_V1(idem_outbox_stage_bytes);
PG_FUNCTION_INFO_V1(idem_outbox_stage_batch);

#define BACKOFF_MAX_STEPS		32

int			idem_outbox_max_attempts = 6;
bool		idem_outbox_archive = true;
int			idem_inbox_backoff_base_ms = 1000;
int			idem_inbox_backoff_max_ms = 60 * 1000;
static char *outbox_backoff_string = NULL;

/* The parsed idem.outbox_backoff schedule (a GUC "extra"). */
typedef struct BackoffSchedule
{
	int			nsteps;
	int			ms[BACKOFF_MAX_STEPS];
} BackoffSchedule;

static BackoffSchedule *outbox_backoff = NULL;

/* Parse "5s, 30s, 2min" into a schedule; false (with a detail) if malformed. */
static bool
parse_backoff(const char *value, BackoffSchedule *schedule)
{
	char	   *copy = pstrdup(value);
	char	   *item;
	char	   *save = NULL;

	schedule->nsteps = 0;
	for (item = strtok_r(copy, ",", &save); item != NULL;
		 item = strtok_r(NULL, ",", &save))
	{
		const char *hint = NULL;
		int			ms;

		while (*item == ' ')
			item++;
		if (schedule->nsteps == BACKOFF_MAX_STEPS)
		{
			GUC_check_errdetail("At most %d steps are allowed.", BACKOFF_MAX_STEPS);
			return false;
		}
		if (!parse_int(item, &ms, GUC_UNIT_MS, &hint) || ms < 0)
		{
			GUC_check_errdetail("\"%s\" is not a duration such as 5s, 2min or 1h.", item);
			return false;
		}
		schedule->ms[schedule->nsteps++] = ms;
	}
	if (schedule->nsteps == 0)
	{
		GUC_check_errdetail("The schedule needs at least one duration.");
		return false;
	}
	return true;
}

/* Check hook of idem.outbox_backoff: parse once, keep the result as extra. */
static bool
check_outbox_backoff(char **newval, void **extra, GucSource source)
{
	BackoffSchedule parsed;
	BackoffSchedule *result;

	if (!parse_backoff(*newval, &parsed))
		return false;
	result = malloc(sizeof(BackoffSchedule));
	if (result == NULL)
		return false;
	*result = parsed;
	*extra = result;
	return true;
}

/* Assign hook of idem.outbox_backoff. */
static void
assign_outbox_backoff(const char *newval, void *extra)
{
	outbox_backoff = (BackoffSchedule *) extra;
}

/* Register the idem.* settings of the inbox and the outbox; from _PG_init. */
void
idem_define_message_settings(void)
{
	/* Superuser only: they decide the fate of every drainer's events. */
	DefineCustomIntVariable("idem.outbox_max_attempts",
							"Publish attempts of an outbox event before it is dead (1 .. 1000).",
							"Attempts are counted when a drainer claims the event.",
							&idem_outbox_max_attempts,
							6, 1, 1000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomStringVariable("idem.outbox_backoff",
							   "Delays before retrying a nacked outbox event, one per attempt.",
							   "A comma-separated list of durations; the last one repeats.",
							   &outbox_backoff_string,
							   "5s, 30s, 2min, 5min, 15min, 30min",
							   PGC_SUSET, 0,
							   check_outbox_backoff, assign_outbox_backoff, NULL);

	DefineCustomBoolVariable("idem.outbox_archive",
							 "Whether an ack keeps published outbox events in idem_outbox_archive.",
							 "Off deletes them at the ack (no retention: idem.outbox_retention does not apply).",
							 &idem_outbox_archive,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idem.inbox_backoff_base",
							"Retry delay after an inbox message's first failure (1ms .. 1 day).",
							"The delay doubles with every failure, up to idem.inbox_backoff_max.",
							&idem_inbox_backoff_base_ms,
							1000, 1, 24 * 60 * 60 * 1000,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.inbox_backoff_max",
							"Longest retry delay of an inbox message (1ms .. 1 day).",
							NULL,
							&idem_inbox_backoff_max_ms,
							60 * 1000, 1, 24 * 60 * 60 * 1000,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* The backoff schedule as an interval[] for the nack statement. */
ArrayType *
idem_outbox_backoff_array(void)
{
	Datum		steps[BACKOFF_MAX_STEPS];
	int			i;

	if (outbox_backoff == NULL)
		elog(ERROR, "idem.outbox_backoff is not set");
	for (i = 0; i < outbox_backoff->nsteps; i++)
		steps[i] = IntervalPGetDatum(idem_ms_interval(outbox_backoff->ms[i]));
	return construct_array(steps, outbox_backoff->nsteps, INTERVALOID,
						   sizeof(Interval), false, TYPALIGN_DOUBLE);
}

/* Bounds of the arguments: they keep one call's work bounded. */
#define OUTBOX_MAX_BATCH		10000
#define OUTBOX_MAX_TOPIC_BYTES	255

/* The columns stage_event writes, in the order of its parameters. */
#define STAGE_NARGS 8

static IdemStatement stage_event = {
	"INSERT INTO @extschema@.idem_outbox_queue"
	" (topic, message_key, key_hash, payload, payload_bytes, headers, available_at, scope)"
	" VALUES ($1, $2, $3, $4, $5, $6, pg_catalog.clock_timestamp() + $7, $8)"
	" RETURNING id",
	STAGE_NARGS, {TEXTOID, TEXTOID, BYTEAOID, JSONBOID, BYTEAOID, JSONBOID, INTERVALOID, TEXTOID}
};

/*
 * A batch: one INSERT over the arrays, in array order (the ORDER BY sits
 * below the projection that draws the ids, so ids follow the arrays and
 * per-key order is the order of the batch).  A NULL array stands for all
 * NULLs (ROWS FROM pads).
 */
static IdemStatement stage_batch = {
	"INSERT INTO @extschema@.idem_outbox_queue"
	" (topic, message_key, key_hash, payload, headers, available_at, scope)"
	" SELECT $1, u.k, u.h, u.p, u.hd, pg_catalog.clock_timestamp() + $6, $7"
	"   FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4),"
	"                   pg_catalog.unnest($5)) WITH ORDINALITY AS u(p, k, h, hd, n)"
	"  ORDER BY u.n"
	" RETURNING id",
	7, {TEXTOID, JSONBARRAYOID, TEXTARRAYOID, BYTEAARRAYOID, JSONBARRAYOID, INTERVALOID, TEXTOID}
};


/* Refuse a batch size outside 1 .. max. */
int32
idem_outbox_batch_arg(FunctionCallInfo fcinfo, int argno, int32 max)
{
	int32		batch;

	idem_require_arg(fcinfo, argno, "batch");
	batch = PG_GETARG_INT32(argno);
	if (batch < 1 || batch > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", max),
				 errdetail("The batch given is %d.", batch)));
	return batch;
}

/* Refuse a negative interval, by name. */
static Interval *
check_non_negative(Interval *span, const char *name)
{
	Interval	zero = {0};

	if (DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(span),
										  IntervalPGetDatum(&zero))) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be negative", name),
				 errdetail("The %s given is %s.", name,
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(span))))));
	return span;
}

/* A non-NULL interval argument that must not be negative. */
Interval *
idem_outbox_interval_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	idem_require_arg(fcinfo, argno, name);
	return check_non_negative(PG_GETARG_INTERVAL_P(argno), name);
}

/* Refuse an empty or over-long topic. */
static void
check_topic(text *topic)
{
	if (VARSIZE_ANY_EXHDR(topic) == 0 ||
		VARSIZE_ANY_EXHDR(topic) > OUTBOX_MAX_TOPIC_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topic must be between 1 and %d bytes", OUTBOX_MAX_TOPIC_BYTES),
				 errdetail("The topic given is %d bytes long.",
						   (int) VARSIZE_ANY_EXHDR(topic))));
}

/* A message key's SHA-256 as bytea; an empty key is refused. */
static bytea *
key_hash(text *key)
{
	bytea	   *hash;

	if (VARSIZE_ANY_EXHDR(key) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key must not be empty"),
				 errhint("Pass NULL for an event that needs no per-key order.")));
	hash = palloc(VARHDRSZ + IDEM_DIGEST_LEN);
	SET_VARSIZE(hash, VARHDRSZ + IDEM_DIGEST_LEN);
	idem_sha256((const uint8 *) VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key),
				(uint8 *) VARDATA(hash));
	return hash;
}

/* Refuse headers that are not a JSON object. */
static void
check_headers(Jsonb *headers)
{
	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object"),
				 errdetail("Headers are stored as {\"name\": value, ...}.")));
}

/*
 * Insert one checked event with stage_event; json_payload tells which
 * payload column payload goes to.  Wakes drainers at commit.
 */
static int64
insert_event(Oid namespace, text *topic, Datum payload, bool json_payload,
			 text *key, Jsonb *headers, Interval *delay)
{
	Datum		values[STAGE_NARGS];
	char		nulls[STAGE_NARGS];
	Interval	zero = {0};
	int64		id;
	bool		isnull;

	memset(nulls, ' ', sizeof(nulls));
	check_topic(topic);
	values[0] = PointerGetDatum(topic);
	if (key == NULL)
	{
		values[1] = values[2] = (Datum) 0;
		nulls[1] = nulls[2] = 'n';
	}
	else
	{
		values[2] = PointerGetDatum(key_hash(key));
		values[1] = PointerGetDatum(key);
	}
	values[3] = values[4] = (Datum) 0;
	nulls[3] = nulls[4] = 'n';
	values[json_payload ? 3 : 4] = payload;
	nulls[json_payload ? 3 : 4] = ' ';
	if (headers == NULL)
	{
		values[5] = (Datum) 0;
		nulls[5] = 'n';
	}
	else
	{
		check_headers(headers);
		values[5] = PointerGetDatum(headers);
	}
	values[6] = IntervalPGetDatum(delay == NULL ? &zero : check_non_negative(delay, "delay"));
	values[7] = PointerGetDatum(idem_current_scope());

	SPI_connect();
	idem_execute(&stage_event, namespace, values, nulls, false, 1);
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
									 1, &isnull));
	SPI_finish();
	idem_count(IDEM_STAT_OUTBOX_STAGED, 1);
	idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	return id;
}

/* See messages.h. */
int64
idem_outbox_stage_event(Oid namespace, text *topic, Jsonb *payload, text *key,
						Jsonb *headers, Interval *delay)
{
	if (topic == NULL || payload == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", topic == NULL ? "topic" : "payload"),
				 errdetail("An outbox event needs a topic and a payload.")));
	return insert_event(namespace, topic, JsonbPGetDatum(payload), true, key,
						headers, delay);
}

/*
 * Shared body of the SQL stage functions (topic, payload, key, headers,
 * delay): validate, insert in the caller's transaction, return the id.
 */
static Datum
stage_common(FunctionCallInfo fcinfo, bool json_payload)
{
	text	   *topic;
	text	   *key;
	Jsonb	   *headers;
	Interval   *delay;

	idem_require_arg(fcinfo, 0, "topic");
	topic = PG_GETARG_TEXT_PP(0);
	check_topic(topic);
	idem_require_arg(fcinfo, 1, "payload");
	key = PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2);
	headers = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	delay = idem_outbox_interval_arg(fcinfo, 4, "delay");
	PG_RETURN_INT64(insert_event(idem_function_namespace(fcinfo), topic,
								 PG_GETARG_DATUM(1), json_payload,
								 key, headers, delay));
}

/* idem_outbox_stage(topic, payload jsonb, key, headers, delay): an event with a JSON payload. */
Datum
idem_outbox_stage_json(PG_FUNCTION_ARGS)
{
	return stage_common(fcinfo, true);
}

/*
 * idem_outbox_stage_bytes(topic, payload bytea, key, headers, delay), and
 * the deprecated bytea overload of idem_outbox_stage: a binary payload.
 */
Datum
idem_outbox_stage_bytes(PG_FUNCTION_ARGS)
{
	return stage_common(fcinfo, false);
}

/* A one-dimensional array argument's elements (NULL argument: n = -1). */
static void
array_arg(FunctionCallInfo fcinfo, int argno, const char *name, Oid elemtype,
		  int16 elemlen, bool elembyval, char elemalign,
		  Datum **elems, bool **nulls, int *n)
{
	ArrayType  *array;

	*n = -1;
	if (PG_ARGISNULL(argno))
		return;
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", name),
				 errdetail("The array given has %d dimensions.", ARR_NDIM(array))));
	deconstruct_array(array, elemtype, elemlen, elembyval, elemalign, elems, nulls, n);
}

/* Refuse a per-event array whose length differs from the payloads'. */
static void
check_length(const char *name, int n, int npayloads)
{
	if (n >= 0 && n != npayloads)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must have one element per payload", name),
				 errdetail("There are %d payloads and %d %s.", npayloads, n, name),
				 errhint("Pass NULL for no %s at all, or a NULL element for one event.", name)));
}

/* An array of n Datums (with nulls) of one type, for the batch INSERT. */
static Datum
make_array(Datum *elems, bool *nulls, int n, Oid elemtype, int16 elemlen,
		   bool elembyval, char elemalign)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};

	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs, elemtype,
											  elemlen, elembyval, elemalign));
}

/*
 * idem_outbox_stage_batch(topic, payloads jsonb[], keys text[], headers
 * jsonb[], delay): one event per payload, one INSERT; returns the ids in
 * the payloads' order.
 */
Datum
idem_outbox_stage_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum	   *payloads,
			   *keys = NULL,
			   *headers = NULL,
			   *hashes = NULL;
	bool	   *payload_nulls,
			   *key_nulls = NULL,
			   *header_nulls = NULL;
	int			npayloads,
				nkeys,
				nheaders,
				i;
	Datum		values[7];
	char		nulls[7];
	text	   *topic;
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	MemoryContext old;
	uint64		row;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem_outbox_stage_batch must be called where a set is accepted"),
				 errdetail("Call it as SELECT * FROM idem_outbox_stage_batch(...).")));

	memset(nulls, ' ', sizeof(nulls));
	idem_require_arg(fcinfo, 0, "topic");
	topic = PG_GETARG_TEXT_PP(0);
	check_topic(topic);
	idem_require_arg(fcinfo, 1, "payloads");
	array_arg(fcinfo, 1, "payloads", JSONBOID, -1, false, TYPALIGN_INT,
			  &payloads, &payload_nulls, &npayloads);
	if (npayloads > OUTBOX_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("at most %d events can be staged in one batch", OUTBOX_MAX_BATCH),
				 errdetail("The batch has %d payloads.", npayloads),
				 errhint("Split it into several calls in the same transaction.")));
	for (i = 0; i < npayloads; i++)
		if (payload_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("payloads must not contain nulls"),
					 errdetail("Payload %d is NULL.", i + 1)));
	array_arg(fcinfo, 2, "keys", TEXTOID, -1, false, TYPALIGN_INT,
			  &keys, &key_nulls, &nkeys);
	check_length("keys", nkeys, npayloads);
	array_arg(fcinfo, 3, "headers", JSONBOID, -1, false, TYPALIGN_INT,
			  &headers, &header_nulls, &nheaders);
	check_length("headers", nheaders, npayloads);

	values[0] = PointerGetDatum(topic);
	values[1] = PG_GETARG_DATUM(1);
	if (nkeys < 0)
	{
		values[2] = values[3] = (Datum) 0;
		nulls[2] = nulls[3] = 'n';
	}
	else
	{
		hashes = palloc(sizeof(Datum) * Max(nkeys, 1));
		for (i = 0; i < nkeys; i++)
			if (!key_nulls[i])
				hashes[i] = PointerGetDatum(key_hash(DatumGetTextPP(keys[i])));
		values[2] = PG_GETARG_DATUM(2);
		values[3] = make_array(hashes, key_nulls, nkeys, BYTEAOID, -1, false, TYPALIGN_INT);
	}
	if (nheaders < 0)
	{
		values[4] = (Datum) 0;
		nulls[4] = 'n';
	}
	else
	{
		for (i = 0; i < nheaders; i++)
			if (!header_nulls[i])
				check_headers(DatumGetJsonbP(headers[i]));
		values[4] = PG_GETARG_DATUM(3);
	}
	values[5] = IntervalPGetDatum(idem_outbox_interval_arg(fcinfo, 4, "delay"));
	values[6] = PointerGetDatum(idem_current_scope());

	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	tupdesc = CreateTemplateTupleDesc(1);
	TupleDescInitEntry(tupdesc, (AttrNumber) 1, "id", INT8OID, -1, 0);
	store = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(old);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = tupdesc;

	if (npayloads == 0)
		return (Datum) 0;

	SPI_connect();
	idem_execute(&stage_batch, namespace, values, nulls, false, 0);
	for (row = 0; row < SPI_processed; row++)
	{
		bool		isnull;
		Datum		id = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
									   1, &isnull);

		tuplestore_putvalues(store, tupdesc, &id, &isnull);
	}
	SPI_finish();
	idem_count(IDEM_STAT_OUTBOX_STAGED, npayloads);
	idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	return (Datum) 0;
}

/* Append a JSON string (escaped) for a text Datum to buf. */
static void
append_json_text(StringInfo buf, Datum value)
{
	escape_json(buf, TextDatumGetCString(value));
}

/*
 * Stage an inbox message's dead-letter event (through
 * idem_outbox_stage_event); the caller is in SPI.
 */
void
idem_outbox_stage_dead_letter(Oid namespace, Datum consumer, Datum message_id,
							  int32 error_count, Datum last_error, bool last_error_null)
{
	StringInfoData json;
	Jsonb	   *payload;

	initStringInfo(&json);
	appendStringInfoString(&json, "{\"consumer\": ");
	append_json_text(&json, consumer);
	appendStringInfoString(&json, ", \"message_id\": ");
	append_json_text(&json, message_id);
	appendStringInfo(&json, ", \"error_count\": %d, \"last_error\": ", error_count);
	if (last_error_null)
		appendStringInfoString(&json, "null");
	else
		append_json_text(&json, last_error);
	appendStringInfoChar(&json, '}');
	payload = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data)));
	(void) idem_outbox_stage_event(namespace, cstring_to_text(IDEM_INBOX_DEAD_TOPIC),
								   payload, NULL, NULL, NULL);
}
