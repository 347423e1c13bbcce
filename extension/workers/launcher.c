/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The cleanup launcher: serves every database that has pg_idem, with no
 *	  configuration.
 *
 * One static background worker, registered at preload, connected to no
 * database (it reads only the shared catalog pg_database).  Every
 * idem.cleanup_interval it lists the databases that accept connections
 * (optionally restricted by idem.database) and, one after the other,
 * starts a short-lived cleanup worker in each (worker.c) and waits for it
 * to exit.  The worker looks pg_idem up in its database's catalog and
 * exits at once where it is not installed, so a database where the
 * extension was just created is served from the next pass on, and one
 * where it was dropped (or the database itself) is no longer served.
 *
 * Why short-lived workers, unlike TimescaleDB's resident per-database
 * schedulers: a resident worker holds a connection, which makes DROP
 * DATABASE, ALTER DATABASE ... RENAME and CREATE DATABASE ... TEMPLATE of
 * that database fail ("being accessed by other users") and takes one
 * max_worker_processes slot per database away from parallel query.  A
 * pass holds one connection, in one database, for the few milliseconds it
 * runs; a database without pg_idem costs one connection per interval.
 *
 * No database stalls the others: the launcher waits for a worker at most
 * idem.cleanup_database_timeout.  A worker still running then is waiting
 * for something (a connection blocked by a transaction that holds the
 * database's lock, such as an uncommitted ALTER DATABASE ... RENAME; a
 * cleanup blocked by a lock on a pg_idem table), so it is stopped, a
 * WARNING names the database and what its worker waits for (the lock and
 * the processes that hold it), and the pass goes on with the next
 * database.  The skipped database is served again at the next pass; what
 * its worker had committed stays (every batch is its own transaction).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/settings.h"
#include "workers/worker.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "lib/stringinfo.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

PGDLLEXPORT void idem_launcher_main(Datum main_arg);

/* A database a pass visits. */
typedef struct LauncherDatabase
{
	Oid			oid;
	char		name[NAMEDATALEN];
} LauncherDatabase;

/* Register the launcher when pg_idem is preloaded; called from _PG_init. */
void
idem_workers_init(void)
{
	BackgroundWorker worker;

	if (!process_shared_preload_libraries_in_progress)
		return;
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_idem cleanup launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_idem launcher");
	RegisterBackgroundWorker(&worker);
}

/* Whether name is in the idem.database list (an empty list: every name). */
static bool
database_selected(const char *name)
{
	char	   *copy;
	List	   *names;
	ListCell   *lc;
	bool		found = false;

	if (idem_database == NULL || idem_database[0] == '\0')
		return true;
	copy = pstrdup(idem_database);
	if (!SplitIdentifierString(copy, ',', &names))
		return false;			/* refused by the setting's check hook */
	foreach(lc, names)
	{
		if (strcmp((const char *) lfirst(lc), name) == 0)
			found = true;
	}
	return found;
}

/*
 * The databases a pass visits, allocated in the caller's context: those
 * that accept connections, are not templates, are valid (not half
 * dropped) and are selected by idem.database.
 */
static List *
list_databases(void)
{
	MemoryContext caller = CurrentMemoryContext;
	List	   *result = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);
		MemoryContext old;
		LauncherDatabase *entry;

		if (db->datistemplate || !db->datallowconn ||
			db->datconnlimit == DATCONNLIMIT_INVALID_DB ||
			!database_selected(NameStr(db->datname)))
			continue;
		old = MemoryContextSwitchTo(caller);
		entry = palloc(sizeof(LauncherDatabase));
		entry->oid = db->oid;
		strlcpy(entry->name, NameStr(db->datname), NAMEDATALEN);
		result = lappend(result, entry);
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return result;
}

/*
 * What process pid waits for, appended to buf: its wait event and, for a
 * heavyweight lock, the lock and the processes that hold it.
 */
