/*-------------------------------------------------------------------------
 *
 * direct_build.c
 *	  Building direct_table.c's kept state of a table: where its columns
 *	  are, its executor pieces (ResultRelInfo, index information, the
 *	  defaults), the arbiters of its race-safe inserts, and whether code
 *	  somebody else wrote runs inside its writes.
 *
 * A build runs with the table open and locked, but many of its steps look
 * up catalogs (an extension's dependency, an operator, an index's first
 * lock in the transaction), and each such lookup can accept invalidation
 * messages.  One of the table's rebuilds its relcache entry in place: the
 * trigger array, the pg_class row and the index list are freed and
 * replaced (and the tuple descriptor, if it changed).  So the build
 * copies what it reads of the relation first (the tuple descriptor with
 * its constraints; the trigger descriptor, by InitResultRelInfo) and
 * reads the copies from then on, never a pointer into the relation across
 * a lookup: 0.4.0 read the trigger array across one, which crashed a
 * backend when maintenance (SET (fillfactor), REINDEX CONCURRENTLY, ...)
 * committed at that moment (issue 24).  An invalidation that arrives
 * during the build marks the state stale, and direct_open builds again.
 * An index's own entry is reloaded in place while it is open, so its
 * fields may be read while it is.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/compat.h"
#include "table/direct_build.h"

#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/transam.h"
#include "catalog/dependency.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "parser/parse_coerce.h"
#include "rewrite/rewriteHandler.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

/*
 * Check the table's shape and note where each declared column is, from
 * desc (the kept copy): no catalog lookup, so nothing here can accept an
 * invalidation and rebuild the relation under a pointer into it.
 */
static void
map_columns(DirectTable *dt, TupleDesc desc)
{
	int			c;
	int			i;

	Assert(dt->ncolumns <= DIRECT_MAX_COLUMNS);
	for (c = 0; c < dt->ncolumns; c++)
	{
		Form_pg_attribute found = NULL;

		for (i = 0; i < desc->natts && found == NULL; i++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, i);

			if (!att->attisdropped && strcmp(NameStr(att->attname), dt->columns[c].name) == 0)
				found = att;
		}
		if (found == NULL || found->atttypid != dt->columns[c].type)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pg_idem table %s has an unexpected shape", dt->relname),
					 errdetail("Column \"%s\" is missing or not of type %s.",
							   dt->columns[c].name, format_type_be(dt->columns[c].type))));
		dt->attnum[c] = found->attnum;
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
 *
 * desc and trigdesc are the kept copies, never the relation's own: every
 * catalog lookup below (the extension of a function, an index's first
 * lock in the transaction) can accept invalidations, and one of the table
 * rebuilds its relcache entry in place, freeing the trigger array and
 * maybe the tuple descriptor a pointer into the relation would still
 * point at (the SIGSEGV of 0.4.0 under SET (fillfactor), REINDEX
 * CONCURRENTLY and the like).  An index's fields are read before its own
 * lookups; its entry is reloaded in place while open anyway.
 */
