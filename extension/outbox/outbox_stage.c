/*-------------------------------------------------------------------------
 *
 * outbox_stage.c
 *	  The transactional outbox: staging.  Claims, acks,
 *	  nacks and prune are in outbox_claim.c; the wait, the backlog and the
 *	  idem_outbox view's writes in outbox_wait.c.
 *
 * An event is staged by an insert in the caller's transaction, so it exists
 * exactly when the domain change commits, and staging costs one row (no
 * NOTIFY; an event with a key also keeps its key's slot locked to commit,
 * below).  Events are inserted
 * directly (direct_table.c): no executor per event, and a batch is its
 * events' rows written in array order by one call.  The stage registers the outbox's
 * wake-up channel: idle drainers (idem_outbox_wait) wake when the
 * stager's transaction commits, never before.
 *
 * Every event carries the stager's scope (scope.c): drainers claim only
 * their own scope's events (and those staged before 0.3.0, the shared
 * scope).
 *
 * Per-key order is commit order: an event with a key is staged only once
 * its key's slot row (idem_outbox_key_slots, install/40_outbox.sql) is
 * locked FOR UPDATE until the stager's transaction ends, and its id is
 * drawn after that lock.  A second stager of the key waits for the first
 * one's commit or rollback, then draws a higher id: ids of one key follow
 * commit order, and a drainer never sees a later event of the key before
 * an earlier one commits.  A batch locks its keys' slots in slot order
 * first, so two batches never deadlock over one another's keys.  Events
 * without a key lock nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/hashing.h"
#include "core/scope.h"
#include "core/sequences.h"
#include "core/statements.h"
#include "core/stats.h"
#include "core/wakeup.h"
#include "outbox/outbox.h"
#include "outbox/outbox_queue.h"
#include "table/direct_table.h"

#include "access/htup_details.h"
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
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idem_outbox_stage_json);
PG_FUNCTION_INFO_V1(idem_outbox_stage_bytes);
PG_FUNCTION_INFO_V1(idem_outbox_stage_batch);

/* Bounds of the arguments: they keep one call's work bounded. */
#define OUTBOX_MAX_BATCH		10000
#define OUTBOX_MAX_TOPIC_BYTES	255

/*
 * The key slots: rows 0 .. OUTBOX_KEY_SLOTS - 1, as the install script
 * makes them (a power of two: a slot is a mask of bits).
 */
#define OUTBOX_KEY_SLOTS		16384

enum
{
	SLOT_SLOT,
	SLOT_NCOLUMNS
};

static const DirectColumn slot_columns[SLOT_NCOLUMNS] = {
	[SLOT_SLOT] = {"slot", INT4OID},
};

static DirectTableDef idem_outbox_key_slots =
DIRECT_TABLE("idem_outbox_key_slots", slot_columns, SLOT_NCOLUMNS);


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

/*
 * A key's slot in scope: the first 16 bits of its SHA-256 with the scope's
 * OID mixed in (so that a key's slot differs between scopes whose OIDs
 * differ in the low bits, as roles made one after another do), masked.
 * The SQL edition computes the same (39_sql_outbox.sql, key_slot).
 */
static int32
key_slot(bytea *hash, Oid scope)
{
	const uint8 *h = (const uint8 *) VARDATA_ANY(hash);

	return (int32) (((((uint32) h[0]) << 8 | h[1]) ^ (uint32) scope) & (OUTBOX_KEY_SLOTS - 1));
}