static void
describe_wait(StringInfo buf, const LauncherDatabase *db, int pid)
{
	PGPROC	   *proc = pid != 0 ? BackendPidGetProc(pid) : NULL;
	uint32		wait_event_info = proc != NULL ? *((volatile uint32 *) &proc->wait_event_info) : 0;
	BlockedProcsData *blocked;
	int			i;

	if (proc == NULL)
	{
		appendStringInfoString(buf, "The worker had not started.");
		return;
	}
	if (wait_event_info == 0)
	{
		appendStringInfoString(buf, "The worker was running, not waiting: the pass takes longer than the limit.");
		return;
	}
	appendStringInfo(buf, "The worker (process %d) waits for %s/%s", pid,
					 pgstat_get_wait_event_type(wait_event_info),
					 pgstat_get_wait_event(wait_event_info));
	if ((wait_event_info & 0xFF000000) != PG_WAIT_LOCK)
	{
		appendStringInfoChar(buf, '.');
		return;
	}

	/* The lock it waits for, and who holds it (as pg_blocking_pids sees). */
	blocked = GetBlockerStatusData(pid);
	for (i = 0; i < blocked->nprocs; i++)
	{
		BlockedProcData *bproc = &blocked->procs[i];
		LockInstanceData *waited;
		int			j;
		int			holders = 0;

		if (bproc->pid != pid || bproc->num_locks == 0)
			continue;
		waited = &blocked->locks[bproc->first_lock];
		if (waited->locktag.locktag_type == LOCKTAG_OBJECT &&
			waited->locktag.locktag_field2 == DatabaseRelationId &&
			waited->locktag.locktag_field3 == db->oid)
			appendStringInfo(buf, ": the lock on database \"%s\" itself", db->name);
		else
		{
			appendStringInfoString(buf, ": a lock on ");
			DescribeLockTag(buf, &waited->locktag);
		}
		for (j = 0; j < bproc->num_locks; j++)
		{
			LockInstanceData *instance = &blocked->locks[bproc->first_lock + j];

			if (instance->holdMask == 0 || instance->pid == pid)
				continue;
			appendStringInfo(buf, "%s%d", holders++ == 0 ? ", held by process " : ", ",
							 instance->pid);
		}
		break;
	}
	appendStringInfoChar(buf, '.');
}

/*
 * Wait for a database's worker to exit, at most
 * idem.cleanup_database_timeout; after that, say what it waits for, stop
 * it and return false (the database is skipped until the next pass).
 */
static bool
wait_for_worker(BackgroundWorkerHandle *handle, const LauncherDatabase *db)
{
	TimestampTz deadline = GetCurrentTimestamp() +
		(TimestampTz) idem_cleanup_database_timeout_s * USECS_PER_SEC;
	pid_t		pid = 0;
	StringInfoData detail;

	for (;;)
	{
		BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);
		TimestampTz now;
		long		wait_ms;

		if (status == BGWH_STOPPED)
			return true;
		if (status == BGWH_POSTMASTER_DIED)
			proc_exit(1);
		now = GetCurrentTimestamp();
		if (now >= deadline)
			break;
		/* The postmaster sets our latch when the worker's state changes. */
		wait_ms = Min((long) ((deadline - now) / 1000) + 1, 1000L);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}

	initStringInfo(&detail);
	describe_wait(&detail, db, pid);
	ereport(WARNING,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("pg_idem cleanup of database \"%s\" skipped: its worker did not finish within idem.cleanup_database_timeout (%d s)",
					db->name, idem_cleanup_database_timeout_s),
			 errdetail_internal("%s", detail.data),
			 errhint("The database is cleaned again at the next pass; the other databases are not held up. End the transaction that holds the lock if it should not be open.")));
	TerminateBackgroundWorker(handle);
	if (WaitForBackgroundWorkerShutdown(handle) == BGWH_POSTMASTER_DIED)
		proc_exit(1);
	return false;
}

/*
 * Run one cleanup worker in a database and wait for it to exit (or give
 * up on it, see wait_for_worker).  False when no background worker slot
 * is free (max_worker_processes).
 */
