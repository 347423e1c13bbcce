/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The cleanup worker: deletes expired keys and prunes finished outbox
 *	  events, inbox messages and attempts in one database, so that no cron
 *	  job is needed; first, it records the inbox failures that sessions
 *	  handed over and no delivery adopted.
 *
 * Started by the launcher (launcher.c) once per pass and database, with
 * the database's OID as its argument.  It looks pg_idem up in the catalog
 * and exits at once where it is not installed; otherwise it runs each job
 * in batches of idem.cleanup_batch, one transaction per batch, so that no
 * pass holds locks or a snapshot for long, and exits.  An error in a job
 * is reported: that job stops for the pass, the others go on.
 *
 * After a full batch it sleeps idem.cleanup_delay before the next one, as
 * autovacuum's cost delay paces a vacuum: a backlog cleaned back to back
 * takes a core the requests need (on 2 cores the claims' p99 went to 2.6 x
 * quiet at 1 M keys, and a CPU burner alone did most of that).  The sleep
 * waits on the latch, so SIGTERM, SIGHUP (a new delay applies to the sleep
 * in progress) and the postmaster's death are answered at once.  Sleeps
 * never carry a pass past half of idem.cleanup_database_timeout: the
 * launcher would stop the worker there with a WARNING meant for a stuck
 * one.  The jobs take turns, a batch each, so that a backlog of keys does
 * not hold up the pruning of the other tables, and a job with nothing to
 * do leaves the pass's time to those with a backlog (a fixed share per
 * job capped a pass at 66 of its 100 batches of keys at the defaults, and
 * the worker's capacity at about 980 keys/s).  What a pass leaves is for
 * the next.
 *
 * It runs no SQL text at all: the extension and its schema are found in
 * the catalog by name, each job's function by its exact signature in that
 * schema, checked to be a member of the extension, and called through its
 * OID.  Nothing resolves through search_path, so objects a hostile role
 * creates in the extension's schema, public or pg_temp are never run.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/settings.h"
#include "inbox/inbox.h"
#include "workers/worker.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

PGDLLEXPORT void idem_cleanup_worker_main(Datum main_arg);

/* Most batches of one job in a pass: bounds a pass when far behind. */
#define MAX_BATCHES_PER_PASS 100

/*
 * What a pass runs, in order.  With a retention, the function is
 * f(older_than interval, batch integer); without, f(batch integer) and it
 * uses idem.ttl.  A job whose function the installed version lacks is
 * skipped.
 */
typedef struct CleanupJob
{
	const char *function;
	int		   *retention_s;
} CleanupJob;

static const CleanupJob cleanup_jobs[] = {
	{"idem_cleanup", NULL},
	{"idem_outbox_prune", &idem_outbox_retention_s},
	{"idem_inbox_prune", &idem_inbox_retention_s},
	{"idem_attempt_prune", &idem_attempt_retention_s},
};

/*
 * The pg_idem extension of the connected database and its schema, looked
 * up by name in pg_extension: false when it is not installed.
 */
