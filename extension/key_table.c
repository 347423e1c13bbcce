/*-------------------------------------------------------------------------
 *
 * key_table.c
 *	  Direct access to idem_keys for the claim hot path: a primary-key
 *	  probe, a race-safe insert of a new key, and an update of a row read
 *	  before, without a SQL executor per call.
 *
 * The claim, lookup and fenced calls run a handful of fixed statements on
 * one row.  Planning, executor start-up and the CHECK constraints rebuilt
 * from their stored text in every executor cost more than the row access
 * itself, so this module does what those statements did, with the
 * executor's own pieces, kept per backend across calls:
 *
 *  - a read is an index scan of the primary key on cache_key with the
 *    snapshot the SQL statement would have used (a fresh one under READ
 *    COMMITTED; the transaction's otherwise), so it sees, waits for and
 *    predicate-locks what a SELECT would;
 *  - an insert is ON CONFLICT DO NOTHING's speculative insertion
 *    (nodeModifyTable.c): it waits for an in-flight insert of the same
 *    key, and inserts nothing if that one committed;
 *  - an update rewrites the version that was read.  If a concurrent
 *    transaction updated or deleted it first, the update waited for it
 *    and changed nothing: the caller reads the key again and decides
 *    again, which is what EvalPlanQual's re-check of the WHERE clause
 *    gave the SQL UPDATE, without keeping a lock on a row it did not
 *    change.  REPEATABLE READ and SERIALIZABLE get 40001 where UPDATE and
 *    ON CONFLICT would raise it.
 *
 * Writes keep what the SQL statements kept: the CHECK and NOT NULL
 * constraints (ExecConstraints), index maintenance and HOT (the table AM
 * decides), and the deferred constraint trigger of in-transaction claims
 * (queued by the after-row trigger calls, fired at commit).
 *
 * Kept across calls: the relation and index OIDs, the column numbers, an
 * EState with its ResultRelInfo (so the CHECK expressions and the trigger's
 * WHEN clause are compiled once), the index information, and slots over a
 * copy of the tuple descriptor (a copy is not reference-counted, so kept
 * slots pin nothing across transactions).  The relations themselves are
 * opened and locked per call, as a statement would.  A relcache
 * invalidation of the table, its indexes or the sequence (DDL, DROP or
 * CREATE EXTENSION, ALTER EXTENSION UPDATE, VACUUM FULL) marks the kept
 * state stale, and an error inside a call (its slots may hold released
 * buffer pins) does too; the next call rebuilds it.
 *
 * The table access runs as the table's owner (SetUserIdAndSecContext, as
 * ri_triggers.c does), and no SQL text is run, so nothing a caller
 * creates can be resolved inside: the functions need no SECURITY DEFINER.
 *
 *-------------------------------------------------------------------------
 */
#include "key_table.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "executor/nodeModifyTable.h"
#include "nodes/makefuncs.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

/* The columns the protocol reads and writes. */
typedef enum KeyColumn
{
	COL_CACHE_KEY,
	COL_SCOPE,
	COL_STATE,
	COL_REQUEST_HASH,
	COL_CLAIM_ID,
	COL_GENERATION,
	COL_LEASE_EXPIRES_AT,
	COL_CREATED_AT,
	COL_FINISHED_AT,
	COL_RESPONSE_STATUS,
	COL_RESPONSE_HEADERS,
	COL_RESPONSE_BODY,
	COL_REPLAYABLE,
	COL_IN_TRANSACTION,
	NCOLUMNS
} KeyColumn;

static const struct
{
	const char *name;
	Oid			type;
}			key_columns[NCOLUMNS] = {
	[COL_CACHE_KEY] = {"cache_key", BYTEAOID},
	[COL_SCOPE] = {"scope", TEXTOID},	/* since 0.3.0 */
	[COL_STATE] = {"state", TEXTOID},
	[COL_REQUEST_HASH] = {"request_hash", BYTEAOID},
	[COL_CLAIM_ID] = {"claim_id", UUIDOID},
	[COL_GENERATION] = {"generation", INT8OID},
	[COL_LEASE_EXPIRES_AT] = {"lease_expires_at", TIMESTAMPTZOID},
	[COL_CREATED_AT] = {"created_at", TIMESTAMPTZOID},
	[COL_FINISHED_AT] = {"finished_at", TIMESTAMPTZOID},
	[COL_RESPONSE_STATUS] = {"response_status", INT4OID},
	[COL_RESPONSE_HEADERS] = {"response_headers", JSONBOID},
	[COL_RESPONSE_BODY] = {"response_body", BYTEAOID},
	[COL_REPLAYABLE] = {"replayable", BOOLOID},
	[COL_IN_TRANSACTION] = {"in_transaction", BOOLOID},
};

