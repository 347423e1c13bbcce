/*
 * compat.h: the differences between PostgreSQL majors, one #if each.
 *
 * pg_idem is one code base for PostgreSQL 15 to 19.  The direct access
 * layer (extension/table) calls the executor's internals, whose signatures
 * change between majors; every such call goes through a helper here, so
 * that a new major is a new #if in this file and nothing else.  Each
 * difference names the PostgreSQL release (and the commit, where known)
 * that made it.  Built with -Wall -Wextra -Werror against 15, 18 and 19
 * (Debian's 19~rc1) in CI, where every suite runs on each
 * (docs/guides/upgrading.md).
 *
 * Include after postgres.h.
 */
#ifndef IDEM_CORE_COMPAT_H
#define IDEM_CORE_COMPAT_H

#include "access/genam.h"
#include "access/tableam.h"
#include "executor/executor.h"
#include "nodes/execnodes.h"
#include "nodes/parsenodes.h"
#include "nodes/pg_list.h"
#include "parser/analyze.h"
#include "storage/lock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/relcache.h"
#if PG_VERSION_NUM >= 160000
#include "parser/parse_relation.h"
#endif
/*
 * The varlena macros (VARSIZE_ANY_EXHDR, VARDATA, SET_VARSIZE): in
 * postgres.h up to 15; PostgreSQL 16 (commit d952373a9, "New header
 * varatt.h split off from postgres.h", Peter Eisentraut) moved them, and
 * 18's header clean-ups stopped fmgr.h and others from including it.
 */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/*
 * The table's primary key index.  PostgreSQL 18 (relcache: rd_pkindex also
 * records a DEFERRABLE primary key now; callers say whether they accept
 * one) added deferrable_ok.  A deferrable key cannot arbitrate a claim
 * (ON CONFLICT refuses one too), so pg_idem keeps 15's answer: none.
 */
static inline Oid
idem_primary_key_index(Relation rel)
{
#if PG_VERSION_NUM >= 180000
	return RelationGetPrimaryKeyIndex(rel, false);
#else
	return RelationGetPrimaryKeyIndex(rel);
#endif
}

/*
 * The executor state's range table: the one table pg_idem writes.
 * PostgreSQL 16 (commit a61b1f748, "Rework query relation permission
 * checking") moved the permissions into RTEPermissionInfo, a list beside
 * the range table; PostgreSQL 18 (runtime partition pruning done before
 * ExecInitNode, Amit Langote) added the set of unpruned range table
 * indexes, here just the table (index 1).
 */
static inline void
idem_init_range_table(EState *estate, RangeTblEntry *rte)
{
#if PG_VERSION_NUM >= 160000
	List	   *perminfos = NIL;

	(void) addRTEPermissionInfo(&perminfos, rte);
#endif
#if PG_VERSION_NUM >= 180000
	ExecInitRangeTable(estate, list_make1(rte), perminfos, bms_make_singleton(1));
#elif PG_VERSION_NUM >= 160000
	ExecInitRangeTable(estate, list_make1(rte), perminfos);
#else
	ExecInitRangeTable(estate, list_make1(rte));
#endif
}

/*
 * The columns an UPDATE changes, which column-level triggers and
 * permission checks read: on the range table entry up to 15, on its
 * RTEPermissionInfo from 16 (commit a61b1f748, as above).
 */
static inline void
idem_set_updated_cols(EState *estate, RangeTblEntry *rte, Bitmapset *cols)
{
#if PG_VERSION_NUM >= 160000
	getRTEPermissionInfo(estate->es_rteperminfos, rte)->updatedCols = cols;
#else
	(void) estate;
	rte->updatedCols = cols;
#endif
}

/*
 * A generated column an UPDATE must recompute.  Up to 15 the executor
 * read them from rte->extraUpdatedCols; PostgreSQL 16 ("Remove
 * RangeTblEntry.extraUpdatedCols", Tom Lane) computes them itself, so
 * there is nothing to note.
 */
static inline void
idem_note_generated_column(RangeTblEntry *rte, AttrNumber attnum)
{
#if PG_VERSION_NUM < 160000
	rte->extraUpdatedCols = bms_add_member(rte->extraUpdatedCols,
										   attnum - FirstLowInvalidHeapAttributeNumber);
#else
	(void) rte;
	(void) attnum;
#endif
}

/*
 * An index scan with no ORDER BY keys.  PostgreSQL 18 (commit 0fbceae84,
 * "Show index search count in EXPLAIN ANALYZE", Peter Geoghegan) added the
 * instrumentation argument (none here); PostgreSQL 19 ("Thread flags
 * through begin-scan APIs", Melanie Plageman) added scan option flags.
 * SO_NONE, not SO_HINT_REL_READ_ONLY: that hint lets a scan set the
 * visibility map while pruning, for a query that does not modify the
 * table, and pg_idem's scans are followed by its writes to the table.
 */
