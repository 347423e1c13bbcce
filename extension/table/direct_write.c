/*-------------------------------------------------------------------------
 *
 * direct_write.c
 *	  The writes of direct_table.c's tables: a plain or race-safe insert
 *	  and an update of the version read, through the executor's own pieces
 *	  (see direct_table.c for the whole design).
 *
 * A write keeps what the SQL statement gave: the CHECK and NOT NULL
 * constraints, column defaults (a domain's judgement of a NULL included)
 * and stored generated columns, index maintenance and HOT, row and
 * statement-level triggers with their transition tables, the replica
 * identity check, and 25006 in a read-only transaction.  A call that only
 * read holds a SELECT's lock; its first write takes the writer's, and if
 * that delivered an invalidation the write is refused as DIRECT_STALE and
 * the caller starts over on a rebuilt state.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/compat.h"
#include "table/direct_table.h"

#include "table/direct_build.h"

#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/nodeModifyTable.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/datum.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

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
		memcpy(dt->old_values, slot->tts_values, sizeof(Datum) * natts);
		memcpy(dt->old_nulls, slot->tts_isnull, sizeof(bool) * natts);
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

/* Set a declared column of the row being written. */
void
direct_set(DirectTable *dt, int column, Datum value, bool isnull)
{
	AttrNumber	attnum = dt->attnum[column];

	dt->new_slot->tts_values[attnum - 1] = value;
	dt->new_slot->tts_isnull[attnum - 1] = isnull;
	dt->assigned[attnum - 1] = true;
}

/*
 * What every write does first: the writer's locks (a call that only read
 * holds no more than a SELECT would), a command id, the trigger query
 * level.  False when taking the writer's locks delivered an invalidation
 * of the table (an index or a trigger created while this call read): the
 * kept index list is older than the lock, so nothing may be written with
 * it; the caller reopens the table, which rebuilds, and starts over.
 */
static bool
start_write(DirectTable *dt, const char *command, CmdType operation)
{
	int			i;

	if (dt->rel->rd_rules != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("pg_idem table %s has a rule", dt->relname),
				 errdetail("pg_idem writes it directly, and a rule would not be applied."),
				 errhint("Use a trigger.")));
	if (!dt->write_locked)
	{
		PreventCommandIfReadOnly(command);
		PreventCommandIfParallelMode(command);
		LockRelationOid(dt->relid, RowExclusiveLock);
		for (i = 0; i < dt->nindexes; i++)
			LockRelationOid(dt->index_oids[i], RowExclusiveLock);
		dt->write_locked = true;
		if (dt->stale)
			return false;
	}
	/* What the executor checks of a result relation: replica identity, say. */
	idem_check_valid_result_rel(dt->rri, operation);
	/* An insert that read nothing first: the statement's snapshot. */
	if (dt->snapshot == NULL)
	{
		dt->snapshot = GetActiveSnapshot();
		dt->estate->es_snapshot = dt->snapshot;
	}
	dt->estate->es_output_cid = GetCurrentCommandId(true);
	direct_begin_trigger_query(dt);
	ResetPerTupleExprContext(dt->estate);
	return true;
}

/*
 * Begin the table's trigger query (the after-trigger events' level, which
 * direct_close ends) now rather than at its first write.  A call that
 * writes two tables begins both, in the order it opened them, before it
 * writes either: all its writes are then one query level, as one
 * statement's (each table's statement triggers fire once), and the closes,
 * in the reverse order, end the levels they began.
 */
