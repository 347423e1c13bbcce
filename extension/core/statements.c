/*-------------------------------------------------------------------------
 *
 * statements.c
 *	  Cached SPI plans qualified with the extension's schema.
 *
 * The SQL-callable functions of the outbox, the inbox, the attempts and the
 * cleanup run a handful of fixed statements against their own tables (the
 * claim hot path runs none: key_table.c reads and writes idem_keys
 * directly).  Preparing them once per backend and keeping the
 * plans (as ri_triggers.c does) keeps the per-call cost near that of the
 * bare statements.  Plans name the tables with the schema the calling
 * function lives in, so a caller's search_path can neither break nor
 * redirect them.
 *
 * pg_idem's functions are SECURITY INVOKER, so that the scope is the role
 * whose code calls them (scope.c); every statement is prepared and run
 * here as the tables' owner, with search_path pinned to pg_catalog,
 * pg_temp, which is what SECURITY DEFINER ... SET search_path did for
 * them before 0.5.0, and it refuses to run inside a security-restricted
 * operation (idem_refuse_restricted).  Tables older than the library
 * serves are refused first (schema.c).
 *
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/statements.h"
#include "core/schema.h"
#include "core/scope.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/syscache.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

/* The schema of the SQL-callable function being run: the extension's. */
Oid
idem_function_namespace(FunctionCallInfo fcinfo)
{
	Oid			fn_oid = fcinfo->flinfo->fn_oid;
	Oid			namespace = get_func_namespace(fn_oid);

	if (!OidIsValid(namespace))
		elog(ERROR, "cache lookup failed for function %u", fn_oid);
	return namespace;
}

/* Statement text with every @extschema@ replaced by the quoted schema. */
static char *
qualified_sql(const char *sql, Oid namespace)
{
	const char *schema;
	const char *token = "@extschema@";
	size_t		token_len = strlen(token);
	StringInfoData buf;
	const char *p = sql;
	const char *hit;
	char	   *name = get_namespace_name(namespace);

	if (name == NULL)
		elog(ERROR, "cache lookup failed for namespace %u", namespace);
	schema = quote_identifier(name);

	initStringInfo(&buf);
	while ((hit = strstr(p, token)) != NULL)
	{
		appendBinaryStringInfo(&buf, p, hit - p);
		appendStringInfoString(&buf, schema);
		p = hit + token_len;
	}
	appendStringInfoString(&buf, p);
	return buf.data;
}

/* The owner of the schema's tables (idem_keys'), which pg_idem acts as. */
static Oid
tables_owner(Oid namespace)
{
	Oid			owner;
	Oid			keys = get_relname_relid("idem_keys", namespace);
	HeapTuple	tuple;

	if (!OidIsValid(keys))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("pg_idem table idem_keys is missing"),
				 errdetail("Schema \"%s\" has no idem_keys.", get_namespace_name(namespace))));
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(keys));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", keys);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

/*
 * From here on, as the tables' owner with search_path pinned, as a
 * SECURITY DEFINER function would be: the caller's scope must have been
 * read before (scope.c).  An error in between is undone by the
 * (sub)transaction's abort, which restores both.  Refused inside a
 * security-restricted operation.
 */
void
idem_as_owner(Oid namespace, IdemOwnerSwitch *save)
{
	idem_refuse_restricted();
	GetUserIdAndSecContext(&save->save_userid, &save->save_sec_context);
	save->save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	SetUserIdAndSecContext(tables_owner(namespace),
						   save->save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
}

/* Back to the caller (after idem_as_owner). */
void
idem_as_caller(IdemOwnerSwitch *save)
{
	SetUserIdAndSecContext(save->save_userid, save->save_sec_context);
	AtEOXact_GUC(true, save->save_nestlevel);
}

/* The statement's kept plan for this schema, prepared on first use. */
static SPIPlanPtr
statement_plan(IdemStatement *stmt, Oid namespace)
{
	SPIPlanPtr	plan;

	idem_require_served_schema(namespace);
	if (stmt->plan != NULL && stmt->namespace == namespace)
		return stmt->plan;

	/* The extension was re-created elsewhere: forget the old plan. */
	if (stmt->plan != NULL)
	{
		SPI_freeplan(stmt->plan);
		stmt->plan = NULL;
	}

	plan = SPI_prepare(qualified_sql(stmt->sql, namespace), stmt->nargs, stmt->argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 stmt->sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	stmt->plan = plan;
	stmt->namespace = namespace;
	return plan;
}

/*
 * Run a cached statement; the caller is connected to SPI.  Returns
 * SPI_processed.  A volatile (read_only = false) execution takes a fresh
 * snapshot, so under READ COMMITTED every statement sees the latest
 * committed state of the key, as the claim protocol requires.
 */
int
idem_execute(IdemStatement *stmt, Oid namespace, Datum *values,
			 const char *nulls, bool read_only, long count)
{
	int			rc;
	IdemOwnerSwitch save;

	idem_as_owner(namespace, &save);
	/*
	 * A statement that writes its batch by TID (keys/cleanup.c) is planned
	 * with TID scans on whatever the session or database set: with them off
	 * each batch would be a scan of the whole table.  Undone with the rest
	 * by idem_as_caller.
	 */
	if (stmt->by_tid)
		(void) set_config_option("enable_tidscan", "on", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	rc = SPI_execute_plan(statement_plan(stmt, namespace), values, nulls,
						  read_only, count);
	idem_as_caller(&save);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s",
			 stmt->sql, SPI_result_code_string(rc));
	return (int) SPI_processed;
}
