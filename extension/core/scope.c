/*-------------------------------------------------------------------------
 *
 * scope.c
 *	  Whose rows a call works on: role isolation.
 *
 * Every row pg_idem keeps for a caller (idempotency keys, inbox messages,
 * outbox events, attempts) carries a scope, the OID of a role, and every
 * function a client role may call works only on rows of the caller's
 * scope.  The same cache key used by two roles is two independent keys,
 * so one service can neither replay, claim, finalize nor fail another's
 * keys, even when it can compute them, nor squat on them in advance.
 *
 * The scope is a role's identity, not its name: a renamed role keeps its
 * rows, a new role created under an old name gets none of them, and a
 * dropped role's rows are reachable by no role and expire.
 *
 * The scope is the role whose code calls pg_idem (GetUserId): the session's
 * role, or the owner of the SECURITY DEFINER function that calls it, or
 * the owner of a table whose trigger calls it.  That role wrote the code
 * that runs, so it is the one whose keys the code may use; the session's
 * role (GetOuterUserId) would lend the caller's scope to any function it
 * happens to run.  For that to hold, pg_idem's own functions are SECURITY
 * INVOKER: they switch to the tables' owner in C, after reading the scope
 * (table/direct_table.c, core/statements.c).
 *
 * A service whose replicas log in as different roles shares its keys by
 * SET idem.scope = 'group_role', which is allowed only when the calling
 * role has the privileges of that role: the check runs at every call,
 * since SET ROLE may change the answer.
 *
 * Rows written before 0.3.0 have the shared scope (IDEM_SHARED_SCOPE):
 * they were shared by every role then, and stay usable by every role until
 * they expire.
 *
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/scope.h"
#include "core/settings.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"

/*
 * pg_idem does not act inside a security-restricted operation: there
 * PostgreSQL runs one role's code (an index expression, a materialized
 * view's query) on behalf of another (the maintenance role, autovacuum),
 * and whatever scope such a call got, it would be one the code's author
 * did not choose: refusing is the one answer that lends nobody's keys,
 * messages or events.  Every SQL-callable function that reaches a table
 * or a scope calls this first.
 */
void
idem_refuse_restricted(void)
{
	if (InSecurityRestrictedOperation())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("pg_idem cannot be used inside a security-restricted operation"),
				 errdetail("The call runs as role \"%s\" inside an index expression, a materialized view's query "
						   "or maintenance (ANALYZE, VACUUM, CLUSTER, REINDEX, CREATE INDEX, REFRESH MATERIALIZED VIEW, "
						   "autovacuum), where one role's code runs on behalf of another.",
						   GetUserNameFromId(GetUserId(), false)),
				 errhint("Call pg_idem from ordinary statements, functions and triggers only.")));
}

/*
 * The caller's scope in the schema's tables: the calling role's OID, or
 * idem.scope's role when the calling role has its privileges.  Called
 * before any switch to the tables' owner.
 */
Oid
idem_current_scope(void)
{
	Oid			caller = GetUserId();
	Oid			scope_role;

	idem_refuse_restricted();
	if (idem_scope_setting == NULL || idem_scope_setting[0] == '\0')
		return caller;

	scope_role = get_role_oid(idem_scope_setting, true);
	if (!OidIsValid(scope_role))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("idem.scope names a role that does not exist"),
				 errdetail("idem.scope is \"%s\".", idem_scope_setting),
				 errhint("Set idem.scope to a role the session is a member of, or to '' for its own role.")));
	if (!has_privs_of_role(caller, scope_role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for idempotency scope \"%s\"", idem_scope_setting),
				 errdetail("Role \"%s\" does not have the privileges of role \"%s\".",
						   GetUserNameFromId(caller, false), idem_scope_setting),
				 errhint("Only members of a role may use its keys: GRANT %s TO %s.",
						 quote_identifier(idem_scope_setting),
						 quote_identifier(GetUserNameFromId(caller, false)))));
	return scope_role;
}
