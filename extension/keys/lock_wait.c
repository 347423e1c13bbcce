/*-------------------------------------------------------------------------
 *
 * lock_wait.c
 *	  The lock_wait argument of idem_claim, idem_begin and idem_renew: the
 *	  longest each wait for another transaction's lock on the key may last.
 *
 * A claim waits on another transaction's lock when that transaction
 * inserted the key and has not committed yet (an idem_begin's handler
 * still running, as INSERT ... ON CONFLICT waits) or holds the key's row
 * (a take-over, a renew, a finalize in flight).  A client bounds that wait
 * by the time it has left to answer.  Up to 0.5.0 the clients did so by
 * wrapping the call in set_config('lock_timeout', ...) and, for
 * idem_begin in the caller's transaction, setting it back in the same
 * statement; lock_wait is that, stated once, in the server.
 *
 * The value is applied as lock_timeout for the call only, at a GUC nest
 * level of its own, as a function's SET clause is (fmgr's
 * fmgr_security_definer): idem_lock_wait_restore puts the caller's
 * setting back when the call returns, and the abort of the (sub)
 * transaction does when the call fails (a lock timeout included).  So
 * the handler that runs after idem_begin in the same transaction runs
 * with its own lock_timeout.
 *
 *   NULL      no budget of the call's own: the session's lock_timeout
 *   0         no waiting: a lock held by another transaction fails the
 *             call with 55P03 after a millisecond (lock_timeout's unit;
 *             its own 0 would mean no limit), as max_wait 0 does not wait
 *   positive  each lock wait at most this long, rounded up to whole
 *             milliseconds; then 55P03 (lock_not_available), which the
 *             clients answer as a request still in progress
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "core/arguments.h"
#include "keys/lock_wait.h"

#include "utils/guc.h"

/*
 * Apply the lock_wait argument argno, if given: returns the GUC nest level
 * to hand to idem_lock_wait_restore, or IDEM_LOCK_WAIT_NONE.  A SQL
 * definition from before 0.6.0 passes fewer arguments: none.
 */
int
idem_lock_wait_apply(FunctionCallInfo fcinfo, int argno)
{
	int64		usecs;
	int64		ms;
	int			nest_level;
	char		value[32];

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return IDEM_LOCK_WAIT_NONE;
	usecs = idem_interval_usecs(PG_GETARG_INTERVAL_P(argno));
	if (usecs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock_wait must be zero or positive"),
				 errdetail("The lock_wait given is negative."),
				 errhint("Pass NULL to keep the session's lock_timeout.")));
	ms = (usecs + USECS_PER_MSEC - 1) / USECS_PER_MSEC;
	ms = Max(ms, 1);
	ms = Min(ms, (int64) INT_MAX);
	snprintf(value, sizeof(value), INT64_FORMAT "ms", ms);

	nest_level = NewGUCNestLevel();
	(void) set_config_option("lock_timeout", value, PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return nest_level;
}

/* Put the caller's lock_timeout back after a call that applied lock_wait. */
void
idem_lock_wait_restore(int nest_level)
{
	if (nest_level != IDEM_LOCK_WAIT_NONE)
		AtEOXact_GUC(true, nest_level);
}
