/*-------------------------------------------------------------------------
 *
 * claims.c
 *	  Single-flight claims of idempotency keys: claim, begin, lookup,
 *	  renew, finalize, release and fail.
 *
 * The protocol stands on two facts of READ COMMITTED (see SCENARIOS.md):
 * INSERT ... ON CONFLICT DO NOTHING waits for an in-flight inserter of the
 * same key and then does nothing if it committed, and an UPDATE re-checks
 * its WHERE clause against the newest row version after waiting.  So the
 * claim reads the key, decides, and then writes with a statement whose
 * predicate re-states the decision; if the key changed in between, the
 * write touches nothing and the claim reads again.  Every mutating call
 * after the claim is fenced by the claim_id token and state = 'pending':
 * a stale or forged token changes nothing.
 *
 * All lease arithmetic uses clock_timestamp(): now() is frozen at the
 * start of the transaction, and a claim that waited on a lock must not be
 * born expired.
 *
 *-------------------------------------------------------------------------
 */
#include "pg_idem.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_claim);
PG_FUNCTION_INFO_V1(idem_begin);
PG_FUNCTION_INFO_V1(idem_lookup);
PG_FUNCTION_INFO_V1(idem_renew);
PG_FUNCTION_INFO_V1(idem_finalize);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_fail);

/*
 * How often a claim re-reads a key that changed under it before giving up
 * with a retryable error.  Each retry means another session won a race on
 * this very key, so a handful is plenty.
 */
#define CLAIM_MAX_ATTEMPTS 16

/* Columns of the idem_claim_result type. */
enum
{
	RESULT_OUTCOME,
	RESULT_CLAIM_ID,
	RESULT_GENERATION,
	RESULT_LEASE_EXPIRES_AT,
	RESULT_RETRY_AFTER,
	RESULT_RESPONSE_STATUS,
	RESULT_RESPONSE_HEADERS,
	RESULT_RESPONSE_BODY,
	RESULT_NATTS
};

/* Columns read by select_key. */
enum
{
	ROW_STATE = 1,
	ROW_REQUEST_HASH,
	ROW_LEASE_EXPIRES_AT,
	ROW_CREATED_AT,
	ROW_RESPONSE_STATUS,
	ROW_RESPONSE_HEADERS,
	ROW_RESPONSE_BODY,
	ROW_REPLAYABLE
};

static IdemStatement select_key = {
	"SELECT state, request_hash, lease_expires_at, created_at,"
	" response_status, response_headers, response_body, replayable"
	" FROM @extschema@.idem_keys WHERE cache_key = $1",
	1, {BYTEAOID}
};

/* Parameters of the three claim writes: key, hash, claim_id, lease, in_transaction, sequence, ttl. */
#define CLAIM_ARGS {BYTEAOID, BYTEAOID, UUIDOID, INTERVALOID, BOOLOID, REGCLASSOID, INTERVALOID}

static IdemStatement insert_claim = {
	"INSERT INTO @extschema@.idem_keys AS k"
	" (cache_key, state, request_hash, claim_id, generation,"
	"  lease_expires_at, created_at, in_transaction)"
	" VALUES ($1, 'pending', $2, $3, nextval($6),"
	"  clock_timestamp() + $4, clock_timestamp(), $5)"
	" ON CONFLICT (cache_key) DO NOTHING"
	" RETURNING generation, lease_expires_at",
	6, CLAIM_ARGS
};

/* The new owner's row, written by both kinds of recovery. */
#define RECLAIM_SET \
	"UPDATE @extschema@.idem_keys SET state = 'pending', request_hash = $2," \
	" claim_id = $3, generation = nextval($6)," \
	" lease_expires_at = clock_timestamp() + $4, created_at = clock_timestamp()," \
	" finished_at = NULL, response_status = NULL, response_headers = NULL," \
	" response_body = NULL, replayable = true, in_transaction = $5"

