/*-------------------------------------------------------------------------
 *
 * inbox_registry.c
 *	  The inbox's registry, in shared memory: one entry per message whose
 *	  attempt is not accounted for yet, which no SQL can take, release or
 *	  see.
 *
 * An attempt takes its message's entry in idem_inbox_begin and keeps it
 * until the attempt is accounted for (inbox_cap.c says when), so that no
 * concurrent delivery starts from an error count that misses it.  That
 * spans transactions: a failed attempt's transaction aborts first, its
 * failure is recorded in a later one.  Why not one of PostgreSQL's locks:
 * an advisory lock is in the namespace of ordinary SQL (any role can take
 * it, see it in pg_locks, or release it with pg_advisory_unlock_all from a
 * view or a function); any other session lock of the user lock method is
 * still released by pg_advisory_unlock_all and DISCARD ALL; a session lock
 * of the default lock method is released when a transaction aborts, which
 * is exactly when an attempt must keep it.
 *
 * An entry is (database, scope, message key): deliveries of the same
 * (consumer, message_id) in two scopes are two messages.  It is held by a
 * session, or handed over: a session that cannot record its attempt's
 * failure itself (DISCARD ALL, a failed recording on its way out, a
 * session at its bound) leaves the entry in the registry with the number
 * of failed attempts it carries, and the next delivery of the message
 * adopts it (writes those failures before deciding), or the cleanup
 * worker records it.  So the count of an attempt is never dropped, only
 * moved; only a restart of the server empties the registry.
 *
 * Fair by construction: the registry has room for INBOX_ENTRIES_PER_BACKEND
 * entries per connection slot; a session holds at most
 * idem.inbox_attempts_per_session (inbox_cap.c checks its own) and a role
 * at most idem.inbox_attempts_per_role over every session (and never more
 * than a quarter of the registry), so no one session or role can take
 * what the others need.
 *
 * Waiting.  A holder keeps a heavyweight lock whose tag (a session lock
 * of the user lock method, of a type no SQL function builds) is a keyed
 * hash of the entry under a secret drawn when the server starts, so that a
 * waiter is an ordinary lock waiter: lock_timeout, cancellation and the
 * deadlock detector apply, the isolation tester sees it blocked, and
 * nobody can tell from pg_locks which message, scope or consumer an
 * attempt is about.  The lock is only how waiters sleep, never what
 * decides: the entry is.  If the holder lost its lock (its session ran
 * pg_advisory_unlock_all()), a waiter waits for the holder's transaction
 * instead while the attempt is active in it (its virtual transaction lock,
 * which the deadlock detector sees as well), and adopts the attempt once
 * it is an orphan: the holder gave up the one way others could wait for
 * it, and its failures move with the entry, so they are still counted
 * once.  No wait is ever a poll that the detector cannot see.
 *
 * The registry needs shared_preload_libraries (its size is fixed at
 * start); without it idem_inbox_begin refuses with a clear message.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/compat.h"
#include "core/settings.h"
#include "inbox/inbox.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "port.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* Room per connection slot: what the registry is sized by. */
#define INBOX_ENTRIES_PER_BACKEND 32

typedef struct InboxEntryId
{
	Oid			database;
	Oid			scope;			/* the message row's */
	uint8		key[IDEM_DIGEST_LEN];
} InboxEntryId;

/*
 * What an entry's attempt is doing.  Active: in its holder's transaction
 * (begun, or its failure being recorded).  Orphan: its transaction
 * aborted, its failures (what.uncounted) are the holder's to record.
 * Handed over: nobody's; the next to take it records them.
 */
typedef enum InboxEntryState
{
	ENTRY_ACTIVE,
	ENTRY_ORPHAN,
	ENTRY_HANDED_OVER
} InboxEntryState;

typedef struct InboxEntry
{
	InboxEntryId id;			/* the hash key: first */
	int			holder;			/* pgprocno of the holding session; -1: handed over */
	InboxEntryState state;
	InboxHandOver what;			/* for whoever records it */
} InboxEntry;

typedef struct RoleCount
{
	Oid			role;			/* the hash key */
	int			entries;
} RoleCount;

typedef struct InboxRegistry
{
	LWLock	   *lock;			/* guards both tables and used */
	ConditionVariable released; /* broadcast at every release or hand-over */
	uint64		secret;			/* keys the heavyweight locks' tags */
	int			capacity;
	int			used;
} InboxRegistry;

static InboxRegistry *registry = NULL;
static HTAB *entries = NULL;
static HTAB *role_counts = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static int
registry_capacity(void)
{
	return MaxBackends * INBOX_ENTRIES_PER_BACKEND;
}

