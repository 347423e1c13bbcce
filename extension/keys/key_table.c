/*-------------------------------------------------------------------------
 *
 * key_table.c
 *	  idem_keys as the claim hot path reads and writes it: the protocol's
 *	  columns of a key's row (KeyRow), which of a cache key's rows a call
 *	  wants, and the new row of each write.  The table access itself is
 *	  direct_table.c's: a primary-key probe, ON CONFLICT DO NOTHING's
 *	  speculative insertion for a new key, an update of the version read.
 *
 * This file and the callers' change functions (claim.c, finish.c) are the
 * one description of what each former SQL statement did: the predicate is
 * the KeyMatch of the read plus the caller's decision on the row read, and
 * the SET list is the change made to the KeyRow before it is written.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "keys/key_table.h"

#include "core/scope.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

/* The columns the protocol reads and writes. */
typedef enum KeyColumn
{
	COL_CACHE_KEY,
	COL_SCOPE,
	COL_STATE,
	COL_REQUEST_HASH,
	COL_CLAIM_ID,
	COL_GENERATION,
	COL_LEASE_EXPIRES_AT,
	COL_CREATED_AT,
	COL_FINISHED_AT,
	COL_RESPONSE_STATUS,
	COL_RESPONSE_HEADERS,
	COL_RESPONSE_BODY,
	COL_REPLAYABLE,
	COL_IN_TRANSACTION,
	NCOLUMNS
} KeyColumn;

static const DirectColumn key_columns[NCOLUMNS] = {
	[COL_CACHE_KEY] = {"cache_key", BYTEAOID},
	[COL_SCOPE] = {"scope", IDEM_SCOPE_TYPE},
	[COL_STATE] = {"state", TEXTOID},
	[COL_REQUEST_HASH] = {"request_hash", BYTEAOID},
	[COL_CLAIM_ID] = {"claim_id", UUIDOID},
	[COL_GENERATION] = {"generation", INT8OID},
	[COL_LEASE_EXPIRES_AT] = {"lease_expires_at", TIMESTAMPTZOID},
	[COL_CREATED_AT] = {"created_at", TIMESTAMPTZOID},
	[COL_FINISHED_AT] = {"finished_at", TIMESTAMPTZOID},
	[COL_RESPONSE_STATUS] = {"response_status", INT4OID},
	[COL_RESPONSE_HEADERS] = {"response_headers", JSONBOID},
	[COL_RESPONSE_BODY] = {"response_body", BYTEAOID},
	[COL_REPLAYABLE] = {"replayable", BOOLOID},
	[COL_IN_TRANSACTION] = {"in_transaction", BOOLOID},
};

/* The per-backend access to idem_keys (direct_table.c keeps its pieces). */
static DirectTableDef keys = DIRECT_TABLE("idem_keys", key_columns, NCOLUMNS);

/* Open the schema's idem_keys for one call (see direct_open). */
KeyTable *
key_table_open(Oid namespace, DirectAccess access)
{
	KeyTable   *table = direct_open(&keys, namespace, access);

	if (direct_key_columns(table) != 2 ||
		direct_attnum(table, COL_CACHE_KEY) != direct_key_attnum(table, 0) ||
		direct_attnum(table, COL_SCOPE) != direct_key_attnum(table, 1))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_idem table idem_keys has an unexpected primary key"),
				 errdetail("Its primary key must be (cache_key, scope).")));
	return table;
}

/*
 * After KEY_STALE: the table changed shape while this call only read it.
 * Reopen it (as a writer now: the call is about to write), which rebuilds
 * the kept state; the caller reads and decides again.
 */
KeyTable *
key_table_reopen(KeyTable *table, Oid namespace)
{
	key_table_close(table);
	return key_table_open(namespace, DIRECT_UPDATE);
}

void
key_table_close(KeyTable *table)
{
	direct_close(table);
}

/* A state column's value as the protocol's IdemKeyState. */
static IdemKeyState
parse_state(text *state)
{
	int			s;

	for (s = 0; s < IDEM_KEY_NSTATES; s++)
		if (VARSIZE_ANY_EXHDR(state) == strlen(idem_key_state_names[s]) &&
			memcmp(VARDATA_ANY(state), idem_key_state_names[s], VARSIZE_ANY_EXHDR(state)) == 0)
			return (IdemKeyState) s;
	elog(ERROR, "pg_idem: idem_keys row has unknown state \"%s\"", text_to_cstring(state));
	return IDEM_KEY_PENDING;			/* keep the compiler quiet */
}

