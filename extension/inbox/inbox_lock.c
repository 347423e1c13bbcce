/*-------------------------------------------------------------------------
 *
 * inbox_lock.c
 *	  The inbox attempts' locks: a registry in shared memory of the
 *	  messages whose attempt is not accounted for yet.
 *
 * An attempt holds its message's lock from idem_inbox_begin until it is
 * accounted for (inbox_cap.c says when), so that no concurrent delivery
 * starts from an error count that misses it.  That spans transactions:
 * the failed attempt's transaction aborts first, its failure is recorded
 * in a later one.  Why not one of PostgreSQL's locks:
 *
 *	 - an advisory lock (0.4.0) is in the namespace of ordinary SQL: any
 *	   role can take it (and block a consumer forever, or learn that an
 *	   attempt is open), pg_locks shows it, and pg_advisory_unlock or
 *	   pg_advisory_unlock_all -- from a view, a SQL function or a plan
 *	   prepared earlier -- release it in the middle of an attempt;
 *	 - any other session-level lock of the user lock method (a tag no SQL
 *	   function builds) is still released by pg_advisory_unlock_all and
 *	   DISCARD ALL, which release every session lock of that method;
 *	 - a session-level lock of the default lock method is released when a
 *	   transaction aborts (ProcReleaseLocks), which is exactly when an
 *	   attempt must keep it.
 *
 * So the lock is an entry of this registry: no SQL function reaches it,
 * and nothing but this file takes or releases an entry.  An entry is
 * (database, scope, message key): deliveries of the same (consumer,
 * message_id) in two scopes are two messages, and one never waits for the
 * other.  An entry is released when its attempt is accounted for, and in
 * any case when its backend exits (on_shmem_exit, after inbox_cap.c's
 * before_shmem_exit has recorded the orphans); a crash of the server
 * re-creates shared memory empty.
 *
 * Waiting is done on a heavyweight lock the holder also keeps, so that a
 * waiter is an ordinary lock waiter: lock_timeout, cancellation and the
 * deadlock detector apply, and the isolation tester sees it blocked.  Its
 * tag (a session lock of the user lock method, of the type no SQL
 * function builds) is a keyed hash of the entry under a secret drawn when
 * the server starts, so nobody can tell from pg_locks which message,
 * scope or consumer an attempt is about, nor take the lock in advance.
 * The lock is only how waiters sleep, never what decides: the entry is.
 * If the holder's lock is gone while its entry stays (its session ran
 * pg_advisory_unlock_all() or DISCARD ALL), a waiter finds the entry
 * still taken and polls the registry instead (every WAIT_POLL_MS, still
 * under lock_timeout, with a check for a cycle of such waiters).
 *
 * The registry needs shared_preload_libraries (its size is fixed at
 * start); without it idem_inbox_begin refuses with a clear message.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "inbox/inbox.h"

#include "miscadmin.h"
#include "access/twophase.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "common/hashfn.h"
#include "port.h"
#include "storage/lock.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* This backend's PGPROC number, and LockHeldByMe, across major versions. */
#if PG_VERSION_NUM >= 170000
#define MY_PROC_NUMBER MyProcNumber
#define LOCK_HELD_BY_ME(tag, mode) LockHeldByMe(tag, mode, false)
#else
#define MY_PROC_NUMBER (MyProc->pgprocno)
#define LOCK_HELD_BY_ME(tag, mode) LockHeldByMe(tag, mode)
#endif

/* Entries per backend slot: the attempts one backend may hold at once. */
#define INBOX_LOCKS_PER_BACKEND 16

/* A waiter's poll of the registry when the holder's lock is gone, in ms. */
#define WAIT_POLL_MS 10

typedef struct InboxLockEntry
{
	int			holder;			/* the holder's pgprocno, -1: free */
	Oid			database;
	Oid			scope;
	uint8		key[IDEM_DIGEST_LEN];
} InboxLockEntry;

typedef struct InboxLockShared
{
	LWLock	   *lock;			/* guards entries and waiting_for */
	ConditionVariable released; /* broadcast at every release */
	uint64		secret;			/* keys the heavyweight locks' tags */
	int			nentries;
	int		   *waiting_for;	/* per pgprocno: the entry waited for, or -1 */
	InboxLockEntry entries[FLEXIBLE_ARRAY_MEMBER];
} InboxLockShared;

