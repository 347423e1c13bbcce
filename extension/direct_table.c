/*-------------------------------------------------------------------------
 *
 * direct_table.c
 *	  Reading and writing one of pg_idem's tables without a SQL executor
 *	  per call: a primary-key probe, a plain or race-safe insert, and an
 *	  update of a row read before.
 *
 * The hot paths (claims: key_table.c; staging an outbox event: outbox.c)
 * run a handful of fixed statements on one row.  Planning, executor
 * start-up and the CHECK constraints rebuilt from their stored text in
 * every executor cost more than the row access itself, so this module does
 * what those statements did, with the executor's own pieces, kept per
 * backend across calls:
 *
 *  - a read is an index scan of the primary key on its first column with
 *    the snapshot the SQL statement would have used (a fresh one under
 *    READ COMMITTED; the transaction's otherwise), so it sees, waits for
 *    and predicate-locks what a SELECT would;
 *  - a race-safe insert is ON CONFLICT DO NOTHING's speculative insertion
 *    (nodeModifyTable.c): it waits for an in-flight insert of the same key,
 *    and inserts nothing if that one committed;
 *  - an update rewrites the version that was read.  If a concurrent
 *    transaction updated or deleted it first, the update waited for it and
 *    changed nothing: the caller reads again and decides again, which is
 *    what EvalPlanQual's re-check of the WHERE clause gave the SQL UPDATE,
 *    without keeping a lock on a row it did not change.  REPEATABLE READ
 *    and SERIALIZABLE get 40001 where UPDATE and ON CONFLICT would raise it.
 *
 * Writes keep what the SQL statements kept: the CHECK and NOT NULL
 * constraints (ExecConstraints), column defaults and stored generated
 * columns, index maintenance and HOT (the table AM decides), and AFTER ROW
 * triggers such as the deferred constraint trigger of in-transaction
 * claims (queued by the after-row trigger calls, fired at commit).  BEFORE
 * INSERT triggers run; a BEFORE UPDATE trigger is refused, as it could
 * change a row after the caller's decision on it.
 *
 * Kept across calls: the relation and index OIDs, the column numbers, an
 * EState with its ResultRelInfo (so the CHECK expressions, defaults and
 * trigger WHEN clauses are compiled once), the index information, and
 * slots over a copy of the tuple descriptor (a copy is not
 * reference-counted, so kept slots pin nothing across transactions).  The
 * relations themselves are opened and locked per call, as a statement
 * would.  A relcache invalidation of the table or its indexes (DDL, DROP
 * or CREATE EXTENSION, ALTER EXTENSION UPDATE, VACUUM FULL, REINDEX) marks
 * the kept state stale, and an error inside a call (its slots may hold
 * released buffer pins) does too; the next call rebuilds it.
 *
 * The table access runs as the table's owner (SetUserIdAndSecContext, as
 * ri_triggers.c does), and no SQL text is run, so nothing a caller
 * creates can be resolved inside: the functions need no SECURITY DEFINER.
 *
 *-------------------------------------------------------------------------
 */
#include "direct_table.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/nodeModifyTable.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

/* Every table some module opened in this backend. */
#define MAX_TABLES 4
static DirectTable *tables[MAX_TABLES];
static int	ntables = 0;
static bool callbacks_registered = false;

/* A relcache invalidation of one of our relations: rebuild before next use. */
static void
invalidate_relation(Datum arg, Oid relid)
{
	int			t;
	int			i;

	for (t = 0; t < ntables; t++)
	{
		DirectTable *dt = tables[t];

		if (!dt->built)
			continue;
		if (relid == InvalidOid || relid == dt->relid)
			dt->stale = true;
		for (i = 0; i < dt->nindexes; i++)
			if (relid == dt->index_oids[i])
				dt->stale = true;
	}
}

/*
 * A call that raised an error never reached direct_close: its slots may
 * point at buffers the abort unpinned, so the kept state is dropped.
 */
static void
forget_aborted_calls(void)
{
	int			t;

	for (t = 0; t < ntables; t++)
	{
		DirectTable *dt = tables[t];

		if (dt->in_use)
		{
			dt->in_use = false;
			dt->query_started = false;
			dt->scan = NULL;
			dt->stale = true;
		}
	}
}

static void
xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
		forget_aborted_calls();
}

static void
subxact_callback(SubXactEvent event, SubTransactionId mySubid,
				 SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		forget_aborted_calls();
}

