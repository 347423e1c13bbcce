/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The transactional outbox: stage, claim, ack, nack, prune and wait.
 *
 * An event is staged by a plain INSERT in the caller's transaction, so it
 * exists exactly when the domain change commits, and staging costs one
 * row and nothing else (no NOTIFY, no lock held to commit).
 *
 * Drainers claim batches in short transactions of their own and publish
 * with no transaction open.  A claim takes rows with FOR UPDATE SKIP
 * LOCKED in a MATERIALIZED CTE (a plain IN (SELECT ... LIMIT n) can hand
 * out more than n rows under concurrency), stamps them with a random
 * claim token and a lease, and counts the attempt.  The lease is stored
 * in available_at, the column that also holds the staging delay and the
 * nack backoff: "claimable" is then a single range condition,
 * state = 'pending' AND available_at <= clock_timestamp(), served by one
 * partial index, and a drainer that dies simply lets its rows' leases
 * run out.
 *
 * Per-key order: a row is claimable only if no earlier row of the same
 * key is still pending (waiting, leased or backing off).  Dead rows do
 * not block their key.  Keys are caller-controlled strings, so only
 * their SHA-256 is indexed.
 *
 * Ack and nack are fenced by the claim token and state = 'pending'; a
 * re-claim replaces the token, so a drainer whose lease expired and whose
 * rows were taken over changes nothing.  Attempts are counted at claim
 * time, in the claim's own committed transaction, so a drainer killed
 * mid-batch still uses up an attempt: a row whose last attempt's lease
 * ran out is marked dead by the next claim that meets it, never handed
 * out again.
 *
 *-------------------------------------------------------------------------
 */
#include "messages.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/tuplestore.h"
#include "utils/uuid.h"
#include "utils/wait_event.h"

PG_FUNCTION_INFO_V1(idem_outbox_stage_json);
PG_FUNCTION_INFO_V1(idem_outbox_stage_bytes);
PG_FUNCTION_INFO_V1(idem_outbox_claim);
PG_FUNCTION_INFO_V1(idem_outbox_ack);
PG_FUNCTION_INFO_V1(idem_outbox_nack);
PG_FUNCTION_INFO_V1(idem_outbox_prune);
PG_FUNCTION_INFO_V1(idem_outbox_wait);

/* Bounds of the arguments: they keep one call's work bounded. */
#define OUTBOX_MAX_BATCH		10000
#define PRUNE_MAX_BATCH			1000000
#define OUTBOX_MAX_TOPIC_BYTES	255
#define BACKOFF_MAX_STEPS		32

/* The adaptive poll of idem_outbox_wait, in milliseconds. */
#define WAIT_FIRST_SLEEP_MS		1
#define WAIT_MAX_SLEEP_MS		100

int			idem_outbox_max_attempts = 6;
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

/* Columns of idem_outbox_claim's result, in the order the SQL declares. */
#define CLAIM_NCOLUMNS 10

/* Is the row eligible for a claim?  Shared by the claim and the wake-up probe. */
#define OUTBOX_CLAIMABLE(alias) \
	alias ".state = 'pending' AND " alias ".available_at <= clock_timestamp()" \
	" AND (" alias ".key_hash IS NULL OR NOT EXISTS (" \
	"  SELECT 1 FROM @extschema@.idem_outbox e" \
	"   WHERE e.key_hash = " alias ".key_hash AND e.state = 'pending'" \
	"     AND e.id < " alias ".id))"

static IdemStatement stage_event = {
	"INSERT INTO @extschema@.idem_outbox"
	" (topic, message_key, key_hash, payload, payload_bytes, headers, available_at)"
	" VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp() + $7)"
	" RETURNING id",
	7, {TEXTOID, TEXTOID, BYTEAOID, JSONBOID, BYTEAOID, JSONBOID, INTERVALOID}
};

