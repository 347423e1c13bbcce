/*-------------------------------------------------------------------------
 *
 * direct_build.h
 *	  direct_table.c's kept state of a table (struct DirectTable) and its
 *	  build (direct_build.c); for table/ only: other modules see the
 *	  handle and its accessors (direct_table.h).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TABLE_DIRECT_BUILD_H
#define IDEM_TABLE_DIRECT_BUILD_H

#include "table/direct_table.h"

#include "access/genam.h"
#include "nodes/execnodes.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"

#define DIRECT_MAX_COLUMNS 24

/*
 * What direct_table.c keeps for one of pg_idem's tables across calls (the
 * executor pieces), and the state of the call in progress.  Made at the
 * first open of the module's DirectTableDef; a call nested in a call on
 * the same table gets a transient one.
 */
/* A secondary index scan in progress (at most one per index and call). */
struct DirectIndexScan
{
	DirectTable *table;
	IndexScanDesc desc;			/* NULL: not open */
	TupleTableSlot *slot;
};

struct DirectTable
{
	const char *relname;
	const DirectColumn *columns;
	int			ncolumns;
	const DirectIndex *scan_defs;	/* the secondary indexes the module scans */
	int			nscan_defs;

	/* Kept across calls; rebuilt when stale. */
	bool		registered;
	bool		transient;		/* a nested call's own state, freed at close */
	bool		built;
	bool		stale;
	bool		pin_search_path;	/* code of somebody else's runs inside */
	Oid			namespace;
	Oid			relid;
	Oid			indexid;		/* the primary key */
	Oid			owner;
	AttrNumber	attnum[DIRECT_MAX_COLUMNS];	/* of the declared columns */
	MemoryContext context;
	TupleDesc	desc;			/* a copy of the table's, defaults included */
	EState	   *estate;
	ResultRelInfo *rri;
	int			nindexes;
	Oid		   *index_oids;
	int			pk_index;		/* its place in rri's index arrays */
	RegProcedure pk_eq[INDEX_MAX_KEYS];	/* its columns' equality functions */
	int			scan_index[DIRECT_MAX_SCAN_INDEXES];	/* scan_defs' places there */
	/* Their key columns' comparison functions, by B-tree strategy. */
	RegProcedure scan_procs[DIRECT_MAX_SCAN_INDEXES][DIRECT_MAX_INDEX_KEYS][BTMaxStrategyNumber + 1];
	List	   *arbiters;		/* ON CONFLICT on the primary key */
	int			ndefaults;
	AttrNumber *default_attnums;
	ExprState **default_exprs;
	RangeTblEntry *rte;
	Datum	   *old_values;		/* the version an update replaces */
	bool	   *old_nulls;
	TupleTableSlot *read_slot;
	TupleTableSlot *new_slot;
	TupleTableSlot *conflict_slot;

	/* This call's. */
	bool		in_use;
	SubTransactionId open_subid;	/* where the call began */
	int			guc_level;		/* the pinned search_path's, or 0 */
	bool		query_started;	/* AfterTriggerBeginQuery was called */
	bool		write_locked;	/* RowExclusiveLock taken */
	bool	   *assigned;		/* new_slot's columns the caller set */
	Relation	rel;
	Snapshot	snapshot;
	bool		snapshot_registered;	/* a fresh one, ours to unregister */
	IndexScanDesc scan;
	DirectIndexScan scans[DIRECT_MAX_SCAN_INDEXES];
	struct TransitionCaptureState *capture;	/* this write's, or NULL */
	Oid			save_userid;
	int			save_sec_context;
};


extern void direct_build(DirectTable *table, Relation rel, Oid namespace);
extern HeapTuple direct_copy_row(DirectTable *table, TupleTableSlot *slot);

#endif							/* IDEM_TABLE_DIRECT_BUILD_H */
