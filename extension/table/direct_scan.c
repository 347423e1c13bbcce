/*-------------------------------------------------------------------------
 *
 * direct_scan.c
 *	  Range scans of a table's secondary B-tree indexes, for the direct
 *	  path (direct_table.c has the design): the outbox's claim walks its
 *	  claimable index and probes its per-key order index this way, with
 *	  no planner and no executor per call.
 *
 * A scan is a plain index scan, as the executor's IndexScan node runs it:
 * it returns the row versions visible to the call's snapshot (the same
 * snapshot choice as the primary-key probe), predicate-locks what it reads
 * under SERIALIZABLE, and never fetches a row whose index entry is out of
 * range.  The indexes are the module's declared ones (DirectIndex),
 * resolved by name when the table's state is built and refused unless
 * they are valid B-trees on the declared columns.  At most one scan of an
 * index is open in a call; the call's close ends any left open.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/compat.h"
#include "table/direct_table.h"

#include "table/direct_build.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/relscan.h"
#include "executor/tuptable.h"

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
				 errdetail("Table %s needs a valid B-tree index %s on the columns of pg_idem's definition.",
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