static Size
registry_size(void)
{
	Size		size = MAXALIGN(sizeof(InboxRegistry));

	size = add_size(size, hash_estimate_size(registry_capacity(), sizeof(InboxEntry)));
	return add_size(size, hash_estimate_size(registry_capacity(), sizeof(RoleCount)));
}

static void
registry_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(registry_size());
	RequestNamedLWLockTranche("pg_idem inbox registry", 1);
}

static void
registry_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	registry = ShmemInitStruct("pg_idem inbox registry", sizeof(InboxRegistry), &found);
	if (!found)
	{
		registry->lock = &(GetNamedLWLockTranche("pg_idem inbox registry"))->lock;
		ConditionVariableInit(&registry->released);
		if (!pg_strong_random(&registry->secret, sizeof(registry->secret)))
			elog(ERROR, "could not generate a random secret for pg_idem's inbox registry");
		registry->capacity = registry_capacity();
		registry->used = 0;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(InboxEntryId);
	info.entrysize = sizeof(InboxEntry);
	entries = idem_shmem_init_hash("pg_idem inbox entries", registry_capacity(),
								   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	info.keysize = sizeof(Oid);
	info.entrysize = sizeof(RoleCount);
	role_counts = idem_shmem_init_hash("pg_idem inbox roles", registry_capacity(),
									   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* Reserve the registry; called from _PG_init (through inbox_cap.c's init). */
void
idem_inbox_registry_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = registry_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = registry_shmem_startup;
}

/* Refuse clearly where the registry does not exist. */
static void
require_registry(void)
{
	if (registry == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem's inbox needs pg_idem in shared_preload_libraries"),
				 errdetail("The inbox keeps every attempt not yet accounted for in shared memory, which exists only when the library is preloaded."),
				 errhint("Add pg_idem to shared_preload_libraries and restart the server.")));
}

static void
entry_id(InboxEntryId *id, Oid scope, const uint8 *key)
{
	memset(id, 0, sizeof(*id));
	id->database = MyDatabaseId;
	id->scope = scope;
	memcpy(id->key, key, IDEM_DIGEST_LEN);
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
release_wait_lock(Oid scope, const uint8 *key)
{
	LOCKTAG		tag;

	wait_tag(&tag, scope, key);
	if (idem_lock_held_by_me(&tag, ExclusiveLock))
		(void) LockRelease(&tag, ExclusiveLock, true);
}

/* The most entries one role may have: its setting, at most a quarter of the room. */
static int
role_bound(void)
{
	return Min(idem_inbox_attempts_per_role, Max(registry->capacity / 4, 1));
}

/* Count an entry for role (delta +1 or -1).  Under the lock. */
static void
count_role(Oid role, int delta)
{
	bool		found;
	RoleCount  *rc = hash_search(role_counts, &role, delta > 0 ? HASH_ENTER : HASH_FIND, &found);

	if (rc == NULL)
		return;
	if (!found)
		rc->entries = 0;
	rc->entries += delta;
	if (rc->entries <= 0)
		(void) hash_search(role_counts, &role, HASH_REMOVE, NULL);
}

/* Under the lock: the entries role has now. */
static int
role_entries(Oid role)
{
	RoleCount  *rc = hash_search(role_counts, &role, HASH_FIND, NULL);

	return rc == NULL ? 0 : rc->entries;
}

/* A new entry for this session, or an error naming the bound hit.  Under the lock. */
static InboxEntry *
new_entry(const InboxEntryId *id, const InboxHandOver *what)
{
	InboxEntry *e;
	bool		found;

	if (role_entries(what->caller_scope) >= role_bound())
	{
		int			bound = role_bound();

		LWLockRelease(registry->lock);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("role \"%s\" has %d inbox attempts not accounted for",
						GetUserNameFromId(what->caller_scope, true) ?
						GetUserNameFromId(what->caller_scope, true) : "(dropped)", bound),
				 errdetail("idem.inbox_attempts_per_role bounds one role's attempts in flight over every session (at most a quarter of the registry's %d entries): "
						   "attempts whose transaction committed or whose failure was recorded no longer count.",
						   registry->capacity),
				 errhint("Finish attempts (idem_inbox_done, or idem_inbox_fail and COMMIT); failures left by ended sessions are recorded by the next delivery of their message or by the cleanup worker.")));
	}
	if (registry->used >= registry->capacity)
	{
		LWLockRelease(registry->lock);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pg_idem's inbox registry is full"),
				 errdetail("The server keeps at most %d inbox attempts not accounted for (%d per connection slot), and every role is within idem.inbox_attempts_per_role.",
						   registry->capacity, INBOX_ENTRIES_PER_BACKEND),
				 errhint("Finish attempts (idem_inbox_done, or idem_inbox_fail and COMMIT), or lower idem.inbox_attempts_per_role.")));
	}
	e = hash_search(entries, id, HASH_ENTER, &found);
	Assert(!found);
	e->holder = idem_my_proc_number();
	e->state = ENTRY_ACTIVE;
	e->what = *what;
	e->what.uncounted = 0;
	registry->used++;
	count_role(what->caller_scope, 1);
	return e;
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
 * Wait for the transaction of a holder that lost its lock (a lock the
 * deadlock detector sees); a holder between that transaction's end and
 * its callbacks has none for a moment: sleep a millisecond.
 */
