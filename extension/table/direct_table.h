/*-------------------------------------------------------------------------
 *
 * direct_table.h
 *	  Reading and writing one of pg_idem's tables without a SQL executor
 *	  per call (direct_table.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TABLE_DIRECT_TABLE_H
#define IDEM_TABLE_DIRECT_TABLE_H


#include "access/genam.h"
#include "access/htup.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "storage/itemptr.h"
#include "utils/snapshot.h"

#define DIRECT_MAX_COLUMNS 24

/* How a call will use the table: the lock it takes at open. */
typedef enum DirectAccess
{
	DIRECT_READ,				/* a SELECT's lock; a write upgrades it */
	DIRECT_UPDATE,				/* an UPDATE's lock, from the start */
	DIRECT_INSERT				/* an INSERT's lock, from the start */
} DirectAccess;

/* A column the module that owns the table reads or writes. */
typedef struct DirectColumn
{
	const char *name;
	Oid			type;
	bool		optional;		/* absent from schemas before the version adding it */
	Oid			earlier_type;	/* also accepted: its type before a version changed it */
} DirectColumn;

/*
 * One of pg_idem's tables, as a module declares it (relname, columns),
 * and the executor pieces kept for it across calls.  A module has one
 * static DirectTable per table; direct_table.c fills in the rest.
 */
typedef struct DirectTable
{
	const char *relname;
	const DirectColumn *columns;
	int			ncolumns;

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
	AttrNumber	attnum[DIRECT_MAX_COLUMNS]; /* 0: absent */
	MemoryContext context;
	TupleDesc	desc;			/* a copy of the table's, defaults included */
	EState	   *estate;
	ResultRelInfo *rri;
	int			nindexes;
	Oid		   *index_oids;
	int			pk_index;		/* its place in rri's index arrays */
	RegProcedure pk_eq[INDEX_MAX_KEYS];	/* its columns' equality functions */
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
	IndexScanDesc scan;
	struct TransitionCaptureState *capture;	/* this write's, or NULL */
	Oid			save_userid;
	int			save_sec_context;
} DirectTable;

/* What a write did. */
typedef enum DirectWrite
{
	DIRECT_WRITTEN,
	DIRECT_CHANGED,				/* a concurrent write came first: read again */
	DIRECT_STALE				/* the table changed shape: reopen, read again */
} DirectWrite;

extern DirectTable *direct_open(DirectTable *table, Oid namespace, DirectAccess access);
extern void direct_close(DirectTable *table);

extern void direct_scan_begin(DirectTable *table, int nkeys, const Datum *keys,
							  bool fresh_snapshot);
extern int	direct_key_columns(DirectTable *table);
extern HeapTuple direct_scan_next(DirectTable *table);
extern void direct_scan_end(DirectTable *table);
extern void direct_deform(DirectTable *table, HeapTuple tuple, Datum *values, bool *nulls);

extern TupleTableSlot *direct_new_row(DirectTable *table, HeapTuple old);
extern void direct_set(DirectTable *table, int column, Datum value, bool isnull);
extern DirectWrite direct_insert(DirectTable *table, bool on_conflict_do_nothing,
								 ItemPointer tid);
extern DirectWrite direct_update(DirectTable *table, ItemPointer old_tid, ItemPointer new_tid);

/* The attribute number of a declared column (0: absent). */
static inline AttrNumber
direct_attnum(DirectTable *table, int column)
{
	return table->attnum[column];
}

#endif							/* IDEM_TABLE_DIRECT_TABLE_H */