static IdemStatement stage_dead_letter = {
	"INSERT INTO @extschema@.idem_outbox (topic, payload, available_at)"
	" VALUES ('" IDEM_INBOX_DEAD_TOPIC "',"
	"  jsonb_build_object('consumer', $1, 'message_id', $2,"
	"                     'error_count', $3, 'last_error', $4),"
	"  clock_timestamp())",
	4, {TEXTOID, TEXTOID, INT4OID, TEXTOID}
};

/*
 * One claim: pick at most $1 claimable rows, then lease them to token $2
 * for $3 and count the attempt.  A picked row whose attempts are used up
 * ($4) goes dead instead; only the leased rows are returned.
 */
static IdemStatement claim_batch = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT o.id FROM @extschema@.idem_outbox o"
	"   WHERE " OUTBOX_CLAIMABLE("o")
	"   ORDER BY o.available_at, o.id"
	"   LIMIT $1 FOR UPDATE OF o SKIP LOCKED),"
	" taken AS ("
	"  UPDATE @extschema@.idem_outbox o SET"
	"   state = CASE WHEN o.attempts >= $4 THEN 'dead' ELSE 'pending' END,"
	"   dead_at = CASE WHEN o.attempts >= $4 THEN clock_timestamp() END,"
	"   last_error = CASE WHEN o.attempts >= $4 AND o.claim_token IS NOT NULL"
	"     THEN 'lease expired during the last attempt' ELSE o.last_error END,"
	"   attempts = CASE WHEN o.attempts >= $4 THEN o.attempts ELSE o.attempts + 1 END,"
	"   claim_token = CASE WHEN o.attempts >= $4 THEN NULL ELSE $2 END,"
	"   available_at = CASE WHEN o.attempts >= $4 THEN o.available_at"
	"     ELSE clock_timestamp() + $3 END"
	"  FROM batch"
	"  WHERE o.id = batch.id AND o.state = 'pending'"
	"    AND o.available_at <= clock_timestamp()"
	"  RETURNING o.id, o.topic, o.message_key, o.payload, o.payload_bytes,"
	"   o.headers, o.attempts, o.created_at, o.claim_token, o.available_at, o.state)"
	" SELECT id, topic, message_key, payload, payload_bytes, headers, attempts,"
	"  created_at, claim_token, available_at, state = 'dead'"
	" FROM taken ORDER BY id",
	4, {INT4OID, UUIDOID, INTERVALOID, INT4OID}
};

static IdemStatement ack_events = {
	"UPDATE @extschema@.idem_outbox"
	" SET state = 'published', published_at = clock_timestamp()"
	" WHERE id = ANY ($2) AND claim_token = $1 AND state = 'pending'",
	2, {UUIDOID, INT8ARRAYOID}
};

/*
 * A failed publish: back off by the schedule entry for the attempt just
 * made ($4, the last entry repeating), or go dead after the last attempt.
 */
static IdemStatement nack_event = {
	"UPDATE @extschema@.idem_outbox SET"
	" last_error = $3, claim_token = NULL,"
	" state = CASE WHEN attempts >= $5 THEN 'dead' ELSE 'pending' END,"
	" dead_at = CASE WHEN attempts >= $5 THEN clock_timestamp() END,"
	" available_at = CASE WHEN attempts >= $5 THEN available_at"
	"   ELSE clock_timestamp() + $4[least(attempts, cardinality($4))] END"
	" WHERE id = $2 AND claim_token = $1 AND state = 'pending'"
	" RETURNING state, attempts, $4[least(attempts, cardinality($4))]",
	5, {UUIDOID, INT8OID, TEXTOID, INTERVALARRAYOID, INT4OID}
};

static IdemStatement prune_events = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT id FROM @extschema@.idem_outbox"
	"   WHERE state IN ('published', 'dead')"
	"     AND coalesce(published_at, dead_at) < clock_timestamp() - $2"
	"   LIMIT $1 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_outbox o USING batch"
	"  WHERE o.id = batch.id AND o.state IN ('published', 'dead')"
	"    AND coalesce(o.published_at, o.dead_at) < clock_timestamp() - $2",
	2, {INT4OID, INTERVALOID}
};