static void
register_table(DirectTable *dt)
{
	if (!callbacks_registered)
	{
		CacheRegisterRelcacheCallback(invalidate_relation, (Datum) 0);
		RegisterXactCallback(xact_callback, NULL);
		RegisterSubXactCallback(subxact_callback, NULL);
		callbacks_registered = true;
	}
	if (ntables >= MAX_TABLES)
		elog(ERROR, "pg_idem: too many directly accessed tables");
	tables[ntables++] = dt;
	dt->registered = true;
}

/* The schema's table of this name, checked to be pg_idem's own. */
static Oid
lookup_table(DirectTable *dt, Oid namespace)
{
	Oid			relid = get_relname_relid(dt->relname, namespace);
	Oid			extension;

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("pg_idem table %s is missing", dt->relname),
				 errdetail("Schema \"%s\" has no table %s.",
						   get_namespace_name(namespace), dt->relname)));
	extension = getExtensionOfObject(RelationRelationId, relid);
	if (!OidIsValid(extension) || strcmp(get_extension_name(extension), "pg_idem") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table %s does not belong to extension pg_idem", dt->relname),
				 errdetail("Schema \"%s\" has a table %s that is not pg_idem's.",
						   get_namespace_name(namespace), dt->relname)));
	return relid;
}

/* Check the table's shape and note where each declared column is. */
static void
map_columns(DirectTable *dt, Relation rel)
{
	int			c;

	Assert(dt->ncolumns <= DIRECT_MAX_COLUMNS);
	for (c = 0; c < dt->ncolumns; c++)
	{
		AttrNumber	attnum = get_attnum(RelationGetRelid(rel), dt->columns[c].name);

		if (attnum == InvalidAttrNumber && dt->columns[c].optional)
		{
			dt->attnum[c] = 0;
			continue;
		}
		if (attnum <= 0 ||
			TupleDescAttr(RelationGetDescr(rel), attnum - 1)->atttypid != dt->columns[c].type)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pg_idem table %s has an unexpected shape", dt->relname),
					 errdetail("Column \"%s\" is missing or not of type %s.",
							   dt->columns[c].name, format_type_be(dt->columns[c].type))));
		dt->attnum[c] = attnum;
	}
}

/*
 * What an INSERT naming only the columns the caller sets would give the
 * others: their default, computed per new row (prepared here once).
 * Stored generated columns are recomputed by every write (they are all
 * marked as depending on the update), and every declared column counts as
 * updated for column-specific triggers.
 */
static void
prepare_defaults(DirectTable *dt, Relation rel, RangeTblEntry *rte)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;
	int			c;

	dt->ndefaults = 0;
	dt->default_attnums = palloc(sizeof(AttrNumber) * Max(desc->natts, 1));
	dt->default_exprs = palloc(sizeof(ExprState *) * Max(desc->natts, 1));
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		Node	   *expr;

		if (att->attisdropped)
			continue;
		if (att->attgenerated)
		{
			rte->extraUpdatedCols = bms_add_member(rte->extraUpdatedCols,
												   att->attnum - FirstLowInvalidHeapAttributeNumber);
			continue;
		}
		expr = build_column_default(rel, att->attnum);
		if (expr == NULL)
			continue;
		dt->default_attnums[dt->ndefaults] = att->attnum;
		dt->default_exprs[dt->ndefaults] = ExecPrepareExpr((Expr *) expr, dt->estate);
		dt->ndefaults++;
	}
	for (c = 0; c < dt->ncolumns; c++)
		if (dt->attnum[c] != 0)
			rte->updatedCols = bms_add_member(rte->updatedCols,
											  dt->attnum[c] - FirstLowInvalidHeapAttributeNumber);
}

