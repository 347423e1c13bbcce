/*-------------------------------------------------------------------------
 *
 * inbox_cap.c
 *	  The attempts a backend has begun, and the paths that keep the
 *	  inbox's attempt cap on every way a session can end or forget them.
 *
 * Everything idem_inbox_begin writes rolls back with a failed attempt, so
 * a failure has to be recorded by a transaction that commits on its own
 * (see inbox.c).  Until it is, the attempt holds its message's lock (an
 * entry of inbox_lock.c's registry, which no SQL can take, release or
 * see), so that no concurrent delivery starts from a count that misses
 * it.  The lock is released only when the attempt is accounted for:
 *
 *	 - its transaction commits with the message done, or with its failure
 *	   recorded by idem_inbox_fail (the savepoint protocol) — a recording
 *	   that is rolled back, or whose connection drops before COMMIT, makes
 *	   the attempt an orphan again instead of losing it;
 *	 - an orphan's failure is recorded by a later idem_inbox_fail on this
 *	   session, by DISCARD ALL (which a session pooler runs when a client
 *	   leaves: the orphans are recorded in its transaction, so the next
 *	   client of the connection inherits none), or by the backend on its
 *	   way out (before_shmem_exit, before the registry's entries are freed);
 *	 - PREPARE TRANSACTION would move the attempt out of this session: it
 *	   is refused while an attempt is open or its recording uncommitted.

 * The one case left uncounted is a crash of the server itself (immediate
 * shutdown, a backend killed by signal 9, power loss) during an attempt:
 * nothing of that attempt was committed anywhere, so the message runs one
 * more time after the restart.  Counting it would need a write that
 * commits before the handler runs, outside the consumer's transaction,
 * which would give up processing the message and its effects in one
 * transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/hashing.h"
#include "inbox/inbox.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

static List *attempts = NIL;
static bool callbacks_registered = false;

static ProcessUtility_hook_type prev_process_utility = NULL;

/*
 * The attempt this backend remembers for key: open, or not open (an
 * orphan; with open = false also a recorded one), or NULL.
 */
InboxAttempt *
idem_inbox_find_attempt(const bytea *key, bool open)
{
	ListCell   *lc;

	foreach(lc, attempts)
	{
		InboxAttempt *a = (InboxAttempt *) lfirst(lc);

		if (a->open == open &&
			memcmp(a->key, VARDATA_ANY(key), IDEM_DIGEST_LEN) == 0)
			return a;
	}
	return NULL;
}

/* Forget an attempt that is accounted for, and release its lock. */
static void
forget_attempt(InboxAttempt *a)
{
	idem_inbox_unlock(a->scope, a->key);
	attempts = list_delete_ptr(attempts, a);
	pfree(a->consumer);
	pfree(a->message_id);
	pfree(a);
}

/* Is any attempt open or awaiting the commit of its recording? */
static bool
any_unsettled(void)
{
	ListCell   *lc;

	foreach(lc, attempts)
	{
		InboxAttempt *a = (InboxAttempt *) lfirst(lc);

		if (a->open || a->recorded)
			return true;
	}
	return false;
}

/* The failure of an attempt was written in the current subtransaction. */
void
idem_inbox_mark_recorded(InboxAttempt *attempt)
{
	attempt->recorded = true;
	attempt->recorded_subid = GetCurrentSubTransactionId();
}

/*
 * Transaction end: a commit accounts for the open attempts (done) and the
 * recorded ones; an abort makes both orphans.  PREPARE is refused before
 * it happens (XACT_EVENT_PRE_PREPARE).
 */
static void
inbox_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;

	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (any_unsettled())
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction with an inbox attempt"),
						 errdetail("A prepared transaction could be rolled back in another session, and the attempt would not be counted."),
						 errhint("Commit or roll back the consumer's transaction instead.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			foreach(lc, attempts)
			{
				InboxAttempt *a = (InboxAttempt *) lfirst(lc);

				if (a->open || a->recorded)
				{
					idem_inbox_unlock(a->scope, a->key);
					attempts = foreach_delete_current(attempts, lc);
									pfree(a->consumer);
					pfree(a->message_id);
					pfree(a);
				}
			}
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			foreach(lc, attempts)
			{
				InboxAttempt *a = (InboxAttempt *) lfirst(lc);

				a->open = false;
				a->recorded = false;
			}
			break;
		default:
			break;
	}
}

/*
 * Subtransaction end: rolled back to before begin orphans the attempt;
 * rolled back to before its recording un-records it.
 */