/* The wake-up probe: one index probe, the claim's own eligibility test. */
static IdemStatement probe_work = {
	"SELECT 1 FROM @extschema@.idem_outbox o"
	" WHERE " OUTBOX_CLAIMABLE("o")
	" LIMIT 1",
	0, {InvalidOid}
};

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
static ArrayType *
backoff_array(void)
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

/* Refuse a batch size outside 1 .. max. */
static int32
batch_arg(FunctionCallInfo fcinfo, int argno, int32 max)
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

/* A non-NULL interval argument that must not be negative. */
static Interval *
non_negative_interval_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	Interval   *span;
	Interval	zero = {0};

	idem_require_arg(fcinfo, argno, name);
	span = PG_GETARG_INTERVAL_P(argno);
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

/* The claim token: a random (version 4) UUID. */
static Datum
new_claim_token(void)
{
	return DirectFunctionCall1(gen_random_uuid, (Datum) 0);
}

/*
 * Shared body of both idem_outbox_stage variants: validate, hash the key,
 * insert in the caller's transaction, return the event's id.
 */
static Datum
stage_common(FunctionCallInfo fcinfo, bool json_payload)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[7];
	char		nulls[7];
	text	   *topic;
	int64		id;
	bool		isnull;

	memset(nulls, ' ', sizeof(nulls));

	idem_require_arg(fcinfo, 0, "topic");
	topic = PG_GETARG_TEXT_PP(0);
	if (VARSIZE_ANY_EXHDR(topic) == 0 ||
		VARSIZE_ANY_EXHDR(topic) > OUTBOX_MAX_TOPIC_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topic must be between 1 and %d bytes", OUTBOX_MAX_TOPIC_BYTES),
				 errdetail("The topic given is %d bytes long.",
						   (int) VARSIZE_ANY_EXHDR(topic))));
	values[0] = PointerGetDatum(topic);

	idem_require_arg(fcinfo, 1, "payload");
	values[3] = values[4] = (Datum) 0;
	nulls[3] = nulls[4] = 'n';
	values[json_payload ? 3 : 4] = PG_GETARG_DATUM(1);
	nulls[json_payload ? 3 : 4] = ' ';

	if (PG_ARGISNULL(2))
		nulls[1] = nulls[2] = 'n';
	else
	{
		text	   *key = PG_GETARG_TEXT_PP(2);
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
		values[1] = PointerGetDatum(key);
		values[2] = PointerGetDatum(hash);
	}

	if (PG_ARGISNULL(3))
		nulls[5] = 'n';
	else
	{
		Jsonb	   *headers = PG_GETARG_JSONB_P(3);

		if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("headers must be a JSON object"),
					 errdetail("Headers are stored as {\"name\": value, ...}.")));
		values[5] = PointerGetDatum(headers);
	}

	values[6] = IntervalPGetDatum(non_negative_interval_arg(fcinfo, 4, "delay"));

	SPI_connect();
	idem_execute(&stage_event, namespace, values, nulls, false, 1);
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
									 1, &isnull));
	SPI_finish();
	idem_count(IDEM_STAT_OUTBOX_STAGED, 1);
	PG_RETURN_INT64(id);
}

/* idem_outbox_stage(topic, payload jsonb, key, headers, delay): an event with a JSON payload. */
Datum
idem_outbox_stage_json(PG_FUNCTION_ARGS)
{
	return stage_common(fcinfo, true);
}

/* idem_outbox_stage(topic, payload bytea, key, headers, delay): an event with a binary payload. */
Datum
idem_outbox_stage_bytes(PG_FUNCTION_ARGS)
{
	return stage_common(fcinfo, false);
}

/* Stage an inbox message's dead-letter event; the caller is in SPI. */
void
idem_outbox_stage_dead_letter(Oid namespace, Datum consumer, Datum message_id,
							  int32 error_count, Datum last_error, bool last_error_null)
{
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	values[0] = consumer;
	values[1] = message_id;
	values[2] = Int32GetDatum(error_count);
	values[3] = last_error;
	if (last_error_null)
		nulls[3] = 'n';
	idem_execute(&stage_dead_letter, namespace, values, nulls, false, 0);
	idem_count(IDEM_STAT_OUTBOX_STAGED, 1);
}