void
direct_begin_trigger_query(DirectTable *dt)
{
	if (!dt->query_started)
	{
		AfterTriggerBeginQuery();
		dt->query_started = true;
	}
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

/* A plain INSERT of the new slot's row. */
static DirectWrite
insert_plain(DirectTable *dt, ItemPointer tid)
{
	EState	   *estate = dt->estate;
	TupleTableSlot *slot = dt->new_slot;
	List	   *recheck;

	table_tuple_insert(dt->rel, slot, estate->es_output_cid, 0, NULL);
	recheck = idem_insert_index_tuples(dt->rri, slot, estate, false, false, NULL, NIL, false);
	ExecARInsertTriggers(estate, dt->rri, slot, recheck, dt->capture);
	list_free(recheck);
	*tid = slot->tts_tid;
	return DIRECT_WRITTEN;
}

/* ON CONFLICT DO NOTHING's speculative insertion of the new slot's row. */
static DirectWrite
insert_speculative(DirectTable *dt, ItemPointer tid)
{
	EState	   *estate = dt->estate;
	ResultRelInfo *rri = dt->rri;
	TupleTableSlot *slot = dt->new_slot;

	for (;;)
	{
		ItemPointerData conflict;
		uint32		token;
		bool		spec_conflict = false;
		List	   *recheck;

		if (!idem_check_index_constraints(rri, slot, estate, &conflict, dt->arbiters))
		{
			check_conflict_visible(dt, &conflict);
			return DIRECT_CHANGED;
		}
		token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
		table_tuple_insert_speculative(dt->rel, slot, estate->es_output_cid, 0, NULL, token);
		recheck = idem_insert_index_tuples(rri, slot, estate, false, true,
										   &spec_conflict, dt->arbiters, false);
		table_tuple_complete_speculative(dt->rel, slot, token, !spec_conflict);
		SpeculativeInsertionLockRelease(GetCurrentTransactionId());
		if (!spec_conflict)
		{
			ExecARInsertTriggers(estate, rri, slot, recheck, dt->capture);
			list_free(recheck);
			*tid = slot->tts_tid;
			return DIRECT_WRITTEN;
		}
		/* Lost a race with a concurrent insert: check again (and wait). */
		list_free(recheck);
	}
}

/*
 * Insert the row started by direct_new_row.  on_conflict_do_nothing: as
 * INSERT ... ON CONFLICT (primary key) DO NOTHING would, DIRECT_CHANGED
 * when a row with the key exists (after waiting for an in-flight insert of
 * it to commit); otherwise as a plain INSERT (a duplicate key is an
 * error).  *tid: where the row went; the new slot keeps its values
 * (defaults included) until the next write.  Statement-level triggers
 * fire around the row, as for a one-row INSERT.
 */
DirectWrite
direct_insert(DirectTable *dt, bool on_conflict_do_nothing, ItemPointer tid)
{
	EState	   *estate = dt->estate;
	ResultRelInfo *rri = dt->rri;
	TriggerDesc *trigdesc = rri->ri_TrigDesc;
	TupleTableSlot *slot = dt->new_slot;
	DirectWrite result = DIRECT_WRITTEN;

	if (!start_write(dt, "INSERT", CMD_INSERT))
		return DIRECT_STALE;
	/* Transition tables of a trigger's (REFERENCING NEW TABLE), if any. */
	dt->capture = MakeTransitionCaptureState(trigdesc, dt->relid, CMD_INSERT);
	if (trigdesc && trigdesc->trig_insert_before_statement)
		ExecBSInsertTriggers(estate, rri);
	if (dt->ndefaults > 0)
		compute_defaults(dt, slot);
	ExecStoreVirtualTuple(slot);
	/* A BEFORE trigger that skips the row: nothing inserted, as in SQL. */
	if (trigdesc && trigdesc->trig_insert_before_row &&
		!ExecBRInsertTriggers(estate, rri, slot))
		result = DIRECT_CHANGED;
	else
	{
		if (dt->rel->rd_att->constr && dt->rel->rd_att->constr->has_generated_stored)
			ExecComputeStoredGenerated(rri, estate, slot, CMD_INSERT);
		if (dt->rel->rd_att->constr)
			ExecConstraints(rri, slot, estate);
		result = on_conflict_do_nothing ? insert_speculative(dt, tid) : insert_plain(dt, tid);
	}
	if (trigdesc && trigdesc->trig_insert_after_statement)
		ExecASInsertTriggers(estate, rri, dt->capture);
	return result;
}

/*
 * The columns this update changes, as the SET list of the statement it
 * stands for would name them: for column-specific triggers (UPDATE OF)
 * and the index AM's hint that an index's key is unchanged.
 */
static void
note_updated_columns(DirectTable *dt)
{
	TupleTableSlot *slot = dt->new_slot;
	Bitmapset  *changed = NULL;
	int			i;

	for (i = 0; i < dt->desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(dt->desc, i);

		if (att->attisdropped || att->attgenerated)
			continue;
		if (slot->tts_isnull[i] != dt->old_nulls[i] ||
			(!slot->tts_isnull[i] &&
			 !datumIsEqual(slot->tts_values[i], dt->old_values[i], att->attbyval, att->attlen)))
			changed = bms_add_member(changed, att->attnum - FirstLowInvalidHeapAttributeNumber);
	}
	idem_set_updated_cols(dt->estate, dt->rte, changed);

	/*
	 * The executor works out once per IndexInfo whether an update leaves
	 * an index's key unchanged (the B-tree's bottom-up deletion hint), as
	 * every update of one statement changes the same columns.  The kept
	 * IndexInfo outlives this update and the next changes other columns:
	 * work it out again.
	 */
	for (i = 0; i < dt->rri->ri_NumIndices; i++)
		dt->rri->ri_IndexRelationInfo[i]->ii_CheckedUnchanged = false;
}

/*
 * Whether an update or delete of a version read before wrote: false when
 * a concurrent transaction updated or deleted it first (under READ
 * COMMITTED; 40001 under REPEATABLE READ and SERIALIZABLE, as the SQL
 * statements raise it).
 */
static bool
written(DirectTable *dt, TM_Result result, const char *doing)
{
	switch (result)
	{
		case TM_Ok:
			return true;
		case TM_Updated:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			return false;
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent delete")));
			return false;
		case TM_SelfModified:
			elog(ERROR, "pg_idem: %s row already modified by this command", dt->relname);
			break;
		default:
			elog(ERROR, "pg_idem: unexpected result %d %s %s", (int) result, doing, dt->relname);
			break;
	}
	return false;
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
	IdemUpdateIndexes update_indexes;

	if (rri->ri_TrigDesc && rri->ri_TrigDesc->trig_update_before_row)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("pg_idem table %s has a BEFORE UPDATE trigger", dt->relname),
				 errdetail("pg_idem updates it directly, and a BEFORE UPDATE trigger could change the row after pg_idem decided on it."),
				 errhint("Use an AFTER trigger.")));
	if (!start_write(dt, "UPDATE", CMD_UPDATE))
		return DIRECT_STALE;
	dt->capture = MakeTransitionCaptureState(rri->ri_TrigDesc, dt->relid, CMD_UPDATE);
	note_updated_columns(dt);
	if (rri->ri_TrigDesc && rri->ri_TrigDesc->trig_update_before_statement)
		ExecBSUpdateTriggers(estate, rri);
	ExecStoreVirtualTuple(slot);
	if (dt->rel->rd_att->constr && dt->rel->rd_att->constr->has_generated_stored)
		ExecComputeStoredGenerated(rri, estate, slot, CMD_UPDATE);
	if (dt->rel->rd_att->constr)
		ExecConstraints(rri, slot, estate);

	result = idem_table_tuple_update(dt->rel, old_tid, slot, estate->es_output_cid,
									 dt->snapshot, InvalidSnapshot, true, &tmfd,
									 &lockmode, &update_indexes);
	if (!written(dt, result, "updating"))
		return DIRECT_CHANGED;

	if (rri->ri_NumIndices > 0 && idem_update_needs_indexes(update_indexes))
		recheck = idem_insert_index_tuples(rri, slot, estate, true, false, NULL, NIL,
										   idem_update_only_summarizing(update_indexes));
	ExecARUpdateTriggers(estate, rri, NULL, NULL, old_tid, NULL, slot, recheck,
						 dt->capture, false);
	list_free(recheck);
	if (rri->ri_TrigDesc && rri->ri_TrigDesc->trig_update_after_statement)
		ExecASUpdateTriggers(estate, rri, dt->capture);
	*new_tid = slot->tts_tid;
	return DIRECT_WRITTEN;
}

