/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  Declarations shared by the inbox's parts: its SQL functions
 *	  (inbox.c), this backend's attempts (inbox_cap.c), the registry in
 *	  shared memory (inbox_registry.c) and the recording of failures
 *	  (inbox_failure.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_INBOX_INBOX_H
#define IDEM_INBOX_INBOX_H

#include "core/hashing.h"
#include "core/protocol.h"
#include "outbox/outbox.h"

#include "datatype/timestamp.h"

/* last_error of an attempt recorded when its session ended. */
#define SESSION_ENDED_ERROR		"consumer session ended during the attempt"

/* last_error of failures handed over and recorded by another session. */
#define HANDED_OVER_ERROR		"consumer session ended or was reset before the attempt was recorded"

/* Bytes of consumer and message_id an entry keeps for the cleanup worker. */
#define INBOX_TEXT_MAX			256

/*
 * What the registry keeps of an attempt, so that whoever records its
 * failures (the session, the next delivery of the message, the cleanup
 * worker) can: the message (scope, key), who began it, and what a new
 * row of it needs.
 */
typedef struct InboxHandOver
{
	Oid			scope;			/* the message row's */
	uint8		key[IDEM_DIGEST_LEN];
	Oid			caller;			/* the role that called begin (or fail) */
	Oid			caller_scope;	/* its scope: bounds, dead letter */
	int32		max_attempts;	/* 0: unknown (a failure recorded without begin) */
	bool		has_payload_hash;
	uint8		payload_hash[IDEM_DIGEST_LEN];
	int32		uncounted;		/* handed over: failed attempts not written */
	TimestampTz handed_over_at;
	uint16		consumer_len;	/* 0: the texts did not fit */
	uint16		message_id_len;
	char		texts[INBOX_TEXT_MAX];	/* consumer, then message_id */
} InboxHandOver;

/*
 * An attempt this backend holds the registry entry of (inbox_cap.c).
 *
 * Open while begin's write is in effect (its subtransaction has not
 * aborted); pending is the failures that write carries (adopted from a
 * handed-over entry) and ran says the handler runs (begin answered
 * process).  Once begin's write is undone the attempt is an orphan whose
 * uncounted failures (pending, plus one if it ran) are still to be
 * written.  recorded: a failure recording is written in this transaction,
 * not committed yet.  Kept in TopMemoryContext.
 */
typedef struct InboxAttempt
{
	InboxHandOver what;
	Oid			namespace;
	char	   *consumer;
	char	   *message_id;
	TimestampTz started_at;
	bool		open;
	SubTransactionId subid;		/* open: begin's subtransaction */
	int32		pending;
	bool		ran;
	int32		uncounted;
	bool		recorded;
	SubTransactionId recorded_subid;
} InboxAttempt;

/* inbox_registry.c: the entries in shared memory */
extern void idem_inbox_registry_init(void);
extern int32 idem_inbox_registry_take(const InboxHandOver *what);
extern void idem_inbox_registry_release(Oid scope, const uint8 *key);
extern void idem_inbox_registry_hand_over(Oid scope, const uint8 *key, int32 uncounted);
extern void idem_inbox_registry_orphaned(Oid scope, const uint8 *key, int32 uncounted);
extern bool idem_inbox_registry_reclaim(Oid scope, const uint8 *key);
extern bool idem_inbox_registry_take_handed_over(int grace_ms, InboxHandOver *what);
extern void idem_inbox_registry_release_mine(void);

/* inbox_cap.c: this backend's attempts, and every path that must count them */
extern void idem_inbox_describe(InboxHandOver *what, Oid scope, const bytea *key,
								Oid caller_scope, text *consumer, text *message_id);
extern InboxAttempt *idem_inbox_find_attempt(Oid scope, const bytea *key);
extern InboxAttempt *idem_inbox_my_attempt(Oid caller_scope, const bytea *key);
extern bool idem_inbox_reclaim(InboxAttempt *attempt);
extern int32 idem_inbox_take(const InboxHandOver *what);
extern InboxAttempt *idem_inbox_remember(Oid namespace, const InboxHandOver *what,
										 text *consumer, text *message_id,
										 int32 pending, bool ran);
extern void idem_inbox_mark_recorded(InboxAttempt *attempt);
extern void idem_inbox_hand_back(InboxAttempt *attempt);
extern bool idem_inbox_record_handed_over(Oid namespace);
extern void idem_inbox_init(void);

/*
 * inbox_failure.c: record failed attempts; the caller is in SPI.  Answers
 * retry or dead, or IDEM_INBOX_NOT_RECORDED.
 */
#define IDEM_INBOX_NOT_RECORDED IDEM_INBOX_NANSWERS
extern IdemInboxAnswer idem_inbox_record_failure(Oid namespace, const InboxHandOver *what,
											 Datum consumer, Datum message_id,
											 TimestampTz started_at, int32 failures,
											 Datum error, int32 *error_count,
											 Datum *retry_after);

#endif							/* IDEM_INBOX_INBOX_H */
