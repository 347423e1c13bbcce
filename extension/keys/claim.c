/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  Single-flight claims of idempotency keys: claim, begin and lookup,
 *	  with the follower's wait in the server.
 *
 * The protocol stands on two facts of READ COMMITTED: INSERT ... ON
 * CONFLICT DO NOTHING waits for an in-flight inserter of the same key and
 * then does nothing if it committed (inserts if it aborted), and an UPDATE
 * re-checks its WHERE clause against the newest row version after waiting
 * (EvalPlanQual).  So the
 * claim reads the key, decides, and then writes with a statement whose
 * predicate re-states the decision; if the key changed in between, the
 * write touches nothing and the claim reads again.  The calls after the
 * claim (finish.c, renew) are fenced by the claim_id token.
 *
 * Keys are scoped (scope.c): a claim reads and writes only its caller's
 * row of a cache key, or a row written before scopes existed (the shared
 * scope).
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
#include "postgres.h"

#include "core/arguments.h"
#include "core/scope.h"
#include "core/sequences.h"
#include "core/settings.h"
#include "core/statements.h"
#include "core/stats.h"
#include "core/wakeup.h"
#include "keys/key_table.h"
#include "keys/lock_wait.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
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

/* What the row tells a request, before any write. */
typedef enum Verdict
{
	VERDICT_ANSWER,				/* a follower's answer: outcome is set */
	VERDICT_WAITABLE,			/* in_progress or cooldown: may wait */
	VERDICT_STEAL,				/* an abandoned claim or a tombstone: take it over */
	VERDICT_RECOVER_TTL			/* a finished key past idem.ttl: reuse it */
} Verdict;

/* What a claim found, decided, and will answer. */
typedef struct ClaimAnswer
{
	IdemOutcome outcome;
	pg_uuid_t  *claim_id;		/* winners only */
	int64		generation;
	TimestampTz lease_expires_at;
	bool		has_lease;		/* lease_expires_at is set */
	int64		retry_after_us; /* < 0: none */
	bool		has_row;		/* row: what a follower's answer comes from */
	KeyRow		row;
} ClaimAnswer;

/* What a winner writes: the claim's parameters. */
typedef struct ClaimRequest
{
	bytea	   *cache_key;
	bytea	   *request_hash;
	Oid			scope;
	Interval   *lease;
	bool		in_transaction;
	pg_uuid_t  *claim_id;
} ClaimRequest;

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
 * What is added to the sequence's value to make a generation:
 * (timeline - 1) << 40.  After a promotion the new primary is on a higher
 * timeline, so its generations are above every one the old primary can
 * have handed out, even those an asynchronous standby never received.
 * 2^40 generations per timeline is more than any key space will use.
 */
static int64
generation_base(void)
{
	TimeLineID	tli;

	/*
	 * The insertion timeline is undefined during recovery (and asserted
	 * against); next_generation's nextval refuses a standby first.
	 */
	if (RecoveryInProgress())
		elog(ERROR, "pg_idem cannot hand out a generation during recovery");
	tli = GetWALInsertionTimeLine();

	return tli > 1 ? ((int64) (tli - 1)) << 40 : 0;
}

/*
 * The generation of a new owner of row (a new key's row has generation 0).
 * The sequence value is drawn first, in a statement of its own: on a
 * standby (or in any read-only transaction) nextval refuses with 25006,
 * and only then may generation_base() read the WAL insertion timeline,
 * which is not defined during recovery.
 *
 * After a logical-replication cut-over the sequence starts below the
 * replicated generations (core/sequences.c): while it is young, when the
 * row taken over is not below the value drawn, or once a subscription
 * copies it (19), the sequence is caught up and the value drawn again.  A
 * take-over's generation is above the row's in any case, so the new owner
 * passes every fence the old one set.
 */
static int64
next_generation(KeyTable *table, const KeyRow *row)
{
	int64		sequence_value = key_table_next_generation(table);
	int64		generation = sequence_value + generation_base();

	if ((sequence_value <= IDEM_YOUNG_SEQUENCE || generation <= row->generation ||
		 idem_generations_subscribed(direct_namespace(table))) &&
		idem_generations_catch_up(direct_namespace(table), generation))
		generation = key_table_next_generation(table) + generation_base();
	return Max(generation, row->generation + 1);
}

/*
 * The winner's row: pending under the new claim, its lease starting now,
 * nothing of an earlier owner's response left.  Written by a new key's
 * insert and by both kinds of take-over.  The generation is drawn before
 * the write, as the SQL statements drew nextval() (see idem_release in
 * finish.c for why the order matters).
 */