static const char *const key_state_names[] = {
	[KEY_PENDING] = "pending",
	[KEY_COMPLETED] = "completed",
	[KEY_FAILED] = "failed",
	[KEY_EXPIRED] = "expired",
};

struct KeyTable
{
	/* Kept across calls; rebuilt when stale. */
	bool		built;
	bool		stale;
	Oid			namespace;
	Oid			relid;
	Oid			indexid;		/* the primary key */
	Oid			seqid;			/* idem_generation_seq */
	Oid			owner;
	AttrNumber	attnum[NCOLUMNS];	/* 0: absent (scope, before 0.3.0) */
	MemoryContext context;
	TupleDesc	desc;			/* a copy of the table's, defaults included */
	EState	   *estate;
	ResultRelInfo *rri;
	int			nindexes;
	Oid		   *index_oids;
	int			pk_index;		/* its place in rri's index arrays */
	List	   *arbiters;		/* ON CONFLICT (cache_key, scope) */
	int			ndefaults;		/* columns of the DBA's, with a default */
	AttrNumber *default_attnums;
	ExprState **default_exprs;
	TupleTableSlot *read_slot;
	TupleTableSlot *new_slot;
	TupleTableSlot *conflict_slot;

	/* This call's. */
	bool		in_use;
	bool		query_started;	/* AfterTriggerBeginQuery was called */
	bool		write_locked;	/* RowExclusiveLock taken */
	Relation	rel;
	Snapshot	snapshot;
	Oid			save_userid;
	int			save_sec_context;
};

static KeyTable key_table;
static bool callbacks_registered = false;

/* A relcache invalidation of one of our relations: rebuild before next use. */
static void
invalidate_relation(Datum arg, Oid relid)
{
	int			i;

	if (!key_table.built)
		return;
	if (relid == InvalidOid || relid == key_table.relid || relid == key_table.seqid)
		key_table.stale = true;
	for (i = 0; i < key_table.nindexes; i++)
		if (relid == key_table.index_oids[i])
			key_table.stale = true;
}

/*
 * A call that raised an error never reached key_table_close: its slots may
 * point at buffers the abort unpinned, so the kept state is dropped.
 */
static void
forget_aborted_call(void)
{
	if (key_table.in_use)
	{
		key_table.in_use = false;
		key_table.query_started = false;
		key_table.stale = true;
	}
}

static void
xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
		forget_aborted_call();
}

static void
subxact_callback(SubXactEvent event, SubTransactionId mySubid,
				 SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		forget_aborted_call();
}

/* The schema's idem_keys, checked to be pg_idem's own table. */
static Oid
lookup_table(Oid namespace)
{
	Oid			relid = get_relname_relid("idem_keys", namespace);
	Oid			extension;

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("pg_idem table idem_keys is missing"),
				 errdetail("Schema \"%s\" has no table idem_keys.",
						   get_namespace_name(namespace))));
	extension = getExtensionOfObject(RelationRelationId, relid);
	if (!OidIsValid(extension) || strcmp(get_extension_name(extension), "pg_idem") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idem_keys does not belong to extension pg_idem"),
				 errdetail("Schema \"%s\" has a table idem_keys that is not pg_idem's.",
						   get_namespace_name(namespace))));
	return relid;
}