/* Rebuild the kept state for rel, the schema's table. */
static void
build(DirectTable *dt, Relation rel, Oid namespace)
{
	MemoryContext old;
	RangeTblEntry *rte;
	int			i;

	dt->built = false;
	if (dt->context != NULL)
		MemoryContextDelete(dt->context);
	dt->context = AllocSetContextCreate(TopMemoryContext, "pg_idem direct table access",
										ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(dt->context);

	dt->namespace = namespace;
	dt->relid = RelationGetRelid(rel);
	dt->owner = rel->rd_rel->relowner;
	map_columns(dt, rel);

	dt->indexid = RelationGetPrimaryKeyIndex(rel);
	if (!OidIsValid(dt->indexid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem table %s has no primary key", dt->relname)));

	dt->desc = CreateTupleDescCopyConstr(RelationGetDescr(rel));
	dt->assigned = palloc0(sizeof(bool) * Max(dt->desc->natts, 1));
	dt->estate = CreateExecutorState();
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = dt->relid;
	rte->relkind = RELKIND_RELATION;
	rte->rellockmode = RowExclusiveLock;
#if PG_VERSION_NUM >= 160000
	ExecInitRangeTable(dt->estate, list_make1(rte), NIL);
#else
	ExecInitRangeTable(dt->estate, list_make1(rte));
#endif
	dt->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(dt->rri, rel, 1, NULL, 0);

	/* Index information for speculative insertion, built once. */
	ExecOpenIndices(dt->rri, true);
	dt->nindexes = dt->rri->ri_NumIndices;
	dt->index_oids = palloc(sizeof(Oid) * Max(dt->nindexes, 1));
	dt->pk_index = -1;
	for (i = 0; i < dt->nindexes; i++)
	{
		Relation	index = dt->rri->ri_IndexRelationDescs[i];

		dt->index_oids[i] = RelationGetRelid(index);
		if (dt->index_oids[i] == dt->indexid)
		{
			if (index->rd_rel->relam != BTREE_AM_OID)
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("pg_idem table %s has an unexpected primary key", dt->relname),
						 errdetail("Its primary key is not a B-tree.")));
			dt->pk_index = i;
		}
		/* ExecOpenIndices locked it for a writer: each call locks its own. */
		index_close(index, RowExclusiveLock);
	}
	if (dt->pk_index < 0)
		elog(ERROR, "pg_idem: primary key of %s not among its indexes", dt->relname);
	dt->arbiters = list_make1_oid(dt->indexid);
	prepare_defaults(dt, rel, rte);

	dt->read_slot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);
	dt->new_slot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsVirtual);
	dt->conflict_slot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);
	/* The trigger calls' slots, kept in the ResultRelInfo: over the copy too. */
	dt->rri->ri_TrigOldSlot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);
	dt->rri->ri_TrigNewSlot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsVirtual);

	MemoryContextSwitchTo(old);
	dt->stale = false;
	dt->built = true;
}

/*
 * Open the schema's table for one call: lock it as the statement would
 * (for_write: as an UPDATE; otherwise as a SELECT, and as an INSERT or
 * UPDATE from the first write on), rebuild the kept state if needed, and
 * switch to the table's owner.  Every open is paired with direct_close;
 * an error in between ends the call (see forget_aborted_calls).
 */
void
direct_open(DirectTable *dt, Oid namespace, bool for_write)
{
	LOCKMODE	lockmode = for_write ? RowExclusiveLock : AccessShareLock;
	Relation	rel = NULL;
	int			i;

	if (!dt->registered)
		register_table(dt);
	if (dt->in_use)
		elog(ERROR, "pg_idem: table %s is already in use by this call", dt->relname);

	/* The kept OID may name a table dropped since: then look it up again. */
	if (dt->built && !dt->stale && dt->namespace == namespace)
		rel = try_table_open(dt->relid, lockmode);
	if (rel == NULL)
		rel = table_open(lookup_table(dt, namespace), lockmode);

	/* As the owner from here on: the kept expressions are built as the owner too. */
	GetUserIdAndSecContext(&dt->save_userid, &dt->save_sec_context);
	SetUserIdAndSecContext(rel->rd_rel->relowner, dt->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE | SECURITY_NOFORCE_RLS);
	if (!dt->built || dt->stale || dt->namespace != namespace ||
		dt->relid != RelationGetRelid(rel))
		build(dt, rel, namespace);

	dt->rel = rel;
	dt->rri->ri_RelationDesc = rel;
	for (i = 0; i < dt->nindexes; i++)
		dt->rri->ri_IndexRelationDescs[i] = index_open(dt->index_oids[i], lockmode);
	dt->estate->es_trig_target_relations = NIL;
	dt->query_started = false;
	dt->write_locked = for_write;
	dt->snapshot = NULL;
	dt->scan = NULL;
	dt->in_use = true;
}

