/*-------------------------------------------------------------------------
 *
 * claims.c
 *	  Single-flight claims of idempotency keys: claim, begin and lookup,
 *	  with the follower's wait in the server.
 *
 * The protocol stands on two facts of READ COMMITTED (see SCENARIOS.md):
 * INSERT ... ON CONFLICT DO NOTHING waits for an in-flight inserter of the
 * same key and then does nothing if it committed, and an UPDATE re-checks
 * its WHERE clause against the newest row version after waiting.  So the
 * claim reads the key, decides, and then writes with a statement whose
 * predicate re-states the decision; if the key changed in between, the
 * write touches nothing and the claim reads again.  The calls after the
 * claim (fences.c) are fenced by the claim_id token.
 *
 * Keys are scoped (scope.c): a claim reads and writes only its caller's
 * row of a cache key, or a row written before scopes existed (scope '').
 *
 * A key's whole life has two horizons.  For idem.ttl after its claim a
 * finished key replays its response; after that the response is gone and
 * a retry is answered "expired" (idem.after_ttl = 'refuse', the default)
 * or runs again as "recovered_ttl" ('rerun').  The key's fingerprint
 * stays until idem.tombstone_ttl, when the cleanup deletes the row; a
 * retry after that is a new key.  A pending key is never reused for
 * another request, however old: only the same request recovers it.
 *
 * A follower may wait in the server (max_wait): while the key is in
 * progress (and, once it waited for it, while the failed winner's
 * cooldown runs), the claim sleeps on the key's wake-up channel
 * (wakeup.c), which the winner's finalize, release or fail broadcasts
 * after it commits, and re-reads with a fresh snapshot; it also wakes when
 * the lease or the cooldown ends.  It holds no lock while it sleeps.
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
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_claim);
PG_FUNCTION_INFO_V1(idem_begin);
PG_FUNCTION_INFO_V1(idem_lookup);

/*
 * How often a claim re-reads a key that changed under it before giving up
 * with a retryable error.  Each retry means another session won a race on
 * this very key, so a handful is plenty.  Waiting does not count.
 */
#define CLAIM_MAX_ATTEMPTS 16

/* The polling hint an in-progress answer gives: at most this long. */
#define IN_PROGRESS_HINT_US (1000 * USECS_PER_MSEC)

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
	ROW_REPLAYABLE,
	ROW_SCOPE
};

/* The caller's row of the key, or else a row from before scopes ($2, ''). */
static IdemStatement select_key = {
	"SELECT state, request_hash, lease_expires_at, created_at,"
	" response_status, response_headers, response_body, replayable, scope"
	" FROM @extschema@.idem_keys"
	" WHERE cache_key = $1 AND (scope = $2 OR scope = '')"
	" ORDER BY scope DESC LIMIT 1",
	2, {BYTEAOID, TEXTOID},
	"SELECT state, request_hash, lease_expires_at, created_at,"
	" response_status, response_headers, response_body, replayable, ''::text"
	" FROM @extschema@.idem_keys WHERE cache_key = $1 AND $2 IS NOT NULL"
};

/*
 * Parameters of the three claim writes: key, hash, claim_id, lease,
 * in_transaction, sequence, ttl, generation base, scope.
 */
#define CLAIM_ARGS {BYTEAOID, BYTEAOID, UUIDOID, INTERVALOID, BOOLOID, \
					REGCLASSOID, INTERVALOID, INT8OID, TEXTOID}
#define CLAIM_NARGS 9

static IdemStatement insert_claim = {
	"INSERT INTO @extschema@.idem_keys AS k"
	" (cache_key, scope, state, request_hash, claim_id, generation,"
	"  lease_expires_at, created_at, in_transaction)"
	" VALUES ($1, $9, 'pending', $2, $3, nextval($6) + $8,"
	"  clock_timestamp() + $4, clock_timestamp(), $5)"
	" ON CONFLICT (cache_key, scope) DO NOTHING"
	" RETURNING generation, lease_expires_at",
	CLAIM_NARGS, CLAIM_ARGS,
	"INSERT INTO @extschema@.idem_keys AS k"
	" (cache_key, state, request_hash, claim_id, generation,"
	"  lease_expires_at, created_at, in_transaction)"
	" SELECT $1, 'pending', $2, $3, nextval($6) + $8,"
	"  clock_timestamp() + $4, clock_timestamp(), $5 WHERE $9 IS NOT NULL"
	" ON CONFLICT (cache_key) DO NOTHING"
	" RETURNING generation, lease_expires_at"
};

