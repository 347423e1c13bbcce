/*-------------------------------------------------------------------------
 *
 * outbox_queue.h
 *	  The outbox's two tables as the direct path reads and writes them
 *	  (outbox_queue.c): the queue of events not yet published, with its
 *	  claimable and per-key order indexes, and the archive of published
 *	  ones.  Staging, claims, acks and nacks share these descriptions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_OUTBOX_QUEUE_H
#define IDEM_OUTBOX_OUTBOX_QUEUE_H

#include "table/direct_table.h"

/* The columns of idem_outbox_queue pg_idem reads or writes. */
enum
{
	QUEUE_ID,
	QUEUE_TOPIC,
	QUEUE_MESSAGE_KEY,
	QUEUE_KEY_HASH,
	QUEUE_PAYLOAD,
	QUEUE_PAYLOAD_BYTES,
	QUEUE_HEADERS,
	QUEUE_AVAILABLE_AT,
	QUEUE_SCOPE,
	QUEUE_STATE,
	QUEUE_ATTEMPTS,
	QUEUE_LAST_ERROR,
	QUEUE_CLAIM_TOKEN,
	QUEUE_CREATED_AT,
	QUEUE_DEAD_AT,
	QUEUE_NCOLUMNS
};

/* Its indexes a claim scans. */
enum
{
	QUEUE_INDEX_CLAIMABLE,		/* (scope, available_at, id) WHERE pending */
	QUEUE_INDEX_KEY_ORDER,		/* (key_hash, id) WHERE pending, with a key */
	QUEUE_NINDEXES
};

/* The columns of idem_outbox_archive an ack writes. */
enum
{
	ARCHIVE_ID,
	ARCHIVE_TOPIC,
	ARCHIVE_MESSAGE_KEY,
	ARCHIVE_KEY_HASH,
	ARCHIVE_PAYLOAD,
	ARCHIVE_PAYLOAD_BYTES,
	ARCHIVE_HEADERS,
	ARCHIVE_ATTEMPTS,
	ARCHIVE_LAST_ERROR,
	ARCHIVE_AVAILABLE_AT,
	ARCHIVE_CLAIM_TOKEN,
	ARCHIVE_CREATED_AT,
	ARCHIVE_PUBLISHED_AT,
	ARCHIVE_SCOPE,
	ARCHIVE_NCOLUMNS
};

extern DirectTableDef idem_outbox_queue;
extern DirectTableDef idem_outbox_archive_table;

/* Is a state column's value this state? */
extern bool idem_outbox_state_is(Datum state, const char *name);

#endif							/* IDEM_OUTBOX_OUTBOX_QUEUE_H */
