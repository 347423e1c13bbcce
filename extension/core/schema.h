/*-------------------------------------------------------------------------
 *
 * schema.h
 *	  Which versions' tables this library serves (schema.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_SCHEMA_H
#define IDEM_CORE_SCHEMA_H

/*
 * Refuse, with the hint to run ALTER EXTENSION pg_idem UPDATE, the tables
 * of a version older than the previous release's; probed once and kept
 * until a relcache invalidation of idem_keys.  Every call that reads or
 * writes pg_idem's tables passes here first (direct_open, idem_execute).
 */
extern void idem_require_served_schema(Oid namespace);

#endif							/* IDEM_CORE_SCHEMA_H */