/*
 * idem_outbox_claim(batch, lease): lease at most batch claimable events to
 * a fresh claim token.  Call it in a transaction of its own and publish
 * after it committed.
 */
Datum
idem_outbox_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[4];
	uint64		i;
	int64		claimed = 0;
	int64		dead = 0;

	values[0] = Int32GetDatum(batch_arg(fcinfo, 0, OUTBOX_MAX_BATCH));
	values[1] = new_claim_token();
	values[2] = IntervalPGetDatum(idem_lease_argument(fcinfo, 1, "lease", false,
													  idem_lease_ms));
	values[3] = Int32GetDatum(idem_outbox_max_attempts);

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != CLAIM_NCOLUMNS)
		elog(ERROR, "idem_outbox_claim must return %d columns", CLAIM_NCOLUMNS);

	SPI_connect();
	idem_execute(&claim_batch, namespace, values, NULL, false, 0);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		Datum		out[CLAIM_NCOLUMNS];
		bool		outnull[CLAIM_NCOLUMNS];
		bool		isnull;
		int			col;

		if (DatumGetBool(SPI_getbinval(row, desc, CLAIM_NCOLUMNS + 1, &isnull)))
		{
			dead++;
			continue;
		}
		for (col = 0; col < CLAIM_NCOLUMNS; col++)
			out[col] = SPI_getbinval(row, desc, col + 1, &outnull[col]);
		/* putvalues copies into the tuplestore's own memory. */
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, outnull);
		claimed++;
	}
	SPI_finish();

	idem_count(IDEM_STAT_OUTBOX_CLAIMED, claimed);
	if (dead > 0)
		idem_count(IDEM_STAT_OUTBOX_DEAD, dead);
	return (Datum) 0;
}

/* qsort comparator for int64 ids. */
static int
compare_ids(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* Number of distinct ids in the ack's array (the stale count needs it). */
static int
distinct_ids(ArrayType *ids)
{
	Datum	   *elems;
	int			n;
	int			i;
	int			distinct = 0;
	int64	   *sorted;

	deconstruct_array(ids, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE,
					  &elems, NULL, &n);
	sorted = palloc(sizeof(int64) * Max(n, 1));
	for (i = 0; i < n; i++)
		sorted[i] = DatumGetInt64(elems[i]);
	qsort(sorted, n, sizeof(int64), compare_ids);
	for (i = 0; i < n; i++)
		if (i == 0 || sorted[i] != sorted[i - 1])
			distinct++;
	return distinct;
}

/*
 * idem_outbox_ack(token, ids): mark published the events among ids that
 * this claim still holds; returns how many.  A stale token acks nothing.
 */
Datum
idem_outbox_ack(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	ArrayType  *ids;
	Datum		values[2];
	int			acked;
	int			requested;

	idem_require_arg(fcinfo, 0, "token");
	idem_require_arg(fcinfo, 1, "ids");
	ids = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(ids) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("ids must be a one-dimensional array")));
	if (array_contains_nulls(ids))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not contain nulls")));
	requested = distinct_ids(ids);

	values[0] = PG_GETARG_DATUM(0);
	values[1] = PointerGetDatum(ids);
	SPI_connect();
	acked = idem_execute(&ack_events, namespace, values, NULL, false, 0);
	SPI_finish();

	idem_count(IDEM_STAT_OUTBOX_ACKED, acked);
	if (requested > acked)
		idem_count(IDEM_STAT_OUTBOX_ACK_STALE, requested - acked);
	PG_RETURN_INT32(acked);
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
	MemoryContext outer = CurrentMemoryContext;
	TupleDesc	tupdesc;
	Datum		values[5];
	Datum		result[3];
	bool		resnull[3] = {false, true, true};
	HeapTuple	tuple;
	const char *outcome;

	idem_require_arg(fcinfo, 0, "token");
	idem_require_arg(fcinfo, 1, "id");
	idem_require_arg(fcinfo, 2, "error");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	values[0] = PG_GETARG_DATUM(0);
	values[1] = PG_GETARG_DATUM(1);
	values[2] = PG_GETARG_DATUM(2);
	values[3] = PointerGetDatum(backoff_array());
	values[4] = Int32GetDatum(idem_outbox_max_attempts);

	SPI_connect();
	if (idem_execute(&nack_event, namespace, values, NULL, false, 1) == 0)
	{
		outcome = "stale";
		idem_count(IDEM_STAT_OUTBOX_ACK_STALE, 1);
	}
	else
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *state = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
		bool		is_dead = strcmp(state, "dead") == 0;

		result[1] = SPI_getbinval(row, desc, 2, &isnull);
		resnull[1] = false;
		if (is_dead)
		{
			outcome = "dead";
			idem_count(IDEM_STAT_OUTBOX_DEAD, 1);
		}
		else
		{
			MemoryContext old = MemoryContextSwitchTo(outer);

			outcome = "retry";
			result[2] = datumCopy(SPI_getbinval(row, desc, 3, &isnull), false,
								  sizeof(Interval));
			resnull[2] = false;
			MemoryContextSwitchTo(old);
			idem_count(IDEM_STAT_OUTBOX_NACKED, 1);
		}
	}
	SPI_finish();

	/* Made after SPI_finish, which frees what was allocated inside SPI. */
	result[0] = CStringGetTextDatum(outcome);
	tuple = heap_form_tuple(BlessTupleDesc(tupdesc), result, resnull);
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

