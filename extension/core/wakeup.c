/*-------------------------------------------------------------------------
 *
 * wakeup.c
 *	  Sleeping until another transaction's commit may have changed what a
 *	  backend waits for: claim followers and outbox drainers.
 *
 * A fixed array of condition variables in shared memory, partitioned by
 * a 32-bit channel number (a hash of the database and the key).  A
 * backend that changes something a waiter may be waiting for registers
 * the channel with idem_wake_after_commit(); the transaction callback
 * broadcasts every registered channel at XACT_EVENT_COMMIT, which runs
 * after the commit is visible to new snapshots (ProcArrayEndTransaction
 * comes first), and never for a transaction that aborts or has not yet
 * committed.  So a waiter that is woken and re-reads with a fresh
 * snapshot always sees the change that woke it.
 *
 * Waiters follow the condition-variable protocol: prepare to sleep, check
 * (with a fresh snapshot), sleep, check again.  Waking on a channel that
 * several keys share only costs a spurious re-read.  Sleeps are bounded
 * (IDEM_WAKE_MAX_SLEEP_MS) so that a commit nobody broadcast (COMMIT
 * PREPARED in another session) delays a waiter at most that long.
 *
 * Without shared_preload_libraries there is no shared memory: a waiter
 * polls on its latch instead, 1 ms doubling to IDEM_WAKE_POLL_MAX_MS.
 *
 * A sleeper keeps its statement's snapshot, and with it the xmin horizon
 * that snapshot holds back: the statement around the call may read with
 * that snapshot after the wait returns (a function later in the same
 * target list, another portal of the implicit transaction, a cursor), and
 * nothing a C function can see from inside the statement proves it will
 * not, so clearing the backend's xmin would let VACUUM remove rows the
 * statement must still see (issue 24, item 7).  The horizon is held for
 * at most the wait (idem.max_wait, the caller's timeout).  The sleeper's
 * own re-reads take fresh snapshots that are released before each sleep,
 * and the catalog snapshot is dropped, so the wait holds back no more
 * than the statement already did.
 *
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/wakeup.h"
#include "core/preload.h"
#include "access/xact.h"
#include "miscadmin.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/wait_event.h"

/* Number of condition variables; a power of two. */
#define IDEM_WAKE_PARTITIONS	1024

/* Longest sleep between two checks with shared memory, in ms. */
#define IDEM_WAKE_MAX_SLEEP_MS	1000

/* The fallback poll without shared memory: 1 ms doubling to this. */
#define IDEM_WAKE_POLL_MAX_MS	50

typedef struct IdemWakeShared
{
	ConditionVariable cv[IDEM_WAKE_PARTITIONS];
} IdemWakeShared;

static IdemWakeShared *wake_shared = NULL;

/* Channels this transaction will broadcast when it commits. */
static uint32 *pending_channels = NULL;
static int	pending_count = 0;
static int	pending_size = 0;
static bool callback_registered = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Reserve the condition variables (PostgreSQL 15+: only in this hook). */
static void
wakeup_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(IdemWakeShared)));
}

/* Attach to the condition variables, creating them in the first process. */
static void
wakeup_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	wake_shared = ShmemInitStruct("pg_idem wakeup", sizeof(IdemWakeShared), &found);
	if (!found)
		for (i = 0; i < IDEM_WAKE_PARTITIONS; i++)
			ConditionVariableInit(&wake_shared->cv[i]);
	LWLockRelease(AddinShmemInitLock);
}

/* Broadcast the committed transaction's channels; forget them otherwise. */
static void
wakeup_xact_callback(XactEvent event, void *arg)
{
	int			i;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (wake_shared != NULL)
				for (i = 0; i < pending_count; i++)
					ConditionVariableBroadcast(&wake_shared->cv[pending_channels[i] %
																IDEM_WAKE_PARTITIONS]);
			pending_count = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* PREPARE: the commit comes later; waiters' bounded sleeps cover it. */
			pending_count = 0;
			break;
		default:
			break;
	}
}

/* Set up the shared part; called from _PG_init. */
void
idem_wakeup_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = wakeup_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = wakeup_shmem_startup;
}

/* The channel of a 32-byte key digest in the current database. */
uint32
idem_wake_channel(const uint8 *digest)
{
	uint32		h;

	memcpy(&h, digest, sizeof(h));
	return h ^ (uint32) MyDatabaseId;
}

/* The channel of a whole queue (e.g. the outbox) in the current database. */
uint32
idem_wake_queue_channel(uint32 queue)
{
	return (uint32) MyDatabaseId * 2654435761U + queue;
}

/*
 * Wake the waiters of channel once the current transaction commits.  A
 * channel registered twice is broadcast twice, which is harmless; the
 * list is bounded by what one transaction changes.
 */
void
idem_wake_after_commit(uint32 channel)
{
	if (!callback_registered)
	{
		RegisterXactCallback(wakeup_xact_callback, NULL);
		callback_registered = true;
	}
	if (pending_count > 0 && pending_channels[pending_count - 1] == channel)
		return;
	if (pending_count == pending_size)
	{
		int			new_size = pending_size == 0 ? 16 : pending_size * 2;

		pending_channels = pending_channels == NULL ?
			MemoryContextAlloc(TopMemoryContext, new_size * sizeof(uint32)) :
			repalloc(pending_channels, new_size * sizeof(uint32));
		pending_size = new_size;
	}
	pending_channels[pending_count++] = channel;
}

/*
 * Start waiting on channel: call before the first check, so that a
 * broadcast between the check and the sleep is not missed.
 */
void
idem_wake_prepare(IdemWaiter *waiter, uint32 channel)
{
	waiter->channel = channel;
	waiter->poll_ms = 1;
	if (wake_shared != NULL)
		ConditionVariablePrepareToSleep(&wake_shared->cv[channel % IDEM_WAKE_PARTITIONS]);
	else
		idem_warn_without_preload();	/* the wait will poll */
}

/*
 * Sleep until channel is broadcast, until is reached, or a bounded time
 * passes; the caller checks again either way.  True when a broadcast (or
 * the fallback poll) ended the sleep, false on a timeout.  Interrupts
 * (cancel, statement_timeout, terminate) are served inside; postmaster
 * death ends the process.
 */
bool
idem_wake_sleep(IdemWaiter *waiter, TimestampTz until)
{
	TimestampTz now = GetCurrentTimestamp();
	long		ms;

	CHECK_FOR_INTERRUPTS();
	ms = until > now ? (long) ((until - now + 999) / 1000) : 0;
	if (ms <= 0)
		return false;
	/* Only the catalog snapshot: the statement's one stays (see above). */
	InvalidateCatalogSnapshot();
	if (wake_shared != NULL)
		return !ConditionVariableTimedSleep(&wake_shared->cv[waiter->channel % IDEM_WAKE_PARTITIONS],
											Min(ms, IDEM_WAKE_MAX_SLEEP_MS),
											PG_WAIT_EXTENSION);
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 Min(ms, waiter->poll_ms), PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	waiter->poll_ms = Min(waiter->poll_ms * 2, IDEM_WAKE_POLL_MAX_MS);
	CHECK_FOR_INTERRUPTS();
	return false;
}

/* Stop waiting (also safe when idem_wake_prepare was not called). */
void
idem_wake_done(IdemWaiter *waiter)
{
	if (wake_shared != NULL)
		ConditionVariableCancelSleep();
}