static bool
find_extension(Oid *extension, Oid *schema)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	bool		found = false;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("pg_idem"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		Form_pg_extension ext = (Form_pg_extension) GETSTRUCT(tup);

		*extension = ext->oid;
		*schema = ext->extnamespace;
		found = true;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * find_extension, then the extension held for the rest of the transaction:
 * DROP EXTENSION takes the extension's object lock (AccessExclusiveLock) up
 * to its commit, so with that lock shared, the extension found stays while
 * the batch runs.  Without it, a DROP committing between the look-up and the
 * batch's first read of its table made the batch fail with "relation does
 * not exist".  The look-up is repeated once the lock is held: the wait may
 * have been for a DROP that has committed since (taking the lock accepts
 * the catalog's invalidations, so the second look-up sees it).
 */
static bool
find_extension_held(Oid *extension, Oid *schema)
{
	Oid			found;

	if (!find_extension(&found, schema))
		return false;
	LockDatabaseObject(ExtensionRelationId, found, 0, AccessShareLock);
	if (!find_extension(extension, schema) || *extension != found)
		return false;
	return true;
}

/*
 * The OID of a job's function: exactly that name and signature in the
 * extension's schema, and a member of the extension; InvalidOid when the
 * installed version has no such function.
 */
static Oid
job_function(const CleanupJob *job, Oid extension, Oid schema)
{
	Oid			argtypes[2];
	int			nargs = 0;
	Oid			func;

	if (job->retention_s != NULL)
		argtypes[nargs++] = INTERVALOID;
	argtypes[nargs++] = INT4OID;
	func = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
						   CStringGetDatum(job->function),
						   PointerGetDatum(buildoidvector(argtypes, nargs)),
						   ObjectIdGetDatum(schema));
	if (!OidIsValid(func) || getExtensionOfObject(ProcedureRelationId, func) != extension)
		return InvalidOid;
	return func;
}

/*
 * One batch of one job in its own transaction: rows deleted, or -1 when
 * pg_idem (or this job's function) is not installed in the database.
 */
static pg_noinline int64
run_batch(const CleanupJob *job)
{
	Oid			extension;
	Oid			schema;
	Oid			func = InvalidOid;
	int64		deleted = -1;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, job->function);

	if (find_extension_held(&extension, &schema))
		func = job_function(job, extension, schema);
	if (OidIsValid(func))
	{
		Datum		batch = Int32GetDatum(idem_cleanup_batch);

		if (job->retention_s == NULL)
			deleted = DatumGetInt64(OidFunctionCall1(func, batch));
		else
			deleted = DatumGetInt64(OidFunctionCall2(func,
													 IntervalPGetDatum(idem_ms_interval((int64) *job->retention_s * 1000)),
													 batch));
	}

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return deleted;
}

/* Apply a reload the postmaster signalled (SIGHUP), between two batches. */
static void
reload_if_pending(void)
{
	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
}

/*
 * Sleep idem.cleanup_delay before the next batch; false, without sleeping
 * on, when the sleep would end after deadline (the pass stops there).  A
 * reload during the sleep applies its new delay to it, counted from its
 * start; SIGTERM ends the worker from CHECK_FOR_INTERRUPTS.
 */
static bool
pace(TimestampTz deadline)
{
	TimestampTz start = GetCurrentTimestamp();

	for (;;)
	{
		TimestampTz wake;
		long		wait_ms;

		CHECK_FOR_INTERRUPTS();
		reload_if_pending();
		if (idem_cleanup_delay_ms == 0)
			return true;
		wake = TimestampTzPlusMilliseconds(start, idem_cleanup_delay_ms);
		if (wake > deadline)
			return false;
		wait_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), wake);
		if (wait_ms <= 0)
			return true;
		/* Woken early by a signal's latch: go round, the rest is slept. */
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* run_batch_reported's answer when the batch failed (reported; the job stops). */
#define BATCH_FAILED (-2)

/*
 * One batch of one job, its error reported and cleaned up: rows deleted,
 * -1 when absent, BATCH_FAILED.  Not inlined: inlined into its caller,
 * whose locals live across the PG_TRY, they would look clobbered by the
 * longjmp to gcc -Wextra at -O1 (an assert-enabled build).
 */
static pg_noinline int64
run_batch_reported(const CleanupJob *job, MemoryContext job_context)
{
	volatile int64 deleted = BATCH_FAILED;

	PG_TRY();
	{
		deleted = run_batch(job);
	}
	PG_CATCH();
	{
		/* Report, clean up; the caller goes on with the other jobs. */
		MemoryContextSwitchTo(job_context);
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
		pgstat_report_activity(STATE_IDLE, NULL);
	}
	PG_END_TRY();
	return deleted;
}

/*
 * pace(), with a query cancel during the sleep (pg_cancel_backend)
 * reported and taken as the end of the pass's sleeping: the jobs still
 * get their batch each, the worker goes on.  Not inlined, for the reason
 * run_batch_reported gives.
 */
