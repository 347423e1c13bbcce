/*-------------------------------------------------------------------------
 *
 * outbox_queue.h
 *	  The outbox's two tables as the direct path reads and writes them
 *	  (outbox_queue.c): the queue of events never claimed, and the table
 *	  of claimed ones (leased, backing off, dead or published).  Both have
 *	  the same columns and the same claimable and per-key order indexes,
 *	  so one set of names serves both.  Staging, claims, acks and nacks
 *	  share these descriptions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_OUTBOX_QUEUE_H
#define IDEM_OUTBOX_OUTBOX_QUEUE_H

#include "table/direct_table.h"

/* The columns of idem_outbox_queue and idem_outbox_claimed pg_idem reads or writes. */
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
	QUEUE_PUBLISHED_AT,
	QUEUE_NCOLUMNS
};

/* Its indexes a claim scans. */
enum
{
	QUEUE_INDEX_CLAIMABLE,		/* (scope, available_at, id) WHERE pending */
	QUEUE_INDEX_KEY_ORDER,		/* (key_hash, id) WHERE pending, with a key */
	QUEUE_NINDEXES
};

extern DirectTableDef idem_outbox_queue;
extern DirectTableDef idem_outbox_claimed_table;

extern bool idem_outbox_has_claimed(Oid namespace);
extern DirectTable *idem_outbox_open_claimed(Oid namespace, DirectAccess access);

/* Is a state column's value this state? */
extern bool idem_outbox_state_is(Datum state, const char *name);

#endif							/* IDEM_OUTBOX_OUTBOX_QUEUE_H */