static bool
has_foreign_code(TupleDesc desc, TriggerDesc *trigdesc, const Oid *index_oids, int nindexes)
{
	Oid			extension = get_extension_oid("pg_idem", false);
	TupleConstr *constr = desc->constr;
	int			i;
	int			k;

	/* A type of somebody else's: its domain CHECKs, its I/O functions. */
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

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
	if (trigdesc != NULL)
		for (i = 0; i < trigdesc->numtriggers; i++)
		{
			Trigger    *trigger = &trigdesc->triggers[i];

			if (is_foreign_function(trigger->tgfoid, &extension) ||
				(trigger->tgqual != NULL &&
				 calls_foreign_function(stringToNode(trigger->tgqual), &extension)))
				return true;
		}
	for (i = 0; i < nindexes; i++)
	{
		Relation	index = index_open(index_oids[i], AccessShareLock);
		bool		foreign = false;
		List	   *expressions;
		List	   *predicate;

		for (k = 0; k < index->rd_index->indnkeyatts && !foreign; k++)
			foreign = index->rd_opcintype[k] >= FirstNormalObjectId ||
				index->rd_opfamily[k] >= FirstNormalObjectId;
		/* Both are copies: safe across the lookups of the walk. */
		expressions = RelationGetIndexExpressions(index);
		predicate = RelationGetIndexPredicate(index);
		foreign = foreign ||
			calls_foreign_function((Node *) expressions, &extension) ||
			calls_foreign_function((Node *) predicate, &extension);
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
	/* The kept copy: the lookups below may rebuild the relation's entry. */
	TupleDesc	desc = dt->desc;
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
			idem_note_generated_column(rte, att->attnum);
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

/*
 * Is index a unique index on exactly the primary key's columns, with the
 * same equality, that ON CONFLICT may take as an arbiter beside it?  The
 * copy REINDEX CONCURRENTLY builds of the primary key (<name>_ccnew, and
 * the old one once swapped) is one: without it among the arbiters, a
 * claim that loses the race for a new key to a concurrent claim gets
 * 23505 from the copy instead of the key's row (ExecInsertIndexTuples
 * checks a non-arbiter unique index with UNIQUE_CHECK_YES).  Whether the
 * index takes inserts yet (indisready) the executor checks on each write;
 * a change of it invalidates the table, and the arbiters are rebuilt.
 * Only the indexes' fixed fields are read: no lookups.
 */
static bool
same_unique_key(Relation pk, Relation index)
{
	Form_pg_index pk_form = pk->rd_index;
	Form_pg_index form = index->rd_index;
	int			k;
	int			j;

	if (!form->indisunique || !form->indimmediate ||
		form->indnkeyatts != pk_form->indnkeyatts ||
		index->rd_rel->relam != pk->rd_rel->relam ||
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) ||
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
		return false;
	for (k = 0; k < form->indnkeyatts; k++)
	{
		for (j = 0; j < pk_form->indnkeyatts; j++)
			if (form->indkey.values[k] == pk_form->indkey.values[j])
				break;
		if (j == pk_form->indnkeyatts ||
			index->rd_opfamily[k] != pk->rd_opfamily[j] ||
			index->rd_indcollation[k] != pk->rd_indcollation[j])
			return false;
	}
	return true;
}

/*
 * Does the index hold every row its declared conditions select: is its
 * predicate (none: every row) implied by them?  The index is open, its
 * predicate a copy; the lookups of the proof may accept invalidations.
 */
static bool
holds_declared_rows(DirectTable *dt, const DirectIndex *def, Relation index)
{
	List	   *predicate = RelationGetIndexPredicate(index);
	List	   *conditions = NIL;
	int			c;

	if (predicate == NIL)
		return true;
	for (c = 0; c < def->nconditions; c++)
	{
		const DirectIndexCondition *cond = &def->conditions[c];
		AttrNumber	attnum = dt->attnum[cond->column];
		Form_pg_attribute att;
		Var		   *var;

		att = TupleDescAttr(dt->desc, attnum - 1);
		/* varno 1: the table, as in the stored predicate. */
		var = makeVar(1, attnum, att->atttypid, att->atttypmod, att->attcollation, 0);
		if (cond->equals == NULL)
		{
			NullTest   *test = makeNode(NullTest);

			test->arg = (Expr *) var;
			test->nulltesttype = IS_NOT_NULL;
			test->argisrow = false;
			test->location = -1;
			conditions = lappend(conditions, test);
		}
		else
		{
			Expr	   *equals;

			if (att->atttypid != TEXTOID)
				return false;
			equals = make_opclause(TextEqualOperator, BOOLOID, false, (Expr *) var,
								   (Expr *) makeConst(TEXTOID, -1, DEFAULT_COLLATION_OID, -1,
													  CStringGetTextDatum(cond->equals),
													  false, false),
								   InvalidOid, att->attcollation);
			set_opfuncid((OpExpr *) equals);
			conditions = lappend(conditions, equals);
		}
	}
	return predicate_implied_by(predicate, conditions, false);
}

/*
 * Find the secondary indexes the module scans among the table's (open, in
 * rri) by name, and note the comparison functions of each that is a valid
 * B-tree on the declared columns, ascending, holding every row of the
 * declared conditions; any other is left unresolved (-1), and refused by
 * the scan that needs it (direct_table.c), not by calls that do not scan
 * it.  The names are pg_idem's own: only the table's owner can create an
 * index on it, but a DBA who re-creates one by hand with a narrower
 * predicate (or descending) must get an error, not claims that silently
 * skip events or break per-key order.
 */
static void
resolve_scan_indexes(DirectTable *dt)
{
	int			s;
	int			i;
	int			k;
	StrategyNumber strategy;

	if (dt->nscan_defs > DIRECT_MAX_SCAN_INDEXES)
		elog(ERROR, "pg_idem: table %s declares too many scanned indexes", dt->relname);
	for (s = 0; s < dt->nscan_defs; s++)
	{
		const DirectIndex *def = &dt->scan_defs[s];
		Relation	index = NULL;
		int			found = -1;

		dt->scan_index[s] = -1;
		for (i = 0; i < dt->nindexes && found < 0; i++)
		{
			char	   *name = get_rel_name(dt->index_oids[i]);

			if (name != NULL && strcmp(name, def->name) == 0)
				found = i;
		}
		if (found < 0)
			continue;
		index = dt->rri->ri_IndexRelationDescs[found];
		if (index->rd_rel->relam != BTREE_AM_OID || !index->rd_index->indisvalid ||
			index->rd_index->indnkeyatts != def->nkeys)
			continue;
		for (k = 0; k < def->nkeys; k++)
			if (index->rd_index->indkey.values[k] != dt->attnum[def->keys[k]] ||
				(index->rd_indoption[k] & INDOPTION_DESC) != 0)
				break;
		if (k < def->nkeys || !holds_declared_rows(dt, def, index))
			continue;
		for (k = 0; k < def->nkeys; k++)
			for (strategy = 1; strategy <= BTMaxStrategyNumber; strategy++)
			{
				Oid			op = get_opfamily_member(index->rd_opfamily[k], index->rd_opcintype[k],
													 index->rd_opcintype[k], strategy);

				if (!OidIsValid(op))
					elog(ERROR, "pg_idem: no operator of strategy %d for index %s",
						 strategy, def->name);
				dt->scan_procs[s][k][strategy] = get_opcode(op);
			}
		dt->scan_index[s] = found;
	}
}

/* Rebuild the kept state for rel, the schema's table. */
void
direct_build(DirectTable *dt, Relation rel, Oid namespace)
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
	/* Copied before any lookup (see has_foreign_code); read from the copy. */
	dt->desc = CreateTupleDescCopyConstr(RelationGetDescr(rel));
	map_columns(dt, dt->desc);

	dt->indexid = idem_primary_key_index(rel);
	if (!OidIsValid(dt->indexid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem table %s has no primary key", dt->relname)));

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
	idem_init_range_table(dt->estate, rte);
	dt->rri = makeNode(ResultRelInfo);
	/* Copies the trigger descriptor, before any lookup can free the relation's. */
	InitResultRelInfo(dt->rri, rel, 1, NULL, 0);
	/* So that AFTER trigger firing finds it instead of making one per call. */
	dt->estate->es_opened_result_relations = list_make1(dt->rri);

	/* Index information for speculative insertion, built once. */
	ExecOpenIndices(dt->rri, true);
	/* All OIDs first: invalidate_relation reads them during the lookups below. */
	dt->index_oids = palloc(sizeof(Oid) * Max(dt->rri->ri_NumIndices, 1));
	for (i = 0; i < dt->rri->ri_NumIndices; i++)
		dt->index_oids[i] = RelationGetRelid(dt->rri->ri_IndexRelationDescs[i]);
	dt->nindexes = dt->rri->ri_NumIndices;
	dt->pk_index = -1;
	for (i = 0; i < dt->nindexes; i++)
	{
		Relation	index = dt->rri->ri_IndexRelationDescs[i];

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
	}
	if (dt->pk_index < 0)
		elog(ERROR, "pg_idem: primary key of %s not among its indexes", dt->relname);
	dt->arbiters = NIL;
	for (i = 0; i < dt->nindexes; i++)
		if (i == dt->pk_index ||
			same_unique_key(dt->rri->ri_IndexRelationDescs[dt->pk_index],
							dt->rri->ri_IndexRelationDescs[i]))
			dt->arbiters = lappend_oid(dt->arbiters, dt->index_oids[i]);
	resolve_scan_indexes(dt);
	/* ExecOpenIndices locked them for a writer: each call locks its own. */
	for (i = 0; i < dt->nindexes; i++)
		index_close(dt->rri->ri_IndexRelationDescs[i], RowExclusiveLock);
	dt->pin_search_path = has_foreign_code(dt->desc, dt->rri->ri_TrigDesc,
										   dt->index_oids, dt->nindexes);
	prepare_defaults(dt, rel, rte);

	dt->read_slot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);
	for (i = 0; i < dt->nscan_defs; i++)
	{
		dt->scans[i].table = dt;
		dt->scans[i].desc = NULL;
		dt->scans[i].slot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);
	}
	dt->new_slot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsVirtual);
	dt->conflict_slot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);
	/* The trigger calls' slots, kept in the ResultRelInfo: over the copy too. */
	dt->rri->ri_TrigOldSlot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);
	dt->rri->ri_TrigNewSlot = MakeSingleTupleTableSlot(dt->desc, &TTSOpsBufferHeapTuple);

	MemoryContextSwitchTo(old);
	dt->built = true;
}
