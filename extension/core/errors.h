/*-------------------------------------------------------------------------
 *
 * errors.h
 *	  pg_idem's own SQLSTATEs.  Class "IL" is implementation-defined (the
 *	  SQL standard reserves classes starting with 0-4 and A-H).
 *
 * Generated from extension/protocol/protocol.toml by extension/protocol/generate.py: do not edit.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_ERRORS_H
#define IDEM_CORE_ERRORS_H

#include "utils/elog.h"

/* idem_finalize(..., strict => true) when the claim is no longer owned (stolen, finished or released): roll back */
#define ERRCODE_IDEM_LEASE_LOST MAKE_SQLSTATE('I','L','0','0','1')
/* COMMIT of a transaction whose idem_begin claim was not finalized, released or failed; constraint idem_keys_claim_finished */
#define ERRCODE_IDEM_CLAIM_UNFINISHED MAKE_SQLSTATE('I','L','0','0','2')
/* COMMIT of a transaction that began an inbox message and neither marked it done nor recorded its failure; constraint idem_inbox_message_done */
#define ERRCODE_IDEM_MESSAGE_UNFINISHED MAKE_SQLSTATE('I','L','0','0','3')
/* idem_version_guard: the row's version is not the one the write expected (If-Match failed) */
#define ERRCODE_IDEM_STALE_VERSION MAKE_SQLSTATE('I','L','0','0','4')
/* an attempt transition (or a pointer move) the state machine does not allow */
#define ERRCODE_IDEM_ILLEGAL_TRANSITION MAKE_SQLSTATE('I','L','0','0','5')
/* COMMIT of a promotion without its outbox event; constraint idem_attempts_promotion_published */
#define ERRCODE_IDEM_PROMOTION_UNPUBLISHED MAKE_SQLSTATE('I','L','0','0','6')

#endif							/* IDEM_CORE_ERRORS_H */
