/*-------------------------------------------------------------------------
 *
 * direct_table.c
 *	  Reading and writing one of pg_idem's tables without a SQL executor
 *	  per call: the kept state, opening and closing a call, and the
 *	  primary-key probe.  The writes (a plain or race-safe insert, an
 *	  update of a row read before) are in direct_write.c.
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

#include "table/direct_table.h"
#include "core/scope.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "access/transam.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/nodeModifyTable.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "parser/parse_coerce.h"
#if PG_VERSION_NUM >= 160000
#include "parser/parse_relation.h"
#endif
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/typcache.h"
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
			(TupleDescAttr(RelationGetDescr(rel), attnum - 1)->atttypid != dt->columns[c].type &&
			 (!OidIsValid(dt->columns[c].earlier_type) ||
			  TupleDescAttr(RelationGetDescr(rel), attnum - 1)->atttypid != dt->columns[c].earlier_type)))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pg_idem table %s has an unexpected shape", dt->relname),
					 errdetail("Column \"%s\" is missing or not of type %s.",
							   dt->columns[c].name, format_type_be(dt->columns[c].type))));
		dt->attnum[c] = attnum;
	}
}

/* Is funcid somebody else's: neither built in nor pg_idem's? */
static bool
is_foreign_function(Oid funcid, void *context)
{
	return funcid >= FirstNormalObjectId &&
		getExtensionOfObject(ProcedureRelationId, funcid) != *(Oid *) context;
}

static bool
calls_foreign_function(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (check_functions_in_node(node, is_foreign_function, context))
		return true;
	return expression_tree_walker(node, calls_foreign_function, context);
}

/*
 * Does code somebody else wrote run inside a write: a trigger a DBA added,
 * a column of a type of theirs (a domain's CHECK), or a function of theirs
 * in a CHECK, a default, a generated column, an index expression or
 * predicate, a trigger's WHEN?  Such code may resolve
 * names with the search_path when it runs, and it runs as the table's
 * owner: those calls pin search_path to pg_catalog, pg_temp, as SECURITY
 * DEFINER ... SET search_path did.  pg_idem's own tables have none, so
 * their calls pay nothing for it.
 */
static bool
has_foreign_code(Relation rel)
{
	Oid			extension = get_extension_oid("pg_idem", false);
	TupleConstr *constr = rel->rd_att->constr;
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	int			i;

	/* A type of somebody else's: its domain CHECKs, its I/O functions. */
	for (i = 0; i < RelationGetDescr(rel)->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), i);

		if (!att->attisdropped && att->atttypid >= FirstNormalObjectId)
			return true;
	}
	if (constr != NULL)
	{
		for (i = 0; i < constr->num_check; i++)
			if (calls_foreign_function(stringToNode(constr->check[i].ccbin), &extension))
				return true;
		for (i = 0; i < constr->num_defval; i++)
			if (calls_foreign_function(stringToNode(constr->defval[i].adbin), &extension))
				return true;
	}
	if (rel->trigdesc != NULL)
		for (i = 0; i < rel->trigdesc->numtriggers; i++)
		{
			Trigger    *trigger = &rel->trigdesc->triggers[i];

			if (is_foreign_function(trigger->tgfoid, &extension) ||
				(trigger->tgqual != NULL &&
				 calls_foreign_function(stringToNode(trigger->tgqual), &extension)))
				return true;
		}
	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		bool		foreign = calls_foreign_function((Node *) RelationGetIndexExpressions(index), &extension) ||
			calls_foreign_function((Node *) RelationGetIndexPredicate(index), &extension);

		for (i = 0; i < index->rd_index->indnkeyatts && !foreign; i++)
			foreign = index->rd_opcintype[i] >= FirstNormalObjectId ||
				index->rd_opfamily[i] >= FirstNormalObjectId;
		index_close(index, AccessShareLock);
		if (foreign)
			return true;
	}
	return false;
}

/*
 * What an INSERT naming only the columns the caller sets would give the
 * others: their default, computed per new row (prepared here once).
 * Stored generated columns are recomputed by every write (they are all
 * marked as depending on the update).
 */
static void
prepare_defaults(DirectTable *dt, Relation rel, RangeTblEntry *rte)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

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
#if PG_VERSION_NUM < 160000
			rte->extraUpdatedCols = bms_add_member(rte->extraUpdatedCols,
												   att->attnum - FirstLowInvalidHeapAttributeNumber);
