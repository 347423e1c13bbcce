/*-------------------------------------------------------------------------
 *
 * lock_wait.h
 *	  The lock_wait argument of idem_claim, idem_begin and idem_renew
 *	  (lock_wait.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYS_LOCK_WAIT_H
#define IDEM_KEYS_LOCK_WAIT_H

#include "fmgr.h"

/* What idem_lock_wait_apply returns when the call keeps the session's lock_timeout. */
#define IDEM_LOCK_WAIT_NONE (-1)

extern int	idem_lock_wait_apply(FunctionCallInfo fcinfo, int argno);
extern void idem_lock_wait_restore(int nest_level);

#endif							/* IDEM_KEYS_LOCK_WAIT_H */