/* Check the table's shape and note where each protocol column is. */
static void
map_columns(KeyTable *kt, Relation rel)
{
	int			c;

	for (c = 0; c < NCOLUMNS; c++)
	{
		AttrNumber	attnum = get_attnum(RelationGetRelid(rel), key_columns[c].name);

		if (attnum == InvalidAttrNumber && c == COL_SCOPE)
		{
			kt->attnum[c] = 0;
			continue;
		}
		if (attnum <= 0 ||
			TupleDescAttr(RelationGetDescr(rel), attnum - 1)->atttypid != key_columns[c].type)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pg_idem table idem_keys has an unexpected shape"),
					 errdetail("Column \"%s\" is missing or not of type %s.",
							   key_columns[c].name, format_type_be(key_columns[c].type))));
		kt->attnum[c] = attnum;
	}
}

/* Is attnum one of the protocol's columns? */
static bool
is_protocol_column(KeyTable *kt, AttrNumber attnum)
{
	int			c;

	for (c = 0; c < NCOLUMNS; c++)
		if (kt->attnum[c] == attnum)
			return true;
	return false;
}

/*
 * Columns pg_idem does not know (a DBA's) get what an INSERT naming only
 * the protocol's columns would give them: their default, computed per new
 * row.  Stored generated columns are recomputed by every write (they are
 * all marked as depending on the update), and every protocol column counts
 * as updated for column-specific triggers.
 */
static void
prepare_defaults(KeyTable *kt, Relation rel, RangeTblEntry *rte)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;
	int			c;

	kt->ndefaults = 0;
	kt->default_attnums = palloc(sizeof(AttrNumber) * desc->natts);
	kt->default_exprs = palloc(sizeof(ExprState *) * desc->natts);
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		Node	   *expr;

		if (att->attisdropped || is_protocol_column(kt, att->attnum))
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
		kt->default_attnums[kt->ndefaults] = att->attnum;
		kt->default_exprs[kt->ndefaults] = ExecPrepareExpr((Expr *) expr, kt->estate);
		kt->ndefaults++;
	}
	for (c = 0; c < NCOLUMNS; c++)
		if (kt->attnum[c] != 0)
			rte->updatedCols = bms_add_member(rte->updatedCols,
											  kt->attnum[c] - FirstLowInvalidHeapAttributeNumber);
}