/* An abandoned claim or an elapsed cooldown, taken over by the same request. */
static IdemStatement steal_claim = {
	RECLAIM_SET
	" WHERE cache_key = $1 AND state IN ('pending', 'failed')"
	" AND lease_expires_at < clock_timestamp()"
	" AND (request_hash = $2 OR request_hash IS NULL)"
	" RETURNING generation, lease_expires_at",
	6, CLAIM_ARGS
};

/* A finished key past idem.ttl, reused whatever the request. */
static IdemStatement recover_ttl_claim = {
	RECLAIM_SET
	" WHERE cache_key = $1 AND created_at < clock_timestamp() - $7"
	" AND (state = 'completed' OR lease_expires_at < clock_timestamp())"
	" RETURNING generation, lease_expires_at",
	7, CLAIM_ARGS
};

static IdemStatement renew_claim = {
	"UPDATE @extschema@.idem_keys"
	" SET lease_expires_at = clock_timestamp() + $3"
	" WHERE cache_key = $1 AND claim_id = $2 AND state = 'pending'"
	" RETURNING lease_expires_at",
	3, {BYTEAOID, UUIDOID, INTERVALOID}
};

static IdemStatement finalize_claim = {
	"UPDATE @extschema@.idem_keys"
	" SET state = 'completed', response_status = $3, response_headers = $4,"
	" response_body = $5, replayable = $6, finished_at = clock_timestamp(),"
	" lease_expires_at = NULL"
	" WHERE cache_key = $1 AND claim_id = $2 AND state = 'pending'",
	6, {BYTEAOID, UUIDOID, INT4OID, JSONBOID, BYTEAOID, BOOLOID}
};

/*
 * A released key keeps its row, as a tombstone: failed, its cooldown over,
 * with neither hash nor owner, so that any request may claim it at once.
 * Deleting the row would lose the key's place in the generation order: an
 * INSERT ... ON CONFLICT draws nextval() before it checks the key, so a
 * claimant that drew its generation before the release and inserted after
 * it would hand out an older generation than the released claim's.  With
 * the row kept, that claimant conflicts, reads the tombstone and takes it
 * over with a freshly drawn generation.
 */
static IdemStatement release_claim = {
	IDEM_TOMBSTONE_SET
	" WHERE cache_key = $1 AND claim_id = $2 AND state = 'pending'",
	2, {BYTEAOID, UUIDOID}
};

static IdemStatement fail_claim = {
	"UPDATE @extschema@.idem_keys"
	" SET state = 'failed', lease_expires_at = clock_timestamp() + $3,"
	" finished_at = clock_timestamp()"
	" WHERE cache_key = $1 AND claim_id = $2 AND state = 'pending'",
	3, {BYTEAOID, UUIDOID, INTERVALOID}
};

/* What a claim found, decided, and will answer. */
typedef struct ClaimAnswer
{
	const char *outcome;
	pg_uuid_t  *claim_id;		/* winners only */
	Datum		generation;
	Datum		lease_expires_at;
	bool		has_lease;
	int64		retry_after_us; /* < 0: none */
	HeapTuple	row;			/* the row a follower's answer comes from */
	TupleDesc	row_desc;
} ClaimAnswer;

