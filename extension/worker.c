/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The cleanup worker: deletes expired keys and prunes finished outbox
 *	  events, inbox messages and attempts, so that no cron job is needed.
 *
 * Registered when pg_idem is in shared_preload_libraries.  It connects to
 * idem.database, waits a random part of idem.cleanup_interval first (so
 * that servers restarted together do not clean in lockstep), then every
 * interval runs the cleanup in batches of idem.cleanup_batch, one
 * transaction per batch, so that no pass holds locks or a snapshot for
 * long.  Modelled on src/test/modules/worker_spi: signal handlers before
 * unblocking, WaitLatch with WL_EXIT_ON_PM_DEATH, configuration reloaded
 * on SIGHUP, a memory context reset per pass.  An error in one pass is
 * reported and the next pass runs as usual.
 *
 *-------------------------------------------------------------------------
 */
#include "pg_idem.h"

#include "access/xact.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "catalog/pg_type.h"

PGDLLEXPORT void idem_cleanup_worker_main(Datum main_arg);

static bool idem_cleanup_worker = true;
static int	idem_cleanup_interval_s = 60;
static int	idem_cleanup_batch = 1000;
static char *idem_database = NULL;

static int	idem_outbox_retention_s = 7 * 24 * 60 * 60;
static int	idem_inbox_retention_s = 7 * 24 * 60 * 60;
static int	idem_attempt_retention_s = 31 * 24 * 60 * 60;

/* Most batches of one job in a pass: bounds a pass when far behind. */
#define MAX_BATCHES_PER_PASS 100

/*
 * What a pass runs, in order.  $1 is idem.cleanup_batch, $2 the job's
 * retention.  A job whose function the installed version lacks is skipped.
 */
typedef struct CleanupJob
{
	const char *function;		/* signature, for the existence check */
	const char *call;			/* %s: the extension's schema */
	int		   *retention_s;	/* NULL: the function uses idem.ttl */
} CleanupJob;

static const CleanupJob cleanup_jobs[] = {
	{"idem_cleanup(integer)", "SELECT %s.idem_cleanup($1)", NULL},
	{"idem_outbox_prune(interval,integer)", "SELECT %s.idem_outbox_prune($2, $1)",
	&idem_outbox_retention_s},
	{"idem_inbox_prune(interval,integer)", "SELECT %s.idem_inbox_prune($2, $1)",
	&idem_inbox_retention_s},
	{"idem_attempt_prune(interval,integer)", "SELECT %s.idem_attempt_prune($2, $1)",
	&idem_attempt_retention_s},
};

/* Define the worker's settings and register it (preload only). */
void
idem_worker_init(void)
{
	BackgroundWorker worker;

	DefineCustomBoolVariable("idem.cleanup_worker",
							 "Whether the cleanup worker deletes expired keys.",
							 "Needs pg_idem in shared_preload_libraries; off pauses the worker.",
							 &idem_cleanup_worker, true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.cleanup_interval",
							"Time between two cleanup passes (1s .. 1d).",
							NULL,
							&idem_cleanup_interval_s, 60, 1, 24 * 60 * 60,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.cleanup_batch",
							"Rows the cleanup worker deletes per transaction (1 .. 1000000).",
							NULL,
							&idem_cleanup_batch, 1000, 1, 1000000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.outbox_retention",
							"Age after which the worker prunes published and dead outbox events.",
							NULL,
							&idem_outbox_retention_s, 7 * 24 * 60 * 60, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.inbox_retention",
							"Age after which the worker prunes done and dead inbox messages (the dedup window).",
							NULL,
							&idem_inbox_retention_s, 7 * 24 * 60 * 60, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.attempt_retention",
							"Age after which the worker prunes finished attempts.",
							NULL,
							&idem_attempt_retention_s, 31 * 24 * 60 * 60, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);

	/*
	 * What follows exists only at server start: a PGC_POSTMASTER setting
	 * defined by a backend that loads the library later is a FATAL error.
	 */
	if (!process_shared_preload_libraries_in_progress)
		return;

	DefineCustomStringVariable("idem.database",
							   "Database the cleanup worker connects to.",
							   NULL,
							   &idem_database, "postgres",
							   PGC_POSTMASTER, 0, NULL, NULL, NULL);

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_cleanup_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pg_idem cleanup worker");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pg_idem cleanup");
	RegisterBackgroundWorker(&worker);
}

