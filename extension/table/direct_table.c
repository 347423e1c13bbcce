/*-------------------------------------------------------------------------
 *
 * direct_table.c
 *	  Reading and writing one of pg_idem's tables without a SQL executor
 *	  per call: the kept state, opening and closing a call, the
 *	  primary-key probe and range scans of declared secondary indexes.
 *	  The writes (a plain or race-safe insert, an update, a delete or a
 *	  lock of a row read before) are in direct_write.c.
 *
 * The hot paths (claims: key_table.c; staging an outbox event: outbox_stage.c)
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
#include "postgres.h"

#include "core/compat.h"
#include "core/schema.h"
#include "core/scope.h"
#include "table/direct_table.h"

#include "table/direct_build.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

/*
 * Every table some module opened in this backend, and the states of calls
 * nested inside calls (transient, for their duration): invalidations and
 * aborts reach them all.
 */
#define MAX_TABLES 16
static DirectTable *tables[MAX_TABLES];
static int	ntables = 0;
static bool callbacks_registered = false;

static void direct_use_snapshot(DirectTable *dt, bool fresh);

static void
unregister_table(DirectTable *dt)
{
	int			t;

	for (t = 0; t < ntables; t++)
		if (tables[t] == dt)
		{
			tables[t] = tables[--ntables];
			break;
		}
	dt->registered = false;
}

/* A nested call's state: gone with its call. */
static void
free_transient(DirectTable *dt)
{
	unregister_table(dt);
	if (dt->context != NULL)
		MemoryContextDelete(dt->context);
	pfree(dt);
}

