/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Counters in shared memory, shown by the idem_stats view.
 *
 * Every backend counts the events of its current transaction in local
 * memory and adds them to the shared counters only when the transaction
 * commits, so an aborted claim counts nothing (a claim that rolled back
 * never happened).  A subtransaction that aborts takes its own counts with
 * it.  The shared part follows pg_stat_statements: requested in
 * shmem_request_hook, initialised once under AddinShmemInitLock, updated
 * under a spinlock for a few additions only.
 *
 * Without shared_preload_libraries there is no shared memory: every
 * function works, counts are dropped, and the view says why it is empty.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/compat.h"
#include "core/stats.h"

#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idem_stats);
PG_FUNCTION_INFO_V1(idem_stats_reset);

/* The view's row names, in IdemCounter order (from the same list). */
static const char *const counter_names[] = {
#define IDEM_COUNTER_NAME(id, name) #name,
	IDEM_COUNTERS(IDEM_COUNTER_NAME)
#undef IDEM_COUNTER_NAME
};

StaticAssertDecl(lengthof(counter_names) == IDEM_STAT_NCOUNTERS,
				 "counter_names must name every IdemCounter");

/* Each outcome's counter; -1: the protocol does not count it. */
static const int outcome_counter[IDEM_NOUTCOMES] = {
#define IDEM_COUNTED(id, name) [IDEM_OUTCOME_##id] = IDEM_STAT_##id,
#define IDEM_UNCOUNTED(id, name) [IDEM_OUTCOME_##id] = -1,
	IDEM_COUNTED_OUTCOMES(IDEM_COUNTED)
	IDEM_UNCOUNTED_OUTCOMES(IDEM_UNCOUNTED)
#undef IDEM_COUNTED
#undef IDEM_UNCOUNTED
};

typedef struct IdemSharedStats
{
	slock_t		mutex;
	int64		counters[IDEM_STAT_NCOUNTERS];
	TimestampTz stats_reset;
} IdemSharedStats;

/* This transaction's counts, and a saved copy per open subtransaction. */
typedef struct PendingCounts
{
	int64		counters[IDEM_STAT_NCOUNTERS];
	bool		any;
} PendingCounts;

static IdemSharedStats *shared_stats = NULL;
static PendingCounts pending;
static PendingCounts *saved = NULL;		/* stack, one per subtransaction */
static int	saved_depth = 0;
static int	saved_size = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Reserve the shared counters (PostgreSQL 15+: only in this hook). */
static void
stats_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(IdemSharedStats)));
}

/* Attach to the shared counters, creating them in the first process. */
static void
stats_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared_stats = ShmemInitStruct("pg_idem stats", sizeof(IdemSharedStats), &found);
	if (!found)
	{
		SpinLockInit(&shared_stats->mutex);
		memset(shared_stats->counters, 0, sizeof(shared_stats->counters));
		shared_stats->stats_reset = GetCurrentTimestamp();
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Publish the transaction's counts when it commits; drop them otherwise. */
static void
stats_xact_callback(XactEvent event, void *arg)
{
	int			i;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			if (pending.any && shared_stats != NULL)
			{
				SpinLockAcquire(&shared_stats->mutex);
				for (i = 0; i < IDEM_STAT_NCOUNTERS; i++)
					shared_stats->counters[i] += pending.counters[i];
				SpinLockRelease(&shared_stats->mutex);
			}
			idem_fallthrough;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			memset(&pending, 0, sizeof(pending));
			saved_depth = 0;
			break;
		default:
			break;
	}
}

/* A subtransaction that aborts takes back what it counted. */
static void
stats_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	if (shared_stats == NULL)
		return;
	switch (event)
	{
		case SUBXACT_EVENT_START_SUB:
			if (saved_depth == saved_size)
			{
				int			new_size = saved_size == 0 ? 8 : saved_size * 2;

				saved = saved == NULL ?
					MemoryContextAlloc(TopMemoryContext, new_size * sizeof(PendingCounts)) :
					repalloc(saved, new_size * sizeof(PendingCounts));
				saved_size = new_size;
			}
			saved[saved_depth++] = pending;
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			if (saved_depth > 0)
				saved_depth--;
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			if (saved_depth > 0)
				pending = saved[--saved_depth];
			break;
		default:
			break;
	}
}

/* Set up the counters; called from _PG_init. */
void
idem_stats_init(void)
{
	if (process_shared_preload_libraries_in_progress)
	{
		prev_shmem_request_hook = shmem_request_hook;
		shmem_request_hook = stats_shmem_request;
		prev_shmem_startup_hook = shmem_startup_hook;
		shmem_startup_hook = stats_shmem_startup;
	}
	RegisterXactCallback(stats_xact_callback, NULL);
	RegisterSubXactCallback(stats_subxact_callback, NULL);
}

/* Count n events of one kind in the current transaction. */
void
idem_count(IdemCounter counter, int64 n)
{
	Assert(counter >= 0 && counter < IDEM_STAT_NCOUNTERS);
	if (shared_stats == NULL || n == 0)
		return;
	pending.counters[counter] += n;
	pending.any = true;
}

/* Count one claim outcome, if the protocol counts it. */
void
idem_count_outcome(IdemOutcome outcome)
{
	Assert(outcome >= 0 && outcome < IDEM_NOUTCOMES);
	if (outcome_counter[outcome] >= 0)
		idem_count((IdemCounter) outcome_counter[outcome], 1);
}

/* The view needs the shared counters: say clearly when there are none. */
static void
require_shared_stats(void)
{
	if (shared_stats == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem must be loaded via shared_preload_libraries"),
				 errdetail("Statistics live in shared memory, which is set up only at server start."),
				 errhint("Add pg_idem to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/* idem_stats(): one row per counter, copied out under the spinlock. */
Datum
idem_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int64		counters[IDEM_STAT_NCOUNTERS];
	TimestampTz reset;
	int			i;

	require_shared_stats();
	InitMaterializedSRF(fcinfo, 0);

	SpinLockAcquire(&shared_stats->mutex);
	memcpy(counters, shared_stats->counters, sizeof(counters));
	reset = shared_stats->stats_reset;
	SpinLockRelease(&shared_stats->mutex);

	for (i = 0; i < IDEM_STAT_NCOUNTERS; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = CStringGetTextDatum(counter_names[i]);
		values[1] = Int64GetDatum(counters[i]);
		values[2] = TimestampTzGetDatum(reset);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* idem_stats_reset(): zero every counter; returns the reset time. */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTimestamp();

	require_shared_stats();
	SpinLockAcquire(&shared_stats->mutex);
	memset(shared_stats->counters, 0, sizeof(shared_stats->counters));
	shared_stats->stats_reset = now;
	SpinLockRelease(&shared_stats->mutex);
	PG_RETURN_TIMESTAMPTZ(now);
}
