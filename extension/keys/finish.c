/*-------------------------------------------------------------------------
 *
 * finish.c
 *	  The calls of a claim's owner: renew, finalize, release and fail.
 *
 * Every one names the claim_id it got from its claim and writes only the
 * key's row of the caller's scope (or the shared scope of rows from before
 * 0.3.0) that is pending under that claim_id (KEY_MATCH_OWNER): a stale or
 * forged token changes nothing, also when the write waited for a newer
 * owner's (the write then reads the newest version again).  The claim_id
 * is an unguessable token returned only to the winner, but a token that
 * leaks (a log line, a proxy) must not let another role finish the key:
 * the scope is checked as well, and a claim made before an upgrade to
 * scoped keys (a shared row) is still finished by its owner.
 *
 * Finalize, release and fail change what followers wait for: they
 * register the key's wake-up channel, broadcast after their transaction
 * commits (wakeup.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/errors.h"
#include "core/scope.h"
#include "core/settings.h"
#include "core/statements.h"
#include "core/stats.h"
#include "core/wakeup.h"
#include "keys/key_table.h"
#include "keys/lock_wait.h"

#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_renew);
PG_FUNCTION_INFO_V1(idem_finalize);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_fail);

/* The (cache_key, claim_id) pair every fenced call starts with. */
static void
check_fence_args(FunctionCallInfo fcinfo)
{
	(void) idem_digest_arg(fcinfo, 0, "cache_key");
	idem_require_arg(fcinfo, 1, "claim_id");
}

/* How an owner's call changes its row. */
typedef void (*FenceChange) (KeyRow *row, const void *arg);

/*
 * Run one fenced write: find the key's row pending under claim_id, change
 * it, write it.  If a concurrent transaction changed the row first (the
 * owner's own renew from another session, a steal), read it again: the
 * fence decides on the newest version.  False when no row is owned.
 */
static bool
fenced_write(FunctionCallInfo fcinfo, FenceChange change, const void *arg, KeyRow *row)
{
	bytea	   *cache_key = PG_GETARG_BYTEA_PP(0);
	Oid			namespace = idem_function_namespace(fcinfo);
	KeyOwner	owner;
	KeyTable   *table;
	bool		written = false;

	owner.claim_id = PG_GETARG_UUID_P(1);
	owner.scope = idem_current_scope();
	table = key_table_open(namespace, DIRECT_UPDATE);
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (!key_table_read(table, cache_key, KEY_MATCH_OWNER, &owner, true, row))
			break;
		change(row, arg);
		if (key_table_update(table, row) == KEY_WRITTEN)
		{
			written = true;
			break;
		}
	}
	key_table_close(table);
	return written;
}

/* Wake the key's followers once this transaction commits. */
static void
wake_followers(FunctionCallInfo fcinfo)
{
	bytea	   *key = PG_GETARG_BYTEA_PP(0);

	idem_wake_after_commit(idem_wake_channel((const uint8 *) VARDATA_ANY(key)));
}

/* Count a fenced write: done by the owner, or refused to a non-owner. */
static bool
count_fenced(bool written, IdemCounter done)
{
	idem_count(written ? done : IDEM_STAT_LEASE_LOST, 1);
	return written;
}

/* Renew: the lease runs for lease from now. */
static void
renew_change(KeyRow *row, const void *arg)
{
	row->lease_expires_at = idem_time_plus(GetCurrentTimestamp(), (Interval *) arg);
}

/*
 * idem_renew(cache_key, claim_id, lease, lock_wait): new expiry, NULL if
 * not owned.  lock_wait bounds a wait on a concurrent take-over's lock on
 * the key (lock_wait.c): a lease keeper must not outwait its own lease.
 */