/* The new owner's row, written by both kinds of recovery. */
#define RECLAIM_SET \
	"UPDATE @extschema@.idem_keys SET state = 'pending', request_hash = $2," \
	" claim_id = $3, generation = nextval($6) + $8," \
	" lease_expires_at = clock_timestamp() + $4, created_at = clock_timestamp()," \
	" finished_at = NULL, response_status = NULL, response_headers = NULL," \
	" response_body = NULL, replayable = true, in_transaction = $5"

/* An abandoned claim or an elapsed cooldown, taken over by the same request. */
static IdemStatement steal_claim = {
	RECLAIM_SET
	" WHERE cache_key = $1 AND scope = $9 AND state IN ('pending', 'failed')"
	" AND lease_expires_at < clock_timestamp()"
	" AND (request_hash = $2 OR request_hash IS NULL)"
	" RETURNING generation, lease_expires_at",
	CLAIM_NARGS, CLAIM_ARGS,
	RECLAIM_SET
	" WHERE cache_key = $1 AND $9 IS NOT NULL AND state IN ('pending', 'failed')"
	" AND lease_expires_at < clock_timestamp()"
	" AND (request_hash = $2 OR request_hash IS NULL)"
	" RETURNING generation, lease_expires_at"
};

/*
 * A finished key past idem.ttl, reused whatever the request (after_ttl =
 * 'rerun').  Never a pending key: a crashed winner's key is only ever
 * recovered by the same request (steal_claim).
 */
static IdemStatement recover_ttl_claim = {
	RECLAIM_SET
	" WHERE cache_key = $1 AND scope = $9 AND created_at < clock_timestamp() - $7"
	" AND (state IN ('completed', 'expired')"
	"      OR (state = 'failed' AND lease_expires_at < clock_timestamp()))"
	" RETURNING generation, lease_expires_at",
	CLAIM_NARGS, CLAIM_ARGS,
	RECLAIM_SET
	" WHERE cache_key = $1 AND $9 IS NOT NULL AND created_at < clock_timestamp() - $7"
	" AND (state = 'completed'"
	"      OR (state = 'failed' AND lease_expires_at < clock_timestamp()))"
	" RETURNING generation, lease_expires_at"
};

/* What the row tells a request, before any write. */
typedef enum Verdict
{
	VERDICT_ANSWER,				/* a follower's answer: outcome is set */
	VERDICT_WAITABLE,			/* in_progress or cooldown: may wait */
	VERDICT_STEAL,				/* take over with steal_claim */
	VERDICT_RECOVER_TTL			/* take over with recover_ttl_claim */
} Verdict;

