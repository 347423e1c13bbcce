/*-------------------------------------------------------------------------
 *
 * inbox_cap.c
 *	  The attempts this backend holds, and the paths that keep the inbox's
 *	  attempt cap on every way a session can end or forget them.
 *
 * Everything idem_inbox_begin writes rolls back with a failed attempt, so
 * a failure has to be recorded by a transaction that commits on its own.
 * Until it is, the attempt holds its message's entry in the registry
 * (inbox_registry.c), so that no concurrent delivery starts from a count
 * that misses it.  The entry is released only when the attempt is
 * accounted for, and handed over (with the failures it carries) when this
 * session cannot account for it itself:
 *
 *	 - its transaction commits with the message done, or with its failure
 *	   recorded by idem_inbox_fail (the savepoint protocol) — a recording
 *	   that is rolled back, or whose connection drops before COMMIT, makes
 *	   the attempt an orphan again instead of losing it;
 *	 - an orphan's failures are recorded by a later idem_inbox_fail on this
 *	   session, by a later delivery of the message on this session (which
 *	   adopts them), or by the backend on its way out (before_shmem_exit,
 *	   each in a transaction of its own, read-write whatever the session's
 *	   defaults);
 *	 - handed over: at DISCARD ALL (a session pooler handing the connection
 *	   to its next client, which must inherit nothing: no write is needed,
 *	   so it cannot fail), when the exit's recording fails (an error there
 *	   ends the backend: on_shmem_exit hands over what is left), and when
 *	   the session reaches idem.inbox_attempts_per_session (its orphans
 *	   first).  The next delivery of the message, on any session of the
 *	   scope, adopts them; the cleanup worker records the rest;
 *	 - PREPARE TRANSACTION would move the attempt out of this session: it
 *	   is refused while an attempt is open or its recording uncommitted.
 *
 * Attempts are this session's per scope: begin, done and fail find only
 * the attempts of the caller's scope, so SET ROLE, SET SESSION
 * AUTHORIZATION and a SECURITY DEFINER function see their own only.
 *
 * The one case left uncounted is a restart of the server (a crash, an
 * immediate shutdown, a backend killed by signal 9) while an attempt is
 * unaccounted for: shared memory starts empty, so the message runs one
 * more time.  Counting it would need a write that commits before the
 * handler runs, outside the consumer's transaction, which would give up
 * processing the message and its effects in one transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/hashing.h"
#include "core/settings.h"
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
 * Describe the message (scope, key) for the registry: who calls, and the
 * texts a new row of it needs (kept when they fit).
 */
void
idem_inbox_describe(InboxHandOver *what, Oid scope, const bytea *key, Oid caller_scope,
					text *consumer, text *message_id)
{
	int			clen = VARSIZE_ANY_EXHDR(consumer);
	int			mlen = VARSIZE_ANY_EXHDR(message_id);

	memset(what, 0, sizeof(*what));
	what->scope = scope;
	memcpy(what->key, VARDATA_ANY(key), IDEM_DIGEST_LEN);
	what->caller = GetUserId();
	what->caller_scope = caller_scope;
	if (clen + mlen <= INBOX_TEXT_MAX)
	{
		what->consumer_len = clen;
		what->message_id_len = mlen;
		memcpy(what->texts, VARDATA_ANY(consumer), clen);
		memcpy(what->texts + clen, VARDATA_ANY(message_id), mlen);
	}
}

/* This backend's attempt at the message (scope, key), whoever began it. */
InboxAttempt *
idem_inbox_find_attempt(Oid scope, const bytea *key)
{
	ListCell   *lc;

	foreach(lc, attempts)
	{
		InboxAttempt *a = (InboxAttempt *) lfirst(lc);

		if (a->what.scope == scope &&
			memcmp(a->what.key, VARDATA_ANY(key), IDEM_DIGEST_LEN) == 0)
			return a;
	}
	return NULL;
}

/* This backend's attempt at message key begun in scope caller_scope. */
InboxAttempt *
idem_inbox_my_attempt(Oid caller_scope, const bytea *key)
{
	ListCell   *lc;

	foreach(lc, attempts)
	{
		InboxAttempt *a = (InboxAttempt *) lfirst(lc);

		if (a->what.caller_scope == caller_scope &&
			memcmp(a->what.key, VARDATA_ANY(key), IDEM_DIGEST_LEN) == 0)
			return a;
	}
	return NULL;
}

static void
free_attempt(InboxAttempt *a)
{
	attempts = list_delete_ptr(attempts, a);
	pfree(a->consumer);
	pfree(a->message_id);
	pfree(a);
}