/* Rebuild the kept state for rel, the schema's idem_keys. */
static void
build(KeyTable *kt, Relation rel, Oid namespace)
{
	MemoryContext old;
	RangeTblEntry *rte;
	Form_pg_index pk;
	int			i;

	kt->built = false;
	if (kt->context != NULL)
		MemoryContextDelete(kt->context);
	kt->context = AllocSetContextCreate(TopMemoryContext, "pg_idem idem_keys access",
										ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(kt->context);

	kt->namespace = namespace;
	kt->relid = RelationGetRelid(rel);
	kt->owner = rel->rd_rel->relowner;
	map_columns(kt, rel);

	kt->indexid = RelationGetPrimaryKeyIndex(rel);
	if (!OidIsValid(kt->indexid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem table idem_keys has no primary key")));
	kt->seqid = get_relname_relid("idem_generation_seq", namespace);
	if (!OidIsValid(kt->seqid))
		elog(ERROR, "pg_idem sequence idem_generation_seq is missing");

	kt->desc = CreateTupleDescCopyConstr(RelationGetDescr(rel));
	kt->estate = CreateExecutorState();
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = kt->relid;
	rte->relkind = RELKIND_RELATION;
	rte->rellockmode = RowExclusiveLock;
#if PG_VERSION_NUM >= 160000
	ExecInitRangeTable(kt->estate, list_make1(rte), NIL);
#else
	ExecInitRangeTable(kt->estate, list_make1(rte));
#endif
	kt->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(kt->rri, rel, 1, NULL, 0);

	/* Index information for speculative insertion, built once. */
	ExecOpenIndices(kt->rri, true);
	kt->nindexes = kt->rri->ri_NumIndices;
	kt->index_oids = palloc(sizeof(Oid) * Max(kt->nindexes, 1));
	kt->pk_index = -1;
	for (i = 0; i < kt->nindexes; i++)
	{
		Relation	index = kt->rri->ri_IndexRelationDescs[i];

		kt->index_oids[i] = RelationGetRelid(index);
		if (kt->index_oids[i] == kt->indexid)
		{
			pk = index->rd_index;
			if (pk->indnkeyatts < 1 || pk->indkey.values[0] != kt->attnum[COL_CACHE_KEY])
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("pg_idem table idem_keys has an unexpected primary key"),
						 errdetail("Its primary key must start with cache_key.")));
			kt->pk_index = i;
		}
		/* ExecOpenIndices locked it for a writer: each call locks its own. */
		index_close(index, RowExclusiveLock);
	}
	if (kt->pk_index < 0)
		elog(ERROR, "pg_idem: primary key of idem_keys not among its indexes");
	kt->arbiters = list_make1_oid(kt->indexid);
	prepare_defaults(kt, rel, rte);

	kt->read_slot = MakeSingleTupleTableSlot(kt->desc, &TTSOpsBufferHeapTuple);
	kt->new_slot = MakeSingleTupleTableSlot(kt->desc, &TTSOpsVirtual);
	kt->conflict_slot = MakeSingleTupleTableSlot(kt->desc, &TTSOpsBufferHeapTuple);
	/* The trigger calls' slots, kept in the ResultRelInfo: over the copy too. */
	kt->rri->ri_TrigOldSlot = MakeSingleTupleTableSlot(kt->desc, &TTSOpsBufferHeapTuple);
	kt->rri->ri_TrigNewSlot = MakeSingleTupleTableSlot(kt->desc, &TTSOpsVirtual);

	MemoryContextSwitchTo(old);
	kt->stale = false;
	kt->built = true;
}

/*
 * Open the schema's idem_keys for one call: lock it as the statement
 * would (for_write: as an UPDATE; otherwise as a SELECT, and as an INSERT
 * or UPDATE from the first write on), rebuild the kept state if needed,
 * and switch to the table's owner.  Every open is paired with
 * key_table_close; an error in between ends the call (see
 * forget_aborted_call).
 */
KeyTable *
key_table_open(Oid namespace, bool for_write)
{
	KeyTable   *kt = &key_table;
	LOCKMODE	lockmode = for_write ? RowExclusiveLock : AccessShareLock;
	Relation	rel = NULL;
	int			i;

	if (!callbacks_registered)
	{
		CacheRegisterRelcacheCallback(invalidate_relation, (Datum) 0);
		RegisterXactCallback(xact_callback, NULL);
		RegisterSubXactCallback(subxact_callback, NULL);
		callbacks_registered = true;
	}
	if (kt->in_use)
		elog(ERROR, "pg_idem: idem_keys is already in use by this call");

	/* The kept OID may name a table dropped since: then look it up again. */
	if (kt->built && !kt->stale && kt->namespace == namespace)
		rel = try_table_open(kt->relid, lockmode);
	if (rel == NULL)
		rel = table_open(lookup_table(namespace), lockmode);
	if (!kt->built || kt->stale || kt->namespace != namespace ||
		kt->relid != RelationGetRelid(rel))
		build(kt, rel, namespace);

	kt->rel = rel;
	kt->rri->ri_RelationDesc = rel;
	for (i = 0; i < kt->nindexes; i++)
		kt->rri->ri_IndexRelationDescs[i] = index_open(kt->index_oids[i], lockmode);
	kt->estate->es_trig_target_relations = NIL;
	kt->query_started = false;
	kt->write_locked = for_write;
	kt->snapshot = NULL;

	GetUserIdAndSecContext(&kt->save_userid, &kt->save_sec_context);
	SetUserIdAndSecContext(kt->owner, kt->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE | SECURITY_NOFORCE_RLS);
	kt->in_use = true;
	return kt;
}

/* End a call: queue the deferred trigger events, release everything. */
void
key_table_close(KeyTable *kt)
{
	EState	   *estate = kt->estate;
	ListCell   *lc;
	int			i;

	if (kt->query_started)
		AfterTriggerEndQuery(estate);
	kt->query_started = false;
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

	ExecClearTuple(kt->read_slot);
	ExecClearTuple(kt->new_slot);
	ExecClearTuple(kt->conflict_slot);
	ExecClearTuple(kt->rri->ri_TrigOldSlot);
	ExecClearTuple(kt->rri->ri_TrigNewSlot);
	ResetPerTupleExprContext(estate);

	for (i = 0; i < kt->nindexes; i++)
		index_close(kt->rri->ri_IndexRelationDescs[i], NoLock);
	table_close(kt->rel, NoLock);
	kt->rel = NULL;

	SetUserIdAndSecContext(kt->save_userid, kt->save_sec_context);
	kt->in_use = false;
}

/* Does the table have 0.3.0's scope column? */
bool
key_table_has_scopes(KeyTable *kt)
{
	return kt->attnum[COL_SCOPE] != 0;
}

static bool
texts_equal(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

static KeyState
parse_state(text *state)
{
	int			s;

	for (s = 0; s < (int) lengthof(key_state_names); s++)
		if (VARSIZE_ANY_EXHDR(state) == strlen(key_state_names[s]) &&
			memcmp(VARDATA_ANY(state), key_state_names[s], VARSIZE_ANY_EXHDR(state)) == 0)
			return (KeyState) s;
	elog(ERROR, "pg_idem: idem_keys row has unknown state \"%s\"", text_to_cstring(state));
	return KEY_PENDING;			/* keep the compiler quiet */
}

/* The row in the read slot, copied into the caller's memory. */
static void
row_from_slot(KeyTable *kt, TupleTableSlot *slot, KeyRow *row)
{
	HeapTuple	tuple = ExecCopySlotHeapTuple(slot);
	Datum	   *values = palloc(sizeof(Datum) * kt->desc->natts);
	bool	   *nulls = palloc(sizeof(bool) * kt->desc->natts);

#define VALUE(c) values[kt->attnum[c] - 1]
#define ISNULL(c) nulls[kt->attnum[c] - 1]

	/*
	 * A row older than a column added since (scope, by the 0.3.0 upgrade)
	 * lacks it: expand it with the column's default, as a slot would.
	 */
	if (HeapTupleHeaderGetNatts(tuple->t_data) < kt->desc->natts)
		tuple = heap_expand_tuple(tuple, kt->desc);
	heap_deform_tuple(tuple, kt->desc, values, nulls);
	memset(row, 0, sizeof(*row));
	row->tid = slot->tts_tid;
	row->tuple = tuple;
	row->cache_key = DatumGetByteaPP(VALUE(COL_CACHE_KEY));
	row->scope = kt->attnum[COL_SCOPE] != 0 ? DatumGetTextPP(VALUE(COL_SCOPE))
		: cstring_to_text("");
	row->state = parse_state(DatumGetTextPP(VALUE(COL_STATE)));
	row->request_hash = ISNULL(COL_REQUEST_HASH) ? NULL : DatumGetByteaPP(VALUE(COL_REQUEST_HASH));
	row->claim_id = ISNULL(COL_CLAIM_ID) ? NULL : DatumGetUUIDP(VALUE(COL_CLAIM_ID));
	row->generation = DatumGetInt64(VALUE(COL_GENERATION));
	row->has_lease = !ISNULL(COL_LEASE_EXPIRES_AT);
	if (row->has_lease)
		row->lease_expires_at = DatumGetTimestampTz(VALUE(COL_LEASE_EXPIRES_AT));
	row->created_at = DatumGetTimestampTz(VALUE(COL_CREATED_AT));
	row->has_finished = !ISNULL(COL_FINISHED_AT);
	if (row->has_finished)
		row->finished_at = DatumGetTimestampTz(VALUE(COL_FINISHED_AT));
	row->has_status = !ISNULL(COL_RESPONSE_STATUS);
	if (row->has_status)
		row->response_status = DatumGetInt32(VALUE(COL_RESPONSE_STATUS));
	row->headers_null = ISNULL(COL_RESPONSE_HEADERS);
	row->response_headers = VALUE(COL_RESPONSE_HEADERS);
	row->body_null = ISNULL(COL_RESPONSE_BODY);
	row->response_body = VALUE(COL_RESPONSE_BODY);
	row->replayable = DatumGetBool(VALUE(COL_REPLAYABLE));
	row->in_transaction = DatumGetBool(VALUE(COL_IN_TRANSACTION));
#undef VALUE
#undef ISNULL
}

/* Is this the row the read wants?  *fallback: a row from before scopes. */
static bool
row_matches(KeyRow *row, KeyMatch match, const void *arg, bool *fallback)
{
	*fallback = false;
	switch (match)
	{
		case KEY_MATCH_SCOPE:
			if (texts_equal(row->scope, (text *) arg))
				return true;
			*fallback = VARSIZE_ANY_EXHDR(row->scope) == 0;
			return false;
		case KEY_MATCH_OWNER:
			return row->state == KEY_PENDING && row->claim_id != NULL &&
				memcmp(row->claim_id->data, ((const pg_uuid_t *) arg)->data, UUID_LEN) == 0;
		case KEY_MATCH_LIVE:
			return !key_row_is_tombstone(row);
	}
	return false;
}

/*
 * Read a row of cache_key (see KeyMatch) into *row; false when there is
 * none.  fresh_snapshot: as a volatile statement reads (the command
 * counter advanced, a new snapshot under READ COMMITTED); otherwise with
 * the calling statement's snapshot, as a stable function reads.
 */
bool
key_table_read(KeyTable *kt, bytea *cache_key, KeyMatch match, const void *arg,
			   bool fresh_snapshot, KeyRow *row)
{
	ScanKeyData skey;
	IndexScanDesc scan;
	KeyRow		candidate;
	bool		found = false;
	bool		have_fallback = false;
	bool		fallback;

	if (fresh_snapshot)
	{
		CommandCounterIncrement();
		kt->snapshot = GetTransactionSnapshot();
	}
	else
		kt->snapshot = GetActiveSnapshot();
	kt->estate->es_snapshot = kt->snapshot;

	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_BYTEAEQ, PointerGetDatum(cache_key));
	scan = index_beginscan(kt->rel, kt->rri->ri_IndexRelationDescs[kt->pk_index],
						   kt->snapshot, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, kt->read_slot))
	{
		row_from_slot(kt, kt->read_slot, &candidate);
		if (row_matches(&candidate, match, arg, &fallback))
		{
			*row = candidate;
			found = true;
			break;
		}
		if (fallback && !have_fallback)
		{
			*row = candidate;
			have_fallback = true;
		}
	}
	index_endscan(scan);
	ExecClearTuple(kt->read_slot);
	return found || have_fallback;
}