/* A fresh fencing token: a random (version 4) UUID. */
static pg_uuid_t *
new_claim_id(void)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));

	if (!pg_strong_random(uuid->data, UUID_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random claim id")));
	uuid->data[6] = (uuid->data[6] & 0x0f) | 0x40;
	uuid->data[8] = (uuid->data[8] & 0x3f) | 0x80;
	return uuid;
}

/*
 * The generation sequence of the extension's schema.  Looked up on every
 * claim (one syscache probe): an OID cached per schema would outlive a
 * DROP EXTENSION + CREATE EXTENSION in the same session.
 */
static Oid
generation_sequence(Oid namespace)
{
	Oid			sequence = get_relname_relid("idem_generation_seq", namespace);

	if (!OidIsValid(sequence))
		elog(ERROR, "pg_idem sequence idem_generation_seq is missing");
	return sequence;
}

/* Copy of the single row the last SPI statement returned. */
static void
take_row(ClaimAnswer *answer)
{
	answer->row = SPI_tuptable->vals[0];
	answer->row_desc = SPI_tuptable->tupdesc;
}

static Datum
row_value(ClaimAnswer *answer, int column, bool *isnull)
{
	return SPI_getbinval(answer->row, answer->row_desc, column, isnull);
}

/* Microseconds from now until ts, never negative. */
static int64
remaining_us(TimestampTz ts)
{
	TimestampTz now = GetCurrentTimestamp();

	return ts > now ? ts - now : 0;
}

/* Does the stored request hash allow this request? (NULL: a legacy row.) */
static bool
hash_matches(ClaimAnswer *answer, bytea *request_hash)
{
	bool		isnull;
	Datum		stored = row_value(answer, ROW_REQUEST_HASH, &isnull);
	bytea	   *stored_hash;

	if (isnull)
		return true;
	stored_hash = DatumGetByteaPP(stored);
	return VARSIZE_ANY_EXHDR(stored_hash) == VARSIZE_ANY_EXHDR(request_hash) &&
		memcmp(VARDATA_ANY(stored_hash), VARDATA_ANY(request_hash),
			   VARSIZE_ANY_EXHDR(request_hash)) == 0;
}

/*
 * What the row says to a request that does not own it, without writing:
 * the follower's part of the decision table.  Returns NULL when the row is
 * claimable (lease or cooldown over, or past idem.ttl); *ttl_passed tells
 * which kind of recovery applies.
 */
static const char *
follower_outcome(ClaimAnswer *answer, bytea *request_hash, bool *ttl_passed)
{
	bool		isnull;
	char	   *state = TextDatumGetCString(row_value(answer, ROW_STATE, &isnull));
	TimestampTz created_at = DatumGetTimestampTz(row_value(answer, ROW_CREATED_AT, &isnull));
	Datum		lease = row_value(answer, ROW_LEASE_EXPIRES_AT, &isnull);
	bool		live;
	bool		completed = strcmp(state, "completed") == 0;

	/* A completed row stays "live" (replayable) until idem.ttl is over. */
	live = completed ? true : (!isnull && remaining_us(DatumGetTimestampTz(lease)) > 0);
	*ttl_passed = GetCurrentTimestamp() - created_at > (int64) idem_ttl_s * USECS_PER_SEC;

	if (*ttl_passed && (completed || !live))
		return NULL;
	if (!hash_matches(answer, request_hash))
		return "mismatch";
	if (completed)
	{
		bool		replayable = DatumGetBool(row_value(answer, ROW_REPLAYABLE, &isnull));

		return replayable ? "replay" : "not_replayable";
	}
	if (!live)
		return NULL;
	answer->retry_after_us = remaining_us(DatumGetTimestampTz(lease));
	return strcmp(state, "pending") == 0 ? "in_progress" : "cooldown";
}

/* Was the row released or evicted (see IDEM_TOMBSTONE_SET)? */
static bool
is_tombstone(ClaimAnswer *answer)
{
	bool		hash_null;
	bool		isnull;
	char	   *state = TextDatumGetCString(row_value(answer, ROW_STATE, &isnull));

	(void) row_value(answer, ROW_REQUEST_HASH, &hash_null);
	return hash_null && strcmp(state, "failed") == 0;
}

/* Fill the winner's part of the answer from a claim write's RETURNING row. */
static void
won(ClaimAnswer *answer, const char *outcome, pg_uuid_t *claim_id)
{
	bool		isnull;

	answer->outcome = outcome;
	answer->claim_id = claim_id;
	answer->generation = SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull);
	answer->lease_expires_at = SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 2, &isnull);
	answer->has_lease = true;
	answer->row = NULL;
}

