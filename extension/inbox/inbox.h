/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  Declarations shared by the inbox's functions (inbox.c) and its
 *	  per-backend registry of attempts (inbox_cap.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_INBOX_INBOX_H
#define IDEM_INBOX_INBOX_H

#include "core/hashing.h"
#include "core/protocol.h"
#include "outbox/outbox.h"

/* last_error of an attempt recorded when its session ended. */
#define SESSION_ENDED_ERROR		"consumer session ended during the attempt"

/*
 * An attempt this backend began.  Open while its transaction runs; an
 * orphan once that transaction (or the subtransaction of begin) aborted;
 * recorded once idem_inbox_fail (or DISCARD ALL) wrote its failure, until
 * the recording commits (then it is forgotten) or aborts (an orphan
 * again).  Until it is forgotten the attempt holds its message's lock.
 * Kept in TopMemoryContext.
 */
typedef struct InboxAttempt
{
	uint8		key[IDEM_DIGEST_LEN];
	Oid			namespace;
	Oid			scope;			/* the message row's */
	char	   *consumer;
	char	   *message_id;
	uint8		payload_hash[IDEM_DIGEST_LEN];
	int32		max_attempts;
	int32		seen_errors;	/* error_count when the attempt began */
	TimestampTz started_at;
	SubTransactionId subid;		/* open attempts: the subtransaction of begin */
	Oid			caller;			/* the role that called begin */
	bool		open;
	bool		recorded;		/* its failure is written, not yet committed */
	SubTransactionId recorded_subid;
} InboxAttempt;

/* inbox_lock.c: the message's lock, (scope, key) in this database */
extern void idem_inbox_lock(Oid scope, const uint8 *key);
extern void idem_inbox_unlock(Oid scope, const uint8 *key);
extern void idem_inbox_lock_init(void);

/* inbox_cap.c */
extern InboxAttempt *idem_inbox_find_attempt(const bytea *key, bool open);
extern void idem_inbox_remember(Oid namespace, bytea *key, Oid scope, text *consumer,
								text *message_id, bytea *payload_hash,
								int32 max_attempts, int32 seen_errors);
extern void idem_inbox_mark_recorded(InboxAttempt *attempt);
extern void idem_inbox_register_callbacks(void);
extern void idem_inbox_init(void);

/*
 * inbox_failure.c: record one failed attempt; the caller is in SPI.  Answers
 * retry or dead, or IDEM_INBOX_NOT_RECORDED.
 */
#define IDEM_INBOX_NOT_RECORDED IDEM_INBOX_NANSWERS
extern IdemInboxAnswer idem_inbox_record_failure(Oid namespace, bytea *key, Datum scope,
											 Datum consumer, Datum message_id,
											 InboxAttempt *known, Datum error,
											 bool guarded, int32 *error_count,
											 Datum *retry_after);

#endif							/* IDEM_INBOX_INBOX_H */
