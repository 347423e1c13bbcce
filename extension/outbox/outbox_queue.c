/*-------------------------------------------------------------------------
 *
 * outbox_queue.c
 *	  The outbox's tables, declared once for the direct path
 *	  (outbox_queue.h): which columns and indexes staging, claims, acks
 *	  and nacks use, by name and type.  The install script
 *	  (extension/install/40_outbox.sql) creates them.
 *
 * Until ALTER EXTENSION UPDATE, the library serves 0.5.0's tables
 * (core/schema.c), which have no idem_outbox_claimed: there a claimed
 * event stays in the queue, leased in place, and its ack marks it
 * published in place (0.5.0's prune and view already treat a published
 * row of the queue as published); the update moves such rows across.
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
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "commands/extension.h"
#include "utils/lsyscache.h"

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
	[QUEUE_PUBLISHED_AT] = {"published_at", TIMESTAMPTZOID},
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

static const DirectIndex claimed_indexes[QUEUE_NINDEXES] = {
	[QUEUE_INDEX_CLAIMABLE] = {"idem_outbox_claimed_claimable", 3,
		{QUEUE_SCOPE, QUEUE_AVAILABLE_AT, QUEUE_ID},
	1, {{QUEUE_STATE, IDEM_OUTBOX_PENDING_NAME}}},
	[QUEUE_INDEX_KEY_ORDER] = {"idem_outbox_claimed_key_order", 2, {QUEUE_KEY_HASH, QUEUE_ID},
	2, {{QUEUE_STATE, IDEM_OUTBOX_PENDING_NAME}, {QUEUE_KEY_HASH, NULL}}},
};

DirectTableDef idem_outbox_claimed_table =
DIRECT_TABLE_INDEXED("idem_outbox_claimed", queue_columns, QUEUE_NCOLUMNS,
					 claimed_indexes, QUEUE_NINDEXES);

/*
 * Has the schema pg_idem's idem_outbox_claimed (false: 0.5.0's tables)?
 * On 0.5.0's tables the name is free, and a table of that name that is
 * not pg_idem's (planted in a schema others may create in) is not used:
 * the library serves the 0.5.0 tables as if it were not there (and says
 * so), never deletes from it or fires its triggers.  From 0.6.0 on
 * pg_idem's own table holds the name.  The last table found pg_idem's is
 * kept, so that a call pays one syscache lookup (an OID is not reused
 * while its table exists).
 */
bool
idem_outbox_has_claimed(Oid namespace)
{
	static Oid	known_relid = InvalidOid;
	Oid			relid = get_relname_relid(idem_outbox_claimed_table.relname, namespace);
	Oid			extension;

	if (!OidIsValid(relid))
		return false;
	if (relid == known_relid)
		return true;
	extension = getExtensionOfObject(RelationRelationId, relid);
	if (!OidIsValid(extension) || strcmp(get_extension_name(extension), "pg_idem") != 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table %s does not belong to extension pg_idem: not used",
						idem_outbox_claimed_table.relname),
				 errdetail("Schema \"%s\" has a table %s that is not pg_idem's; pg_idem serves its 0.5.0 tables.",
						   get_namespace_name(namespace), idem_outbox_claimed_table.relname),
				 errhint("Drop that table, and run ALTER EXTENSION pg_idem UPDATE.")));
		return false;
	}
	known_relid = relid;
	return true;
}

/*
 * Open idem_outbox_claimed, or return NULL when the schema is 0.5.0's,
 * which has none (the caller then leases and publishes in the queue).
 */
DirectTable *
idem_outbox_open_claimed(Oid namespace, DirectAccess access)
{
	if (!idem_outbox_has_claimed(namespace))
		return NULL;
	return direct_open(&idem_outbox_claimed_table, namespace, access);
}

/* Is a state column's value this state? */
bool
idem_outbox_state_is(Datum state, const char *name)
{
	text	   *value = DatumGetTextPP(state);
	size_t		len = strlen(name);

	return VARSIZE_ANY_EXHDR(value) == len && memcmp(VARDATA_ANY(value), name, len) == 0;
}
