/*-------------------------------------------------------------------------
 *
 * outbox_queue.c
 *	  The outbox's tables, declared once for the direct path
 *	  (outbox_queue.h): which columns and indexes staging, claims, acks
 *	  and nacks use, by name and type.  The install script
 *	  (extension/install/40_outbox.sql) creates them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/compat.h"
#include "core/protocol.h"
#include "core/scope.h"
#include "outbox/outbox_queue.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

static const DirectColumn queue_columns[QUEUE_NCOLUMNS] = {
	[QUEUE_ID] = {"id", INT8OID},
	[QUEUE_TOPIC] = {"topic", TEXTOID},
	[QUEUE_MESSAGE_KEY] = {"message_key", TEXTOID},
	[QUEUE_KEY_HASH] = {"key_hash", BYTEAOID},
	[QUEUE_PAYLOAD] = {"payload", JSONBOID},
	[QUEUE_PAYLOAD_BYTES] = {"payload_bytes", BYTEAOID},
	[QUEUE_HEADERS] = {"headers", JSONBOID},
	[QUEUE_AVAILABLE_AT] = {"available_at", TIMESTAMPTZOID},
	[QUEUE_SCOPE] = {"scope", IDEM_SCOPE_TYPE},
	[QUEUE_STATE] = {"state", TEXTOID},
	[QUEUE_ATTEMPTS] = {"attempts", INT4OID},
	[QUEUE_LAST_ERROR] = {"last_error", TEXTOID},
	[QUEUE_CLAIM_TOKEN] = {"claim_token", UUIDOID},
	[QUEUE_CREATED_AT] = {"created_at", TIMESTAMPTZOID},
	[QUEUE_DEAD_AT] = {"dead_at", TIMESTAMPTZOID},
};

/* As the install script creates them: keys, and the rows they must hold. */
static const DirectIndex queue_indexes[QUEUE_NINDEXES] = {
	[QUEUE_INDEX_CLAIMABLE] = {"idem_outbox_claimable", 3,
		{QUEUE_SCOPE, QUEUE_AVAILABLE_AT, QUEUE_ID},
	1, {{QUEUE_STATE, IDEM_OUTBOX_PENDING_NAME}}},
	[QUEUE_INDEX_KEY_ORDER] = {"idem_outbox_key_order", 2, {QUEUE_KEY_HASH, QUEUE_ID},
	2, {{QUEUE_STATE, IDEM_OUTBOX_PENDING_NAME}, {QUEUE_KEY_HASH, NULL}}},
};

DirectTableDef idem_outbox_queue =
DIRECT_TABLE_INDEXED("idem_outbox_queue", queue_columns, QUEUE_NCOLUMNS,
					 queue_indexes, QUEUE_NINDEXES);

static const DirectColumn archive_columns[ARCHIVE_NCOLUMNS] = {
	[ARCHIVE_ID] = {"id", INT8OID},
	[ARCHIVE_TOPIC] = {"topic", TEXTOID},
	[ARCHIVE_MESSAGE_KEY] = {"message_key", TEXTOID},
	[ARCHIVE_KEY_HASH] = {"key_hash", BYTEAOID},
	[ARCHIVE_PAYLOAD] = {"payload", JSONBOID},
	[ARCHIVE_PAYLOAD_BYTES] = {"payload_bytes", BYTEAOID},
	[ARCHIVE_HEADERS] = {"headers", JSONBOID},
	[ARCHIVE_ATTEMPTS] = {"attempts", INT4OID},
	[ARCHIVE_LAST_ERROR] = {"last_error", TEXTOID},
	[ARCHIVE_AVAILABLE_AT] = {"available_at", TIMESTAMPTZOID},
	[ARCHIVE_CLAIM_TOKEN] = {"claim_token", UUIDOID},
	[ARCHIVE_CREATED_AT] = {"created_at", TIMESTAMPTZOID},
	[ARCHIVE_PUBLISHED_AT] = {"published_at", TIMESTAMPTZOID},
	[ARCHIVE_SCOPE] = {"scope", IDEM_SCOPE_TYPE},
};

DirectTableDef idem_outbox_archive_table =
DIRECT_TABLE("idem_outbox_archive", archive_columns, ARCHIVE_NCOLUMNS);

/* Is a state column's value this state? */
bool
idem_outbox_state_is(Datum state, const char *name)
{
	text	   *value = DatumGetTextPP(state);
	size_t		len = strlen(name);

	return VARSIZE_ANY_EXHDR(value) == len && memcmp(VARDATA_ANY(value), name, len) == 0;
}