/*
 * Try to take a key over with a steal or ttl-recovery UPDATE; true when it
 * did, with the RETURNING row in SPI_tuptable.
 *
 * An UPDATE that waited on a concurrent writer locks the newest row version
 * before re-checking its WHERE clause, and keeps that lock when the check
 * fails.  A claimant that lost the race inside a longer transaction would
 * then hold the winner's row until it ends, stalling the winner's renew and
 * finalize.  So the attempt runs in a subtransaction that is rolled back
 * when it changed nothing.  Only this rare path pays for it: new keys and
 * followers never get here.
 *
 * An error in the attempt (lock_timeout, a cancel, a serialization
 * failure) rolls the subtransaction back here before it propagates, as
 * the PLs do: a caller's exception handler (PL/pgSQL EXCEPTION) would
 * otherwise roll back ours instead of its own and leave its own open.
 */
static bool
take_over(IdemStatement *stmt, Oid namespace, Datum *values, const char *nulls)
{
	MemoryContext context = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	bool		taken = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(context);

	PG_TRY();
	{
		taken = idem_execute(stmt, namespace, values, nulls, false, 1) == 1;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
		ReThrowError(edata);
	}
	PG_END_TRY();

	if (taken)
		ReleaseCurrentSubTransaction();
	else
		RollbackAndReleaseCurrentSubTransaction();

	MemoryContextSwitchTo(context);
	CurrentResourceOwner = owner;
	return taken;
}

/*
 * The claim loop shared by idem_claim and idem_begin: read the key, decide,
 * write with a predicate that re-checks the decision, and read again if a
 * concurrent session changed the key first.
 */
static void
claim_key(Oid namespace, bytea *cache_key, bytea *request_hash, Interval *lease,
		  bool in_transaction, ClaimAnswer *answer)
{
	pg_uuid_t  *claim_id = new_claim_id();
	Datum		values[7];
	char		nulls[7];
	int			attempt;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(cache_key);
	values[1] = PointerGetDatum(request_hash);
	values[2] = UUIDPGetDatum(claim_id);
	values[3] = IntervalPGetDatum(lease);
	values[4] = BoolGetDatum(in_transaction);
	values[5] = ObjectIdGetDatum(generation_sequence(namespace));
	values[6] = IntervalPGetDatum(idem_ms_interval((int64) idem_ttl_s * 1000));

	for (attempt = 0; attempt < CLAIM_MAX_ATTEMPTS; attempt++)
	{
		const char *outcome;
		bool		ttl_passed;

		CHECK_FOR_INTERRUPTS();

		if (idem_execute(&select_key, namespace, values, nulls, false, 1) == 0)
		{
			if (idem_execute(&insert_claim, namespace, values, nulls, false, 1) == 1)
			{
				won(answer, "claimed", claim_id);
				return;
			}
			continue;			/* someone inserted it first: read theirs */
		}

		take_row(answer);
		outcome = follower_outcome(answer, request_hash, &ttl_passed);
		if (outcome != NULL)
		{
			answer->outcome = outcome;
			return;
		}

		/* A released or evicted key is simply claimed; others recovered. */
		outcome = is_tombstone(answer) ? "claimed" :
			ttl_passed ? "recovered_ttl" : "recovered_abandoned";
		if (take_over(ttl_passed ? &recover_ttl_claim : &steal_claim, namespace,
					  values, nulls))
		{
			won(answer, outcome, claim_id);
			return;
		}
		/* The key changed between our read and our write: read it again. */
	}

	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not claim idempotency key: it changed concurrently %d times",
					CLAIM_MAX_ATTEMPTS),
			 errhint("The transaction might succeed if retried.")));
}

/* Count a claim outcome (followers' and winners' alike). */
static void
count_claim_outcome(const char *outcome)
{
	static const struct
	{
		const char *name;
		IdemCounter counter;
	}			counters[] = {
		{"claimed", IDEM_STAT_CLAIMED},
		{"recovered_ttl", IDEM_STAT_RECOVERED_TTL},
		{"recovered_abandoned", IDEM_STAT_RECOVERED_ABANDONED},
		{"replay", IDEM_STAT_REPLAY},
		{"mismatch", IDEM_STAT_MISMATCH},
		{"in_progress", IDEM_STAT_IN_PROGRESS},
		{"cooldown", IDEM_STAT_COOLDOWN},
		{"not_replayable", IDEM_STAT_NOT_REPLAYABLE},
	};
	int			i;

	for (i = 0; i < (int) lengthof(counters); i++)
		if (strcmp(outcome, counters[i].name) == 0)
			idem_count(counters[i].counter, 1);
}

