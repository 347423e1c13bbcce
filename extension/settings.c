/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  The idem.* settings and the checks every function applies to its
 *	  arguments.
 *
 * Durations are validated here once, so that no function can be handed
 * a lease of zero, a negative lease or one of years and quietly turn it
 * into "no expiry".
 *
 *-------------------------------------------------------------------------
 */
#include "pg_idem.h"

#include "common/int.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

int			idem_lease_ms = 30 * 1000;
int			idem_max_lease_ms = 60 * 60 * 1000;
int			idem_ttl_s = 24 * 60 * 60;
int			idem_failure_cooldown_ms = 2 * 1000;
int			idem_max_response_bytes = 2 * 1024 * 1024;

/* Shortest lease accepted: anything shorter expires before it is read. */
#define IDEM_MIN_LEASE_MS 1

/* Register the idem.* settings; called from _PG_init. */
void
idem_define_settings(void)
{
	DefineCustomIntVariable("idem.lease",
							"Default lease of a claim (1ms .. idem.max_lease).",
							"Used when idem_claim or idem_renew is given no lease.",
							&idem_lease_ms,
							30 * 1000, IDEM_MIN_LEASE_MS, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_lease",
							"Longest lease or cooldown a caller may ask for (1ms .. 24 days).",
							NULL,
							&idem_max_lease_ms,
							60 * 60 * 1000, IDEM_MIN_LEASE_MS, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	/*
	 * Superuser only: a session that shortened it could take over, or
	 * clean up, other requests' finished keys.
	 */
	DefineCustomIntVariable("idem.ttl",
							"How long a finished key is kept and replayed (1s .. 68 years).",
							"Older finished keys are reclaimed by new requests and deleted by idem_cleanup.",
							&idem_ttl_s,
							24 * 60 * 60, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.failure_cooldown",
							"Default cooldown after idem_fail (0 .. idem.max_lease).",
							"During the cooldown, claims of the same request get the outcome cooldown.",
							&idem_failure_cooldown_ms,
							2 * 1000, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_response_bytes",
							"Largest response body stored for replay (0 .. 1GB; 1GB: any body, a bytea holds less).",
							"A larger body is recorded as completed but not replayable.",
							&idem_max_response_bytes,
							2 * 1024 * 1024, 0, 1024 * 1024 * 1024,
							PGC_USERSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

/* A pure duration of ms milliseconds, for the lease arithmetic in SQL. */
Interval *
idem_ms_interval(int64 ms)
{
	Interval   *result = palloc0(sizeof(Interval));

	result->time = ms * USECS_PER_MSEC;
	return result;
}

/*
 * Exact length of an interval in microseconds, with a month counted as 30
 * days and a day as 24 hours (as EXTRACT(epoch) does), saturated to
 * PG_INT64_MIN or PG_INT64_MAX on overflow so that a huge negative
 * interval is still reported as negative.
 */
static int64
interval_usecs(const Interval *span)
{
	int64		days;
	int64		day_usecs;
	int64		usecs;

	days = (int64) span->month * DAYS_PER_MONTH + span->day;
	if (pg_mul_s64_overflow(days, USECS_PER_DAY, &day_usecs))
		return days < 0 ? PG_INT64_MIN : PG_INT64_MAX;
	if (pg_add_s64_overflow(day_usecs, span->time, &usecs))
		return day_usecs < 0 ? PG_INT64_MIN : PG_INT64_MAX;
	return usecs;
}

/*
 * Validate a lease or cooldown argument and normalise it to a pure
 * duration.  NULL means the setting given as default_ms.  The bound is
 * idem.max_lease, checked for the default too, so that a setting raised
 * by a session cannot exceed what the superuser allows.
 */
Interval *
idem_lease_argument(FunctionCallInfo fcinfo, int argno, const char *what,
					bool allow_zero, int default_ms)
{
	int64		usecs;
	int64		min_usecs = allow_zero ? 0 : IDEM_MIN_LEASE_MS * USECS_PER_MSEC;
	int64		max_usecs = (int64) idem_max_lease_ms * USECS_PER_MSEC;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		usecs = (int64) default_ms * USECS_PER_MSEC;
	else
		usecs = interval_usecs(PG_GETARG_INTERVAL_P(argno));

	if (usecs < min_usecs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be %s", what,
						allow_zero ? "zero or positive" : "at least 1 millisecond"),
				 errdetail("The %s given is %s.", what,
						   usecs < 0 ? "negative" : usecs == 0 ? "zero" : "shorter than 1 millisecond")));
	if (usecs > max_usecs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not exceed idem.max_lease", what),
				 errdetail("idem.max_lease is %d ms.", idem_max_lease_ms),
				 errhint("Renew a lease while the work runs instead of asking for a long one.")));

	{
		Interval   *result = palloc0(sizeof(Interval));

		result->time = usecs;
		return result;
	}
}

/* Refuse a NULL argument by name: a NULL never becomes a silent default. */
void
idem_require_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/* A non-NULL bytea argument that must be a 32-byte SHA-256 digest. */
bytea *
idem_digest_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	bytea	   *digest;

	idem_require_arg(fcinfo, argno, name);
	digest = PG_GETARG_BYTEA_PP(argno);
	if (VARSIZE_ANY_EXHDR(digest) != IDEM_DIGEST_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a 32-byte SHA-256 digest", name),
				 errdetail("The value given is %d bytes long.",
						   (int) VARSIZE_ANY_EXHDR(digest)),
				 errhint("Compute it with idem_key() or idem_request_hash().")));
	return digest;
}
