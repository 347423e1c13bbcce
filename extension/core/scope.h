/*-------------------------------------------------------------------------
 *
 * scope.h
 *	  Whose rows a call works on: role isolation (scope.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_SCOPE_H
#define IDEM_CORE_SCOPE_H

#include "catalog/pg_type.h"

/*
 * The scope of rows written before 0.3.0, which every role shares: no
 * role has OID 0.
 */
#define IDEM_SHARED_SCOPE	InvalidOid

/*
 * The type of the scope columns from 0.5.0: regrole, a role's OID (so a
 * renamed role keeps its rows and a new role under an old name gets none)
 * whose text form is the role's name, so that pg_dump and logical
 * replication (text format, a subscription's default) carry each row to
 * the role of that name on another cluster, where OIDs differ.  Its
 * datums, operators and B-tree opclass are oid's.
 */
#define IDEM_SCOPE_TYPE		REGROLEOID

extern void idem_refuse_restricted(void);
extern Oid	idem_current_scope(void);

#endif							/* IDEM_CORE_SCOPE_H */