static void
own_row(KeyTable *table, KeyRow *row, ClaimRequest *req)
{
	TimestampTz now = GetCurrentTimestamp();

	/* Drawn at the first write: a follower's answer needs no token. */
	if (req->claim_id == NULL)
		req->claim_id = new_claim_id();
	row->state = IDEM_KEY_PENDING;
	row->request_hash = req->request_hash;
	row->claim_id = req->claim_id;
	row->generation = next_generation(table, row);
	row->has_lease = true;
	row->lease_expires_at = idem_time_plus(now, req->lease);
	row->created_at = now;
	row->has_finished = false;
	row->has_status = false;
	row->headers_null = true;
	row->body_null = true;
	row->replayable = true;
	row->in_transaction = req->in_transaction;
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
hash_matches(const KeyRow *row, bytea *request_hash)
{
	if (row->request_hash == NULL)
		return true;
	return VARSIZE_ANY_EXHDR(row->request_hash) == VARSIZE_ANY_EXHDR(request_hash) &&
		memcmp(VARDATA_ANY(row->request_hash), VARDATA_ANY(request_hash),
			   VARSIZE_ANY_EXHDR(request_hash)) == 0;
}

/* A finished key past idem.ttl: expired, or reused when after_ttl = 'rerun'. */
static Verdict
after_ttl(ClaimAnswer *answer)
{
	if (idem_after_ttl == IDEM_AFTER_TTL_RERUN)
	{
		answer->outcome = IDEM_OUTCOME_RECOVERED_TTL;
		return VERDICT_RECOVER_TTL;
	}
	answer->outcome = IDEM_OUTCOME_EXPIRED;
	return VERDICT_ANSWER;
}

/*
 * The decision table: what the row says to this request, without
 * writing.  Sets answer->outcome (for a take-over, the winner's outcome).
 * A take-over then rewrites exactly the version decided on: if another
 * session changed the key meanwhile, the write changes nothing and the
 * claim reads and decides again (key_table_update).
 */
static Verdict
decide(ClaimAnswer *answer, bytea *request_hash)
{
	const KeyRow *row = &answer->row;
	bool		same = hash_matches(row, request_hash);
	int64		left = row->has_lease ? remaining_us(row->lease_expires_at) : 0;
	bool		ttl_passed;

	ttl_passed = GetCurrentTimestamp() - row->created_at > (int64) idem_ttl_s * USECS_PER_SEC;

	if (row->state == IDEM_KEY_COMPLETED)
	{
		if (ttl_passed)
			return after_ttl(answer);
		if (!same)
			answer->outcome = IDEM_OUTCOME_MISMATCH;
		else
			answer->outcome = row->replayable ? IDEM_OUTCOME_REPLAY : IDEM_OUTCOME_NOT_REPLAYABLE;
		return VERDICT_ANSWER;
	}
	if (row->state == IDEM_KEY_EXPIRED)
		return after_ttl(answer);

	/* pending or failed: a lease or a cooldown, live or over */
	if (left > 0)
	{
		if (!same)
		{
			answer->outcome = IDEM_OUTCOME_MISMATCH;
			return VERDICT_ANSWER;
		}
		answer->has_lease = true;
		answer->lease_expires_at = row->lease_expires_at;
		if (row->state == IDEM_KEY_PENDING)
		{
			answer->outcome = IDEM_OUTCOME_IN_PROGRESS;
			answer->retry_after_us = Min(left, IN_PROGRESS_HINT_US);
		}
		else
		{
			answer->outcome = IDEM_OUTCOME_COOLDOWN;
			answer->retry_after_us = left;
		}
		return VERDICT_WAITABLE;
	}

	/* Over: a released or evicted key (no hash) is simply claimed. */
	if (row->request_hash == NULL)
	{
		answer->outcome = IDEM_OUTCOME_CLAIMED;
		return VERDICT_STEAL;
	}
	if (same)
	{
		answer->outcome = IDEM_OUTCOME_RECOVERED_ABANDONED;
		return VERDICT_STEAL;
	}
	if (row->state == IDEM_KEY_FAILED && ttl_passed)
		return after_ttl(answer);
	answer->outcome = IDEM_OUTCOME_MISMATCH;
	return VERDICT_ANSWER;
}

/* Fill the winner's part of the answer from the row it wrote. */
static void
won(ClaimAnswer *answer, IdemOutcome outcome, const KeyRow *row)
{
	answer->outcome = outcome;
	answer->claim_id = row->claim_id;
	answer->generation = row->generation;
	answer->lease_expires_at = row->lease_expires_at;
	answer->has_lease = true;
	answer->retry_after_us = -1;
	answer->has_row = false;
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
 * write the version decided on, and read again if a concurrent session
 * changed the key first.  With a wait deadline, an in-progress or
 * cooling-down key is waited for (see the file header).
 */
static void
claim_key(Oid namespace, ClaimRequest *req, TimestampTz deadline,
		  ClaimAnswer *answer)
{
	KeyTable   *table = key_table_open(namespace, DIRECT_READ);
	int			attempts = 0;
	IdemWaiter	waiter;
	bool		waiting = false;

	while (attempts < CLAIM_MAX_ATTEMPTS)
	{
		Verdict		verdict;
		IdemOutcome outcome;
		KeyWrite	written;
		KeyRow	   *row = &answer->row;

		CHECK_FOR_INTERRUPTS();
		reset_answer(answer);

		if (!key_table_read(table, req->cache_key, KEY_MATCH_SCOPE, &req->scope, true, row))
		{
			memset(row, 0, sizeof(*row));
			row->cache_key = req->cache_key;
			row->scope = req->scope;
			own_row(table, row, req);
			written = key_table_insert(table, row);
			if (written == KEY_WRITTEN)
			{
				won(answer, IDEM_OUTCOME_CLAIMED, row);
				break;
			}
			if (written == KEY_STALE)
				table = key_table_reopen(table, namespace);
			else
				attempts++;		/* someone inserted it first: read theirs */
			continue;
		}
		answer->has_row = true;
		verdict = decide(answer, req->request_hash);

		/*
		 * A request that arrives during a cooldown is answered at once: the
		 * cooldown bounds retries of a handler that just failed.  Only a
		 * follower that was already waiting for the winner waits it out.
		 */
		if (verdict == VERDICT_WAITABLE && deadline != 0 && !waiting &&
			answer->outcome == IDEM_OUTCOME_COOLDOWN)
			break;
		if (verdict == VERDICT_WAITABLE && deadline != 0 &&
			GetCurrentTimestamp() < deadline)
		{
			if (!waiting)
			{
				/* Prepare first, then check again: no broadcast is missed. */
				idem_wake_prepare(&waiter, idem_wake_channel((const uint8 *) VARDATA_ANY(req->cache_key)));
				waiting = true;
				idem_count(IDEM_STAT_FOLLOWER_WAITS, 1);
				continue;
			}
			if (idem_wake_sleep(&waiter, Min(deadline, answer->lease_expires_at + USECS_PER_MSEC)))
				idem_count(IDEM_STAT_FOLLOWER_WAKEUPS, 1);
			continue;
		}
		if (verdict == VERDICT_ANSWER || verdict == VERDICT_WAITABLE)
			break;

		/*
		 * A take-over of the row we read (the caller's, or one from before
		 * scopes, which keeps its scope).
		 */
		outcome = answer->outcome;
		own_row(table, row, req);
		written = key_table_update(table, row);
		if (written == KEY_WRITTEN)
		{
			won(answer, outcome, row);
			break;
		}
		if (written == KEY_STALE)
			table = key_table_reopen(table, namespace);
		else
			attempts++;			/* the key changed between our read and our write */
	}

	if (waiting)
		idem_wake_done(&waiter);
	key_table_close(table);
	if (attempts >= CLAIM_MAX_ATTEMPTS)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not claim idempotency key: it changed concurrently %d times",
						CLAIM_MAX_ATTEMPTS),
				 errhint("The transaction might succeed if retried.")));
}

