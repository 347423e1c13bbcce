/*-------------------------------------------------------------------------
 *
 * scope.h
 *	  Whose rows a call works on: role isolation (scope.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_SCOPE_H
#define IDEM_CORE_SCOPE_H

extern text *idem_current_scope(void);

#endif							/* IDEM_CORE_SCOPE_H */
