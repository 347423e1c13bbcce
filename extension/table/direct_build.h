/*-------------------------------------------------------------------------
 *
 * direct_build.h
 *	  Building direct_table.c's kept state of a table (direct_build.c);
 *	  for table/ only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TABLE_DIRECT_BUILD_H
#define IDEM_TABLE_DIRECT_BUILD_H

#include "table/direct_table.h"

#include "utils/relcache.h"

extern void direct_build(DirectTable *table, Relation rel, Oid namespace);

#endif							/* IDEM_TABLE_DIRECT_BUILD_H */