/* End a call: queue the deferred trigger events, release everything. */
void
direct_close(DirectTable *dt)
{
	EState	   *estate = dt->estate;
	ListCell   *lc;
	int			i;

	if (dt->scan != NULL)
		direct_scan_end(dt);
	if (dt->query_started)
		AfterTriggerEndQuery(estate);
	dt->query_started = false;
	/* Relations an immediate trigger's firing opened (SET CONSTRAINTS). */
	foreach(lc, estate->es_trig_target_relations)
	{
		ResultRelInfo *rinfo = lfirst(lc);

		ExecCloseIndices(rinfo);
		table_close(rinfo->ri_RelationDesc, NoLock);
	}
	estate->es_trig_target_relations = NIL;
	ExecResetTupleTable(estate->es_tupleTable, false);
	estate->es_tupleTable = NIL;

	ExecClearTuple(dt->read_slot);
	ExecClearTuple(dt->new_slot);
	ExecClearTuple(dt->conflict_slot);
	ExecClearTuple(dt->rri->ri_TrigOldSlot);
	ExecClearTuple(dt->rri->ri_TrigNewSlot);
	ResetPerTupleExprContext(estate);

	for (i = 0; i < dt->nindexes; i++)
		index_close(dt->rri->ri_IndexRelationDescs[i], NoLock);
	table_close(dt->rel, NoLock);
	dt->rel = NULL;

	SetUserIdAndSecContext(dt->save_userid, dt->save_sec_context);
	dt->in_use = false;
}

/*
 * Start reading the rows whose primary key's first column equals
 * first_key.  fresh_snapshot: as a volatile statement reads (the command
 * counter advanced, a new snapshot under READ COMMITTED); otherwise with
 * the calling statement's snapshot, as a stable function reads.
 */
void
direct_scan_begin(DirectTable *dt, Datum first_key, bool fresh_snapshot)
{
	Relation	index = dt->rri->ri_IndexRelationDescs[dt->pk_index];
	ScanKeyData skey;
	Oid			opfamily = index->rd_opfamily[0];
	Oid			opcintype = index->rd_opcintype[0];
	Oid			eq = get_opfamily_member(opfamily, opcintype, opcintype, BTEqualStrategyNumber);

	if (!OidIsValid(eq))
		elog(ERROR, "pg_idem: no equality operator for the primary key of %s", dt->relname);
	if (fresh_snapshot)
	{
		CommandCounterIncrement();
		dt->snapshot = GetTransactionSnapshot();
	}
	else
		dt->snapshot = GetActiveSnapshot();
	dt->estate->es_snapshot = dt->snapshot;

	ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, opcintype,
						   index->rd_indcollation[0], get_opcode(eq), first_key);
	dt->scan = index_beginscan(dt->rel, index, dt->snapshot, 1, 0);
	index_rescan(dt->scan, &skey, 1, NULL, 0);
}

/*
 * The next matching row, copied into the caller's memory with its place
 * in t_self; NULL after the last.  A row older than a column added since
 * (scope, by the 0.3.0 upgrade) is expanded with the column's default, as
 * a slot would show it.
 */
HeapTuple
direct_scan_next(DirectTable *dt)
{
	HeapTuple	tuple;
	ItemPointerData tid;

	if (!index_getnext_slot(dt->scan, ForwardScanDirection, dt->read_slot))
		return NULL;
	tid = dt->read_slot->tts_tid;
	tuple = ExecCopySlotHeapTuple(dt->read_slot);
	if (HeapTupleHeaderGetNatts(tuple->t_data) < dt->desc->natts)
		tuple = heap_expand_tuple(tuple, dt->desc);
	tuple->t_self = tid;
	return tuple;
}

void
direct_scan_end(DirectTable *dt)
{
	index_endscan(dt->scan);
	dt->scan = NULL;
	ExecClearTuple(dt->read_slot);
}

/* A row's columns, in the table's attribute order. */
void
direct_deform(DirectTable *dt, HeapTuple tuple, Datum *values, bool *nulls)
{
	heap_deform_tuple(tuple, dt->desc, values, nulls);
}

/*
 * Start the row the next insert or update writes: old's columns for an
 * update (so that columns the caller does not know are kept), or none
 * for an insert (those the caller does not set get their defaults).
 */
TupleTableSlot *
direct_new_row(DirectTable *dt, HeapTuple old)
{
	TupleTableSlot *slot = dt->new_slot;
	int			natts = dt->desc->natts;

	ExecClearTuple(slot);
	if (old != NULL)
	{
		heap_deform_tuple(old, dt->desc, slot->tts_values, slot->tts_isnull);
		memset(dt->assigned, true, sizeof(bool) * natts);
	}
	else
	{
		memset(slot->tts_values, 0, sizeof(Datum) * natts);
		memset(slot->tts_isnull, true, sizeof(bool) * natts);
		memset(dt->assigned, false, sizeof(bool) * natts);
	}
	return slot;
}

