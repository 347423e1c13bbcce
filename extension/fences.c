/*-------------------------------------------------------------------------
 *
 * fences.c
 *	  The calls of a claim's owner: renew, finalize, release and fail.
 *
 * Every one names the claim_id it got from its claim and writes only
 * WHERE cache_key = $1 AND claim_id = $2 AND state = 'pending': a stale or
 * forged token changes nothing, also when the write waited for a newer
 * owner's (READ COMMITTED re-checks the predicate against the newest row
 * version).  The claim_id is an unguessable token returned only to the
 * winner, so it is the owner's capability: these calls need no scope, and
 * a claim made before an upgrade to scoped keys is still finished by its
 * owner.
 *
 * Finalize, release and fail change what followers wait for: they
 * register the key's wake-up channel, broadcast after their transaction
 * commits (wakeup.c).
 *
 *-------------------------------------------------------------------------
 */
#include "pg_idem.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_renew);
PG_FUNCTION_INFO_V1(idem_finalize);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_fail);

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

/* Wake the key's followers once this transaction commits. */
static void
wake_followers(Datum cache_key)
{
	bytea	   *key = DatumGetByteaPP(cache_key);

	idem_wake_after_commit(idem_wake_channel((const uint8 *) VARDATA_ANY(key)));
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
		wake_followers(values[0]);
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
	if (fenced_write(fcinfo, &release_claim, values, NULL, NULL, NULL) == 1)
		wake_followers(values[0]);
	else
		PG_RETURN_BOOL(count_fenced(0, IDEM_STAT_RELEASED));
	PG_RETURN_BOOL(count_fenced(1, IDEM_STAT_RELEASED));
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
	if (fenced_write(fcinfo, &fail_claim, values, NULL, NULL, NULL) == 1)
		wake_followers(values[0]);
	else
		PG_RETURN_BOOL(count_fenced(0, IDEM_STAT_FAILED));
	PG_RETURN_BOOL(count_fenced(1, IDEM_STAT_FAILED));
}