static pg_noinline bool
pace_reported(TimestampTz deadline, MemoryContext job_context)
{
	volatile bool slept = false;

	PG_TRY();
	{
		slept = pace(deadline);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(job_context);
		EmitErrorReport();
		FlushErrorState();
	}
	PG_END_TRY();
	return slept;
}

/*
 * One pass's jobs, taking turns a batch each until every job's last batch
 * came back short (or failed, or reached MAX_BATCHES_PER_PASS), paced
 * after each full batch.  Once a sleep would end past half of
 * idem.cleanup_database_timeout there are no more sleeps: each job that
 * has not had a batch in this pass gets one, and the pass ends.  False
 * when pg_idem is not installed in the database.  (No PG_TRY here: the
 * two above keep this function's locals out of a longjmp's way.)
 */
static bool
run_jobs(TimestampTz pass_start, MemoryContext job_context)
{
	TimestampTz pass_end = pass_start +
		(TimestampTz) idem_cleanup_database_timeout_s * USECS_PER_SEC / 2;
	int			batches[lengthof(cleanup_jobs)] = {0};
	bool		finished[lengthof(cleanup_jobs)] = {false};
	bool		out_of_time = false;
	bool		more = true;

	while (more)
	{
		int			j;

		more = false;
		for (j = 0; j < (int) lengthof(cleanup_jobs); j++)
		{
			MemoryContext old;
			int64		deleted;

			if (finished[j] || (out_of_time && batches[j] > 0))
			{
				finished[j] = true;
				continue;
			}
			reload_if_pending();
			old = MemoryContextSwitchTo(job_context);
			deleted = run_batch_reported(&cleanup_jobs[j], job_context);
			MemoryContextSwitchTo(old);
			MemoryContextReset(job_context);
			batches[j]++;
			/* The first job's function exists in every version: absent = not installed. */
			if (deleted == -1 && j == 0)
				return false;
			if (deleted < idem_cleanup_batch || batches[j] == MAX_BATCHES_PER_PASS)
			{
				finished[j] = true;
				continue;
			}
			/* A full batch: a sleep before its next one, if the pass has the time. */
			if (out_of_time || !pace_reported(pass_end, job_context))
			{
				out_of_time = true;
				finished[j] = true;
				continue;
			}
			more = true;
		}
	}
	return true;
}

/* Most failures handed over that one pass records. */
#define MAX_HANDED_OVER_PER_PASS 10000

/*
 * Record the inbox failures sessions handed over in this database
 * (inbox_cap.c), each in a transaction of its own.  Not inlined, for the
 * reason run_batch_reported gives; what is left after an error stays
 * handed over for the next pass.
 */
static pg_noinline void
record_some_handed_over(void)
{
	int			i;

	for (i = 0; i < MAX_HANDED_OVER_PER_PASS; i++)
	{
		Oid			extension;
		Oid			schema;
		bool		recorded = false;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, "recording inbox failures handed over");
		if (find_extension_held(&extension, &schema))
			recorded = idem_inbox_record_handed_over(schema);
		PopActiveSnapshot();
		CommitTransactionCommand();
		pgstat_report_activity(STATE_IDLE, NULL);
		if (!recorded)
			break;
		CHECK_FOR_INTERRUPTS();
	}
}

/* The above, reported and left for the next pass if it fails. */
static pg_noinline void
record_handed_over(void)
{
	PG_TRY();
	{
		record_some_handed_over();
	}
	PG_CATCH();
	{
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
		pgstat_report_activity(STATE_IDLE, NULL);
	}
	PG_END_TRY();
}

/* Entry point of a cleanup worker: one pass in one database, then exit. */
void
idem_cleanup_worker_main(Datum main_arg)
{
	MemoryContext job_context;
	TimestampTz pass_start = GetCurrentTimestamp();

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);
	pgstat_report_appname("pg_idem cleanup worker");

	job_context = AllocSetContextCreate(TopMemoryContext, "pg_idem cleanup job",
										ALLOCSET_DEFAULT_SIZES);
	record_handed_over();
	if (!run_jobs(pass_start, job_context))
		elog(DEBUG1, "pg_idem cleanup worker: pg_idem is not installed in this database");
	proc_exit(0);
}
