/*-------------------------------------------------------------------------
 *
 * scope.c
 *	  Whose keys a call works on: role isolation.
 *
 * Every row pg_idem keeps for a caller (idempotency keys, inbox messages,
 * outbox events) carries a scope, the name of a role, and every function
 * a client role may call works only on rows of the caller's scope.  The
 * same cache key used by two roles is two independent keys, so one
 * service can neither replay, claim, finalize nor fail another's keys,
 * even when it can compute them, nor squat on them in advance.
 *
 * The scope is the session's role: the login role, or the one chosen by
 * SET ROLE (GetOuterUserId, which SECURITY DEFINER functions, pg_idem's
 * own included, do not change).  A service whose replicas log in as
 * different roles shares its keys by SET idem.scope = 'group_role', which
 * is allowed only to roles with the privileges of that role: the check
 * runs at every call, since SET ROLE may change the answer.
 *
 * Rows written before 0.3.0 have the empty scope: they were shared by
 * every role then, and stay usable by every role until they expire.
 *
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/scope.h"
#include "core/settings.h"
#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"

/*
 * The caller's scope as text: the session's role, or idem.scope when the
 * session has that role's privileges.
 */
text *
idem_current_scope(void)
{
	Oid			session_role = GetOuterUserId();
	Oid			scope_role;

	if (idem_scope_setting == NULL || idem_scope_setting[0] == '\0')
		return cstring_to_text(GetUserNameFromId(session_role, false));

	scope_role = get_role_oid(idem_scope_setting, true);
	if (!OidIsValid(scope_role))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("idem.scope names a role that does not exist"),
				 errdetail("idem.scope is \"%s\".", idem_scope_setting),
				 errhint("Set idem.scope to a role the session is a member of, or to '' for its own role.")));
	if (!has_privs_of_role(session_role, scope_role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for idempotency scope \"%s\"", idem_scope_setting),
				 errdetail("Role \"%s\" does not have the privileges of role \"%s\".",
						   GetUserNameFromId(session_role, false), idem_scope_setting),
				 errhint("Only members of a role may use its keys: GRANT %s TO %s.",
						 quote_identifier(idem_scope_setting),
						 quote_identifier(GetUserNameFromId(session_role, false)))));
	return cstring_to_text(idem_scope_setting);
}
