/*-------------------------------------------------------------------------
 *
 * arguments.c
 *	  The checks every SQL-callable function applies to its arguments, and
 *	  the duration arithmetic they share.
 *
 * Durations are validated here once, so that no function can be handed
 * a lease of zero, a negative lease or one of years and quietly turn it
 * into "no expiry".
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/hashing.h"
#include "core/settings.h"

#include "common/int.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"


/*
 * A duration in the units the documentation and SHOW use: the largest of
 * d, h, min, s, ms that divides it exactly ("1h", "90s", "1500ms").
 */
char *
idem_format_ms(int64 ms)
{
	static const struct
	{
		int64		ms;
		const char *unit;
	}			units[] = {
		{24 * 60 * 60 * 1000, "d"}, {60 * 60 * 1000, "h"}, {60 * 1000, "min"},
		{1000, "s"}, {1, "ms"},
	};
	int			i;

	for (i = 0; i < (int) lengthof(units); i++)
	{
		if (ms != 0 && ms % units[i].ms == 0)
			return psprintf(INT64_FORMAT "%s", ms / units[i].ms, units[i].unit);
	}
	return psprintf(INT64_FORMAT "ms", ms);
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
int64
idem_interval_usecs(const Interval *span)
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

/* ts + span, as timestamptz + interval computes it in SQL. */
TimestampTz
idem_time_plus(TimestampTz ts, Interval *span)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(ts),
												   IntervalPGetDatum(span)));
}

/* An interval's length in microseconds for a message, in the docs' units. */
static char *
format_usecs(int64 usecs)
{
	if (usecs == PG_INT64_MAX)
		return pstrdup("over 290000 years");	/* saturated by interval_usecs */
	if (usecs % USECS_PER_MSEC == 0)
		return idem_format_ms(usecs / USECS_PER_MSEC);
	return psprintf("%.3fms", (double) usecs / USECS_PER_MSEC);
}

/*
 * Validate a lease or cooldown argument and normalise it to a pure
 * duration.  NULL means the setting given as default_ms.  The bound is
 * idem.max_lease, checked for the default too: the settings' check hooks
 * cannot see every combination (values applied at session start come in
 * no particular order), so this check stays.
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
		usecs = idem_interval_usecs(PG_GETARG_INTERVAL_P(argno));

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
				 errmsg("%s must not exceed idem.max_lease (%s)", what,
						idem_format_ms(idem_max_lease_ms)),
				 (PG_NARGS() <= argno || PG_ARGISNULL(argno)) ?
				 errdetail("No %s was given, and the default is %s.", what, format_usecs(usecs)) :
				 errdetail("The %s given is %s.", what, format_usecs(usecs)),
				 errhint("Renew a lease while the work runs instead of asking for a long one.")));

	{
		Interval   *result = palloc0(sizeof(Interval));

		result->time = usecs;
		return result;
	}
}

/*
 * Refuse a NULL argument by name: a NULL never becomes a silent default.
 * The detail names the function (every bad input gets one); a call made
 * from C without a function (no flinfo) names only the argument.
 */
void
idem_require_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	char	   *function = NULL;

	if (!PG_ARGISNULL(argno))
		return;
	if (fcinfo->flinfo != NULL && OidIsValid(fcinfo->flinfo->fn_oid))
		function = get_func_name(fcinfo->flinfo->fn_oid);
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be null", name),
			 function != NULL ?
			 errdetail("Argument %d of %s, %s, is null.", argno + 1, function, name) :
			 errdetail("Argument %d, %s, is null.", argno + 1, name)));
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
