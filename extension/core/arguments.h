/*-------------------------------------------------------------------------
 *
 * arguments.h
 *	  Argument checks and durations shared by the SQL-callable functions
 *	  (arguments.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_ARGUMENTS_H
#define IDEM_CORE_ARGUMENTS_H

#include "fmgr.h"
#include "utils/timestamp.h"

#ifndef USECS_PER_MSEC
#define USECS_PER_MSEC INT64CONST(1000)
#endif

/* Shortest lease accepted: anything shorter expires before it is read. */
#define IDEM_MIN_LEASE_MS 1

extern Interval *idem_lease_argument(FunctionCallInfo fcinfo, int argno,
									 const char *what, bool allow_zero,
									 int default_ms);
extern void idem_require_arg(FunctionCallInfo fcinfo, int argno, const char *name);
extern bytea *idem_digest_arg(FunctionCallInfo fcinfo, int argno, const char *name);

extern Interval *idem_ms_interval(int64 ms);
extern int64 idem_interval_usecs(const Interval *span);
extern TimestampTz idem_time_plus(TimestampTz ts, Interval *span);
extern char *idem_format_ms(int64 ms);

#endif							/* IDEM_CORE_ARGUMENTS_H */