static bool
serve_database(const LauncherDatabase *db)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_cleanup_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_idem cleanup worker for %s", db->name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_idem cleanup");
	worker.bgw_main_arg = ObjectIdGetDatum(db->oid);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return false;
	pgstat_report_activity(STATE_RUNNING, worker.bgw_name);
	(void) wait_for_worker(handle, db);
	pfree(handle);
	pgstat_report_activity(STATE_IDLE, NULL);
	return true;
}

/*
 * Say once per value of idem.database which of its names match no database
 * a pass can visit: a typo would otherwise leave a database uncleaned
 * without a word.
 */
static void
report_unknown_names(List *databases)
{
	static char *reported_for = NULL;
	char	   *copy;
	List	   *names;
	ListCell   *lc;

	if (idem_database == NULL || idem_database[0] == '\0' ||
		(reported_for != NULL && strcmp(reported_for, idem_database) == 0))
		return;
	if (reported_for != NULL)
		pfree(reported_for);
	reported_for = MemoryContextStrdup(TopMemoryContext, idem_database);

	copy = pstrdup(idem_database);
	if (!SplitIdentifierString(copy, ',', &names))
		return;
	foreach(lc, names)
	{
		const char *name = (const char *) lfirst(lc);
		ListCell   *dc;
		bool		found = false;

		foreach(dc, databases)
		{
			if (strcmp(((LauncherDatabase *) lfirst(dc))->name, name) == 0)
				found = true;
		}
		if (!found)
			ereport(LOG,
					(errmsg("pg_idem cleanup launcher: database \"%s\" named in idem.database is not served", name),
					 errdetail("No database of that name accepts connections."),
					 errhint("Correct idem.database, or empty it to serve every database that has pg_idem.")));
	}
}

/* A pass: every selected database in turn. */
static void
launcher_pass(void)
{
	static bool reported_no_slot = false;
	List	   *databases = list_databases();
	ListCell   *lc;

	report_unknown_names(databases);

	foreach(lc, databases)
	{
		CHECK_FOR_INTERRUPTS();
		if (!serve_database((LauncherDatabase *) lfirst(lc)))
		{
			if (!reported_no_slot)
				ereport(WARNING,
						(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
						 errmsg("pg_idem cleanup launcher: no background worker slot is free"),
						 errdetail("The pass is skipped and retried after idem.cleanup_interval."),
						 errhint("Raise max_worker_processes.")));
			reported_no_slot = true;
			return;
		}
		reported_no_slot = false;
	}
}

/* Entry point of the launcher. */
void
idem_launcher_main(Datum main_arg)
{
	MemoryContext pass_context;
	TimestampTz next_pass;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* No database: only the shared catalogs, which is all it reads. */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("pg_idem cleanup launcher");

	pass_context = AllocSetContextCreate(TopMemoryContext, "pg_idem launcher pass",
										 ALLOCSET_DEFAULT_SIZES);

	/* A random first delay within one interval: no herd at boot. */
	next_pass = GetCurrentTimestamp() +
		(TimestampTz) (pg_prng_double(&pg_global_prng_state) *
					   idem_cleanup_interval_s * USECS_PER_SEC);

	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		long		wait_ms = 0;

		if (next_pass > now)
			wait_ms = (long) ((next_pass - now) / 1000) + 1;
		if (wait_ms > 0)
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();

		if (ConfigReloadPending)
		{
			TimestampTz last_pass = next_pass - (TimestampTz) idem_cleanup_interval_s * USECS_PER_SEC;

			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			/* A new interval applies from the last pass on. */
			next_pass = last_pass + (TimestampTz) idem_cleanup_interval_s * USECS_PER_SEC;
		}
		if (GetCurrentTimestamp() < next_pass)
			continue;

		if (idem_cleanup_worker)
		{
			MemoryContext old = MemoryContextSwitchTo(pass_context);

			launcher_pass();
			MemoryContextSwitchTo(old);
			MemoryContextReset(pass_context);
		}
		next_pass = GetCurrentTimestamp() + (TimestampTz) idem_cleanup_interval_s * USECS_PER_SEC;
	}
}