static InboxLockShared *registry = NULL;
static bool exit_callback_registered = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Backend slots: every PGPROC that can run a transaction. */
static int
proc_slots(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

static Size
registry_size(void)
{
	int			nentries = MaxBackends * INBOX_LOCKS_PER_BACKEND;

	return add_size(add_size(offsetof(InboxLockShared, entries),
							 mul_size(nentries, sizeof(InboxLockEntry))),
					mul_size(proc_slots(), sizeof(int)));
}

static void
inbox_lock_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(registry_size()));
	RequestNamedLWLockTranche("pg_idem inbox locks", 1);
}

static void
inbox_lock_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	registry = ShmemInitStruct("pg_idem inbox locks", registry_size(), &found);
	if (!found)
	{
		registry->lock = &(GetNamedLWLockTranche("pg_idem inbox locks"))->lock;
		ConditionVariableInit(&registry->released);
		if (!pg_strong_random(&registry->secret, sizeof(registry->secret)))
			elog(ERROR, "could not generate a random secret for pg_idem's inbox locks");
		registry->nentries = MaxBackends * INBOX_LOCKS_PER_BACKEND;
		for (i = 0; i < registry->nentries; i++)
			registry->entries[i].holder = -1;
		registry->waiting_for = (int *) &registry->entries[registry->nentries];
		for (i = 0; i < proc_slots(); i++)
			registry->waiting_for[i] = -1;
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Reserve the registry; called from _PG_init (inbox_cap.c's init). */
void
idem_inbox_lock_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = inbox_lock_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = inbox_lock_shmem_startup;
}

/* The entry of (scope, key) in this database, or -1.  Under the lock. */
static int
find_entry(Oid scope, const uint8 *key)
{
	int			i;

	for (i = 0; i < registry->nentries; i++)
	{
		InboxLockEntry *e = &registry->entries[i];

		if (e->holder >= 0 && e->database == MyDatabaseId && e->scope == scope &&
			memcmp(e->key, key, IDEM_DIGEST_LEN) == 0)
			return i;
	}
	return -1;
}

/*
 * Would waiting for entry close a cycle of waiters back to this backend?
 * Under the lock; at most one step per backend slot.
 */
static bool
closes_cycle(int entry)
{
	int			steps;

	for (steps = 0; steps < proc_slots() && entry >= 0; steps++)
	{
		int			holder = registry->entries[entry].holder;

		if (holder == MY_PROC_NUMBER)
			return true;
		if (holder < 0)
			return false;
		entry = registry->waiting_for[holder];
	}
	return false;
}

/* Free every entry this backend holds, and wake the waiters. */
static void
release_all(int code, Datum arg)
{
	int			i;

	if (registry == NULL || MyProc == NULL)
		return;
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	for (i = 0; i < registry->nentries; i++)
		if (registry->entries[i].holder == MY_PROC_NUMBER)
			registry->entries[i].holder = -1;
	registry->waiting_for[MY_PROC_NUMBER] = -1;
	LWLockRelease(registry->lock);
	ConditionVariableBroadcast(&registry->released);
}

/* Stop waiting (normally, or on the way out of an error). */
static void
stop_waiting(void)
{
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	registry->waiting_for[MY_PROC_NUMBER] = -1;
	LWLockRelease(registry->lock);
	ConditionVariableCancelSleep();
}

/* Take a free entry for (scope, key): under the lock; false when full. */
static bool
take_entry(Oid scope, const uint8 *key)
{
	int			i;

	for (i = 0; i < registry->nentries; i++)
	{
		InboxLockEntry *e = &registry->entries[i];

		if (e->holder < 0)
		{
			e->holder = MY_PROC_NUMBER;
			e->database = MyDatabaseId;
			e->scope = scope;
			memcpy(e->key, key, IDEM_DIGEST_LEN);
			return true;
		}
	}
	return false;
}

/*
 * The heavyweight lock a holder keeps and its waiters wait on: keyed by
 * the server's secret, in this database.
 */
static void
wait_tag(LOCKTAG *tag, Oid scope, const uint8 *key)
{
	uint64		h = hash_bytes_extended(key, IDEM_DIGEST_LEN, registry->secret ^ scope);

	h = hash_combine64(h, hash_bytes_uint32_extended(scope, registry->secret));
	tag->locktag_field1 = MyDatabaseId;
	tag->locktag_field2 = (uint32) (h >> 32);
	tag->locktag_field3 = (uint32) h;
	tag->locktag_field4 = 0;
	tag->locktag_type = LOCKTAG_USERLOCK;
	tag->locktag_lockmethodid = USER_LOCKMETHOD;
}

/* Release the wait lock, if this session still holds it. */
static void
release_wait_lock(LOCKTAG *tag)
{
	if (LOCK_HELD_BY_ME(tag, ExclusiveLock))
		(void) LockRelease(tag, ExclusiveLock, true);
}

/* Refuse when lock_timeout has passed since the wait began. */
static void
check_lock_timeout(TimestampTz deadline)
{
	if (deadline != 0 && GetCurrentTimestamp() >= deadline)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("canceling statement due to lock timeout"),
				 errdetail("Another session's attempt at this inbox message is not accounted for yet.")));
}