static inline IndexScanDesc
idem_index_beginscan(Relation heap, Relation index, Snapshot snapshot, int nkeys)
{
#if PG_VERSION_NUM >= 190000
	return index_beginscan(heap, index, snapshot, NULL, nkeys, 0, SO_NONE);
#elif PG_VERSION_NUM >= 180000
	return index_beginscan(heap, index, snapshot, NULL, nkeys, 0);
#else
	return index_beginscan(heap, index, snapshot, nkeys, 0);
#endif
}

/*
 * A sequential scan of a table.  PostgreSQL 19 added scan option flags
 * (same commit and the same SO_NONE as for index scans).
 */
static inline TableScanDesc
idem_table_beginscan(Relation rel, Snapshot snapshot, int nkeys, ScanKeyData *key)
{
#if PG_VERSION_NUM >= 190000
	return table_beginscan(rel, snapshot, nkeys, key, SO_NONE);
#else
	return table_beginscan(rel, snapshot, nkeys, key);
#endif
}

/*
 * What the executor checks of a result relation (replica identity, ...).
 * PostgreSQL 17 (commit 5f2e179bd, "Support MERGE into updatable views",
 * Dean Rasheed) added the MERGE actions; PostgreSQL 18 the ON CONFLICT
 * action, so that DO UPDATE checks UPDATE's replica identity too (17's
 * minor releases carry it as CheckValidResultRelNew).  pg_idem's writes are
 * plain INSERTs (DO NOTHING at most) and UPDATEs, checked as themselves.
 */
static inline void
idem_check_valid_result_rel(ResultRelInfo *rri, CmdType operation)
{
#if PG_VERSION_NUM >= 180000
	CheckValidResultRel(rri, operation, ONCONFLICT_NONE, NIL);
#elif PG_VERSION_NUM >= 170000
	CheckValidResultRel(rri, operation, NIL);
#else
	CheckValidResultRel(rri, operation);
#endif
}

/*
 * ON CONFLICT's pre-check of the arbiter indexes.  PostgreSQL 18 added the
 * TID of a tuple to leave out of the check (for WITHOUT OVERLAPS
 * constraints re-checked after an insert); before the insert there is
 * none, which is what 15 assumed.
 */
static inline bool
idem_check_index_constraints(ResultRelInfo *rri, TupleTableSlot *slot, EState *estate,
							 ItemPointer conflict, List *arbiters)
{
#if PG_VERSION_NUM >= 180000
	ItemPointerData none;

	ItemPointerSetInvalid(&none);
	return ExecCheckIndexConstraints(rri, slot, estate, conflict, &none, arbiters);
#else
	return ExecCheckIndexConstraints(rri, slot, estate, conflict, arbiters);
#endif
}

/*
 * Index entries for a new row version.  PostgreSQL 16 (commit 19d8e2308,
 * "Ignore BRIN indexes when checking for HOT updates", Tomas Vondra) added
 * onlySummarizing; PostgreSQL 19 folded the booleans into flags and
 * reordered the arguments.
 */
static inline List *
idem_insert_index_tuples(ResultRelInfo *rri, TupleTableSlot *slot, EState *estate,
						 bool update, bool no_dup_error, bool *spec_conflict,
						 List *arbiters, bool only_summarizing)
{
#if PG_VERSION_NUM >= 190000
	uint32		flags = (update ? EIIT_IS_UPDATE : 0) |
		(no_dup_error ? EIIT_NO_DUPE_ERROR : 0) |
		(only_summarizing ? EIIT_ONLY_SUMMARIZING : 0);

	return ExecInsertIndexTuples(rri, estate, flags, slot, arbiters, spec_conflict);
#elif PG_VERSION_NUM >= 160000
	return ExecInsertIndexTuples(rri, slot, estate, update, no_dup_error, spec_conflict,
								 arbiters, only_summarizing);
#else
	Assert(!only_summarizing);
	return ExecInsertIndexTuples(rri, slot, estate, update, no_dup_error, spec_conflict,
								 arbiters);
#endif
}

/*
 * Which indexes an updated row version needs entries in, as
 * table_tuple_update reports it: a bool up to 15, TU_UpdateIndexes (none,
 * all, or only the summarizing ones) from 16 (commit 19d8e2308, as
 * above).
 */
#if PG_VERSION_NUM >= 160000
typedef TU_UpdateIndexes IdemUpdateIndexes;
#define idem_update_needs_indexes(u) ((u) != TU_None)
#define idem_update_only_summarizing(u) ((u) == TU_Summarizing)
#else
typedef bool IdemUpdateIndexes;
#define idem_update_needs_indexes(u) (u)
#define idem_update_only_summarizing(u) false
#endif

/*
 * An updated row version.  PostgreSQL 19 added an options word
 * (TABLE_UPDATE_NO_LOGICAL, ...); pg_idem's updates are ordinary ones.
 */