/* qsort comparator: slots in ascending order. */
static int
compare_slots(const void *a, const void *b)
{
	int32		x = *(const int32 *) a;
	int32		y = *(const int32 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * Lock the n slots (in any order, repeats allowed) until the transaction
 * ends, in ascending order: every stager takes a set of slots in the same
 * order, so two batches of crossing keys wait, never deadlock.  A wait is
 * a row lock's (heavyweight: lock_timeout bounds it, the deadlock detector
 * sees it); after it, the row is only locked, never updated, so REPEATABLE
 * READ goes on without a serialization failure.  A slot this transaction
 * already holds (an earlier stage of the key) is taken again at no cost.
 * Without the table (0.5.0's tables under this library, during a rolling
 * upgrade) nothing is locked, and ids follow staging order as in 0.5.0.
 */
static void
lock_key_slots(Oid namespace, int32 *slots, int n)
{
	DirectTable *table;
	int			i;

	if (n == 0 || !OidIsValid(get_relname_relid(idem_outbox_key_slots.relname, namespace)))
		return;
	qsort(slots, n, sizeof(int32), compare_slots);
	table = direct_open(&idem_outbox_key_slots, namespace, DIRECT_UPDATE);
	for (i = 0; i < n; i++)
	{
		Datum		slot = Int32GetDatum(slots[i]);
		HeapTuple	row;
		HeapTuple	locked = NULL;

		if (i > 0 && slots[i] == slots[i - 1])
			continue;
		direct_scan_begin(table, 1, &slot, false);
		row = direct_scan_next(table);
		direct_scan_end(table);
		if (row != NULL)
			locked = direct_lock(table, &row->t_self, false);
		if (locked == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pg_idem key slot %d is missing", slots[i]),
					 errdetail("Table idem_outbox_key_slots must hold the rows 0 to %d its install made.",
							   OUTBOX_KEY_SLOTS - 1),
					 errhint("Insert the missing rows: INSERT INTO idem_outbox_key_slots SELECT generate_series(0, %d) ON CONFLICT DO NOTHING.",
							 OUTBOX_KEY_SLOTS - 1)));
		heap_freetuple(locked);
		heap_freetuple(row);
	}
	direct_close(table);
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
 * Write one checked event's row into the open queue (key_hash: the key's
 * SHA-256, NULL without a key; json_payload tells which payload column
 * payload goes to); its id.  The one description of an event's row, for
 * single stages and batches alike.
 */
static int64
stage_row(DirectTable *queue, text *topic, Datum payload, bool json_payload, text *key, bytea *hash,
		  Jsonb *headers, Interval *delay, Oid scope)
{
	TupleTableSlot *slot = direct_new_row(queue, NULL);
	TimestampTz now = GetCurrentTimestamp();
	ItemPointerData tid;

	direct_set(queue, QUEUE_TOPIC, PointerGetDatum(topic), false);
	direct_set(queue, QUEUE_MESSAGE_KEY, PointerGetDatum(key), key == NULL);
	direct_set(queue, QUEUE_KEY_HASH, PointerGetDatum(hash), hash == NULL);
	direct_set(queue, QUEUE_PAYLOAD, payload, !json_payload);
	direct_set(queue, QUEUE_PAYLOAD_BYTES, payload, json_payload);
	direct_set(queue, QUEUE_HEADERS, PointerGetDatum(headers), headers == NULL);
	direct_set(queue, QUEUE_AVAILABLE_AT,
			   TimestampTzGetDatum(delay == NULL ? now : idem_time_plus(now, delay)), false);
	direct_set(queue, QUEUE_SCOPE, ObjectIdGetDatum(scope), false);
	/* Opened as an inserter, the table cannot have changed shape since. */
	if (direct_insert(queue, false, &tid) != DIRECT_WRITTEN)
		ereport(ERROR,
				(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
				 errmsg("outbox event not staged"),
				 errdetail("A BEFORE INSERT trigger on idem_outbox_queue skipped the row.")));
	return DatumGetInt64(slot->tts_values[direct_attnum(queue, QUEUE_ID) - 1]);
}

/*
 * Insert one checked event; json_payload tells which payload column
 * payload goes to.  Wakes drainers at commit.
 */