/* Build the idem_claim_result row. */
static Datum
claim_result(FunctionCallInfo fcinfo, ClaimAnswer *answer)
{
	Oid			result_type = get_fn_expr_rettype(fcinfo->flinfo);
	TupleDesc	tupdesc;
	Datum		values[RESULT_NATTS];
	bool		nulls[RESULT_NATTS];
	const KeyRow *row = &answer->row;
	Datum		result;

	/* The type cache's descriptor of idem_claim_result: no copy per call. */
	if (!OidIsValid(result_type))
		result_type = get_func_rettype(fcinfo->flinfo->fn_oid);
	tupdesc = lookup_rowtype_tupdesc(result_type, -1);
	if (tupdesc->natts != RESULT_NATTS)
		elog(ERROR, "pg_idem: idem_claim_result has %d columns, expected %d",
			 tupdesc->natts, RESULT_NATTS);

	memset(nulls, true, sizeof(nulls));
	values[RESULT_OUTCOME] = CStringGetTextDatum(idem_outcomes[answer->outcome].name);
	nulls[RESULT_OUTCOME] = false;

	if (answer->claim_id != NULL)
	{
		values[RESULT_CLAIM_ID] = UUIDPGetDatum(answer->claim_id);
		values[RESULT_GENERATION] = Int64GetDatum(answer->generation);
		nulls[RESULT_CLAIM_ID] = nulls[RESULT_GENERATION] = false;
	}
	if (answer->has_lease)
	{
		values[RESULT_LEASE_EXPIRES_AT] = TimestampTzGetDatum(answer->lease_expires_at);
		nulls[RESULT_LEASE_EXPIRES_AT] = false;
	}
	if (answer->retry_after_us >= 0)
	{
		Interval   *retry_after = palloc0(sizeof(Interval));

		retry_after->time = answer->retry_after_us;
		values[RESULT_RETRY_AFTER] = IntervalPGetDatum(retry_after);
		nulls[RESULT_RETRY_AFTER] = false;
	}
	if (answer->has_row && idem_outcomes[answer->outcome].response)
	{
		values[RESULT_RESPONSE_STATUS] = Int32GetDatum(row->response_status);
		nulls[RESULT_RESPONSE_STATUS] = !row->has_status;
		/* Past idem.ttl only the status is told, even before cleanup drops the rest. */
		if (answer->outcome != IDEM_OUTCOME_EXPIRED)
		{
			values[RESULT_RESPONSE_HEADERS] = row->response_headers;
			nulls[RESULT_RESPONSE_HEADERS] = row->headers_null;
			values[RESULT_RESPONSE_BODY] = row->response_body;
			nulls[RESULT_RESPONSE_BODY] = row->body_null;
		}
	}

	/*
	 * A response body TOASTed out of line is read as a TOAST pointer;
	 * HeapTupleGetDatum flattens the row, fetching it.
	 */
	result = HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
	ReleaseTupleDesc(tupdesc);
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

/*
 * Shared body of idem_claim and idem_begin.  lock_wait (lock_wait.c)
 * bounds the claim's waits on another transaction's lock on the key; the
 * caller's lock_timeout is back once the claim is decided.
 */
static Datum
claim_common(FunctionCallInfo fcinfo, bool in_transaction)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	ClaimRequest req;
	TimestampTz deadline;
	ClaimAnswer answer;
	int			lock_wait;

	req.cache_key = idem_digest_arg(fcinfo, 0, "cache_key");
	req.request_hash = idem_digest_arg(fcinfo, 1, "request_hash");
	req.lease = idem_lease_argument(fcinfo, 2, "lease", false, idem_lease_ms);
	deadline = wait_deadline(fcinfo, 3);
	req.in_transaction = in_transaction;
	req.scope = idem_current_scope();
	req.claim_id = NULL;

	lock_wait = idem_lock_wait_apply(fcinfo, 4);
	claim_key(namespace, &req, deadline, &answer);
	idem_lock_wait_restore(lock_wait);
	idem_count_outcome(answer.outcome);
	return claim_result(fcinfo, &answer);
}