static void
wait_for_holder(VirtualTransactionId vxid, TimestampTz deadline)
{
	check_lock_timeout(deadline);
	if (VirtualTransactionIdIsValid(vxid))
	{
		(void) VirtualXactLock(vxid, true);
		return;
	}
	ConditionVariablePrepareToSleep(&registry->released);
	(void) ConditionVariableTimedSleep(&registry->released, 1, PG_WAIT_EXTENSION);
	ConditionVariableCancelSleep();
}

/* Make a handed-over or orphaned entry this session's; its failures.  Under the lock. */
static int32
adopt(InboxEntry *e, const InboxHandOver *what)
{
	int32		adopted = e->what.uncounted;

	count_role(e->what.caller_scope, -1);
	count_role(what->caller_scope, 1);
	e->holder = idem_my_proc_number();
	e->state = ENTRY_ACTIVE;
	e->what = *what;
	e->what.uncounted = 0;
	return adopted;
}

/*
 * Take the entry of the message (scope, key) for an attempt, waiting for
 * another session's attempt at it to be accounted for.  Returns the
 * failures a handed-over entry carried (which the caller must write), or
 * 0 for a new entry.  The caller has checked its own session's bound.
 */
int32
idem_inbox_registry_take(const InboxHandOver *what)
{
	TimestampTz deadline = LockTimeout > 0 ?
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(), LockTimeout) : 0;
	InboxEntryId id;
	LOCKTAG		tag;
	volatile int32 adopted = 0;

	require_registry();
	entry_id(&id, what->scope, what->key);
	wait_tag(&tag, what->scope, what->key);

	PG_TRY();
	{
		for (;;)
		{
			InboxEntry *e;
			VirtualTransactionId vxid;

			CHECK_FOR_INTERRUPTS();
			/* The ordinary wait: for the holder's lock. */
			(void) LockAcquire(&tag, ExclusiveLock, true, false);

			LWLockAcquire(registry->lock, LW_EXCLUSIVE);
			e = hash_search(entries, &id, HASH_FIND, NULL);
			if (e == NULL)
			{
				(void) new_entry(&id, what);
				LWLockRelease(registry->lock);
				break;
			}
			if (e->state == ENTRY_HANDED_OVER ||
				(e->state == ENTRY_ORPHAN && e->holder != idem_my_proc_number()))
			{
				/*
				 * Handed over, or an orphan whose holder dropped the lock
				 * we just took: adopt it, and its failures with it.
				 */
				adopted = adopt(e, what);
				LWLockRelease(registry->lock);
				break;
			}
			if (e->holder == idem_my_proc_number())
			{
				LWLockRelease(registry->lock);
				elog(ERROR, "inbox registry entry is already this session's");
			}
			/* Active in a session without its lock: wait for its transaction. */
			GET_VXID_FROM_PGPROC(vxid, *GetPGProcByNumber(e->holder));
			LWLockRelease(registry->lock);
			release_wait_lock(what->scope, what->key);
			wait_for_holder(vxid, deadline);
		}
	}
	PG_CATCH();
	{
		/* Not the holder (that ends the loop): keep no lock of the wait. */
		release_wait_lock(what->scope, what->key);
		ConditionVariableCancelSleep();
		PG_RE_THROW();
	}
	PG_END_TRY();
	return adopted;
}

/* Our entry of (scope, key), or NULL.  Under the lock. */
static InboxEntry *
my_entry(Oid scope, const uint8 *key)
{
	InboxEntryId id;
	InboxEntry *e;

	entry_id(&id, scope, key);
	e = hash_search(entries, &id, HASH_FIND, NULL);
	return e != NULL && e->holder == idem_my_proc_number() ? e : NULL;
}