/* The row's protocol columns into the new-tuple slot (other columns kept). */
static TupleTableSlot *
slot_from_row(KeyTable *kt, KeyRow *row)
{
	TupleTableSlot *slot = kt->new_slot;
	Datum	   *values = slot->tts_values;
	bool	   *nulls = slot->tts_isnull;

#define SET(c, v, n) do { if (kt->attnum[c] != 0) { \
		values[kt->attnum[c] - 1] = (v); nulls[kt->attnum[c] - 1] = (n); } } while (0)

	ExecClearTuple(slot);
	if (row->tuple != NULL)
		heap_deform_tuple(row->tuple, kt->desc, values, nulls);
	else
	{
		memset(values, 0, sizeof(Datum) * kt->desc->natts);
		memset(nulls, true, sizeof(bool) * kt->desc->natts);
	}
	SET(COL_CACHE_KEY, PointerGetDatum(row->cache_key), false);
	SET(COL_SCOPE, PointerGetDatum(row->scope), false);
	SET(COL_STATE, CStringGetTextDatum(key_state_names[row->state]), false);
	SET(COL_REQUEST_HASH, PointerGetDatum(row->request_hash), row->request_hash == NULL);
	SET(COL_CLAIM_ID, UUIDPGetDatum(row->claim_id), row->claim_id == NULL);
	SET(COL_GENERATION, Int64GetDatum(row->generation), false);
	SET(COL_LEASE_EXPIRES_AT, TimestampTzGetDatum(row->lease_expires_at), !row->has_lease);
	SET(COL_CREATED_AT, TimestampTzGetDatum(row->created_at), false);
	SET(COL_FINISHED_AT, TimestampTzGetDatum(row->finished_at), !row->has_finished);
	SET(COL_RESPONSE_STATUS, Int32GetDatum(row->response_status), !row->has_status);
	SET(COL_RESPONSE_HEADERS, row->response_headers, row->headers_null);
	SET(COL_RESPONSE_BODY, row->response_body, row->body_null);
	SET(COL_REPLAYABLE, BoolGetDatum(row->replayable), false);
	SET(COL_IN_TRANSACTION, BoolGetDatum(row->in_transaction), false);
