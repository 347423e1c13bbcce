/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  Counters in shared memory, shown by the idem_stats view (stats.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_STATS_H
#define IDEM_CORE_STATS_H

/*
 * Counted per backend as events happen and added to
 * the shared counters only when the transaction commits.  The order here
 * is the order of the idem_stats view's rows.
 */
typedef enum IdemCounter
{
	/* claim outcomes (idem_claim and idem_begin) */
	IDEM_STAT_CLAIMED,
	IDEM_STAT_RECOVERED_TTL,
	IDEM_STAT_RECOVERED_ABANDONED,
	IDEM_STAT_REPLAY,
	IDEM_STAT_MISMATCH,
	IDEM_STAT_IN_PROGRESS,
	IDEM_STAT_COOLDOWN,
	IDEM_STAT_NOT_REPLAYABLE,
	IDEM_STAT_EXPIRED,
	IDEM_STAT_FOLLOWER_WAITS,	/* claims that waited in the server */
	IDEM_STAT_FOLLOWER_WAKEUPS, /* of their sleeps, those a commit ended */
	/* what owners did with their claims */
	IDEM_STAT_FINALIZED,
	IDEM_STAT_RELEASED,
	IDEM_STAT_FAILED,
	IDEM_STAT_LEASE_LOST,		/* finalize, release or fail by a non-owner */
	IDEM_STAT_RENEWED,
	IDEM_STAT_RENEW_LOST,
	IDEM_STAT_CLEANUP_DELETED,
	IDEM_STAT_CLEANUP_EXPIRED,
	IDEM_STAT_EVICTED,
	/* outbox */
	IDEM_STAT_OUTBOX_STAGED,
	IDEM_STAT_OUTBOX_CLAIMED,
	IDEM_STAT_OUTBOX_ACKED,
	IDEM_STAT_OUTBOX_ACK_STALE,
	IDEM_STAT_OUTBOX_NACKED,
	IDEM_STAT_OUTBOX_DEAD,
	IDEM_STAT_OUTBOX_PRUNED,
	/* inbox */
	IDEM_STAT_INBOX_PROCESS,
	IDEM_STAT_INBOX_DUPLICATE,
	IDEM_STAT_INBOX_DEAD,
	IDEM_STAT_INBOX_MISMATCH,
	IDEM_STAT_INBOX_DONE,
	IDEM_STAT_INBOX_RETRY,
	IDEM_STAT_INBOX_DEAD_LETTERED,
	IDEM_STAT_INBOX_REVIVED,
	IDEM_STAT_INBOX_PRUNED,
	/* attempts */
	IDEM_STAT_ATTEMPT_OPENED,
	IDEM_STAT_ATTEMPT_TRANSITIONS,
	IDEM_STAT_ATTEMPT_STALE,
	IDEM_STAT_NCOUNTERS
} IdemCounter;

extern void idem_stats_init(void);
extern void idem_count(IdemCounter counter, int64 n);

#endif							/* IDEM_CORE_STATS_H */