/* This session will not account for the attempt: hand it over, forget it. */
void
idem_inbox_hand_back(InboxAttempt *a)
{
	idem_inbox_registry_hand_over(a->what.scope, a->what.key, a->uncounted);
	free_attempt(a);
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

/* A failure recording of the attempt was written in the current subtransaction. */
void
idem_inbox_mark_recorded(InboxAttempt *attempt)
{
	attempt->recorded = true;
	attempt->recorded_subid = GetCurrentSubTransactionId();
}

/*
 * Begin's write, or a recording, is undone: the attempt is an orphan with
 * its failures to write, published with its entry.
 */
static void
orphan(InboxAttempt *a)
{
	if (a->open)
	{
		a->open = false;
		a->uncounted += a->pending + (a->ran ? 1 : 0);
		a->pending = 0;
		a->ran = false;
	}
	a->recorded = false;
	if (a->uncounted > 0)
		idem_inbox_registry_orphaned(a->what.scope, a->what.key, a->uncounted);
}

/*
 * Before this session records its orphan: false (and the attempt
 * forgotten) when another session adopted it meanwhile, which can happen
 * only after this session dropped its lock (pg_advisory_unlock_all()): its
 * failures went with the entry and are that session's to write.
 */
bool
idem_inbox_reclaim(InboxAttempt *a)
{
	if (a->open || idem_inbox_registry_reclaim(a->what.scope, a->what.key))
		return true;
	free_attempt(a);
	return false;
}

/*
 * Transaction end: a commit accounts for the open attempts (done, or
 * their failure recorded) and the recorded orphans; an abort makes every
 * attempt an orphan.  PREPARE is refused before it happens.
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
					idem_inbox_registry_release(a->what.scope, a->what.key);
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

				if (a->open || a->recorded)
					orphan(a);
				if (a->uncounted == 0)
				{
					/* Nothing ran and nothing was adopted: nothing to count. */
					idem_inbox_registry_release(a->what.scope, a->what.key);
					attempts = foreach_delete_current(attempts, lc);
					pfree(a->consumer);
					pfree(a->message_id);
					pfree(a);
				}
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
				orphan(a);
			else if (a->recorded && a->recorded_subid == mySubid)
			{
				a->recorded = false;
				if (!a->open)
					orphan(a);
			}
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
 * Record an orphan's failures in the current transaction, as
 * idem_inbox_begin ran: as the role that called it (the statements switch
 * to the tables' owner themselves) and with a pinned search_path; its dead
 * letter, if it dies, goes to that role's scope.
 */
static void
record_orphan(InboxAttempt *a, const char *error)
{
	int32		error_count;
	Datum		retry_after;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(a->what.caller, save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);

	PushActiveSnapshot(GetTransactionSnapshot());
	SPI_connect();
	(void) idem_inbox_record_failure(a->namespace, &a->what,
									 CStringGetTextDatum(a->consumer),
									 CStringGetTextDatum(a->message_id),
									 a->started_at, a->uncounted,
									 CStringGetTextDatum(error),
									 &error_count, &retry_after);
	SPI_finish();
	PopActiveSnapshot();
	AtEOXact_GUC(true, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec_context);
	idem_inbox_mark_recorded(a);
}

/*
 * A transaction of our own at exit: read-write and READ COMMITTED whatever
 * the session's defaults (a pooler's default_transaction_read_only, SET
 * SESSION CHARACTERISTICS), and no lock_timeout: it writes pg_idem's own
 * accounting of work the session did in read-write transactions.
 */
static void
start_exit_transaction(void)
{
	StartTransactionCommand();
	(void) set_config_option("transaction_read_only", "off",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL,
							 true, 0, false);
	(void) set_config_option("transaction_isolation", "read committed",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL,
							 true, 0, false);
	(void) set_config_option("lock_timeout", "0",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL,
							 true, 0, false);
}

/*
 * Backend exit: record every orphan, each in a transaction of its own, as
 * RemoveTempRelationsCallback runs its cleanup.  An error raised here is
 * promoted to FATAL (proc_exit is running): it is logged, and
 * inbox_at_shmem_exit hands over what is left.
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

		if (!idem_inbox_reclaim(a))
			continue;			/* adopted by another session */
		start_exit_transaction();
		record_orphan(a, SESSION_ENDED_ERROR);
		CommitTransactionCommand();		/* releases and forgets it */
	}
}