/* What a claim found, decided, and will answer. */
typedef struct ClaimAnswer
{
	const char *outcome;
	pg_uuid_t  *claim_id;		/* winners only */
	Datum		generation;
	Datum		lease_expires_at;
	bool		has_lease;		/* lease_expires_at is set */
	TimestampTz lease_end;		/* waitable rows: when the lease or cooldown ends */
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

/*
 * What is added to the sequence's value to make a generation:
 * (timeline - 1) << 40.  After a promotion the new primary is on a higher
 * timeline, so its generations are above every one the old primary can
 * have handed out, even those an asynchronous standby never received.
 * 2^40 generations per timeline is more than any key space will use.
 */
static int64
generation_base(void)
{
	TimeLineID	tli = GetWALInsertionTimeLine();

	return tli > 1 ? ((int64) (tli - 1)) << 40 : 0;
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

/* Was the row released or evicted (a tombstone: no request hash)? */
static bool
is_tombstone(ClaimAnswer *answer)
{
	bool		isnull;

	(void) row_value(answer, ROW_REQUEST_HASH, &isnull);
	return isnull;
}

/* A finished key past idem.ttl: expired, or reused when after_ttl = 'rerun'. */
static Verdict
after_ttl(ClaimAnswer *answer)
{
	if (idem_after_ttl == IDEM_AFTER_TTL_RERUN)
	{
		answer->outcome = "recovered_ttl";
		return VERDICT_RECOVER_TTL;
	}
	answer->outcome = "expired";
	return VERDICT_ANSWER;
}

/*
 * The decision table: what the row says to this request, without
 * writing.  Sets answer->outcome (for a take-over, the winner's outcome).
 */
static Verdict
decide(ClaimAnswer *answer, bytea *request_hash)
{
	bool		isnull;
	char	   *state = TextDatumGetCString(row_value(answer, ROW_STATE, &isnull));
	TimestampTz created_at = DatumGetTimestampTz(row_value(answer, ROW_CREATED_AT, &isnull));
	Datum		lease = row_value(answer, ROW_LEASE_EXPIRES_AT, &isnull);
	bool		lease_null = isnull;
	bool		ttl_passed;
	bool		same = hash_matches(answer, request_hash);
	int64		left = lease_null ? 0 : remaining_us(DatumGetTimestampTz(lease));

	ttl_passed = GetCurrentTimestamp() - created_at > (int64) idem_ttl_s * USECS_PER_SEC;

	if (strcmp(state, "completed") == 0)
	{
		if (ttl_passed)
			return after_ttl(answer);
		if (!same)
			answer->outcome = "mismatch";
		else
			answer->outcome = DatumGetBool(row_value(answer, ROW_REPLAYABLE, &isnull)) ?
				"replay" : "not_replayable";
		return VERDICT_ANSWER;
	}
	if (strcmp(state, "expired") == 0)
		return after_ttl(answer);

	/* pending or failed: a lease or a cooldown, live or over */
	if (left > 0)
	{
		if (!same)
		{
			answer->outcome = "mismatch";
			return VERDICT_ANSWER;
		}
		answer->has_lease = true;
		answer->lease_expires_at = lease;
		answer->lease_end = DatumGetTimestampTz(lease);
		if (strcmp(state, "pending") == 0)
		{
			answer->outcome = "in_progress";
			answer->retry_after_us = Min(left, IN_PROGRESS_HINT_US);
		}
		else
		{
			answer->outcome = "cooldown";
			answer->retry_after_us = left;
		}
		return VERDICT_WAITABLE;
	}

	/* Over: a released or evicted key (no hash) is simply claimed. */
	if (is_tombstone(answer))
	{
		answer->outcome = "claimed";
		return VERDICT_STEAL;
	}
	if (same)
	{
		answer->outcome = "recovered_abandoned";
		return VERDICT_STEAL;
	}
	if (strcmp(state, "failed") == 0 && ttl_passed)
		return after_ttl(answer);
	answer->outcome = "mismatch";
	return VERDICT_ANSWER;
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
	answer->retry_after_us = -1;
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

/* Read the caller's row of the key into answer; false when there is none. */
static bool
read_key(Oid namespace, Datum key, Datum scope, bool read_only, ClaimAnswer *answer)
{
	Datum		values[2];

	values[0] = key;
	values[1] = scope;
	if (idem_execute(&select_key, namespace, values, NULL, read_only, 1) == 0)
		return false;
	answer->row = SPI_tuptable->vals[0];
	answer->row_desc = SPI_tuptable->tupdesc;
	return true;
}

/* Start an answer afresh for another read. */
static void
reset_answer(ClaimAnswer *answer)
{
	memset(answer, 0, sizeof(*answer));
	answer->retry_after_us = -1;
}

/*
 * The claim loop shared by idem_claim and idem_begin: read the key, decide,
 * write with a predicate that re-checks the decision, and read again if a
 * concurrent session changed the key first.  With a wait deadline, an
 * in-progress or cooling-down key is waited for (see the file header).
 */
static void
claim_key(Oid namespace, bytea *cache_key, bytea *request_hash, Interval *lease,
		  bool in_transaction, TimestampTz deadline, ClaimAnswer *answer)
{
	pg_uuid_t  *claim_id = new_claim_id();
	text	   *scope = idem_current_scope();
	Datum		values[CLAIM_NARGS];
	char		nulls[CLAIM_NARGS];
	int			attempts = 0;
	IdemWaiter	waiter;
	bool		waiting = false;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = PointerGetDatum(cache_key);
	values[1] = PointerGetDatum(request_hash);
	values[2] = UUIDPGetDatum(claim_id);
	values[3] = IntervalPGetDatum(lease);
	values[4] = BoolGetDatum(in_transaction);
	values[5] = ObjectIdGetDatum(generation_sequence(namespace));
	values[6] = IntervalPGetDatum(idem_ms_interval((int64) idem_ttl_s * 1000));
	values[7] = Int64GetDatum(generation_base());
	values[8] = PointerGetDatum(scope);

	while (attempts < CLAIM_MAX_ATTEMPTS)
	{
		Verdict		verdict;
		bool		isnull;

		CHECK_FOR_INTERRUPTS();
		reset_answer(answer);

		if (!read_key(namespace, values[0], values[8], false, answer))
		{
			values[8] = PointerGetDatum(scope);
			if (idem_execute(&insert_claim, namespace, values, nulls, false, 1) == 1)
			{
				won(answer, "claimed", claim_id);
				break;
			}
			attempts++;
			continue;			/* someone inserted it first: read theirs */
		}

		verdict = decide(answer, request_hash);

		/*
		 * A request that arrives during a cooldown is answered at once: the
		 * cooldown bounds retries of a handler that just failed.  Only a
		 * follower that was already waiting for the winner waits it out.
		 */
		if (verdict == VERDICT_WAITABLE && deadline != 0 && !waiting &&
			strcmp(answer->outcome, "cooldown") == 0)
			break;
		if (verdict == VERDICT_WAITABLE && deadline != 0 &&
			GetCurrentTimestamp() < deadline)
		{
			if (!waiting)
			{
				/* Prepare first, then check again: no broadcast is missed. */
				idem_wake_prepare(&waiter, idem_wake_channel((const uint8 *) VARDATA_ANY(cache_key)));
				waiting = true;
				idem_count(IDEM_STAT_FOLLOWER_WAITS, 1);
				continue;
			}
			SPI_freetuptable(SPI_tuptable);
			if (idem_wake_sleep(&waiter, Min(deadline, answer->lease_end + USECS_PER_MSEC)))
				idem_count(IDEM_STAT_FOLLOWER_WAKEUPS, 1);
			continue;
		}
		if (verdict == VERDICT_ANSWER || verdict == VERDICT_WAITABLE)
			break;

		/* A take-over, of the row we read (the caller's or a legacy one). */
		{
			const char *outcome = answer->outcome;

			values[8] = row_value(answer, ROW_SCOPE, &isnull);
			if (take_over(verdict == VERDICT_RECOVER_TTL ? &recover_ttl_claim : &steal_claim,
						  namespace, values, nulls))
			{
				won(answer, outcome, claim_id);
				break;
			}
		}
		/* The key changed between our read and our write: read it again. */
		attempts++;
	}

	if (waiting)
		idem_wake_done(&waiter);
	if (attempts >= CLAIM_MAX_ATTEMPTS)
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
		{"expired", IDEM_STAT_EXPIRED},
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
		nulls[RESULT_CLAIM_ID] = nulls[RESULT_GENERATION] = false;
	}
	if (answer->has_lease)
	{
		values[RESULT_LEASE_EXPIRES_AT] = answer->lease_expires_at;
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
		 strcmp(answer->outcome, "not_replayable") == 0 ||
		 strcmp(answer->outcome, "expired") == 0))
	{
		values[RESULT_RESPONSE_STATUS] =
			row_value(answer, ROW_RESPONSE_STATUS, &nulls[RESULT_RESPONSE_STATUS]);
		if (strcmp(answer->outcome, "expired") != 0)
		{
			values[RESULT_RESPONSE_HEADERS] =
				row_value(answer, ROW_RESPONSE_HEADERS, &nulls[RESULT_RESPONSE_HEADERS]);
			values[RESULT_RESPONSE_BODY] =
				row_value(answer, ROW_RESPONSE_BODY, &nulls[RESULT_RESPONSE_BODY]);
		}
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

/*
 * The wait deadline of a max_wait argument (0: no wait).  Bounded by the
 * superuser setting idem.max_wait (clamped to it); waiting needs READ COMMITTED, where
 * every re-read sees what committed meanwhile.
 */
static TimestampTz
wait_deadline(FunctionCallInfo fcinfo, int argno)
{
	int64		usecs;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return 0;
	usecs = idem_interval_usecs(PG_GETARG_INTERVAL_P(argno));
	if (usecs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_wait must be zero or positive"),
				 errdetail("The max_wait given is negative.")));
	/* Clamped, not refused: a follower asking for more waits what is allowed. */
	usecs = Min(usecs, (int64) idem_max_wait_ms * USECS_PER_MSEC);
	if (usecs == 0)
		return 0;
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("max_wait needs a READ COMMITTED transaction"),
				 errdetail("Under REPEATABLE READ or SERIALIZABLE a waiting claim could never see the winner's commit."),
				 errhint("Claim outside an explicit transaction, or pass max_wait => NULL.")));
	return GetCurrentTimestamp() + usecs;
}