/*
 * This session's attempt became an orphan: its failures are published
 * with the entry, where a session that takes it over (after this one
 * dropped its lock) finds them.  Called from abort callbacks.
 */
void
idem_inbox_registry_orphaned(Oid scope, const uint8 *key, int32 uncounted)
{
	InboxEntry *e;

	if (registry == NULL)
		return;
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	e = my_entry(scope, key);
	if (e != NULL)
	{
		e->state = ENTRY_ORPHAN;
		e->what.uncounted = uncounted;
	}
	LWLockRelease(registry->lock);
	ConditionVariableBroadcast(&registry->released);
}

/*
 * Before this session records its orphan: is the entry still its own (not
 * adopted by another session after this one dropped its lock)?  If so it
 * is active again, and nobody can adopt it while the recording runs.
 */
bool
idem_inbox_registry_reclaim(Oid scope, const uint8 *key)
{
	InboxEntry *e;
	bool		mine;

	if (registry == NULL)
		return false;
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	e = my_entry(scope, key);
	mine = e != NULL;
	if (mine)
		e->state = ENTRY_ACTIVE;
	LWLockRelease(registry->lock);
	return mine;
}

/* The attempt is accounted for: free its entry, and wake the waiters. */
void
idem_inbox_registry_release(Oid scope, const uint8 *key)
{
	InboxEntry *e;

	if (registry == NULL)
		return;
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	e = my_entry(scope, key);
	if (e != NULL)
	{
		count_role(e->what.caller_scope, -1);
		(void) hash_search(entries, &e->id, HASH_REMOVE, NULL);
		registry->used--;
	}
	LWLockRelease(registry->lock);
	/* The entry first: a waiter woken by the lock then finds it free. */
	release_wait_lock(scope, key);
	ConditionVariableBroadcast(&registry->released);
}

/*
 * This session cannot record the failures of its attempt: leave the entry
 * in the registry with them, for the next delivery or the cleanup worker.
 */
void
idem_inbox_registry_hand_over(Oid scope, const uint8 *key, int32 uncounted)
{
	InboxEntry *e;

	if (registry == NULL)
		return;
	if (uncounted <= 0)
	{
		idem_inbox_registry_release(scope, key);
		return;
	}
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	e = my_entry(scope, key);
	if (e != NULL)
	{
		e->holder = -1;
		e->state = ENTRY_HANDED_OVER;
		e->what.uncounted = uncounted;
		e->what.handed_over_at = GetCurrentTimestamp();
	}
	LWLockRelease(registry->lock);
	release_wait_lock(scope, key);
	ConditionVariableBroadcast(&registry->released);
}

/*
 * For the cleanup worker: take one entry of this database handed over at
 * least grace_ms ago whose message's texts were kept (so its row can be
 * written even when none exists), without waiting.  Copies what it knows
 * into *what; false when there is none.
 */
bool
idem_inbox_registry_take_handed_over(int grace_ms, InboxHandOver *what)
{
	HASH_SEQ_STATUS seq;
	InboxEntry *e;
	TimestampTz before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), -grace_ms);
	bool		taken = false;

	if (registry == NULL)
		return false;
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		LOCKTAG		tag;

		if (e->id.database != MyDatabaseId || e->state != ENTRY_HANDED_OVER ||
			e->what.consumer_len == 0 || e->what.handed_over_at > before)
			continue;
		/* Waiters must sleep on us while we record it; a busy lock: next time. */
		wait_tag(&tag, e->id.scope, e->id.key);
		if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
			continue;
		e->holder = idem_my_proc_number();
		e->state = ENTRY_ACTIVE;
		*what = e->what;
		taken = true;
		hash_seq_term(&seq);
		break;
	}
	LWLockRelease(registry->lock);
	return taken;
}

/*
 * Backend exit, after inbox_cap.c accounted for or handed over its
 * attempts: free whatever entry this backend still holds (one taken by a
 * call that failed before it was remembered), and wake the waiters.
 */
void
idem_inbox_registry_release_mine(void)
{
	HASH_SEQ_STATUS seq;
	InboxEntry *e;

	if (registry == NULL || MyProc == NULL)
		return;
	LWLockAcquire(registry->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, entries);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (e->holder != idem_my_proc_number())
			continue;
		count_role(e->what.caller_scope, -1);
		(void) hash_search(entries, &e->id, HASH_REMOVE, NULL);
		registry->used--;
	}
	LWLockRelease(registry->lock);
	ConditionVariableBroadcast(&registry->released);
}