/* Set a declared column of the row being written (absent ones: ignored). */
void
direct_set(DirectTable *dt, int column, Datum value, bool isnull)
{
	AttrNumber	attnum = dt->attnum[column];

	if (attnum == 0)
		return;
	dt->new_slot->tts_values[attnum - 1] = value;
	dt->new_slot->tts_isnull[attnum - 1] = isnull;
	dt->assigned[attnum - 1] = true;
}

/*
 * What every write does first: the writer's locks (a follower that only
 * read holds no more than a SELECT would), a command id, the trigger
 * query level.
 */
static void
start_write(DirectTable *dt)
{
	int			i;

	/* An insert that read nothing first: the statement's snapshot. */
	if (dt->snapshot == NULL)
	{
		dt->snapshot = GetActiveSnapshot();
		dt->estate->es_snapshot = dt->snapshot;
	}
	if (!dt->write_locked)
	{
		LockRelationOid(dt->relid, RowExclusiveLock);
		for (i = 0; i < dt->nindexes; i++)
			LockRelationOid(dt->index_oids[i], RowExclusiveLock);
		dt->write_locked = true;
	}
	dt->estate->es_output_cid = GetCurrentCommandId(true);
	if (!dt->query_started)
	{
		AfterTriggerBeginQuery();
		dt->query_started = true;
	}
	ResetPerTupleExprContext(dt->estate);
}

/* The defaults of the columns the caller did not set, into the new row. */
static void
compute_defaults(DirectTable *dt, TupleTableSlot *slot)
{
	ExprContext *econtext = GetPerTupleExprContext(dt->estate);
	int			i;

	for (i = 0; i < dt->ndefaults; i++)
	{
		int			off = dt->default_attnums[i] - 1;

		if (dt->assigned[off])
			continue;
		slot->tts_values[off] = ExecEvalExprSwitchContext(dt->default_exprs[i], econtext,
														  &slot->tts_isnull[off]);
	}
}

/*
 * Under REPEATABLE READ and SERIALIZABLE, a key inserted by a transaction
 * our snapshot cannot see is a serialization failure, as ON CONFLICT DO
 * NOTHING raises it (ExecCheckTIDVisible in nodeModifyTable.c).
 */
static void
check_conflict_visible(DirectTable *dt, ItemPointer tid)
{
	TupleTableSlot *slot = dt->conflict_slot;
	bool		isnull;

	if (!IsolationUsesXactSnapshot())
		return;
	if (!table_tuple_fetch_row_version(dt->rel, tid, SnapshotAny, slot))
		elog(ERROR, "pg_idem: failed to fetch the conflicting %s row", dt->relname);
	if (!table_tuple_satisfies_snapshot(dt->rel, slot, dt->snapshot) &&
		!TransactionIdIsCurrentTransactionId(
			DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull))))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update")));
	ExecClearTuple(slot);
}

/*
 * Insert the row started by direct_new_row.  on_conflict_do_nothing: as
 * INSERT ... ON CONFLICT (primary key) DO NOTHING would, false when a row
 * with the key exists (after waiting for an in-flight insert of it to
 * commit); otherwise as a plain INSERT (a duplicate key is an error).
 * *tid: where the row went; the new slot keeps its values (defaults
 * included) until the next write.
 */
bool
direct_insert(DirectTable *dt, bool on_conflict_do_nothing, ItemPointer tid)
{
	EState	   *estate = dt->estate;
	ResultRelInfo *rri = dt->rri;
	TupleTableSlot *slot = dt->new_slot;
	List	   *recheck;

	start_write(dt);
	if (dt->ndefaults > 0)
		compute_defaults(dt, slot);
	ExecStoreVirtualTuple(slot);
	/* A BEFORE trigger that skips the row: nothing inserted, as in SQL. */
	if (rri->ri_TrigDesc && rri->ri_TrigDesc->trig_insert_before_row &&
		!ExecBRInsertTriggers(estate, rri, slot))
		return false;
	if (dt->rel->rd_att->constr && dt->rel->rd_att->constr->has_generated_stored)
		ExecComputeStoredGenerated(rri, estate, slot, CMD_INSERT);
	if (dt->rel->rd_att->constr)
		ExecConstraints(rri, slot, estate);

	if (!on_conflict_do_nothing)
	{
		table_tuple_insert(dt->rel, slot, estate->es_output_cid, 0, NULL);
#if PG_VERSION_NUM >= 160000
		recheck = ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL, false);
#else
		recheck = ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL);