static int64
insert_event(Oid namespace, Oid scope, text *topic, Datum payload, bool json_payload,
			 text *key, Jsonb *headers, Interval *delay)
{
	DirectTable *queue;
	bytea	   *hash = NULL;
	int64		id;

	check_topic(topic);
	if (headers != NULL)
		check_headers(headers);
	if (delay != NULL)
		(void) check_non_negative(delay, "delay");

	/* Before the id is drawn: see the head comment. */
	if (key != NULL)
	{
		int32		slot;

		hash = key_hash(key);
		slot = key_slot(hash, scope);
		lock_key_slots(namespace, &slot, 1);
	}
	queue = direct_open(&idem_outbox_queue, namespace, DIRECT_INSERT);
	idem_outbox_ids_catch_up(namespace);
	id = stage_row(queue, topic, payload, json_payload, key, hash, headers, delay, scope);
	direct_close(queue);

	idem_count(IDEM_STAT_OUTBOX_STAGED, 1);
	idem_wake_after_commit(IDEM_OUTBOX_CHANNEL());
	return id;
}

/* See outbox.h. */
int64
idem_outbox_stage_event(Oid namespace, text *topic, Jsonb *payload, text *key,
						Jsonb *headers, Interval *delay)
{
	if (topic == NULL || payload == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", topic == NULL ? "topic" : "payload"),
				 errdetail("An outbox event needs a topic and a payload.")));
	return insert_event(namespace, idem_current_scope(), topic, JsonbPGetDatum(payload), true, key,
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
	PG_RETURN_INT64(insert_event(idem_function_namespace(fcinfo),
								 idem_current_scope(), topic,
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

/*
 * idem_outbox_stage_batch(topic, payloads jsonb[], keys text[], headers
 * jsonb[], delay): one event per payload, in one call; returns the ids in
 * the payloads' order.
 */
Datum
idem_outbox_stage_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum	   *payloads,
			   *keys = NULL,
			   *headers = NULL;
	bool	   *payload_nulls,
			   *key_nulls = NULL,
			   *header_nulls = NULL;
	int			npayloads,
				nkeys,
				nheaders,
				i;
	text	   *topic;
	Interval   *delay;
	Oid			scope;
	DirectTable *queue;
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	MemoryContext old;
	bytea	  **hashes;
	int32	   *slots;
	int			nslots = 0;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem_outbox_stage_batch must be called where a set is accepted"),
				 errdetail("Call it as SELECT * FROM idem_outbox_stage_batch(...).")));

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

	if (nheaders >= 0)
		for (i = 0; i < nheaders; i++)
			if (!header_nulls[i])
				check_headers(DatumGetJsonbP(headers[i]));
	delay = idem_outbox_interval_arg(fcinfo, 4, "delay");
	scope = idem_current_scope();

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

	/*
	 * Every key checked and its slot locked before the first id is drawn
	 * (an empty key is refused before any wait).
	 */
	hashes = palloc0(sizeof(bytea *) * npayloads);
	slots = palloc(sizeof(int32) * npayloads);
	for (i = 0; i < npayloads; i++)
		if (nkeys >= 0 && !key_nulls[i])
		{
			hashes[i] = key_hash(DatumGetTextPP(keys[i]));
			slots[nslots++] = key_slot(hashes[i], scope);
		}
	lock_key_slots(namespace, slots, nslots);

	/* In array order: ids follow the arrays, and so does per-key order. */
	queue = direct_open(&idem_outbox_queue, namespace, DIRECT_INSERT);
	idem_outbox_ids_catch_up(namespace);
	for (i = 0; i < npayloads; i++)
	{
		bool		has_key = nkeys >= 0 && !key_nulls[i];
		text	   *key = has_key ? DatumGetTextPP(keys[i]) : NULL;
		bool		isnull = false;
		Datum		id;

		id = Int64GetDatum(stage_row(queue, topic, payloads[i], true, key, hashes[i],
									 nheaders >= 0 && !header_nulls[i] ?
									 DatumGetJsonbP(headers[i]) : NULL,
									 delay, scope));
		tuplestore_putvalues(store, tupdesc, &id, &isnull);
	}
	direct_close(queue);
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
 * Stage an inbox message's dead-letter event in scope; the caller is in
 * SPI.
 */
void
idem_outbox_stage_dead_letter(Oid namespace, Oid scope, Datum consumer, Datum message_id,
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
	(void) insert_event(namespace, scope, cstring_to_text(IDEM_INBOX_DEAD_TOPIC),
						JsonbPGetDatum(payload), true, NULL, NULL, NULL);
}