/* Build the idem_claim_result row; called inside SPI, allocates in outer. */
static Datum
claim_result(FunctionCallInfo fcinfo, ClaimAnswer *answer, MemoryContext outer)
{
	TupleDesc	tupdesc;
	Datum		values[RESULT_NATTS];
	bool		nulls[RESULT_NATTS];
	MemoryContext old;
	HeapTuple	tuple;
	Datum		result;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	memset(nulls, true, sizeof(nulls));
	values[RESULT_OUTCOME] = CStringGetTextDatum(answer->outcome);
	nulls[RESULT_OUTCOME] = false;

	if (answer->claim_id != NULL)
	{
		values[RESULT_CLAIM_ID] = UUIDPGetDatum(answer->claim_id);
		values[RESULT_GENERATION] = answer->generation;
		values[RESULT_LEASE_EXPIRES_AT] = answer->lease_expires_at;
		nulls[RESULT_CLAIM_ID] = nulls[RESULT_GENERATION] = false;
		nulls[RESULT_LEASE_EXPIRES_AT] = false;
	}
	if (answer->retry_after_us >= 0)
	{
		Interval   *retry_after = palloc0(sizeof(Interval));

		retry_after->time = answer->retry_after_us;
		values[RESULT_RETRY_AFTER] = IntervalPGetDatum(retry_after);
		nulls[RESULT_RETRY_AFTER] = false;
	}
	if (answer->row != NULL &&
		(strcmp(answer->outcome, "replay") == 0 ||
		 strcmp(answer->outcome, "not_replayable") == 0))
	{
		values[RESULT_RESPONSE_STATUS] =
			row_value(answer, ROW_RESPONSE_STATUS, &nulls[RESULT_RESPONSE_STATUS]);
		values[RESULT_RESPONSE_HEADERS] =
			row_value(answer, ROW_RESPONSE_HEADERS, &nulls[RESULT_RESPONSE_HEADERS]);
		values[RESULT_RESPONSE_BODY] =
			row_value(answer, ROW_RESPONSE_BODY, &nulls[RESULT_RESPONSE_BODY]);
	}

	/*
	 * heap_form_tuple copies every value, so the SPI memory may go; but a
	 * response body TOASTed out of line is copied as a TOAST pointer, and
	 * HeapTupleGetDatum then flattens the row in the current context: both
	 * must run in the caller's.
	 */
	old = MemoryContextSwitchTo(outer);
	tuple = heap_form_tuple(BlessTupleDesc(tupdesc), values, nulls);
	result = HeapTupleGetDatum(tuple);
	MemoryContextSwitchTo(old);
	return result;
}

/* Shared body of idem_claim and idem_begin. */
static Datum
claim_common(FunctionCallInfo fcinfo, Interval *lease, bool in_transaction)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	bytea	   *cache_key = idem_digest_arg(fcinfo, 0, "cache_key");
	bytea	   *request_hash = idem_digest_arg(fcinfo, 1, "request_hash");
	MemoryContext outer = CurrentMemoryContext;
	ClaimAnswer answer = {0};
	Datum		result;

	answer.retry_after_us = -1;
	SPI_connect();
	claim_key(namespace, cache_key, request_hash, lease, in_transaction, &answer);
	count_claim_outcome(answer.outcome);
	result = claim_result(fcinfo, &answer, outer);
	SPI_finish();
	return result;
}