static inline TM_Result
idem_table_tuple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot, CommandId cid,
						Snapshot snapshot, Snapshot crosscheck, bool wait,
						TM_FailureData *tmfd, LockTupleMode *lockmode,
						IdemUpdateIndexes *update_indexes)
{
#if PG_VERSION_NUM >= 190000
	return table_tuple_update(rel, otid, slot, cid, 0, snapshot, crosscheck, wait, tmfd,
							  lockmode, update_indexes);
#else
	return table_tuple_update(rel, otid, slot, cid, snapshot, crosscheck, wait, tmfd,
							  lockmode, update_indexes);
#endif
}

/*
 * A row version's delete.  PostgreSQL 19 added an options word, as for the
 * update, and folded changingPart into it; pg_idem's deletes are ordinary
 * ones (not a row moving to another partition).
 */
static inline TM_Result
idem_table_tuple_delete(Relation rel, ItemPointer tid, CommandId cid, Snapshot snapshot,
						Snapshot crosscheck, bool wait, TM_FailureData *tmfd)
{
#if PG_VERSION_NUM >= 190000
	return table_tuple_delete(rel, tid, cid, 0, snapshot, crosscheck, wait, tmfd);
#else
	return table_tuple_delete(rel, tid, cid, snapshot, crosscheck, wait, tmfd, false);
#endif
}

/*
 * The end of a call's inserts into an index.  PostgreSQL 17 added the
 * index AM's aminsertcleanup, for BRIN's insert state: it keeps the
 * revmap's buffers pinned across the inserts of a statement until
 * ExecCloseIndices says they are done.  A direct call that inserted must
 * say so too, or the pins outlive the call (an assert-enabled 18 then
 * traps on the next insert's use of them).  Before 17 BRIN released them
 * at each insert: nothing to do.
 */
static inline void
idem_index_insert_cleanup(Relation index, IndexInfo *info)
{
#if PG_VERSION_NUM >= 170000
	index_insert_cleanup(index, info);
#else
	(void) index;
	(void) info;
#endif
}

/*
 * The query jumble post_parse_analyze_hook receives: const from
 * PostgreSQL 19 on.
 */
#if PG_VERSION_NUM >= 190000
typedef const JumbleState IdemJumbleState;
#else
typedef JumbleState IdemJumbleState;
#endif

/*
 * An intended fall-through between switch cases.  PostgreSQL 19 builds
 * with -Wimplicit-fallthrough=5, where only the attribute counts (its
 * pg_fallthrough), not a comment.
 */
#if defined(pg_fallthrough)
#define idem_fallthrough pg_fallthrough
#elif defined(__GNUC__) && __GNUC__ >= 7
#define idem_fallthrough __attribute__((fallthrough))
#else
#define idem_fallthrough ((void) 0)
#endif

/*
 * Whether this backend holds the lock in exactly this mode.  PostgreSQL 17
 * (Noah Misch) folded LockHeldByMeExtended into LockHeldByMe, with an
 * "or stronger" argument.
 */
static inline bool
idem_lock_held_by_me(const LOCKTAG *tag, LOCKMODE mode)
{
#if PG_VERSION_NUM >= 170000
	return LockHeldByMe(tag, mode, false);
#else
	return LockHeldByMe(tag, mode);
#endif
}

/*
 * Memory for a GUC check hook's "extra".  PostgreSQL 16 (commit 407b50f2d,
 * "Store GUC data in a memory context, instead of using malloc", Tom
 * Lane) frees it with pfree: a malloc'd one corrupts memory there (an
 * assert-enabled build reports "GetMemoryChunkContext called with invalid
 * pointer").  NULL when out of memory, as malloc.
 */
static inline void *
idem_guc_malloc(size_t size)
{
#if PG_VERSION_NUM >= 160000
	return guc_malloc(LOG, size);
#else
	return malloc(size);
#endif
}

/*
 * This backend's slot in the PGPROC array.  PostgreSQL 17 (commit
 * 024c521117, "Replace BackendIds with 0-based ProcNumbers", Heikki
 * Linnakangas) dropped PGPROC's pgprocno for MyProcNumber.
 */
#if PG_VERSION_NUM >= 170000
#define idem_my_proc_number() ((int) MyProcNumber)
#else
#define idem_my_proc_number() (MyProc->pgprocno)
#endif

/*
 * A hash table of fixed size in shared memory.  PostgreSQL 19's
 * ShmemInitHash takes one size, the table's (its shared-memory rework
 * added ShmemRequestHash and kept this as the "legacy" call); before, an
 * initial and a maximum size, which a fixed-size table gives alike.
 */
static inline HTAB *
idem_shmem_init_hash(const char *name, long nelems, HASHCTL *info, int flags)
{
#if PG_VERSION_NUM >= 190000
	return ShmemInitHash(name, nelems, info, flags);
#else
	return ShmemInitHash(name, nelems, nelems, info, flags);
#endif
}

#endif							/* IDEM_CORE_COMPAT_H */
