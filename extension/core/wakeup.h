/*-------------------------------------------------------------------------
 *
 * wakeup.h
 *	  Sleeping until another transaction's commit (wakeup.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_WAKEUP_H
#define IDEM_CORE_WAKEUP_H

#include "datatype/timestamp.h"

/*
 * Waking waiters after a commit: claim followers wait on their
 * key's channel, drainers on their queue's.
 */
typedef struct IdemWaiter
{
	uint32		channel;
	int			poll_ms;		/* the fallback poll's next sleep */
} IdemWaiter;

/* Queues with a channel of their own (idem_wake_queue_channel). */
#define IDEM_WAKE_QUEUE_OUTBOX	1

extern void idem_wakeup_init(void);
extern uint32 idem_wake_channel(const uint8 *digest);
extern uint32 idem_wake_queue_channel(uint32 queue);
extern void idem_wake_after_commit(uint32 channel);
extern void idem_wake_prepare(IdemWaiter *waiter, uint32 channel);
extern bool idem_wake_sleep(IdemWaiter *waiter, TimestampTz until);
extern void idem_wake_done(IdemWaiter *waiter);

#endif							/* IDEM_CORE_WAKEUP_H */