/*
 * idem_outbox_prune(older_than, batch): delete at most batch published or
 * dead events finished more than older_than ago.
 */
Datum
idem_outbox_prune(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	int			deleted;

	values[1] = IntervalPGetDatum(non_negative_interval_arg(fcinfo, 0, "older_than"));
	values[0] = Int32GetDatum(batch_arg(fcinfo, 1, PRUNE_MAX_BATCH));

	SPI_connect();
	deleted = idem_execute(&prune_events, namespace, values, NULL, false, 0);
	SPI_finish();
	idem_count(IDEM_STAT_OUTBOX_PRUNED, deleted);
	PG_RETURN_INT64(deleted);
}

/*
 * idem_outbox_wait(timeout): true as soon as an event is claimable, false
 * when the timeout passes first.  An adaptive poll on the backend's latch
 * (1 ms doubling to 100 ms) with the claim's own eligibility test as the
 * probe: stagers pay nothing (no NOTIFY, no shared memory), an idle
 * drainer costs one index probe per 100 ms, and a signal, a cancel or
 * postmaster death ends the wait at once.
 */
Datum
idem_outbox_wait(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Interval   *timeout;
	TimestampTz deadline;
	long		sleep_ms = WAIT_FIRST_SLEEP_MS;
	bool		found = false;

	idem_require_arg(fcinfo, 0, "timeout");
	timeout = idem_lease_argument(fcinfo, 0, "timeout", true, 0);
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("idem_outbox_wait must run in a READ COMMITTED transaction"),
				 errdetail("Under REPEATABLE READ or SERIALIZABLE the wait could never see new events."),
				 errhint("Call it outside an explicit transaction block.")));
	deadline = GetCurrentTimestamp() + timeout->time;

	SPI_connect();
	for (;;)
	{
		long		remaining_ms;

		CHECK_FOR_INTERRUPTS();
		found = idem_execute(&probe_work, namespace, NULL, NULL, false, 1) > 0;
		SPI_freetuptable(SPI_tuptable);
		if (found)
			break;

		remaining_ms = (long) ((deadline - GetCurrentTimestamp() + 999) / 1000);
		if (remaining_ms <= 0)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(sleep_ms, remaining_ms), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		sleep_ms = Min(sleep_ms * 2, WAIT_MAX_SLEEP_MS);
	}
	SPI_finish();
	PG_RETURN_BOOL(found);
}
