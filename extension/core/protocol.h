/*-------------------------------------------------------------------------
 *
 * protocol.h
 *	  Claim outcomes, the attempts' state machine, the rows' states, the
 *	  inbox's answers and the outbox's nack outcomes (protocol.c).
 *
 * Generated from extension/protocol/protocol.toml by extension/protocol/generate.py: do not edit.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_PROTOCOL_H
#define IDEM_CORE_PROTOCOL_H

/* Who answers a claim outcome: a winner, a follower, idem_lookup only. */
typedef enum IdemRole
{
	IDEM_ROLE_WIN,
	IDEM_ROLE_FOLLOW,
	IDEM_ROLE_LOOKUP
} IdemRole;

/*
 * X(ID, name, role, counted, carries the stored response), in the order
 * of protocol.toml; counted outcomes have an idem_stats counter.
 */
#define IDEM_OUTCOMES(X) \
	X(CLAIMED, claimed, IDEM_ROLE_WIN, true, false) \
	X(RECOVERED_TTL, recovered_ttl, IDEM_ROLE_WIN, true, false) \
	X(RECOVERED_ABANDONED, recovered_abandoned, IDEM_ROLE_WIN, true, false) \
	X(REPLAY, replay, IDEM_ROLE_FOLLOW, true, true) \
	X(MISMATCH, mismatch, IDEM_ROLE_FOLLOW, true, false) \
	X(IN_PROGRESS, in_progress, IDEM_ROLE_FOLLOW, true, false) \
	X(COOLDOWN, cooldown, IDEM_ROLE_FOLLOW, true, false) \
	X(NOT_REPLAYABLE, not_replayable, IDEM_ROLE_FOLLOW, true, true) \
	X(EXPIRED, expired, IDEM_ROLE_FOLLOW, true, true) \
	X(ABSENT, absent, IDEM_ROLE_LOOKUP, false, false) \
	X(CLAIMABLE, claimable, IDEM_ROLE_LOOKUP, false, false)

/* The counted outcomes only: X(ID, name). */
#define IDEM_COUNTED_OUTCOMES(X) \
	X(CLAIMED, claimed) \
	X(RECOVERED_TTL, recovered_ttl) \
	X(RECOVERED_ABANDONED, recovered_abandoned) \
	X(REPLAY, replay) \
	X(MISMATCH, mismatch) \
	X(IN_PROGRESS, in_progress) \
	X(COOLDOWN, cooldown) \
	X(NOT_REPLAYABLE, not_replayable) \
	X(EXPIRED, expired)

/* The others: X(ID, name). */
#define IDEM_UNCOUNTED_OUTCOMES(X) \
	X(ABSENT, absent) \
	X(CLAIMABLE, claimable)

typedef enum IdemOutcome
{
#define IDEM_OUTCOME_ENUM(id, name, role, counted, response) IDEM_OUTCOME_##id,
	IDEM_OUTCOMES(IDEM_OUTCOME_ENUM)
#undef IDEM_OUTCOME_ENUM
	IDEM_NOUTCOMES
} IdemOutcome;

typedef struct IdemOutcomeInfo
{
	const char *name;
	IdemRole	role;
	bool		counted;
	bool		response;		/* carries the stored response */
} IdemOutcomeInfo;

extern PGDLLIMPORT const IdemOutcomeInfo idem_outcomes[IDEM_NOUTCOMES];

/* A legal move of an attempt; a NULL reason: the bare status. */
typedef struct IdemAttemptTransition
{
	const char *from_status;
	const char *from_reason;
	const char *to_status;
	const char *to_reason;
	bool		next_generation;	/* a reopen: the move starts a new generation */
} IdemAttemptTransition;

#define IDEM_ATTEMPT_NTRANSITIONS 9
extern PGDLLIMPORT const IdemAttemptTransition idem_attempt_transitions[IDEM_ATTEMPT_NTRANSITIONS];

/* The legal moves in words, for IL005's hint. */
#define IDEM_ATTEMPT_TRANSITIONS_TEXT "pending -> stored, stored -> promoted, promoted -> superseded, pending -> failed(reaped_no_blob), pending -> failed(digest_mismatch), pending -> failed(target_gone), stored -> failed(target_gone), failed(reaped_no_blob) -> pending, failed(digest_mismatch) -> pending"

/*
 * The states of pg_idem's rows ([[row_states]]): the install script's
 * CHECK constraints and partial indexes name the same (checked by
 * generate.py and sql/protocol_states.sql).
 */