/*
 * Take the lock of the message (scope, key), waiting for another
 * session's attempt at it to be accounted for.
 */
void
idem_inbox_lock(Oid scope, const uint8 *key)
{
	TimestampTz deadline = LockTimeout > 0 ?
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(), LockTimeout) : 0;
	LOCKTAG		tag;

	if (registry == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem's inbox needs pg_idem in shared_preload_libraries"),
				 errdetail("The inbox keeps the lock of every attempt not yet accounted for in shared memory, which exists only when the library is preloaded."),
				 errhint("Add pg_idem to shared_preload_libraries and restart the server.")));
	if (!exit_callback_registered)
	{
		on_shmem_exit(release_all, (Datum) 0);
		exit_callback_registered = true;
	}
	wait_tag(&tag, scope, key);

	PG_TRY();
	{
		for (;;)
		{
			int			held;

			/* The ordinary wait: for the holder's lock (lock_timeout applies). */
			(void) LockAcquire(&tag, ExclusiveLock, true, false);

			LWLockAcquire(registry->lock, LW_EXCLUSIVE);
			held = find_entry(scope, key);
			if (held < 0)
			{
				bool		taken = take_entry(scope, key);

				registry->waiting_for[MY_PROC_NUMBER] = -1;
				LWLockRelease(registry->lock);
				if (!taken)
					ereport(ERROR,
							(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
							 errmsg("too many inbox attempts are unaccounted for"),
							 errdetail("The server keeps at most %d inbox attempts in flight (%d per connection slot).",
									   registry->nentries, INBOX_LOCKS_PER_BACKEND),
							 errhint("Finish attempts (idem_inbox_done, or idem_inbox_fail and COMMIT) before beginning more.")));
				break;			/* the entry and its lock are ours */
			}

			/* Taken, but its holder's lock is gone: poll the registry. */
			release_wait_lock(&tag);
			if (closes_cycle(held))
			{
				registry->waiting_for[MY_PROC_NUMBER] = -1;
				LWLockRelease(registry->lock);
				ereport(ERROR,
						(errcode(ERRCODE_T_R_DEADLOCK_DETECTED),
						 errmsg("deadlock detected between inbox attempts"),
						 errdetail("This session waits for an inbox message whose attempt another session holds, and that session waits for one this session holds."),
						 errhint("Account for a failed attempt (idem_inbox_fail and COMMIT) before beginning another message.")));
			}
			registry->waiting_for[MY_PROC_NUMBER] = held;
			LWLockRelease(registry->lock);
			check_lock_timeout(deadline);
			ConditionVariablePrepareToSleep(&registry->released);
			(void) ConditionVariableTimedSleep(&registry->released, WAIT_POLL_MS,
											   PG_WAIT_EXTENSION);
			ConditionVariableCancelSleep();
			check_lock_timeout(deadline);
		}
	}
	PG_CATCH();
	{
		/* Not the holder (that ends the loop): keep no lock of the wait. */
		release_wait_lock(&tag);
		stop_waiting();
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/* Release the message's lock if this backend holds it. */
void
idem_inbox_unlock(Oid scope, const uint8 *key)
{
	int			held;
	LOCKTAG		tag;

	if (registry == NULL)
		return;
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	held = find_entry(scope, key);
	if (held >= 0 && registry->entries[held].holder == MY_PROC_NUMBER)
		registry->entries[held].holder = -1;
	else
		held = -1;
	LWLockRelease(registry->lock);
	/* The entry first: a waiter woken by the lock then finds it free. */
	wait_tag(&tag, scope, key);
	release_wait_lock(&tag);
	if (held >= 0)
		ConditionVariableBroadcast(&registry->released);
}