static void
inbox_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	ListCell   *lc;

	foreach(lc, attempts)
	{
		InboxAttempt *a = (InboxAttempt *) lfirst(lc);

		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			if (a->open && a->subid == mySubid)
				a->open = false;
			if (a->recorded && a->recorded_subid == mySubid)
				a->recorded = false;
		}
		else if (event == SUBXACT_EVENT_COMMIT_SUB)
		{
			if (a->open && a->subid == mySubid)
				a->subid = parentSubid;
			if (a->recorded && a->recorded_subid == mySubid)
				a->recorded_subid = parentSubid;
		}
	}
}

/*
 * Record an orphan's failure in the current transaction, as
 * idem_inbox_begin ran: as the role that called it (the statements switch
 * to the tables' owner themselves; a dead letter takes that role's scope)
 * and with a pinned search_path.  Guarded by the error_count the attempt
 * started from, so an attempt recorded elsewhere is not counted twice.
 */
static void
record_orphan(InboxAttempt *a)
{
	int32		error_count;
	Datum		retry_after;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(a->caller, save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);

	PushActiveSnapshot(GetTransactionSnapshot());
	SPI_connect();
	idem_inbox_record_failure(a->namespace, idem_digest_bytea(a->key),
							  ObjectIdGetDatum(a->scope),
							  CStringGetTextDatum(a->consumer),
							  CStringGetTextDatum(a->message_id), a,
							  CStringGetTextDatum(SESSION_ENDED_ERROR),
							  true, &error_count, &retry_after);
	SPI_finish();
	PopActiveSnapshot();
	AtEOXact_GUC(true, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec_context);
}

/*
 * Backend exit: record every orphaned attempt, each in a transaction of
 * its own, as RemoveTempRelationsCallback runs its cleanup.  An error
 * raised here is promoted to FATAL (proc_exit is running): it is logged
 * and the remaining orphans stay uncounted.
 */
static void
inbox_at_exit(int code, Datum arg)
{
	if (attempts == NIL)
		return;
	AbortOutOfAnyTransaction();		/* turns open attempts into orphans */

	while (attempts != NIL)
	{
		InboxAttempt *a = (InboxAttempt *) linitial(attempts);

		StartTransactionCommand();
		record_orphan(a);
		CommitTransactionCommand();
		forget_attempt(a);
	}
}

/*
 * DISCARD ALL (a session pooler handing the connection to its next
 * client): first record the orphans in its own transaction (DISCARD ALL
 * cannot run in a transaction block, so no attempt is open); they are
 * forgotten, and their locks released, when it commits.
 */
static void
inbox_process_utility(PlannedStmt *pstmt, const char *queryString,
					  bool readOnlyTree, ProcessUtilityContext context,
					  ParamListInfo params, QueryEnvironment *queryEnv,
					  DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;

	if (attempts != NIL && IsA(parsetree, DiscardStmt) &&
		((DiscardStmt *) parsetree)->target == DISCARD_ALL &&
		!IsTransactionBlock())
	{
		ListCell   *lc;

		foreach(lc, attempts)
		{
			InboxAttempt *a = (InboxAttempt *) lfirst(lc);

			if (!a->open && !a->recorded)
			{
				record_orphan(a);
				idem_inbox_mark_recorded(a);
			}
		}
	}

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params,
							 queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
								queryEnv, dest, qc);
}

/* Install the utility hook and the lock registry; called from _PG_init. */
void
idem_inbox_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = inbox_process_utility;
	idem_inbox_lock_init();
}

/* Register the transaction and exit callbacks once per backend. */
void
idem_inbox_register_callbacks(void)
{
	if (callbacks_registered)
		return;
	RegisterXactCallback(inbox_xact_callback, NULL);
	RegisterSubXactCallback(inbox_subxact_callback, NULL);
	before_shmem_exit(inbox_at_exit, (Datum) 0);
	callbacks_registered = true;
}

/* Remember an attempt begun in the current (sub)transaction. */
void
idem_inbox_remember(Oid namespace, bytea *key, Oid scope, text *consumer,
					text *message_id, bytea *payload_hash, int32 max_attempts,
					int32 seen_errors)
{
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
	InboxAttempt *a = palloc0(sizeof(InboxAttempt));

	memcpy(a->key, VARDATA_ANY(key), IDEM_DIGEST_LEN);
	a->namespace = namespace;
	a->scope = scope;
	a->consumer = text_to_cstring(consumer);
	a->message_id = text_to_cstring(message_id);
	memcpy(a->payload_hash, VARDATA_ANY(payload_hash), IDEM_DIGEST_LEN);
	a->max_attempts = max_attempts;
	a->seen_errors = seen_errors;
	a->started_at = GetCurrentTimestamp();
	a->subid = GetCurrentSubTransactionId();
	a->caller = GetUserId();
	a->open = true;
	attempts = lappend(attempts, a);
	MemoryContextSwitchTo(old);
}
