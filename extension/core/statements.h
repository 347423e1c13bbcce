/*-------------------------------------------------------------------------
 *
 * statements.h
 *	  Cached SPI statements qualified with the extension's schema
 *	  (statements.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_STATEMENTS_H
#define IDEM_CORE_STATEMENTS_H

#include "executor/spi.h"
#include "fmgr.h"

/*
 * A cached, schema-qualified SPI statement.  "@extschema@"
 * in the text is replaced by the extension's schema, so the functions work
 * whatever the caller's search_path is.
 */
typedef struct IdemStatement
{
	const char *sql;
	int			nargs;
	Oid			argtypes[12];
	SPIPlanPtr	plan;			/* kept plan, or NULL before first use */
	Oid			namespace;		/* schema the plan was prepared for */
	bool		by_tid;			/* writes its batch by TID: TID scans pinned on */
} IdemStatement;

/* The caller's identity, kept while a statement runs as the tables' owner. */
typedef struct IdemOwnerSwitch
{
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
} IdemOwnerSwitch;

/*
 * A batch written by TID: WRITE ("DELETE FROM ... alias" or "UPDATE ...
 * alias SET ...") applied to at most LIMIT rows of TABLE that PRED
 * matches, picked FOR UPDATE SKIP LOCKED and re-checked by PRED at the
 * write; PRED(prefix) is a predicate macro over columns named prefix
 * "column".  keys/cleanup.c says why by TID; a statement made with it
 * sets .by_tid.
 */
#define IDEM_BATCH_BY_TID(WRITE, ALIAS, TABLE, PRED, LIMIT) \
	WRITE " WHERE " ALIAS ".ctid = ANY (ARRAY(" \
	"SELECT ctid FROM @extschema@." TABLE " WHERE " PRED("") \
	" LIMIT " LIMIT " FOR UPDATE SKIP LOCKED)) AND " PRED(ALIAS ".")

extern Oid	idem_function_namespace(FunctionCallInfo fcinfo);
extern void idem_as_owner(Oid namespace, IdemOwnerSwitch *save);
extern void idem_as_caller(IdemOwnerSwitch *save);
extern int	idem_execute(IdemStatement *stmt, Oid namespace, Datum *values,
						 const char *nulls, bool read_only, long count);

#endif							/* IDEM_CORE_STATEMENTS_H */
