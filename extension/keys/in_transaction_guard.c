/*-------------------------------------------------------------------------
 *
 * in_transaction_guard.c
 *	  The deferred constraint trigger that keeps a half-done in-transaction
 *	  claim from committing.
 *
 * idem_begin inserts (or takes over) a pending row with in_transaction set.
 * The constraint trigger idem_keys_claim_finished is queued only for such
 * rows (its WHEN clause), so lease-mode claims pay nothing for it.  At
 * commit it looks at the row version that queued it: if a later statement
 * of the transaction finalized, released or failed the claim, that version
 * is no longer live and there is nothing to check; if it is still live,
 * the claim is unfinished and the commit is refused.  Written after
 * ri_triggers.c: check the calling context first, skip rows that are no
 * longer live, report with errtableconstraint().
 *
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/errors.h"
#include "access/tableam.h"
#include "commands/trigger.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(idem_keys_claim_finished);

/* Constraint trigger: refuse to commit an unfinished in-transaction claim. */
Datum
idem_keys_claim_finished(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleTableSlot *slot;
	bool		isnull;
	Datum		key;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"idem_keys_claim_finished\" was not called by trigger manager")));
	if (!TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"idem_keys_claim_finished\" must be fired AFTER INSERT OR UPDATE FOR EACH ROW")));

	slot = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newslot : trigdata->tg_trigslot;

	/* Finished, released or taken over later in the transaction: fine. */
	if (!table_tuple_satisfies_snapshot(trigdata->tg_relation, slot, SnapshotSelf))
		return PointerGetDatum(NULL);

	key = slot_getattr(slot, 1, &isnull);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_CLAIM_UNFINISHED),
			 errmsg("idempotency claim begun in this transaction was not finished"),
			 errdetail("Key %s is still pending at commit.",
					   isnull ? "(null)" :
					   DatumGetCString(DirectFunctionCall1(byteaout, key))),
			 errhint("Call idem_finalize, idem_release or idem_fail before COMMIT, or roll back."),
			 errtableconstraint(trigdata->tg_relation, "idem_keys_claim_finished")));
	return PointerGetDatum(NULL);
}