#undef SET
	return ExecStoreVirtualTuple(slot);
}

/*
 * What every write does first: the writer's locks (a follower that only
 * read holds no more than a SELECT would), a command id, the trigger
 * query level.
 */
static void
start_write(KeyTable *kt)
{
	int			i;

	if (kt->snapshot == NULL)
		elog(ERROR, "pg_idem: idem_keys written before it was read");
	if (!kt->write_locked)
	{
		LockRelationOid(kt->relid, RowExclusiveLock);
		for (i = 0; i < kt->nindexes; i++)
			LockRelationOid(kt->index_oids[i], RowExclusiveLock);
		kt->write_locked = true;
	}
	kt->estate->es_output_cid = GetCurrentCommandId(true);
	if (!kt->query_started)
	{
		AfterTriggerBeginQuery();
		kt->query_started = true;
	}
	ResetPerTupleExprContext(kt->estate);
}

/* The defaults of the DBA's columns, into a new row's slot. */
static void
compute_defaults(KeyTable *kt, TupleTableSlot *slot)
{
	ExprContext *econtext = GetPerTupleExprContext(kt->estate);
	int			i;

	for (i = 0; i < kt->ndefaults; i++)
	{
		int			off = kt->default_attnums[i] - 1;

		slot->tts_values[off] = ExecEvalExprSwitchContext(kt->default_exprs[i], econtext,
														  &slot->tts_isnull[off]);
	}
}