#endif
			continue;
		}
		expr = build_column_default(rel, att->attnum);
		/* No default, a domain type: its NOT NULL and CHECKs judge the NULL, as in SQL. */
		if (expr == NULL && get_typtype(att->atttypid) == TYPTYPE_DOMAIN)
			expr = coerce_to_domain((Node *) makeNullConst(getBaseType(att->atttypid), -1,
														   att->attcollation),
									InvalidOid, -1, att->atttypid, COERCION_IMPLICIT,
									COERCE_IMPLICIT_CAST, -1, false);
		if (expr == NULL)
			continue;
		dt->default_attnums[dt->ndefaults] = att->attnum;
		dt->default_exprs[dt->ndefaults] = ExecPrepareExpr((Expr *) expr, dt->estate);
		dt->ndefaults++;
	}
}

/* Rebuild the kept state for rel, the schema's table. */
static void
build(DirectTable *dt, Relation rel, Oid namespace)
{
	MemoryContext old;
	RangeTblEntry *rte;
	int			i;
	int			k;

	/* An invalidation during the build (it takes locks) makes it stale again. */
	dt->built = false;
	dt->stale = false;
	dt->relid = RelationGetRelid(rel);
	dt->nindexes = 0;
	dt->index_oids = NULL;
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

	dt->pin_search_path = has_foreign_code(rel);
	dt->desc = CreateTupleDescCopyConstr(RelationGetDescr(rel));
	dt->assigned = palloc0(sizeof(bool) * Max(dt->desc->natts, 1));
	dt->old_values = palloc0(sizeof(Datum) * Max(dt->desc->natts, 1));
	dt->old_nulls = palloc0(sizeof(bool) * Max(dt->desc->natts, 1));
	dt->estate = CreateExecutorState();
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = dt->relid;
	rte->relkind = RELKIND_RELATION;
	rte->rellockmode = RowExclusiveLock;
	dt->rte = rte;
#if PG_VERSION_NUM >= 160000
	{
		List	   *perminfos = NIL;

		(void) addRTEPermissionInfo(&perminfos, rte);
		ExecInitRangeTable(dt->estate, list_make1(rte), perminfos);
	}
#else
	ExecInitRangeTable(dt->estate, list_make1(rte));
#endif
	dt->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(dt->rri, rel, 1, NULL, 0);
	/* So that AFTER trigger firing finds it instead of making one per call. */
	dt->estate->es_opened_result_relations = list_make1(dt->rri);

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
			for (k = 0; k < index->rd_index->indnkeyatts; k++)
			{
				Oid			eq = get_opfamily_member(index->rd_opfamily[k], index->rd_opcintype[k],
													 index->rd_opcintype[k], BTEqualStrategyNumber);

				if (!OidIsValid(eq))
					elog(ERROR, "pg_idem: no equality operator for the primary key of %s",
						 dt->relname);
				dt->pk_eq[k] = get_opcode(eq);
			}
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
	dt->rri->ri_TrigNewSlot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);

	MemoryContextSwitchTo(old);
	dt->built = true;
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
direct_open(DirectTable *kept, Oid namespace, DirectAccess access)
{
	DirectTable *dt = kept;
	LOCKMODE	lockmode = access == DIRECT_READ ? AccessShareLock : RowExclusiveLock;
	Relation	rel = NULL;
	int			i;

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
		rel = table_open(lookup_table(dt, namespace), lockmode);

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
			build(dt, rel, namespace);
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
	dt->scan = NULL;
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
	ExecResetTupleTable(estate->es_tupleTable, true);
	estate->es_tupleTable = NIL;
#if PG_VERSION_NUM >= 160000
	getRTEPermissionInfo(estate->es_rteperminfos, dt->rte)->updatedCols = NULL;
#else
	dt->rte->updatedCols = NULL;
#endif

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
	if (fresh_snapshot)
	{
		CommandCounterIncrement();
		dt->snapshot = GetTransactionSnapshot();
	}
	else if (dt->snapshot == NULL)
		dt->snapshot = GetActiveSnapshot();
	dt->estate->es_snapshot = dt->snapshot;

	dt->scan = index_beginscan(dt->rel, index, dt->snapshot, nkeys, 0);
	index_rescan(dt->scan, skey, nkeys, NULL, 0);
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
