/*-------------------------------------------------------------------------
 *
 * version_guard.c
 *	  idem_version_guard(): If-Match style optimistic concurrency for
 *	  ordinary tables with a version column.
 *
 * A write states the version it read by setting the column to it:
 *
 *	  UPDATE docs SET body = $2, version = $3 WHERE id = $1;
 *
 * The trigger compares that with the row's version: equal, the write goes
 * through and the version becomes one more; different, it raises IL004
 * (stale row version) and nothing is written.  Under READ COMMITTED a
 * writer that waited for a concurrent one is re-evaluated against the
 * newest row version (EvalPlanQual), so of two writers holding the same
 * version exactly one succeeds.  A write that does not set the column
 * carries the row's own version: it is unconditional, and still bumps.
 *
 * On INSERT a NULL version becomes 1; a given one is kept, so that copies
 * and restores keep the versions clients hold.
 *
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/errors.h"
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "utils/rel.h"

PG_FUNCTION_INFO_V1(idem_version_guard);

/* A version value of the column's integer type, as int64. */
static int64
version_value(Oid type, Datum value)
{
	switch (type)
	{
		case INT2OID:
			return DatumGetInt16(value);
		case INT4OID:
			return DatumGetInt32(value);
		default:
			return DatumGetInt64(value);
	}
}

/* The next version, refused past the column type's range. */
static Datum
next_version(Relation rel, int attnum, Oid type, int64 version)
{
	int64		max = type == INT2OID ? PG_INT16_MAX :
		type == INT4OID ? PG_INT32_MAX : PG_INT64_MAX;

	if (version >= max)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("row version is out of range"),
				 errdetail("Version " INT64_FORMAT " of a row of \"%s\" cannot be bumped.",
						   version, RelationGetRelationName(rel)),
				 errtablecol(rel, attnum)));
	version++;
	switch (type)
	{
		case INT2OID:
			return Int16GetDatum((int16) version);
		case INT4OID:
			return Int32GetDatum((int32) version);
		default:
			return Int64GetDatum(version);
	}
}

/*
 * BEFORE INSERT OR UPDATE FOR EACH ROW trigger.  The column is named by
 * the trigger's argument, "version" by default; it must be smallint,
 * integer or bigint.
 */
Datum
idem_version_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	TupleDesc	desc;
	const char *colname;
	int			attnum;
	Oid			type;
	HeapTuple	tuple;
	Datum		value;
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"idem_version_guard\" was not called by trigger manager")));
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) ||
		TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"idem_version_guard\" must be fired BEFORE INSERT OR UPDATE FOR EACH ROW")));
	if (trigdata->tg_trigger->tgnargs > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem_version_guard takes at most one argument, the version column's name")));

	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	colname = trigdata->tg_trigger->tgnargs == 1 ? trigdata->tg_trigger->tgargs[0] : "version";
	attnum = SPI_fnumber(desc, colname);
	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist",
						colname, RelationGetRelationName(rel)),
				 errhint("Add a column \"%s bigint NOT NULL DEFAULT 1\", or name the version column in the trigger's argument.",
						 colname)));
	type = TupleDescAttr(desc, attnum - 1)->atttypid;
	if (type != INT2OID && type != INT4OID && type != INT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("version column \"%s\" of relation \"%s\" must be smallint, integer or bigint",
						colname, RelationGetRelationName(rel)),
				 errtablecol(rel, attnum)));

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
	{
		tuple = trigdata->tg_trigtuple;
		heap_getattr(tuple, attnum, desc, &isnull);
		if (!isnull)
			return PointerGetDatum(tuple);
		value = next_version(rel, attnum, type, 0);
	}
	else
	{
		HeapTuple	old = trigdata->tg_trigtuple;
		Datum		old_value = heap_getattr(old, attnum, desc, &isnull);
		int64		current;
		int64		expected;

		tuple = trigdata->tg_newtuple;
		if (isnull)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("version column \"%s\" of relation \"%s\" holds a null",
							colname, RelationGetRelationName(rel)),
					 errhint("Declare it NOT NULL DEFAULT 1."),
					 errtablecol(rel, attnum)));
		value = heap_getattr(tuple, attnum, desc, &isnull);
		if (isnull)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("expected row version must not be null"),
					 errdetail("The write set column \"%s\" of \"%s\" to null.",
							   colname, RelationGetRelationName(rel)),
					 errtablecol(rel, attnum)));
		current = version_value(type, old_value);
		expected = version_value(type, value);
		if (expected != current)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_STALE_VERSION),
					 errmsg("stale row version"),
					 errdetail("The row of \"%s\" is at version " INT64_FORMAT "; the write expected version " INT64_FORMAT ".",
							   RelationGetRelationName(rel), current, expected),
					 errhint("Read the row again and retry with its current version (HTTP 412 Precondition Failed)."),
					 errtablecol(rel, attnum)));
		value = next_version(rel, attnum, type, current);
	}

	isnull = false;
	tuple = heap_modify_tuple_by_cols(tuple, desc, 1, &attnum, &value, &isnull);
	return PointerGetDatum(tuple);
}
