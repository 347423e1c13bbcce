/*-------------------------------------------------------------------------
 *
 * statements.c
 *	  Cached SPI plans qualified with the extension's schema.
 *
 * Between installing a new library and ALTER EXTENSION UPDATE, the new
 * library runs against the previous version's tables: a statement that
 * depends on 0.3.0's scope columns carries the text for a 0.2 schema as
 * well, and the shape of the schema is checked on every execution (two
 * syscache probes), so that an ALTER EXTENSION UPDATE in the same session
 * switches to the new text at once.
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
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/statements.h"
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

/* Does the schema's idem_keys have 0.3.0's scope column? */
bool
idem_schema_scoped(Oid namespace)
{
	Oid			keys = get_relname_relid("idem_keys", namespace);

	return OidIsValid(keys) && get_attnum(keys, "scope") != InvalidAttrNumber;
}

/* The statement's kept plan for this schema, prepared on first use. */
static SPIPlanPtr
statement_plan(IdemStatement *stmt, Oid namespace)
{
	SPIPlanPtr	plan;
	bool		unscoped = stmt->unscoped_sql != NULL && !idem_schema_scoped(namespace);

	if (stmt->plan != NULL && stmt->namespace == namespace && stmt->unscoped == unscoped)
		return stmt->plan;

	/* The extension was re-created elsewhere: forget the old plan. */
	if (stmt->plan != NULL)
	{
		SPI_freeplan(stmt->plan);
		stmt->plan = NULL;
	}

	plan = SPI_prepare(qualified_sql(unscoped ? stmt->unscoped_sql : stmt->sql, namespace),
					   stmt->nargs, stmt->argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 stmt->sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	stmt->plan = plan;
	stmt->namespace = namespace;
	stmt->unscoped = unscoped;
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

	rc = SPI_execute_plan(statement_plan(stmt, namespace), values, nulls,
						  read_only, count);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s",
			 stmt->sql, SPI_result_code_string(rc));
	return (int) SPI_processed;
}
