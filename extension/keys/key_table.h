/*-------------------------------------------------------------------------
 *
 * key_table.h
 *	  idem_keys as the claim hot path reads and writes it (key_table.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYS_KEY_TABLE_H
#define IDEM_KEYS_KEY_TABLE_H

#include "core/protocol.h"
#include "table/direct_table.h"

#include "datatype/timestamp.h"
#include "storage/itemptr.h"
#include "utils/snapshot.h"
#include "utils/uuid.h"

/*
 * One row of idem_keys as the protocol sees it.  A row read carries its
 * place (tid) and the whole stored tuple, so that an update rewrites only
 * the protocol's columns and keeps any other column as it was.  NULL
 * pointers are SQL NULLs; the response's headers and body stay Datums, as
 * stored (possibly TOASTed), because only a replay looks at them.
 */
typedef struct KeyRow
{
	ItemPointerData tid;
	HeapTuple	tuple;			/* as read; NULL for a row to insert */
	bytea	   *cache_key;
	Oid			scope;			/* the role's OID; IDEM_SHARED_SCOPE: from before 0.3.0 */
	IdemKeyState state;
	bytea	   *request_hash;	/* NULL: a tombstone (or a legacy row) */
	pg_uuid_t  *claim_id;		/* NULL: no owner */
	int64		generation;
	bool		has_lease;
	TimestampTz lease_expires_at;
	TimestampTz created_at;
	bool		has_finished;
	TimestampTz finished_at;
	bool		has_status;
	int32		response_status;
	bool		headers_null;
	Datum		response_headers;
	bool		body_null;
	Datum		response_body;
	bool		replayable;
	bool		in_transaction;
} KeyRow;

/* Which of a cache key's rows (one per scope) a read wants. */
typedef enum KeyMatch
{
	KEY_MATCH_SCOPE,			/* the scope's (arg: an Oid *), else one from before scopes */
	KEY_MATCH_OWNER,			/* pending under a claim id, in a scope (arg: a KeyOwner *) */
	KEY_MATCH_LIVE				/* the first that is not a tombstone, any scope */
} KeyMatch;

/* KEY_MATCH_OWNER's argument: the claim and the caller's scope. */
typedef struct KeyOwner
{
	pg_uuid_t  *claim_id;
	Oid			scope;			/* the row's, or the row is in the shared scope */
} KeyOwner;

/* What a write did (DirectWrite's values). */
typedef enum KeyWrite
{
	KEY_WRITTEN = DIRECT_WRITTEN,
	KEY_CHANGED = DIRECT_CHANGED,	/* a concurrent write came first: read again */
	KEY_STALE = DIRECT_STALE	/* reopen (key_table_reopen), read again */
} KeyWrite;

typedef DirectTable KeyTable;

extern KeyTable *key_table_open(Oid namespace, DirectAccess access);
extern KeyTable *key_table_reopen(KeyTable *table, Oid namespace);
extern void key_table_close(KeyTable *table);
extern bool key_table_read(KeyTable *table, bytea *cache_key, KeyMatch match,
						   const void *arg, bool fresh_snapshot, KeyRow *row);
extern KeyWrite key_table_insert(KeyTable *table, KeyRow *row);
extern KeyWrite key_table_update(KeyTable *table, KeyRow *row);
extern int64 key_table_next_generation(KeyTable *table);

extern bool key_row_is_tombstone(const KeyRow *row);
extern void key_row_make_tombstone(KeyRow *row);

#endif							/* IDEM_KEYS_KEY_TABLE_H */