/*
 * Delete the version at tid, read before, as a one-row DELETE: row and
 * statement-level AFTER triggers, transition tables.  DIRECT_CHANGED as
 * for direct_update.  A BEFORE DELETE trigger is refused, as a BEFORE
 * UPDATE one is.
 */
DirectWrite
direct_delete(DirectTable *dt, ItemPointer tid)
{
	EState	   *estate = dt->estate;
	ResultRelInfo *rri = dt->rri;
	TriggerDesc *trigdesc = rri->ri_TrigDesc;
	TM_FailureData tmfd;
	TM_Result	result;

	if (trigdesc && trigdesc->trig_delete_before_row)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("pg_idem table %s has a BEFORE DELETE trigger", dt->relname),
				 errdetail("pg_idem deletes its rows directly, and a BEFORE DELETE trigger could keep a row after pg_idem decided on it."),
				 errhint("Use an AFTER trigger.")));
	if (!start_write(dt, "DELETE", CMD_DELETE))
		return DIRECT_STALE;
	dt->capture = MakeTransitionCaptureState(trigdesc, dt->relid, CMD_DELETE);
	if (trigdesc && trigdesc->trig_delete_before_statement)
		ExecBSDeleteTriggers(estate, rri);
	result = idem_table_tuple_delete(dt->rel, tid, estate->es_output_cid, dt->snapshot,
									 InvalidSnapshot, true, &tmfd);
	if (!written(dt, result, "deleting"))
		return DIRECT_CHANGED;
	ExecARDeleteTriggers(estate, rri, tid, NULL, dt->capture, false);
	if (trigdesc && trigdesc->trig_delete_after_statement)
		ExecASDeleteTriggers(estate, rri, dt->capture);
	return DIRECT_WRITTEN;
}

