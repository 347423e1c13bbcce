/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  Counters in shared memory, shown by the idem_stats view (stats.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_STATS_H
#define IDEM_CORE_STATS_H

#include "core/protocol.h"

/*
 * Every counter, once: X(ID, name), in the order of the idem_stats view's
 * rows.  The claim outcomes come first, one per counted outcome of the
 * protocol (protocol.h), under the outcome's own name.
 */
#define IDEM_OTHER_COUNTERS(X) \
	X(FOLLOWER_WAITS, follower_waits)	/* claims that waited in the server */ \
	X(FOLLOWER_WAKEUPS, follower_wakeups)	/* of their sleeps, those a commit ended */ \
	/* what owners did with their claims */ \
	X(FINALIZED, finalized) \
	X(RELEASED, released) \
	X(FAILED, failed) \
	X(LEASE_LOST, lease_lost)	/* finalize, release or fail by a non-owner */ \
	X(RENEWED, renewed) \
	X(RENEW_LOST, renew_lost) \
	X(CLEANUP_DELETED, cleanup_deleted) \
	X(CLEANUP_EXPIRED, cleanup_expired) \
	X(EVICTED, evicted) \
	/* outbox */ \
	X(OUTBOX_STAGED, outbox_staged) \
	X(OUTBOX_CLAIMED, outbox_claimed) \
	X(OUTBOX_ACKED, outbox_acked) \
	X(OUTBOX_ACK_STALE, outbox_ack_stale) \
	X(OUTBOX_NACKED, outbox_nacked) \
	X(OUTBOX_DEAD, outbox_dead) \
	X(OUTBOX_PRUNED, outbox_pruned) \
	/* inbox */ \
	X(INBOX_PROCESS, inbox_process) \
	X(INBOX_DUPLICATE, inbox_duplicate) \
	X(INBOX_DEAD, inbox_dead) \
	X(INBOX_MISMATCH, inbox_mismatch) \
	X(INBOX_DONE, inbox_done) \
	X(INBOX_RETRY, inbox_retry) \
	X(INBOX_DEAD_LETTERED, inbox_dead_lettered) \
	X(INBOX_REVIVED, inbox_revived) \
	X(INBOX_PRUNED, inbox_pruned) \
	/* attempts */ \
	X(ATTEMPT_OPENED, attempt_opened) \
	X(ATTEMPT_TRANSITIONS, attempt_transitions) \
	X(ATTEMPT_STALE, attempt_stale)

#define IDEM_COUNTERS(X) \
	IDEM_COUNTED_OUTCOMES(X) \
	IDEM_OTHER_COUNTERS(X)

typedef enum IdemCounter
{
#define IDEM_COUNTER_ENUM(id, name) IDEM_STAT_##id,
	IDEM_COUNTERS(IDEM_COUNTER_ENUM)
#undef IDEM_COUNTER_ENUM
	IDEM_STAT_NCOUNTERS
} IdemCounter;

extern void idem_stats_init(void);
extern void idem_count(IdemCounter counter, int64 n);
extern void idem_count_outcome(IdemOutcome outcome);

#endif							/* IDEM_CORE_STATS_H */
