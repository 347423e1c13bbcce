/*-------------------------------------------------------------------------
 *
 * sequences.c
 *	  Keeping a schema's sequences above the generations and outbox ids its
 *	  tables already hold, so that a logical-replication cut-over (blue/green,
 *	  a major-version upgrade by logical replication) never hands one out
 *	  again.
 *
 * Logical replication copies rows, not sequence positions: on the new
 * writer idem_generation_seq and idem_outbox_id_seq start where that
 * cluster's own history left them (at 1 after CREATE EXTENSION), below
 * the generations and ids the replicated rows carry.  Drawing from them
 * as they are would give a take-over a generation downstream fences
 * refuse, a new key a generation below other keys' (a fence shared by
 * several keys, such as a ledger row, refuses it), and a staged event an
 * id already published (consumers that deduplicate by id drop it, and its
 * ack fails on the archive's primary key).
 *
 * So a sequence that is seen to be behind its tables is advanced past
 * them, once, by the first call that sees it:
 *  - generations: claim.c checks while the sequence is young (its first
 *	  IDEM_YOUNG_SEQUENCE values: a new cluster or a new install, which is
 *	  what a cut-over's new writer is) and whenever a take-over finds a row
 *	  whose generation is not below the value drawn (proof that the sequence
 *	  is behind).  The check reads the highest generation of idem_keys, a
 *	  scan, so it is not made on every claim; a take-over's generation is moreover
 *	  always above the row's, whatever the sequence says.
 *  - outbox ids: both tables have their id as primary key, so max(id) is
 *	  two index probes; each backend checks before its first stage, and
 *	  again after any change to pg_subscription (a subscription created,
 *	  altered, disabled or dropped: what a cut-over does), so a backend that
 *	  staged before its database became a subscriber (a cut back) checks
 *	  again.
 *
 * Advancing never moves a sequence back: catch-ups are serialized by a
 * ShareUpdateExclusiveLock on the sequence (which nextval's
 * RowExclusiveLock does not conflict with, so claims and stages go on),
 * the position is re-read under it, and the new position leaves
 * IDEM_SEQUENCE_HEADROOM values above the table's maximum and the
 * position read, far more than concurrent callers can draw in between.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/compat.h"

#include "core/sequences.h"
#include "core/statements.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

/* How far past what it must exceed a sequence is advanced (see above). */
#define IDEM_SEQUENCE_HEADROOM	INT64CONST(1000000)

static IdemStatement max_outbox_id = {
	"SELECT pg_catalog.max(id) FROM (SELECT pg_catalog.max(id) AS id FROM @extschema@.idem_outbox_queue"
	" UNION ALL SELECT pg_catalog.max(id) FROM @extschema@.idem_outbox_archive) ids",
	0, {InvalidOid}
};

/* The outbox sequence this backend has checked, until pg_subscription changes. */
static Oid	outbox_sequence_checked = InvalidOid;
static bool subscription_callback_registered = false;

/* A cut-over changes pg_subscription: check the outbox ids again. */
static void
subscriptions_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	outbox_sequence_checked = InvalidOid;
}

/* The sequence's position: the last value drawn, or 0 before the first. */
static int64
sequence_position(Oid sequence)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		result;

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(sequence);
	fcinfo->args[0].isnull = false;
	result = pg_sequence_last_value(fcinfo);
	return fcinfo->isnull ? 0 : DatumGetInt64(result);
}

/*
 * The highest generation of any row version of idem_keys, dead or alive
 * (SnapshotAny: a higher bound is as good, and a scan with a non-MVCC
 * snapshot takes no predicate lock, so a SERIALIZABLE claim that checks
 * does not conflict with every other one).  A scan of the whole table;
 * see the file header for when it is made.
 */
static int64
highest_generation(Oid namespace)
{
	Oid			relid = get_relname_relid("idem_keys", namespace);
	Relation	rel;
	AttrNumber	attnum;
	TableScanDesc scan;
	HeapTuple	tuple;
	int64		highest = 0;

	if (!OidIsValid(relid))
		elog(ERROR, "pg_idem table idem_keys is missing");
	rel = table_open(relid, AccessShareLock);
	attnum = get_attnum(relid, "generation");
	if (attnum == InvalidAttrNumber)
		elog(ERROR, "pg_idem table idem_keys has no generation column");
	scan = idem_table_beginscan(rel, SnapshotAny, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		bool		isnull;
		Datum		value = heap_getattr(tuple, attnum, RelationGetDescr(rel), &isnull);

		if (!isnull && DatumGetInt64(value) > highest)
			highest = DatumGetInt64(value);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	return highest;
}

/* The one bigint a statement of this file answers (0 for NULL). */
static int64
single_value(IdemStatement *stmt, Oid namespace)
{
	int64		value = 0;
	bool		isnull;
	Datum		datum;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	idem_execute(stmt, namespace, NULL, NULL, true, 1);
	datum = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		value = DatumGetInt64(datum);
	SPI_finish();
	return value;
}

/*
 * Advance sequence so that its next value is above floor (nothing to do
 * when its position is not below floor).  Never moves it back (see the
 * file header).
 */
static void
advance_past(Oid sequence, int64 floor)
{
	int64		position;
	LockRelationOid(sequence, ShareUpdateExclusiveLock);
	position = sequence_position(sequence);
	if (position < floor)
	{
		DirectFunctionCall2(setval_oid, ObjectIdGetDatum(sequence),
							Int64GetDatum(Max(floor, position) + IDEM_SEQUENCE_HEADROOM));
		ereport(LOG,
				(errmsg("pg_idem advanced sequence \"%s\" past " INT64_FORMAT,
						get_rel_name(sequence), floor),
				 errdetail("Its position (" INT64_FORMAT ") was not above what its tables hold, as after a logical-replication cut-over.",
						   position)));
	}
	/* setval is not transactional: nothing to keep the lock for. */
	UnlockRelationOid(sequence, ShareUpdateExclusiveLock);
}

/* The sequence named name in namespace; an error if it is missing. */
static Oid
schema_sequence(Oid namespace, const char *name)
{
	Oid			sequence = get_relname_relid(name, namespace);

	if (!OidIsValid(sequence))
		elog(ERROR, "pg_idem sequence %s is missing", name);
	return sequence;
}

/* See sequences.h. */
bool
idem_generations_catch_up(Oid namespace, int64 generation)
{
	int64		highest = highest_generation(namespace);

	if (highest < generation)
		return false;
	advance_past(schema_sequence(namespace, "idem_generation_seq"), highest);
	return true;
}

/* See sequences.h. */
void
idem_outbox_ids_catch_up(Oid namespace)
{
	Oid			sequence = schema_sequence(namespace, "idem_outbox_id_seq");

	if (sequence == outbox_sequence_checked)
		return;
	if (!subscription_callback_registered)
	{
		CacheRegisterSyscacheCallback(SUBSCRIPTIONOID, subscriptions_changed, (Datum) 0);
		subscription_callback_registered = true;
	}
	advance_past(sequence, single_value(&max_outbox_id, namespace));
	outbox_sequence_checked = sequence;
}