/* A row read, as the protocol sees it (pointing into tuple). */
static void
row_from_tuple(KeyTable *table, HeapTuple tuple, KeyRow *row)
{
	int			natts = direct_natts(table);
	Datum	   *values = palloc(sizeof(Datum) * natts);
	bool	   *nulls = palloc(sizeof(bool) * natts);

#define VALUE(c) values[direct_attnum(table, c) - 1]
#define ISNULL(c) nulls[direct_attnum(table, c) - 1]

	direct_deform(table, tuple, values, nulls);
	memset(row, 0, sizeof(*row));
	row->tid = tuple->t_self;
	row->tuple = tuple;
	row->cache_key = DatumGetByteaPP(VALUE(COL_CACHE_KEY));
	row->scope = DatumGetObjectId(VALUE(COL_SCOPE));
	row->state = parse_state(DatumGetTextPP(VALUE(COL_STATE)));
	row->request_hash = ISNULL(COL_REQUEST_HASH) ? NULL : DatumGetByteaPP(VALUE(COL_REQUEST_HASH));
	row->claim_id = ISNULL(COL_CLAIM_ID) ? NULL : DatumGetUUIDP(VALUE(COL_CLAIM_ID));
	row->generation = DatumGetInt64(VALUE(COL_GENERATION));
	row->has_lease = !ISNULL(COL_LEASE_EXPIRES_AT);
	if (row->has_lease)
		row->lease_expires_at = DatumGetTimestampTz(VALUE(COL_LEASE_EXPIRES_AT));
	row->created_at = DatumGetTimestampTz(VALUE(COL_CREATED_AT));
	row->has_finished = !ISNULL(COL_FINISHED_AT);
	if (row->has_finished)
		row->finished_at = DatumGetTimestampTz(VALUE(COL_FINISHED_AT));
	row->has_status = !ISNULL(COL_RESPONSE_STATUS);
	if (row->has_status)
		row->response_status = DatumGetInt32(VALUE(COL_RESPONSE_STATUS));
	row->headers_null = ISNULL(COL_RESPONSE_HEADERS);
	row->response_headers = VALUE(COL_RESPONSE_HEADERS);
	row->body_null = ISNULL(COL_RESPONSE_BODY);
	row->response_body = VALUE(COL_RESPONSE_BODY);
	row->replayable = DatumGetBool(VALUE(COL_REPLAYABLE));
	row->in_transaction = DatumGetBool(VALUE(COL_IN_TRANSACTION));
#undef VALUE
#undef ISNULL
}

/* Is this the row the read wants?  *fallback: a row from before scopes. */
static bool
row_matches(KeyRow *row, KeyMatch match, const void *arg, bool *fallback)
{
	*fallback = false;
	switch (match)
	{
		case KEY_MATCH_SCOPE:
			if (row->scope == *(const Oid *) arg)
				return true;
			*fallback = row->scope == IDEM_SHARED_SCOPE;
			return false;
		case KEY_MATCH_OWNER:
			{
				const KeyOwner *owner = (const KeyOwner *) arg;

				return row->state == IDEM_KEY_PENDING && row->claim_id != NULL &&
					(row->scope == owner->scope || row->scope == IDEM_SHARED_SCOPE) &&
					memcmp(row->claim_id->data, owner->claim_id->data, UUID_LEN) == 0;
			}
		case KEY_MATCH_LIVE:
			return !key_row_is_tombstone(row);
	}
	return false;
}

/* Scan the rows of the first nkeys primary-key columns for match. */
static bool
scan_rows(KeyTable *table, int nkeys, const Datum *keys, KeyMatch match, const void *arg,
		  bool fresh_snapshot, KeyRow *row)
{
	KeyRow		candidate;
	HeapTuple	tuple;
	bool		found = false;
	bool		have_fallback = false;
	bool		fallback;

	direct_scan_begin(table, nkeys, keys, fresh_snapshot);
	while ((tuple = direct_scan_next(table)) != NULL)
	{
		row_from_tuple(table, tuple, &candidate);
		if (row_matches(&candidate, match, arg, &fallback))
		{
			*row = candidate;
			found = true;
			break;
		}
		if (fallback && !have_fallback)
		{
			*row = candidate;
			have_fallback = true;
		}
	}
	direct_scan_end(table);
	return found || have_fallback;
}

/*
 * Read a row of cache_key (see KeyMatch) into *row; false when there is
 * none.  fresh_snapshot: as a volatile statement reads; otherwise with the
 * calling statement's snapshot, as a stable function reads.  The caller's
 * scope is probed by the whole primary key, then the row from before
 * scopes: a claim reads, and predicate-locks, nothing of other scopes.
 */
