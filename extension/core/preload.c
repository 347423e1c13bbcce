/*-------------------------------------------------------------------------
 *
 * preload.c
 *	  Saying what pg_idem without shared_preload_libraries costs, instead of
 *	  letting it degrade in silence.
 *
 * pg_idem works when it is loaded on first use in a session, but then no
 * cleanup launcher is registered (expired keys, published outbox events,
 * done inbox messages and finished attempts are never deleted unless
 * someone calls idem_cleanup and the prune functions), there is no shared
 * memory for the counters (idem_stats refuses) or for the wake-ups
 * (followers and idem_outbox_wait poll their latch instead of being woken
 * by the commit they wait for).  A server where the line was forgotten
 * otherwise looks healthy until its tables have grown for weeks.
 *
 * So CREATE EXTENSION (and ALTER EXTENSION UPDATE) raises a NOTICE saying
 * so (the install script calls idem_preload_notice, a function it creates
 * and drops again, so the extension keeps no trace of it).  PostgreSQL
 * runs an extension script with client_min_messages at least WARNING, so
 * the NOTICE is raised when the transaction commits, after the script
 * (at the end of CREATE EXTENSION, or at the COMMIT of a block).  And the
 * functions that need the preload warn once per backend: a server-side
 * wait (wakeup.c) on its first wait; idem_stats refuses outright (stats.c).
 *
 * Whether the library was preloaded is recorded by _PG_init: the
 * postmaster runs it while it processes shared_preload_libraries, and
 * every backend inherits the answer; a library loaded later in a session
 * (or by session_preload_libraries) gets none of the shared parts.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/preload.h"

#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"

PG_FUNCTION_INFO_V1(idem_preload_notice);

static bool preloaded = false;
static bool notice_pending = false;
static bool notice_callback_registered = false;

/* Record whether the library is being preloaded; called from _PG_init. */
void
idem_preload_init(void)
{
	preloaded = process_shared_preload_libraries_in_progress;
}

/* The report, at elevel: what is missing and what to do. */
static void
report_missing_preload(int elevel)
{
	ereport(elevel,
			(errmsg("pg_idem is not loaded via shared_preload_libraries"),
			 errdetail("Without it no cleanup worker runs (expired keys, published outbox events, done inbox messages "
					   "and finished attempts stay until idem_cleanup and the prune functions are called), "
					   "idem_stats has no counters, and server-side waits poll instead of being woken at the commit they wait for."),
			 errhint("Add pg_idem to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/* See preload.h. */
void
idem_warn_without_preload(void)
{
	static bool warned = false;

	if (preloaded || warned)
		return;
	warned = true;
	report_missing_preload(WARNING);
}

/* The pending NOTICE, once the script's client_min_messages is undone. */
static void
notice_at_commit(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_PRE_COMMIT && notice_pending)
		report_missing_preload(NOTICE);
	if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PARALLEL_ABORT || event == XACT_EVENT_PRE_PREPARE)
		notice_pending = false;
}

/*
 * idem_preload_notice(): the NOTICE of CREATE EXTENSION and ALTER
 * EXTENSION UPDATE when the library is not preloaded, raised when the
 * transaction commits (see the file header).
 */
Datum
idem_preload_notice(PG_FUNCTION_ARGS)
{
	if (preloaded)
		PG_RETURN_VOID();
	if (!notice_callback_registered)
	{
		RegisterXactCallback(notice_at_commit, NULL);
		notice_callback_registered = true;
	}
	notice_pending = true;
	PG_RETURN_VOID();
}