/* A name below as an SQL literal, for the statements built from it. */
#define IDEM_SQL(name) "'" name "'"

/* idem_keys.state */
typedef enum IdemKeyState
{
	IDEM_KEY_PENDING,		/* claimed; the owner runs its handler under a lease */
	IDEM_KEY_COMPLETED,		/* finished; the response is kept (replayable or not) */
	IDEM_KEY_FAILED,		/* the handler failed and the key cools down (or, with no hash and no owner, released: a tombstone) */
	IDEM_KEY_EXPIRED,		/* past idem.ttl: the response is dropped, the fingerprint kept until idem.tombstone_ttl */
	IDEM_KEY_NSTATES
} IdemKeyState;

#define IDEM_KEY_PENDING_NAME "pending"
#define IDEM_KEY_COMPLETED_NAME "completed"
#define IDEM_KEY_FAILED_NAME "failed"
#define IDEM_KEY_EXPIRED_NAME "expired"
extern PGDLLIMPORT const char *const idem_key_state_names[IDEM_KEY_NSTATES];

/* idem_outbox_queue, idem_outbox_claimed.state */
typedef enum IdemOutboxState
{
	IDEM_OUTBOX_PENDING,		/* waiting to be published: claimable when available_at has passed (staged, backing off, or leased until then) */
	IDEM_OUTBOX_DEAD,		/* out of attempts: no drainer claims it again until it is retried by hand */
	IDEM_OUTBOX_PUBLISHED,		/* acknowledged, and kept for idem.outbox_retention (idem.outbox_archive = off deletes it at the ack instead) */
	IDEM_OUTBOX_NSTATES
} IdemOutboxState;

#define IDEM_OUTBOX_PENDING_NAME "pending"
#define IDEM_OUTBOX_DEAD_NAME "dead"
#define IDEM_OUTBOX_PUBLISHED_NAME "published"
extern PGDLLIMPORT const char *const idem_outbox_state_names[IDEM_OUTBOX_NSTATES];

/* idem_outbox_backlog's states. */
#define IDEM_OUTBOX_BACKLOG_READY "ready"
#define IDEM_OUTBOX_BACKLOG_LEASED "leased"
#define IDEM_OUTBOX_BACKLOG_DELAYED "delayed"
#define IDEM_OUTBOX_BACKLOG_DEAD "dead"

/* idem_attempts.status and .failure_reason. */
#define IDEM_ATTEMPT_PENDING "pending"
#define IDEM_ATTEMPT_STORED "stored"
#define IDEM_ATTEMPT_PROMOTED "promoted"
#define IDEM_ATTEMPT_SUPERSEDED "superseded"
#define IDEM_ATTEMPT_FAILED "failed"
#define IDEM_ATTEMPT_REASON_REAPED_NO_BLOB "reaped_no_blob"
#define IDEM_ATTEMPT_REASON_DIGEST_MISMATCH "digest_mismatch"
#define IDEM_ATTEMPT_REASON_TARGET_GONE "target_gone"

/* What idem_inbox_begin and idem_inbox_fail answer (their names: idem_inbox_answers). */
typedef enum IdemInboxAnswer
{
	IDEM_INBOX_ANSWER_PROCESS,	/* from begin */
	IDEM_INBOX_ANSWER_DUPLICATE,	/* from begin, fail */
	IDEM_INBOX_ANSWER_DEAD,	/* from begin, fail */
	IDEM_INBOX_ANSWER_MISMATCH,	/* from begin */
	IDEM_INBOX_ANSWER_RETRY,	/* from fail */
	IDEM_INBOX_NANSWERS
} IdemInboxAnswer;

extern PGDLLIMPORT const char *const idem_inbox_answers[IDEM_INBOX_NANSWERS];

/* idem_inbox_begin's max_attempts: the default and the largest accepted. */
#define IDEM_INBOX_DEFAULT_MAX_ATTEMPTS 5
#define IDEM_INBOX_MAX_ATTEMPTS 1000

/* What idem_outbox_nack answers (their names: idem_nack_outcomes). */
typedef enum IdemNackOutcome
{
	IDEM_NACK_RETRY,
	IDEM_NACK_DEAD,
	IDEM_NACK_STALE,
	IDEM_NACK_NOUTCOMES
} IdemNackOutcome;

extern PGDLLIMPORT const char *const idem_nack_outcomes[IDEM_NACK_NOUTCOMES];

#endif							/* IDEM_CORE_PROTOCOL_H */