/*
 * idem_claim(cache_key, request_hash, lease): claim a key in a transaction
 * of its own (lease mode); the caller commits before running its handler.
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	Interval   *lease = idem_lease_argument(fcinfo, 2, "lease", false, idem_lease_ms);

	PG_RETURN_DATUM(claim_common(fcinfo, lease, false));
}

/*
 * idem_begin(cache_key, request_hash): claim a key inside the caller's
 * transaction (in-transaction mode).  Duplicates wait on the uncommitted
 * row; the deferred trigger idem_keys_claim_finished refuses to commit the
 * transaction until the claim is finalized, released or failed.
 */
Datum
idem_begin(PG_FUNCTION_ARGS)
{
	Interval   *lease = idem_lease_argument(fcinfo, 2, "lease", false, idem_lease_ms);

	PG_RETURN_DATUM(claim_common(fcinfo, lease, true));
}

/*
 * idem_lookup(cache_key, request_hash): what a claim would answer, without
 * writing; absent and claimable tell a polling follower to claim.
 */
Datum
idem_lookup(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	bytea	   *cache_key = idem_digest_arg(fcinfo, 0, "cache_key");
	bytea	   *request_hash = idem_digest_arg(fcinfo, 1, "request_hash");
	MemoryContext outer = CurrentMemoryContext;
	ClaimAnswer answer = {0};
	Datum		values[1];
	Datum		result;
	bool		ttl_passed;

	answer.retry_after_us = -1;
	values[0] = PointerGetDatum(cache_key);
	SPI_connect();
	if (idem_execute(&select_key, namespace, values, NULL, true, 1) == 0)
		answer.outcome = "absent";
	else
	{
		take_row(&answer);
		answer.outcome = follower_outcome(&answer, request_hash, &ttl_passed);
		if (answer.outcome == NULL)
			answer.outcome = "claimable";
	}
	result = claim_result(fcinfo, &answer, outer);
	SPI_finish();
	PG_RETURN_DATUM(result);
}

/* The (cache_key, claim_id) pair every fenced call starts with. */
static void
fence_args(FunctionCallInfo fcinfo, Datum *values)
{
	values[0] = PointerGetDatum(idem_digest_arg(fcinfo, 0, "cache_key"));
	idem_require_arg(fcinfo, 1, "claim_id");
	values[1] = PG_GETARG_DATUM(1);
}

/* Run one fenced write; the number of rows it changed (0 or 1). */
static int
fenced_write(FunctionCallInfo fcinfo, IdemStatement *stmt, Datum *values,
			 const char *nulls, Datum *returned, bool *returned_null)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	int			n;

	SPI_connect();
	n = idem_execute(stmt, namespace, values, nulls, false, 1);
	if (n == 1 && returned != NULL)
		*returned = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
								  1, returned_null);
	SPI_finish();
	return n;
}

/* Count a fenced write: done by the owner, or refused to a non-owner. */
static bool
count_fenced(int rows, IdemCounter done)
{
	idem_count(rows == 1 ? done : IDEM_STAT_LEASE_LOST, 1);
	return rows == 1;
}

/* idem_renew(cache_key, claim_id, lease): new expiry, NULL if not owned. */
Datum
idem_renew(PG_FUNCTION_ARGS)
{
	Datum		values[3];
	Datum		expires = (Datum) 0;
	bool		isnull = true;

	fence_args(fcinfo, values);
	values[2] = IntervalPGetDatum(idem_lease_argument(fcinfo, 2, "lease", false,
													  idem_lease_ms));
	/* timestamptz is pass-by-value, so it survives SPI_finish. */
	if (fenced_write(fcinfo, &renew_claim, values, NULL, &expires, &isnull) == 0 || isnull)
	{
		idem_count(IDEM_STAT_RENEW_LOST, 1);
		PG_RETURN_NULL();
	}
	idem_count(IDEM_STAT_RENEWED, 1);
	PG_RETURN_DATUM(expires);
}

/* Raise IL001: a strict caller's claim was stolen, finished or released. */
static void
report_lease_lost(FunctionCallInfo fcinfo, const char *action)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_LEASE_LOST),
			 errmsg("idempotency claim is no longer owned"),
			 errdetail("Could not %s: key %s is not pending under claim %s.",
					   action,
					   DatumGetCString(DirectFunctionCall1(byteaout, PG_GETARG_DATUM(0))),
					   DatumGetCString(DirectFunctionCall1(uuid_out, PG_GETARG_DATUM(1)))),
			 errhint("Roll back: the lease expired and another request now owns the key, or the claim was already finished.")));
}

