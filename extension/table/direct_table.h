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


#include "access/attnum.h"
#include "access/htup.h"
#include "access/stratnum.h"
#include "executor/tuptable.h"
#include "storage/itemptr.h"

/* How a call will use the table: the lock it takes at open. */
typedef enum DirectAccess
{
	DIRECT_READ,				/* a SELECT's lock; a write upgrades it */
	DIRECT_UPDATE,				/* an UPDATE's lock, from the start */
	DIRECT_INSERT				/* an INSERT's lock, from the start */
} DirectAccess;

/*
 * A column the module that owns the table reads or writes, with its type
 * in the tables of every version the library serves (core/schema.c).
 */
typedef struct DirectColumn
{
	const char *name;
	Oid			type;
} DirectColumn;

/*
 * One of pg_idem's tables, as a module declares it (one static
 * DirectTableDef per table: DIRECT_TABLE(relname, columns, ncolumns)).
 * What direct_table.c keeps for it across calls is its own (DirectTable,
 * opaque outside table/), made at the first open.
 */
typedef struct DirectTable DirectTable;

/*
 * A secondary B-tree index a module scans (the outbox's claimable rows,
 * say), by name, by the declared columns its keys must be, in order and
 * ascending, and by the rows its scans must find (the conditions of
 * pg_idem's partial index: a declared text column equal to a value, or a
 * declared column not null).  An index of that name with other keys, a
 * descending key or a predicate that leaves out some of those rows (a
 * DBA's narrower re-creation) is refused, never scanned: its scans would
 * miss rows, and a claim's per-key order probe that misses an earlier
 * pending event hands out the next one.  A broader predicate, or none,
 * is fine: the callers check every row they read.
 */
#define DIRECT_MAX_INDEX_KEYS 4
#define DIRECT_MAX_SCAN_INDEXES 4
#define DIRECT_MAX_INDEX_CONDITIONS 2

typedef struct DirectIndexCondition
{
	int			column;			/* declared column number */
	const char *equals;			/* a text value it equals; NULL: IS NOT NULL */
} DirectIndexCondition;

typedef struct DirectIndex
{
	const char *name;
	int			nkeys;
	int			keys[DIRECT_MAX_INDEX_KEYS];	/* declared column numbers */
	int			nconditions;
	DirectIndexCondition conditions[DIRECT_MAX_INDEX_CONDITIONS];
} DirectIndex;

typedef struct DirectTableDef
{
	const char *relname;
	const DirectColumn *columns;
	int			ncolumns;
	const DirectIndex *indexes;	/* scanned by direct_index_scan_begin */
	int			nindexes;
	DirectTable *kept;
} DirectTableDef;

#define DIRECT_TABLE(relname, columns, ncolumns) {(relname), (columns), (ncolumns), NULL, 0, NULL}
#define DIRECT_TABLE_INDEXED(relname, columns, ncolumns, indexes, nindexes) \
	{(relname), (columns), (ncolumns), (indexes), (nindexes), NULL}

/* One condition of a secondary index scan: key column OP value. */
typedef struct DirectScanKey
{
	int			key;			/* the index's key column, from 0 */
	StrategyNumber strategy;	/* BTLessStrategyNumber .. BTGreaterStrategyNumber */
	Datum		value;
} DirectScanKey;

typedef struct DirectIndexScan DirectIndexScan;

/* What a write did. */
typedef enum DirectWrite
{
	DIRECT_WRITTEN,
	DIRECT_CHANGED,				/* a concurrent write came first: read again */
	DIRECT_STALE				/* the table changed shape: reopen, read again */
} DirectWrite;

extern DirectTable *direct_open(DirectTableDef *def, Oid namespace, DirectAccess access);
extern void direct_close(DirectTable *table);

extern void direct_scan_begin(DirectTable *table, int nkeys, const Datum *keys,
							  bool fresh_snapshot);
extern int	direct_key_columns(DirectTable *table);
extern HeapTuple direct_scan_next(DirectTable *table);
extern void direct_scan_end(DirectTable *table);
extern void direct_deform(DirectTable *table, HeapTuple tuple, Datum *values, bool *nulls);

extern DirectIndexScan *direct_index_scan_begin(DirectTable *table, int index, int nkeys,
												 const DirectScanKey *keys, bool fresh_snapshot);
extern HeapTuple direct_index_scan_next(DirectIndexScan *scan);
extern void direct_index_scan_end(DirectIndexScan *scan);

extern TupleTableSlot *direct_new_row(DirectTable *table, HeapTuple old);
extern void direct_set(DirectTable *table, int column, Datum value, bool isnull);
extern DirectWrite direct_insert(DirectTable *table, bool on_conflict_do_nothing,
								 ItemPointer tid);
extern DirectWrite direct_update(DirectTable *table, ItemPointer old_tid, ItemPointer new_tid);
extern DirectWrite direct_delete(DirectTable *table, ItemPointer tid);
extern HeapTuple direct_lock(DirectTable *table, ItemPointer tid, bool skip_locked);
extern void direct_begin_trigger_query(DirectTable *table);

/* What a call may ask of its open table. */
extern AttrNumber direct_attnum(DirectTable *table, int column);
extern int	direct_natts(DirectTable *table);
extern AttrNumber direct_key_attnum(DirectTable *table, int key_column);
extern Oid	direct_namespace(DirectTable *table);

#endif							/* IDEM_TABLE_DIRECT_TABLE_H */