/*
 * Lock the version at tid, read before, FOR UPDATE, as SELECT ... FOR
 * UPDATE [SKIP LOCKED] locks a row (ExecLockRows): under READ COMMITTED a
 * version updated since the snapshot is followed to the newest one, which
 * is locked and returned for the caller to check again (EvalPlanQual's
 * re-check of the WHERE clause); under REPEATABLE READ and SERIALIZABLE
 * that is 40001.  Returns the locked version, copied, with its place in
 * t_self; NULL when the row is gone (deleted, or changed by this
 * transaction) or, with skip_locked, another transaction holds a lock on
 * it.  The lock is kept to the end of the transaction.  The call must
 * have been opened for a write (DIRECT_UPDATE).
 */
HeapTuple
direct_lock(DirectTable *dt, ItemPointer tid, bool skip_locked)
{
	TupleTableSlot *slot = dt->conflict_slot;
	TM_FailureData tmfd;
	TM_Result	result;
	HeapTuple	tuple;
	/* The AM moves the TID it is given along the update chain: not the caller's. */
	ItemPointerData target = *tid;

	if (!dt->write_locked || dt->snapshot == NULL)
		elog(ERROR, "pg_idem: %s row locked outside a write after a read", dt->relname);
	result = table_tuple_lock(dt->rel, &target, dt->snapshot, slot, GetCurrentCommandId(true),
							  LockTupleExclusive, skip_locked ? LockWaitSkip : LockWaitBlock,
							  IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
							  &tmfd);
	switch (result)
	{
		case TM_Ok:
			tuple = direct_copy_row(dt, slot);
			ExecClearTuple(slot);
			return tuple;
		case TM_WouldBlock:
		case TM_SelfModified:
			return NULL;
		case TM_Updated:
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent %s",
								result == TM_Updated ? "update" : "delete")));
			if (result == TM_Updated)
				elog(ERROR, "pg_idem: %s row updated although its newest version was locked",
					 dt->relname);
			return NULL;
		default:
			elog(ERROR, "pg_idem: unexpected result %d locking %s", (int) result, dt->relname);
	}
	return NULL;
}