/* Shared body of idem_claim and idem_begin. */
static Datum
claim_common(FunctionCallInfo fcinfo, bool in_transaction)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	bytea	   *cache_key = idem_digest_arg(fcinfo, 0, "cache_key");
	bytea	   *request_hash = idem_digest_arg(fcinfo, 1, "request_hash");
	Interval   *lease = idem_lease_argument(fcinfo, 2, "lease", false, idem_lease_ms);
	TimestampTz deadline = wait_deadline(fcinfo, 3);
	MemoryContext outer = CurrentMemoryContext;
	ClaimAnswer answer;
	Datum		result;

	SPI_connect();
	claim_key(namespace, cache_key, request_hash, lease, in_transaction, deadline, &answer);
	count_claim_outcome(answer.outcome);
	result = claim_result(fcinfo, &answer, outer);
	SPI_finish();
	return result;
}

/*
 * idem_claim(cache_key, request_hash, lease, max_wait): claim a key in a
 * transaction of its own (lease mode); the caller commits before running
 * its handler.  A follower may wait up to max_wait for the winner.
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	PG_RETURN_DATUM(claim_common(fcinfo, false));
}

/*
 * idem_begin(cache_key, request_hash, lease, max_wait): claim a key inside
 * the caller's transaction (in-transaction mode).  Duplicates wait on the
 * uncommitted row; the deferred trigger idem_keys_claim_finished refuses
 * to commit the transaction until the claim is finalized, released or
 * failed.
 */
Datum
idem_begin(PG_FUNCTION_ARGS)
{
	PG_RETURN_DATUM(claim_common(fcinfo, true));
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
	Datum		scope = PointerGetDatum(idem_current_scope());
	MemoryContext outer = CurrentMemoryContext;
	ClaimAnswer answer;
	Datum		result;

	reset_answer(&answer);
	SPI_connect();
	if (!read_key(namespace, PointerGetDatum(cache_key), scope, true, &answer))
		answer.outcome = "absent";
	else if (decide(&answer, request_hash) >= VERDICT_STEAL)
	{
		answer.outcome = "claimable";
		answer.has_lease = false;
	}
	result = claim_result(fcinfo, &answer, outer);
	SPI_finish();
	PG_RETURN_DATUM(result);
}