bool
key_table_read(KeyTable *table, bytea *cache_key, KeyMatch match, const void *arg,
			   bool fresh_snapshot, KeyRow *row)
{
	Datum		keys[2];

	keys[0] = PointerGetDatum(cache_key);
	if (match != KEY_MATCH_SCOPE)
		return scan_rows(table, 1, keys, match, arg, fresh_snapshot, row);

	keys[1] = ObjectIdGetDatum(*(const Oid *) arg);
	if (scan_rows(table, 2, keys, match, arg, fresh_snapshot, row))
		return true;
	if (*(const Oid *) arg == IDEM_SHARED_SCOPE)
		return false;
	keys[1] = ObjectIdGetDatum(IDEM_SHARED_SCOPE);
	/* The same read's second probe: the same snapshot. */
	return scan_rows(table, 2, keys, match, arg, false, row);
}

/* The row's protocol columns, as the row to write (other columns kept). */
static void
set_row(KeyTable *table, KeyRow *row)
{
	(void) direct_new_row(table, row->tuple);
	direct_set(table, COL_CACHE_KEY, PointerGetDatum(row->cache_key), false);
	direct_set(table, COL_SCOPE, ObjectIdGetDatum(row->scope), false);
	direct_set(table, COL_STATE, CStringGetTextDatum(idem_key_state_names[row->state]), false);
	direct_set(table, COL_REQUEST_HASH, PointerGetDatum(row->request_hash), row->request_hash == NULL);
	direct_set(table, COL_CLAIM_ID, UUIDPGetDatum(row->claim_id), row->claim_id == NULL);
	direct_set(table, COL_GENERATION, Int64GetDatum(row->generation), false);
	direct_set(table, COL_LEASE_EXPIRES_AT, TimestampTzGetDatum(row->lease_expires_at), !row->has_lease);
	direct_set(table, COL_CREATED_AT, TimestampTzGetDatum(row->created_at), false);
	direct_set(table, COL_FINISHED_AT, TimestampTzGetDatum(row->finished_at), !row->has_finished);
	direct_set(table, COL_RESPONSE_STATUS, Int32GetDatum(row->response_status), !row->has_status);
	direct_set(table, COL_RESPONSE_HEADERS, row->response_headers, row->headers_null);
	direct_set(table, COL_RESPONSE_BODY, row->response_body, row->body_null);
	direct_set(table, COL_REPLAYABLE, BoolGetDatum(row->replayable), false);
	direct_set(table, COL_IN_TRANSACTION, BoolGetDatum(row->in_transaction), false);
}

/*
 * Insert a new key's row, as INSERT ... ON CONFLICT (cache_key, scope) DO
 * NOTHING would; KEY_CHANGED when a row of the key and scope exists
 * (after waiting for an in-flight insert of it to commit), KEY_STALE as
 * for key_table_update.
 */
KeyWrite
key_table_insert(KeyTable *table, KeyRow *row)
{
	row->tuple = NULL;
	set_row(table, row);
	return (KeyWrite) direct_insert(table, true, &row->tid);
}

/*
 * Rewrite the row read by key_table_read with row's protocol columns.
 * KEY_CHANGED when a concurrent transaction updated or deleted that
 * version first (under READ COMMITTED; 40001 otherwise): nothing was
 * written and no lock is kept, and the caller reads the key again.
 * KEY_STALE when the table changed shape while the call only read it: the
 * caller reopens it (key_table_reopen) and reads the key again.
 */
KeyWrite
key_table_update(KeyTable *table, KeyRow *row)
{
	set_row(table, row);
	return (KeyWrite) direct_update(table, &row->tid, &row->tid);
}

/* The next value of the schema's generation sequence. */
int64
key_table_next_generation(KeyTable *table)
{
	Oid			sequence = get_relname_relid("idem_generation_seq", direct_namespace(table));

	if (!OidIsValid(sequence))
		elog(ERROR, "pg_idem sequence idem_generation_seq is missing");
	/* We run as the sequence's owner: no privilege check to make. */
	return nextval_internal(sequence, false);
}

/* Was the row released or evicted: failed, with neither hash nor owner? */
bool
key_row_is_tombstone(const KeyRow *row)
{
	return row->state == IDEM_KEY_FAILED && row->request_hash == NULL && row->claim_id == NULL;
}

/*
 * What release and eviction leave of a key: a tombstone row, failed, its
 * cooldown over, with neither request hash nor owner, so that any request
 * claims it at once.  Keeping the row keeps the key's place in the
 * generation order (see idem_release in finish.c).  The cleanup deletes
 * tombstones with the other finished keys.
 */
void
key_row_make_tombstone(KeyRow *row)
{
	TimestampTz now = GetCurrentTimestamp();

	row->state = IDEM_KEY_FAILED;
	row->request_hash = NULL;
	row->claim_id = NULL;
	row->has_lease = true;
	row->lease_expires_at = now;
	row->has_finished = true;
	row->finished_at = now;
	row->has_status = false;
	row->headers_null = true;
	row->body_null = true;
	row->replayable = true;
}
