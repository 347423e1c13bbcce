/*-------------------------------------------------------------------------
 *
 * errors.h
 *	  pg_idem's own SQLSTATEs.  Class "IL" is implementation-defined (the
 *	  SQL standard reserves classes starting with 0-4 and A-H).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_ERRORS_H
#define IDEM_CORE_ERRORS_H

#include "utils/elog.h"

#define ERRCODE_IDEM_LEASE_LOST			MAKE_SQLSTATE('I','L','0','0','1')
#define ERRCODE_IDEM_CLAIM_UNFINISHED	MAKE_SQLSTATE('I','L','0','0','2')
#define ERRCODE_IDEM_MESSAGE_UNFINISHED	MAKE_SQLSTATE('I','L','0','0','3')
#define ERRCODE_IDEM_STALE_VERSION		MAKE_SQLSTATE('I','L','0','0','4')
#define ERRCODE_IDEM_ILLEGAL_TRANSITION	MAKE_SQLSTATE('I','L','0','0','5')
#define ERRCODE_IDEM_PROMOTION_UNPUBLISHED	MAKE_SQLSTATE('I','L','0','0','6')

#endif							/* IDEM_CORE_ERRORS_H */