Datum
idem_renew(PG_FUNCTION_ARGS)
{
	Interval   *lease;
	KeyRow		row;
	int			lock_wait;
	bool		owned;

	check_fence_args(fcinfo);
	lease = idem_lease_argument(fcinfo, 2, "lease", false, idem_lease_ms);
	lock_wait = idem_lock_wait_apply(fcinfo, 3);
	owned = fenced_write(fcinfo, renew_change, lease, &row);
	idem_lock_wait_restore(lock_wait);
	if (!owned)
	{
		idem_count(IDEM_STAT_RENEW_LOST, 1);
		PG_RETURN_NULL();
	}
	idem_count(IDEM_STAT_RENEWED, 1);
	PG_RETURN_TIMESTAMPTZ(row.lease_expires_at);
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

/* What a finalize stores. */
typedef struct Response
{
	int32		status;
	Datum		headers;		/* (Datum) 0: none */
	Datum		body;			/* (Datum) 0: too large to replay */
} Response;

/* Finalize: completed, with the response, the lease gone. */
static void
finalize_change(KeyRow *row, const void *arg)
{
	const Response *response = arg;

	row->state = IDEM_KEY_COMPLETED;
	row->has_status = true;
	row->response_status = response->status;
	row->headers_null = response->headers == (Datum) 0;
	row->response_headers = response->headers;
	row->body_null = response->body == (Datum) 0;
	row->response_body = response->body;
	row->replayable = !row->body_null;
	row->has_finished = true;
	row->finished_at = GetCurrentTimestamp();
	row->has_lease = false;
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
	Response	response;
	bool		strict;
	KeyRow		row;

	check_fence_args(fcinfo);
	idem_require_arg(fcinfo, 2, "status");
	response.status = PG_GETARG_INT32(2);
	if (response.status < 100 || response.status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("status must be an HTTP status code between 100 and 599"),
				 errdetail("The status given is %d.", response.status)));
	idem_require_arg(fcinfo, 5, "strict");
	strict = PG_GETARG_BOOL(5);

	response.headers = (Datum) 0;
	if (!PG_ARGISNULL(3))
	{
		check_headers(PG_GETARG_JSONB_P(3));
		response.headers = PG_GETARG_DATUM(3);
	}

	if (PG_ARGISNULL(4))
	{
		/* No body (204, say) replays as an empty one. */
		bytea	   *empty = palloc(VARHDRSZ);

		SET_VARSIZE(empty, VARHDRSZ);
		response.body = PointerGetDatum(empty);
	}
	else
	{
		bytea	   *body = PG_GETARG_BYTEA_PP(4);

		/* Too large to replay: remember that it completed, not what. */
		response.body = VARSIZE_ANY_EXHDR(body) > (Size) idem_max_response_bytes ?
			(Datum) 0 : PointerGetDatum(body);
	}

	if (fenced_write(fcinfo, finalize_change, &response, &row))
	{
		wake_followers(fcinfo);
		idem_count(IDEM_STAT_FINALIZED, 1);
		PG_RETURN_BOOL(true);
	}
	idem_count(IDEM_STAT_LEASE_LOST, 1);
	if (strict)
		report_lease_lost(fcinfo, "finalize");
	PG_RETURN_BOOL(false);
}

/*
 * Release: the key's row becomes a tombstone (key_row_make_tombstone), so
 * that any request may claim it at once.  Deleting the row would lose the
 * key's place in the generation order: an insert draws its generation
 * before it checks the key, so a claimant that drew its generation before
 * the release and inserted after it would hand out an older generation
 * than the released claim's.  With the row kept, that claimant conflicts,
 * reads the tombstone and takes it over with a freshly drawn generation.
 */
static void
release_change(KeyRow *row, const void *arg)
{
	key_row_make_tombstone(row);
}

/* idem_release(cache_key, claim_id): claimable again at once, nothing cached. */
Datum
idem_release(PG_FUNCTION_ARGS)
{
	KeyRow		row;
	bool		written;

	check_fence_args(fcinfo);
	written = fenced_write(fcinfo, release_change, NULL, &row);

	if (written)
		wake_followers(fcinfo);
	PG_RETURN_BOOL(count_fenced(written, IDEM_STAT_RELEASED));
}

/* Fail: failed, the cooldown running from now. */
static void
fail_change(KeyRow *row, const void *arg)
{
	TimestampTz now = GetCurrentTimestamp();

	row->state = IDEM_KEY_FAILED;
	row->lease_expires_at = idem_time_plus(now, (Interval *) arg);
	row->has_finished = true;
	row->finished_at = now;
}

/*
 * idem_fail(cache_key, claim_id, cooldown): failed; until the cooldown
 * ends, claims of the same request get cooldown instead of re-running a
 * handler that just failed (this bounds retry amplification).
 */
Datum
idem_fail(PG_FUNCTION_ARGS)
{
	Interval   *cooldown;
	KeyRow		row;
	bool		written;

	check_fence_args(fcinfo);
	cooldown = idem_lease_argument(fcinfo, 2, "cooldown", true, idem_failure_cooldown_ms);
	written = fenced_write(fcinfo, fail_change, cooldown, &row);

	if (written)
		wake_followers(fcinfo);
	PG_RETURN_BOOL(count_fenced(written, IDEM_STAT_FAILED));
}