/*
 * Under REPEATABLE READ and SERIALIZABLE, a key inserted by a transaction
 * our snapshot cannot see is a serialization failure, as ON CONFLICT DO
 * NOTHING raises it (ExecCheckTIDVisible in nodeModifyTable.c).
 */
static void
check_conflict_visible(KeyTable *kt, ItemPointer tid)
{
	TupleTableSlot *slot = kt->conflict_slot;
	bool		isnull;

	if (!IsolationUsesXactSnapshot())
		return;
	if (!table_tuple_fetch_row_version(kt->rel, tid, SnapshotAny, slot))
		elog(ERROR, "pg_idem: failed to fetch the conflicting idem_keys row");
	if (!table_tuple_satisfies_snapshot(kt->rel, slot, kt->snapshot) &&
		!TransactionIdIsCurrentTransactionId(
			DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull))))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update")));
	ExecClearTuple(slot);
}

/*
 * Insert a new key's row, as INSERT ... ON CONFLICT (cache_key, scope) DO
 * NOTHING would; false when a row of the key and scope exists (after
 * waiting for an in-flight insert of it to commit).
 */
bool
key_table_insert(KeyTable *kt, KeyRow *row)
{
	EState	   *estate = kt->estate;
	ResultRelInfo *rri = kt->rri;
	TupleTableSlot *slot;

	start_write(kt);
	row->tuple = NULL;
	slot = slot_from_row(kt, row);
	if (kt->ndefaults > 0)
		compute_defaults(kt, slot);
	if (kt->rel->rd_att->constr && kt->rel->rd_att->constr->has_generated_stored)
		ExecComputeStoredGenerated(rri, estate, slot, CMD_INSERT);
	/* A BEFORE trigger that skips the row: nothing inserted, as in SQL. */
	if (rri->ri_TrigDesc && rri->ri_TrigDesc->trig_insert_before_row &&
		!ExecBRInsertTriggers(estate, rri, slot))
		return false;
	if (kt->rel->rd_att->constr)
		ExecConstraints(rri, slot, estate);

	for (;;)
	{
		ItemPointerData conflict;
		uint32		token;
		bool		spec_conflict = false;
		List	   *recheck;

		if (!ExecCheckIndexConstraints(rri, slot, estate, &conflict, kt->arbiters))
		{
			check_conflict_visible(kt, &conflict);
			return false;
		}
		token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
		table_tuple_insert_speculative(kt->rel, slot, estate->es_output_cid, 0, NULL, token);
#if PG_VERSION_NUM >= 160000
		recheck = ExecInsertIndexTuples(rri, slot, estate, false, true,
										&spec_conflict, kt->arbiters, false);
#else
		recheck = ExecInsertIndexTuples(rri, slot, estate, false, true,
										&spec_conflict, kt->arbiters);
#endif
		table_tuple_complete_speculative(kt->rel, slot, token, !spec_conflict);
		SpeculativeInsertionLockRelease(GetCurrentTransactionId());
		if (!spec_conflict)
		{
			ExecARInsertTriggers(estate, rri, slot, recheck, NULL);
			list_free(recheck);
			row->tid = slot->tts_tid;
			return true;
		}
		/* Lost a race with a concurrent insert: check again (and wait). */
		list_free(recheck);
	}
}