#endif
		ExecARInsertTriggers(estate, rri, slot, recheck, NULL);
		list_free(recheck);
		*tid = slot->tts_tid;
		return true;
	}

	for (;;)
	{
		ItemPointerData conflict;
		uint32		token;
		bool		spec_conflict = false;

		if (!ExecCheckIndexConstraints(rri, slot, estate, &conflict, dt->arbiters))
		{
			check_conflict_visible(dt, &conflict);
			return false;
		}
		token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
		table_tuple_insert_speculative(dt->rel, slot, estate->es_output_cid, 0, NULL, token);
#if PG_VERSION_NUM >= 160000
		recheck = ExecInsertIndexTuples(rri, slot, estate, false, true,
										&spec_conflict, dt->arbiters, false);
#else
		recheck = ExecInsertIndexTuples(rri, slot, estate, false, true,
										&spec_conflict, dt->arbiters);
#endif
		table_tuple_complete_speculative(dt->rel, slot, token, !spec_conflict);
		SpeculativeInsertionLockRelease(GetCurrentTransactionId());
		if (!spec_conflict)
		{
			ExecARInsertTriggers(estate, rri, slot, recheck, NULL);
			list_free(recheck);
			*tid = slot->tts_tid;
			return true;
		}
		/* Lost a race with a concurrent insert: check again (and wait). */
		list_free(recheck);
	}
}

/*
 * Write the row started by direct_new_row over the version at old_tid.
 * DIRECT_CHANGED when a concurrent transaction updated or deleted that
 * version first (under READ COMMITTED; 40001 otherwise): nothing was
 * written and no lock is kept, and the caller reads the key again.
 */
DirectWrite
direct_update(DirectTable *dt, ItemPointer old_tid, ItemPointer new_tid)
{
	EState	   *estate = dt->estate;
	ResultRelInfo *rri = dt->rri;
	TupleTableSlot *slot = dt->new_slot;
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	TM_Result	result;
	List	   *recheck = NIL;
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes;
#else
	bool		update_indexes;
#endif

	if (rri->ri_TrigDesc && rri->ri_TrigDesc->trig_update_before_row)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("pg_idem table %s has a BEFORE UPDATE trigger", dt->relname),
				 errdetail("pg_idem updates it directly, and a BEFORE UPDATE trigger could change the row after pg_idem decided on it."),
				 errhint("Use an AFTER trigger.")));
	start_write(dt);
	ExecStoreVirtualTuple(slot);
	if (dt->rel->rd_att->constr && dt->rel->rd_att->constr->has_generated_stored)
		ExecComputeStoredGenerated(rri, estate, slot, CMD_UPDATE);
	if (dt->rel->rd_att->constr)
		ExecConstraints(rri, slot, estate);

	result = table_tuple_update(dt->rel, old_tid, slot, estate->es_output_cid,
								dt->snapshot, InvalidSnapshot, true, &tmfd,
								&lockmode, &update_indexes);
	switch (result)
	{
		case TM_Ok:
			break;
		case TM_Updated:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			return DIRECT_CHANGED;
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent delete")));
			return DIRECT_CHANGED;
		case TM_SelfModified:
			elog(ERROR, "pg_idem: %s row already modified by this command", dt->relname);
			break;
		default:
			elog(ERROR, "pg_idem: unexpected result %d updating %s", (int) result, dt->relname);
			break;
	}

#if PG_VERSION_NUM >= 160000
	if (rri->ri_NumIndices > 0 && update_indexes != TU_None)
		recheck = ExecInsertIndexTuples(rri, slot, estate, true, false, NULL, NIL,
										update_indexes == TU_Summarizing);
#else
	if (rri->ri_NumIndices > 0 && update_indexes)
		recheck = ExecInsertIndexTuples(rri, slot, estate, true, false, NULL, NIL);
#endif
	ExecARUpdateTriggers(estate, rri, NULL, NULL, old_tid, NULL, slot, recheck,
						 NULL, false);
	list_free(recheck);
	*new_tid = slot->tts_tid;
	return DIRECT_WRITTEN;
}
