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
 * claim fails on idem_outbox_claimed's primary key).
 *
 * PostgreSQL 19 replicates sequences, but as snapshots: a publication FOR
 * ALL SEQUENCES copies the publisher's positions when the subscription is
 * created and again at each ALTER SUBSCRIPTION ... REFRESH SEQUENCES,
 * never in between (and only from a 19 publisher).  A cut-over that
 * refreshes them once writes have stopped gets exact sequences; one that
 * does not leaves the new writer's sequences where the last copy put
 * them, below the replicated rows but no longer young (below).  And a
 * copy made after the new writer drew values moves its sequences back
 * (measured on 19rc1: a REFRESH SEQUENCES set a sequence from 5000 back to
 * the publisher's 900), under backends that already checked.
 *
 * So a sequence that is seen to be behind its tables is advanced past
 * them, once, by the first call that sees it:
 *  - generations: claim.c checks while the sequence is young (its first
 *	  IDEM_YOUNG_SEQUENCE values: a new cluster or a new install, which is
 *	  what a cut-over's new writer is before 19), whenever a take-over finds
 *	  a row whose generation is not below the value drawn (proof that the
 *	  sequence is behind), and, once per backend, when the sequence is a
 *	  subscribed one (19: listed in pg_subscription_rel, now or when this
 *	  backend last looked), looked at at the backend's first claim and after
 *	  any change to pg_subscription or pg_subscription_rel (a subscription
 *	  created, altered, disabled or dropped, a sequence copied).  The check
 *	  reads the highest generation of idem_keys, a scan, so it is not made
 *	  on every claim; a take-over's generation is moreover always above the
 *	  row's, whatever the sequence says.
 *  - outbox ids: both tables have their id as primary key, so max(id) is
 *	  two index probes; each backend checks before its first stage, and
 *	  again after any change to pg_subscription or pg_subscription_rel, so a
 *	  backend that staged before its database became a subscriber (a cut
 *	  back), or before a copy of the sequences (19), checks again.
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
#include "access/genam.h"
#include "access/skey.h"
#include "catalog/pg_subscription_rel.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

/* How far past what it must exceed a sequence is advanced (see above). */
#define IDEM_SEQUENCE_HEADROOM	INT64CONST(1000000)

static IdemStatement max_outbox_id = {
	"SELECT pg_catalog.max(id) FROM @extschema@.idem_outbox",
	0, {InvalidOid}
};

/* The outbox sequence this backend has checked, until a subscription changes. */
static Oid	outbox_sequence_checked = InvalidOid;
static bool subscription_callbacks_registered = false;

/*
 * Whether the generation sequence's subscription state is to be looked at
 * (at the backend's first claim, and after a subscription changed), and
 * whether it was subscribed when this backend last looked.
 */
static bool generations_look = true;
static bool generations_were_subscribed = false;

/*
 * A cut-over changes pg_subscription; a copy of sequences (19) changes
 * pg_subscription_rel: check again.
 */
static void
subscriptions_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	outbox_sequence_checked = InvalidOid;
	generations_look = true;
}

static void
register_subscription_callbacks(void)
{
	if (subscription_callbacks_registered)
		return;
	CacheRegisterSyscacheCallback(SUBSCRIPTIONOID, subscriptions_changed, (Datum) 0);
	CacheRegisterSyscacheCallback(SUBSCRIPTIONRELMAP, subscriptions_changed, (Datum) 0);
	subscription_callbacks_registered = true;
}

/*
 * Whether a subscription lists sequence (PostgreSQL 19's FOR ALL
 * SEQUENCES; never before 19): one probe of pg_subscription_rel's index.
 */
static bool
sequence_is_subscribed(Oid sequence)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	bool		found;

	rel = table_open(SubscriptionRelRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_subscription_rel_srrelid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(sequence));
	scan = systable_beginscan(rel, SubscriptionRelSrrelidSrsubidIndexId, true, NULL, 1, &key);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
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
idem_generations_subscribed(Oid namespace)
{
	bool		subscribed;
	bool		check;

	if (!generations_look)
		return false;
	register_subscription_callbacks();
	subscribed = sequence_is_subscribed(schema_sequence(namespace, "idem_generation_seq"));
	check = subscribed || generations_were_subscribed;
	generations_were_subscribed = subscribed;
	generations_look = false;
	return check;
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
	register_subscription_callbacks();
	advance_past(sequence, single_value(&max_outbox_id, namespace));
	outbox_sequence_checked = sequence;
}