/*
 * Rewrite the row read by key_table_read with row's protocol columns.
 * KEY_CHANGED when a concurrent transaction updated or deleted that
 * version first (under READ COMMITTED; 40001 otherwise): nothing was
 * written and no lock is kept, and the caller reads the key again.
 */
KeyWrite
key_table_update(KeyTable *kt, KeyRow *row)
{
	EState	   *estate = kt->estate;
	ResultRelInfo *rri = kt->rri;
	TupleTableSlot *slot;
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	TM_Result	result;
	List	   *recheck = NIL;
	ItemPointerData old_tid = row->tid;
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes;
#else
	bool		update_indexes;
#endif

	if (rri->ri_TrigDesc && rri->ri_TrigDesc->trig_update_before_row)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("pg_idem table idem_keys has a BEFORE UPDATE trigger"),
				 errdetail("pg_idem updates idem_keys directly, and a BEFORE UPDATE trigger could change the row after its fence was checked."),
				 errhint("Use an AFTER trigger.")));
	start_write(kt);
	slot = slot_from_row(kt, row);
	if (kt->rel->rd_att->constr && kt->rel->rd_att->constr->has_generated_stored)
		ExecComputeStoredGenerated(rri, estate, slot, CMD_UPDATE);
	if (kt->rel->rd_att->constr)
		ExecConstraints(rri, slot, estate);

	result = table_tuple_update(kt->rel, &old_tid, slot, estate->es_output_cid,
								kt->snapshot, InvalidSnapshot, true, &tmfd,
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
			return KEY_CHANGED;
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent delete")));
			return KEY_CHANGED;
		case TM_SelfModified:
			elog(ERROR, "pg_idem: idem_keys row already modified by this command");
			break;
		default:
			elog(ERROR, "pg_idem: unexpected result %d updating idem_keys", (int) result);
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
	ExecARUpdateTriggers(estate, rri, NULL, NULL, &old_tid, NULL, slot, recheck,
						 NULL, false);
	list_free(recheck);
	row->tid = slot->tts_tid;
	return KEY_WRITTEN;
}

/* The next value of the schema's generation sequence. */
int64
key_table_next_generation(KeyTable *kt)
{
	/* We run as the sequence's owner: no privilege check to make. */
	return nextval_internal(kt->seqid, false);
}

/* Was the row released or evicted: failed, with neither hash nor owner? */
bool
key_row_is_tombstone(const KeyRow *row)
{
	return row->state == KEY_FAILED && row->request_hash == NULL && row->claim_id == NULL;
}

/*
 * What release and eviction leave of a key: a tombstone row, failed, its
 * cooldown over, with neither request hash nor owner, so that any request
 * claims it at once.  Keeping the row keeps the key's place in the
 * generation order (see idem_release in fences.c).  The cleanup deletes
 * tombstones with the other finished keys.
 */
void
key_row_make_tombstone(KeyRow *row)
{
	TimestampTz now = GetCurrentTimestamp();

	row->state = KEY_FAILED;
	row->request_hash = NULL;
	row->claim_id = NULL;
	row->has_lease = true;
	row->lease_expires_at = now;
	row->has_finished = true;
	row->finished_at = now;
	row->has_status = false;
	row->headers_null = true;
	row->body_null = true;
	row->replayable = true;
}