/* After a failed exit: hand over what could not be recorded, free the rest. */
static void
inbox_at_shmem_exit(int code, Datum arg)
{
	while (attempts != NIL)
	{
		InboxAttempt *a = (InboxAttempt *) linitial(attempts);

		if (a->open)
			orphan(a);
		idem_inbox_hand_back(a);
	}
	idem_inbox_registry_release_mine();
}

/*
 * DISCARD ALL (a session pooler handing the connection to its next
 * client): hand over the orphans, without a write that could fail (a
 * read-only session, a statement_timeout); DISCARD ALL cannot run in a
 * transaction block, so no attempt is open.
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
		!IsTransactionBlock() && !any_unsettled())
	{
		while (attempts != NIL)
			idem_inbox_hand_back((InboxAttempt *) linitial(attempts));
	}

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params,
							 queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
								queryEnv, dest, qc);
}

/* Install the utility hook and the registry; called from _PG_init. */
void
idem_inbox_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = inbox_process_utility;
	idem_inbox_registry_init();
}

/* Register the transaction and exit callbacks once per backend. */
static void
register_callbacks(void)
{
	if (callbacks_registered)
		return;
	RegisterXactCallback(inbox_xact_callback, NULL);
	RegisterSubXactCallback(inbox_subxact_callback, NULL);
	/* Runs after inbox_at_exit, even when that one fails (FATAL). */
	on_shmem_exit(inbox_at_shmem_exit, (Datum) 0);
	before_shmem_exit(inbox_at_exit, (Datum) 0);
	callbacks_registered = true;
}

/*
 * Take the registry entry of a message for an attempt (or a recording)
 * of this session; returns the failures a handed-over entry carried.
 * Checks this session's bound first, handing over its orphans to make
 * room if need be.
 */
int32
idem_inbox_take(const InboxHandOver *what)
{
	ListCell   *lc;

	register_callbacks();
	if (list_length(attempts) >= idem_inbox_attempts_per_session)
	{
		foreach(lc, attempts)
		{
			InboxAttempt *a = (InboxAttempt *) lfirst(lc);

			if (!a->open && !a->recorded)
			{
				idem_inbox_registry_hand_over(a->what.scope, a->what.key, a->uncounted);
				attempts = foreach_delete_current(attempts, lc);
				pfree(a->consumer);
				pfree(a->message_id);
				pfree(a);
			}
		}
	}
	if (list_length(attempts) >= idem_inbox_attempts_per_session)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("this session has %d inbox attempts not accounted for",
						list_length(attempts)),
				 errdetail("idem.inbox_attempts_per_session is %d: a session may have that many messages begun, or their failures recorded, in its open transaction.",
						   idem_inbox_attempts_per_session),
				 errhint("Commit the messages begun so far before beginning more, or raise idem.inbox_attempts_per_session for this role.")));
	return idem_inbox_registry_take(what);
}

/* Remember an attempt whose registry entry this session now holds. */
InboxAttempt *
idem_inbox_remember(Oid namespace, const InboxHandOver *what, text *consumer,
					text *message_id, int32 pending, bool ran)
{
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
	InboxAttempt *a = palloc0(sizeof(InboxAttempt));

	a->what = *what;
	a->namespace = namespace;
	a->consumer = text_to_cstring(consumer);
	a->message_id = text_to_cstring(message_id);
	a->started_at = GetCurrentTimestamp();
	a->open = true;
	a->subid = GetCurrentSubTransactionId();
	a->pending = pending;
	a->ran = ran;
	attempts = lappend(attempts, a);
	MemoryContextSwitchTo(old);
	return a;
}

/*
 * For the cleanup worker, in a transaction of its own: record the
 * failures of one entry of this database that a session handed over.
 * False when there is none.  The entry is released when the transaction
 * commits, and kept for the next pass (or the worker's exit) if it aborts.
 */
bool
idem_inbox_record_handed_over(Oid namespace)
{
	InboxHandOver what;
	InboxAttempt *a;
	text	   *consumer;
	text	   *message_id;

	if (!idem_inbox_registry_take_handed_over(0, &what))
		return false;
	register_callbacks();
	consumer = cstring_to_text_with_len(what.texts, what.consumer_len);
	message_id = cstring_to_text_with_len(what.texts + what.consumer_len, what.message_id_len);
	a = idem_inbox_remember(namespace, &what, consumer, message_id, 0, false);
	a->open = false;
	a->uncounted = what.uncounted;
	a->started_at = 0;
	record_orphan(a, HANDED_OVER_ERROR);
	return true;
}