/* Schema pg_idem is installed in, or NULL when it is not installed here. */
static char *
extension_schema(void)
{
	bool		isnull;
	Datum		schema;

	if (SPI_execute("SELECT n.nspname FROM pg_catalog.pg_extension e"
					" JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace"
					" WHERE e.extname = 'pg_idem'", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up the pg_idem extension");
	if (SPI_processed == 0)
		return NULL;
	schema = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return pstrdup(quote_identifier(NameStr(*DatumGetName(schema))));
}

/*
 * One batch of one job in its own transaction: rows deleted, 0 when the
 * job's function does not exist in the installed version, or -1 when
 * pg_idem is not installed in this database.
 */
static int64
run_batch(const CleanupJob *job)
{
	char	   *schema;
	int64		deleted = -1;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, job->function);

	schema = extension_schema();
	if (schema != NULL)
	{
		char	   *signature = psprintf("%s.%s", schema, job->function);
		Oid			argtypes[2] = {INT4OID, INTERVALOID};
		Datum		args[2];
		bool		isnull;

		deleted = 0;
		if (OidIsValid(DatumGetObjectId(DirectFunctionCall1(to_regprocedure,
															CStringGetTextDatum(signature)))))
		{
			char	   *sql = psprintf(job->call, schema);

			args[0] = Int32GetDatum(idem_cleanup_batch);
			args[1] = IntervalPGetDatum(idem_ms_interval(job->retention_s == NULL ? 0 :
														 (int64) *job->retention_s * 1000));
			if (SPI_execute_with_args(sql, 2, argtypes, args, NULL, false, 1) != SPI_OK_SELECT)
				elog(ERROR, "could not run %s", sql);
			deleted = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												  SPI_tuptable->tupdesc, 1, &isnull));
		}
	}

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return deleted;
}

/* A pass: each job in batches until one comes back short (bounded). */
static void
cleanup_pass(void)
{
	static bool reported_missing = false;
	int			j;

	for (j = 0; j < (int) lengthof(cleanup_jobs); j++)
	{
		int			i;

		for (i = 0; i < MAX_BATCHES_PER_PASS; i++)
		{
			int64		deleted = run_batch(&cleanup_jobs[j]);

			if (deleted < 0)
			{
				if (!reported_missing)
					ereport(LOG,
							(errmsg("pg_idem cleanup worker: extension pg_idem is not installed in database \"%s\"",
									idem_database),
							 errhint("Run CREATE EXTENSION pg_idem there, or set idem.database.")));
				reported_missing = true;
				return;
			}
			reported_missing = false;
			if (deleted < idem_cleanup_batch)
				break;
			CHECK_FOR_INTERRUPTS();
		}
	}
}

/* Entry point of the cleanup worker. */
void
idem_cleanup_worker_main(Datum main_arg)
{
	MemoryContext pass_context;
	TimestampTz next_pass;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(idem_database, NULL, 0);
	pgstat_report_appname("pg_idem cleanup worker");

	pass_context = AllocSetContextCreate(TopMemoryContext, "pg_idem cleanup pass",
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

			PG_TRY();
			{
				cleanup_pass();
			}
			PG_CATCH();
			{
				/* Report, clean up, and try again next interval. */
				MemoryContextSwitchTo(pass_context);
				EmitErrorReport();
				FlushErrorState();
				AbortCurrentTransaction();
				pgstat_report_activity(STATE_IDLE, NULL);
			}
			PG_END_TRY();
			MemoryContextSwitchTo(old);
			MemoryContextReset(pass_context);
		}
		next_pass = GetCurrentTimestamp() + (TimestampTz) idem_cleanup_interval_s * USECS_PER_SEC;
	}
}