/* A relcache invalidation of one of our relations: rebuild before next use. */
static void
invalidate_relation(Datum arg, Oid relid)
{
	int			t;
	int			i;

	for (t = 0; t < ntables; t++)
	{
		DirectTable *dt = tables[t];

		/* Also while it is being built: an index lock taken then may deliver it. */
		if (!OidIsValid(dt->relid))
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
 * point at buffers the abort unpinned, so the kept state is dropped.  A
 * subtransaction's abort ends only the calls it began: one begun by a
 * trigger inside a call, or a PL/pgSQL exception block there, leaves the
 * outer call running.
 */
static void
forget_aborted_calls(bool top, SubTransactionId subid)
{
	int			t;
	int			i;

	for (t = ntables - 1; t >= 0; t--)
	{
		DirectTable *dt = tables[t];

		if (dt->in_use && (top || dt->open_subid == subid))
		{
			if (dt->transient)
			{
				free_transient(dt);
				continue;
			}
			dt->in_use = false;
			dt->query_started = false;
			dt->scan = NULL;
			for (i = 0; i < dt->nscan_defs; i++)
				dt->scans[i].desc = NULL;
			dt->guc_level = 0;
			dt->stale = true;
		}
	}
}

static void
xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
		forget_aborted_calls(true, InvalidSubTransactionId);
}

static void
subxact_callback(SubXactEvent event, SubTransactionId mySubid,
				 SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		forget_aborted_calls(false, mySubid);
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

/*
 * Open the schema's table for one call: lock it as the statement would
 * (DIRECT_READ: as a SELECT, and as an INSERT or UPDATE from the first
 * write on), rebuild the kept state if needed, and switch to the table's
 * owner.  Every open is paired with direct_close; an error in between
 * ends the call (see forget_aborted_calls).  A call made inside another
 * call on the same table (by a trigger on it) gets a state of its own for
 * its duration: the returned one.
 */
DirectTable *
direct_open(DirectTableDef *def, Oid namespace, DirectAccess access)
{
	DirectTable *kept = def->kept;
	DirectTable *dt;
	LOCKMODE	lockmode = access == DIRECT_READ ? AccessShareLock : RowExclusiveLock;
	Relation	rel = NULL;
	int			i;

	if (kept == NULL)
	{
		if (def->ncolumns > DIRECT_MAX_COLUMNS)
			elog(ERROR, "pg_idem: table %s declares too many columns", def->relname);
		kept = MemoryContextAllocZero(TopMemoryContext, sizeof(DirectTable));
		kept->relname = def->relname;
		kept->columns = def->columns;
		kept->ncolumns = def->ncolumns;
		kept->scan_defs = def->indexes;
		kept->nscan_defs = def->nindexes;
		def->kept = kept;
	}
	dt = kept;
	/* Never in a security-restricted operation (core/scope.c). */
	idem_refuse_restricted();
	if (!kept->registered)
		register_table(kept);
	if (access != DIRECT_READ)
	{
		const char *command = access == DIRECT_INSERT ? "INSERT" : "UPDATE";

		PreventCommandIfReadOnly(command);
		PreventCommandIfParallelMode(command);
	}
	if (kept->in_use)
	{
		if (ntables >= MAX_TABLES)
			elog(ERROR, "pg_idem: calls nested too deeply on table %s", kept->relname);
		dt = MemoryContextAllocZero(TopMemoryContext, sizeof(DirectTable));
		dt->relname = kept->relname;
		dt->columns = kept->columns;
		dt->ncolumns = kept->ncolumns;
		dt->scan_defs = kept->scan_defs;
		dt->nscan_defs = kept->nscan_defs;
		dt->transient = true;
		register_table(dt);
		/* Reached by an abort from here on (forget_aborted_calls frees it). */
		dt->in_use = true;
		dt->open_subid = GetCurrentSubTransactionId();
	}

	/* The kept OID may name a table dropped since: then look it up again. */
	if (dt->built && !dt->stale && dt->namespace == namespace)
		rel = try_table_open(dt->relid, lockmode);
	if (rel == NULL)
	{
		idem_require_served_schema(namespace);
		rel = table_open(lookup_table(dt, namespace), lockmode);
	}

	/* As the owner from here on: the kept expressions are built as the owner too. */
	GetUserIdAndSecContext(&dt->save_userid, &dt->save_sec_context);
	SetUserIdAndSecContext(rel->rd_rel->relowner, dt->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE | SECURITY_NOFORCE_RLS);

	/*
	 * Rebuild until the state is as new as the catalogs once every lock of
	 * the call's is held: taking one can deliver an invalidation.
	 */
	for (;;)
	{
		if (!dt->built || dt->stale || dt->namespace != namespace ||
			dt->relid != RelationGetRelid(rel))
		{
			/*
			 * Preparing expressions may inline SQL functions, which parses
			 * their bodies: never with the caller's search_path.
			 */
			int			level = NewGUCNestLevel();

			(void) set_config_option("search_path", "pg_catalog, pg_temp",
									 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
									 true, 0, false);
			direct_build(dt, rel, namespace);
			AtEOXact_GUC(true, level);
		}
		dt->rri->ri_RelationDesc = rel;
		for (i = 0; i < dt->nindexes; i++)
			dt->rri->ri_IndexRelationDescs[i] = index_open(dt->index_oids[i], lockmode);
		if (!dt->stale)
			break;
		for (i = 0; i < dt->nindexes; i++)
			index_close(dt->rri->ri_IndexRelationDescs[i], NoLock);
	}

	/*
	 * The kept IndexInfos' AM caches (GIN's and BRIN's insert state) point
	 * at the indexes' relcache entries of the call that made them.  An
	 * entry is only rebuilt or freed by an invalidation of it, which marks
	 * this state stale (invalidate_relation): the caches never outlive
	 * their entries.
	 */
	dt->rel = rel;
	/*
	 * A trigger's function is looked up afresh in every call: its FmgrInfo
	 * caches (PL/pgSQL's compiled function, say) live in the memory of the
	 * call that first fired it.
	 */
	if (dt->rri->ri_TrigDesc != NULL)
		memset(dt->rri->ri_TrigFunctions, 0,
			   sizeof(FmgrInfo) * dt->rri->ri_TrigDesc->numtriggers);
	dt->estate->es_trig_target_relations = NIL;
	dt->query_started = false;
	dt->write_locked = access != DIRECT_READ;
	dt->snapshot = NULL;
	/* After an error the resource owner released a registered one. */
	dt->snapshot_registered = false;
	dt->scan = NULL;
	for (i = 0; i < dt->nscan_defs; i++)
		dt->scans[i].desc = NULL;
	dt->guc_level = 0;
	if (dt->pin_search_path)
	{
		dt->guc_level = NewGUCNestLevel();
		(void) set_config_option("search_path", "pg_catalog, pg_temp",
								 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
								 true, 0, false);
	}
	dt->open_subid = GetCurrentSubTransactionId();
	dt->in_use = true;
	return dt;
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
	for (i = 0; i < dt->nscan_defs; i++)
		if (dt->scans[i].desc != NULL)
			direct_index_scan_end(&dt->scans[i]);
	if (dt->query_started)
		AfterTriggerEndQuery(estate);
	if (dt->snapshot_registered)
		UnregisterSnapshot(dt->snapshot);
	dt->snapshot_registered = false;
	dt->snapshot = NULL;
	dt->query_started = false;
	/* Relations an immediate trigger's firing opened (SET CONSTRAINTS). */
	foreach(lc, estate->es_trig_target_relations)
	{
		ResultRelInfo *rinfo = lfirst(lc);

		ExecCloseIndices(rinfo);
		table_close(rinfo->ri_RelationDesc, NoLock);
	}
	estate->es_trig_target_relations = NIL;
	ExecResetTupleTable(estate->es_tupleTable, true);
	estate->es_tupleTable = NIL;
	idem_set_updated_cols(estate, dt->rte, NULL);

	ExecClearTuple(dt->read_slot);
	ExecClearTuple(dt->new_slot);
	ExecClearTuple(dt->conflict_slot);
	ExecClearTuple(dt->rri->ri_TrigOldSlot);
	ExecClearTuple(dt->rri->ri_TrigNewSlot);
	ResetPerTupleExprContext(estate);

	for (i = 0; i < dt->nindexes; i++)
	{
		/* The AM's insert state (BRIN's pinned revmap) ends with the call. */
		idem_index_insert_cleanup(dt->rri->ri_IndexRelationDescs[i],
								  dt->rri->ri_IndexRelationInfo[i]);
		index_close(dt->rri->ri_IndexRelationDescs[i], NoLock);
	}
	table_close(dt->rel, NoLock);
	dt->rel = NULL;

	if (dt->guc_level != 0)
		AtEOXact_GUC(true, dt->guc_level);
	dt->guc_level = 0;
	SetUserIdAndSecContext(dt->save_userid, dt->save_sec_context);
	dt->in_use = false;
	if (dt->transient)
		free_transient(dt);
}

/* How many columns the table's primary key has. */
int
direct_key_columns(DirectTable *dt)
{
	return dt->rri->ri_IndexRelationDescs[dt->pk_index]->rd_index->indnkeyatts;
}

/* The table's attribute number of the primary key's key_column'th column. */
AttrNumber
direct_key_attnum(DirectTable *dt, int key_column)
{
	Assert(key_column >= 0 && key_column < direct_key_columns(dt));
	return dt->rri->ri_IndexRelationDescs[dt->pk_index]->rd_index->indkey.values[key_column];
}

/* The attribute number of a declared column. */
AttrNumber
direct_attnum(DirectTable *dt, int column)
{
	return dt->attnum[column];
}

/* How many attributes a row of the table has (its deformed arrays' size). */
int
direct_natts(DirectTable *dt)
{
	return dt->desc->natts;
}

/* The schema of the table open in this call. */
Oid
direct_namespace(DirectTable *dt)
{
	return dt->namespace;
}

/*
 * Start reading the rows whose primary key's first nkeys columns equal
 * keys.  fresh_snapshot: as a volatile statement reads (the command
 * counter advanced, a new snapshot under READ COMMITTED); otherwise with
 * the snapshot of the call's previous read, or at first the calling
 * statement's, as a stable function reads.
 */
void
direct_scan_begin(DirectTable *dt, int nkeys, const Datum *keys, bool fresh_snapshot)
{
	Relation	index = dt->rri->ri_IndexRelationDescs[dt->pk_index];
	ScanKeyData skey[INDEX_MAX_KEYS];
	int			k;

	Assert(nkeys >= 1 && nkeys <= direct_key_columns(dt));
	for (k = 0; k < nkeys; k++)
		ScanKeyEntryInitialize(&skey[k], 0, k + 1, BTEqualStrategyNumber,
							   index->rd_opcintype[k], index->rd_indcollation[k],
							   dt->pk_eq[k], keys[k]);
	direct_use_snapshot(dt, fresh_snapshot);
	dt->scan = idem_index_beginscan(dt->rel, index, dt->snapshot, nkeys);
	index_rescan(dt->scan, skey, nkeys, NULL, 0);
}

/*
 * The snapshot of a read.  fresh: as a volatile statement reads (the
 * command counter advanced, a new snapshot under READ COMMITTED);
 * otherwise the snapshot of the call's previous read, or at first the
 * calling statement's, as a stable function reads.
 */
static void
direct_use_snapshot(DirectTable *dt, bool fresh)
{
	if (fresh)
	{
		/*
		 * Registered: under READ COMMITTED GetTransactionSnapshot returns
		 * the static CurrentSnapshot, which the next call (a trigger's
		 * query, say) overwrites, and whose xmin nothing protects.  An
		 * assert-enabled PostgreSQL 18 traps a scan with it.
		 */
		CommandCounterIncrement();
		if (dt->snapshot_registered)
			UnregisterSnapshot(dt->snapshot);
		dt->snapshot = RegisterSnapshot(GetTransactionSnapshot());
		dt->snapshot_registered = true;
	}
	else if (dt->snapshot == NULL)
		dt->snapshot = GetActiveSnapshot();
	dt->estate->es_snapshot = dt->snapshot;
}

/*
 * The next matching row, copied into the caller's memory with its place
 * in t_self; NULL after the last.  A row older than a column added since
 * (by ALTER TABLE ... ADD COLUMN in an upgrade) is expanded with the
 * column's default, as a slot would show it.
 */
HeapTuple
direct_scan_next(DirectTable *dt)
{
	if (!index_getnext_slot(dt->scan, ForwardScanDirection, dt->read_slot))
		return NULL;
	return direct_copy_row(dt, dt->read_slot);
}

/* A slot's row, copied and expanded as direct_scan_next returns it. */
HeapTuple
direct_copy_row(DirectTable *dt, TupleTableSlot *slot)
{
	HeapTuple	tuple;
	ItemPointerData tid = slot->tts_tid;

	tuple = ExecCopySlotHeapTuple(slot);
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
 * Range scans of the declared secondary B-tree indexes (DirectIndex): a
 * plain index scan, as the executor's IndexScan node runs it, with the
 * primary-key probe's snapshot choice; it predicate-locks what it reads
 * under SERIALIZABLE.  At most one scan of an index is open in a call;
 * the call's close ends any left open.  The outbox's claim walks its
 * claimable index and probes its per-key order index this way.
 */

/*
 * Start reading the rows whose entries in the index-th declared index
 * satisfy every key, in the index's order.  fresh_snapshot as for
 * direct_scan_begin.
 */
DirectIndexScan *
direct_index_scan_begin(DirectTable *dt, int index, int nkeys, const DirectScanKey *keys,
						bool fresh_snapshot)
{
	DirectIndexScan *scan;
	Relation	irel;
	ScanKeyData skey[DIRECT_MAX_INDEX_KEYS];
	int			k;

	if (index < 0 || index >= dt->nscan_defs)
		elog(ERROR, "pg_idem: table %s has no declared index %d", dt->relname, index);
	scan = &dt->scans[index];
	if (scan->desc != NULL)
		elog(ERROR, "pg_idem: index %s is already being scanned", dt->scan_defs[index].name);
	if (nkeys < 1 || nkeys > dt->scan_defs[index].nkeys)
		elog(ERROR, "pg_idem: %d keys for index %s", nkeys, dt->scan_defs[index].name);
	if (dt->scan_index[index] < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem index %s is missing or not usable", dt->scan_defs[index].name),
				 errdetail("Table %s needs a valid B-tree index %s on the columns of pg_idem's definition, ascending, with no narrower predicate.",
						   dt->relname, dt->scan_defs[index].name),
				 errhint("Run REINDEX INDEX %s, or create it again as pg_idem's install script does.",
						 dt->scan_defs[index].name)));
	irel = dt->rri->ri_IndexRelationDescs[dt->scan_index[index]];
	for (k = 0; k < nkeys; k++)
	{
		int			col = keys[k].key;

		Assert(col >= 0 && col < dt->scan_defs[index].nkeys);
		Assert(keys[k].strategy >= 1 && keys[k].strategy <= BTMaxStrategyNumber);
		ScanKeyEntryInitialize(&skey[k], 0, col + 1, keys[k].strategy,
							   irel->rd_opcintype[col], irel->rd_indcollation[col],
							   dt->scan_procs[index][col][keys[k].strategy], keys[k].value);
	}
	direct_use_snapshot(dt, fresh_snapshot);
	scan->desc = idem_index_beginscan(dt->rel, irel, dt->snapshot, nkeys);
	index_rescan(scan->desc, skey, nkeys, NULL, 0);
	return scan;
}

/*
 * The next matching row version, copied into the caller's memory with its
 * place in t_self; NULL after the last.
 */
HeapTuple
direct_index_scan_next(DirectIndexScan *scan)
{
	if (!index_getnext_slot(scan->desc, ForwardScanDirection, scan->slot))
		return NULL;
	return direct_copy_row(scan->table, scan->slot);
}

void
direct_index_scan_end(DirectIndexScan *scan)
{
	index_endscan(scan->desc);
	scan->desc = NULL;
	ExecClearTuple(scan->slot);
}
