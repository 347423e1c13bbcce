/*-------------------------------------------------------------------------
 *
 * schema.c
 *	  Which versions' tables this library serves: the current version's
 *	  and the previous release's, and no older ones.
 *
 * Between installing a new library (and restarting) and ALTER EXTENSION
 * pg_idem UPDATE, the new library runs against the tables of whatever
 * version the database had.  The rolling-upgrade promise
 * (docs/guides/upgrading.md) is that it serves the previous release's
 * (IDEM_PREVIOUS_VERSION, the Makefile's PREVIOUS) until the update, so
 * that replicas keep working while the extension is updated under them.
 * Older tables (0.3.0's and 0.4.0's, whose scopes are role names) are
 * refused with 55000 and the hint to update: the library reads and
 * writes only the shapes of those two versions, which are the same for
 * every column it touches, so no call site looks at a version.
 *
 * The probe is one column's type (idem_keys.scope, a role's OID since
 * 0.5.0), looked up once per backend and schema and kept until a relcache
 * invalidation of idem_keys: ALTER EXTENSION UPDATE, DROP and CREATE
 * EXTENSION all send one, so an update in the same session switches at
 * once, and the calls in between pay one comparison.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/schema.h"
#include "core/scope.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

/* The schema whose tables were found served, and its idem_keys. */
static Oid	served_namespace = InvalidOid;
static Oid	served_keys = InvalidOid;
static bool callback_registered = false;

/* idem_keys changed (or everything did): probe again at the next call. */
static void
forget_probe(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == served_keys)
	{
		served_namespace = InvalidOid;
		served_keys = InvalidOid;
	}
}

/* The installed version of pg_idem, for the refusal's detail. */
static char *
installed_version(void)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *version = pstrdup("unknown");

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("pg_idem"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		value = heap_getattr(tuple, Anum_pg_extension_extversion,
										 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(value);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/* See schema.h. */
void
idem_require_served_schema(Oid namespace)
{
	Oid			keys;
	AttrNumber	scope;

	if (namespace == served_namespace && OidIsValid(namespace))
		return;
	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(forget_probe, (Datum) 0);
		callback_registered = true;
	}

	/* No idem_keys at all: the caller's own lookup says what is missing. */
	keys = get_relname_relid("idem_keys", namespace);
	if (!OidIsValid(keys))
		return;
	scope = get_attnum(keys, "scope");
	if (scope == InvalidAttrNumber || get_atttype(keys, scope) != IDEM_SCOPE_TYPE)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem's tables need ALTER EXTENSION pg_idem UPDATE"),
				 errdetail("The library is version %s, which serves the tables of version %s and later; "
						   "this database has pg_idem %s.",
						   IDEM_VERSION, IDEM_PREVIOUS_VERSION, installed_version()),
				 errhint("Run ALTER EXTENSION pg_idem UPDATE in this database.")));
	served_namespace = namespace;
	served_keys = keys;
}