/*
 * idem_claim(cache_key, request_hash, lease, max_wait, lock_wait): claim a
 * key in a transaction of its own (lease mode); the caller commits before
 * running its handler.  A follower may wait up to max_wait for the winner;
 * each wait on another transaction's lock on the key lasts at most
 * lock_wait.
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	PG_RETURN_DATUM(claim_common(fcinfo, false));
}

/*
 * idem_begin(cache_key, request_hash, lease, max_wait, lock_wait): claim a
 * key inside the caller's transaction (in-transaction mode).  Duplicates
 * wait on the uncommitted row (at most lock_wait); the deferred trigger
 * idem_keys_claim_finished refuses to commit the transaction until the
 * claim is finalized, released or failed.
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
	Oid			scope = idem_current_scope();
	KeyTable   *table;
	ClaimAnswer answer;

	reset_answer(&answer);
	table = key_table_open(namespace, DIRECT_READ);
	if (!key_table_read(table, cache_key, KEY_MATCH_SCOPE, &scope, false, &answer.row))
		answer.outcome = IDEM_OUTCOME_ABSENT;
	else
	{
		answer.has_row = true;
		if (decide(&answer, request_hash) >= VERDICT_STEAL)
		{
			answer.outcome = IDEM_OUTCOME_CLAIMABLE;
			answer.has_lease = false;
		}
	}
	key_table_close(table);
	PG_RETURN_DATUM(claim_result(fcinfo, &answer));
}