/* Headers must be a JSON object of strings: that is what a replay sends. */
static void
check_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken token;

	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object"),
				 errdetail("Headers are stored as {\"name\": \"value\", ...}.")));

	it = JsonbIteratorInit(&headers->root);
	while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (token == WJB_VALUE && v.type != jbvString)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("header values must be JSON strings"),
					 errhint("Join repeated headers with \", \".")));
	}
}

/*
 * idem_finalize(cache_key, claim_id, status, headers, body, strict): store
 * the response of an owned claim.  False when not owned, or IL001 with
 * strict => true so that the caller's transaction, and with it the
 * handler's writes, rolls back.
 */
Datum
idem_finalize(PG_FUNCTION_ARGS)
{
	Datum		values[6];
	char		nulls[6];
	int32		status;
	bool		strict;
	bool		replayable = true;

	memset(nulls, ' ', sizeof(nulls));
	fence_args(fcinfo, values);
	idem_require_arg(fcinfo, 2, "status");
	status = PG_GETARG_INT32(2);
	if (status < 100 || status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status must be an HTTP status code between 100 and 599"),
				 errdetail("The status given is %d.", status)));
	idem_require_arg(fcinfo, 5, "strict");
	strict = PG_GETARG_BOOL(5);
	values[2] = Int32GetDatum(status);

	if (PG_ARGISNULL(3))
		nulls[3] = 'n';
	else
	{
		check_headers(PG_GETARG_JSONB_P(3));
		values[3] = PG_GETARG_DATUM(3);
	}

	if (PG_ARGISNULL(4))
	{
		/* No body (204, say) replays as an empty one. */
		bytea	   *empty = palloc(VARHDRSZ);

		SET_VARSIZE(empty, VARHDRSZ);
		values[4] = PointerGetDatum(empty);
	}
	else
	{
		bytea	   *body = PG_GETARG_BYTEA_PP(4);

		values[4] = PointerGetDatum(body);
		if (VARSIZE_ANY_EXHDR(body) > (Size) idem_max_response_bytes)
		{
			/* Too large to replay: remember that it completed, not what. */
			replayable = false;
			nulls[4] = 'n';
		}
	}
	values[5] = BoolGetDatum(replayable);

	if (fenced_write(fcinfo, &finalize_claim, values, nulls, NULL, NULL) == 1)
	{
		idem_count(IDEM_STAT_FINALIZED, 1);
		PG_RETURN_BOOL(true);
	}
	idem_count(IDEM_STAT_LEASE_LOST, 1);
	if (strict)
		report_lease_lost(fcinfo, "finalize");
	PG_RETURN_BOOL(false);
}

/* idem_release(cache_key, claim_id): claimable again at once, nothing cached. */
Datum
idem_release(PG_FUNCTION_ARGS)
{
	Datum		values[2];

	fence_args(fcinfo, values);
	PG_RETURN_BOOL(count_fenced(fenced_write(fcinfo, &release_claim, values, NULL, NULL, NULL),
								IDEM_STAT_RELEASED));
}

/*
 * idem_fail(cache_key, claim_id, cooldown): failed; until the cooldown
 * ends, claims of the same request get cooldown instead of re-running a
 * handler that just failed (this bounds retry amplification).
 */
Datum
idem_fail(PG_FUNCTION_ARGS)
{
	Datum		values[3];

	fence_args(fcinfo, values);
	values[2] = IntervalPGetDatum(idem_lease_argument(fcinfo, 2, "cooldown", true,
													  idem_failure_cooldown_ms));
	PG_RETURN_BOOL(count_fenced(fenced_write(fcinfo, &fail_claim, values, NULL, NULL, NULL),
								IDEM_STAT_FAILED));
}
