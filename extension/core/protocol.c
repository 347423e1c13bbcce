/*-------------------------------------------------------------------------
 *
 * protocol.c
 *	  The tables of protocol.h.
 *
 * Generated from extension/protocol/protocol.toml by extension/protocol/generate.py: do not edit.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/protocol.h"

const IdemOutcomeInfo idem_outcomes[IDEM_NOUTCOMES] = {
#define IDEM_OUTCOME_INFO(id, name, role, counted, response) \
	[IDEM_OUTCOME_##id] = {#name, role, counted, response},
	IDEM_OUTCOMES(IDEM_OUTCOME_INFO)
#undef IDEM_OUTCOME_INFO
};

const IdemAttemptTransition idem_attempt_transitions[IDEM_ATTEMPT_NTRANSITIONS] = {
	{"pending", NULL, "stored", NULL, false},	/* idem_attempt_store */
	{"stored", NULL, "promoted", NULL, false},	/* idem_attempt_promote */
	{"promoted", NULL, "superseded", NULL, false},	/* idem_attempt_promote of a newer attempt of the same target */
	{"pending", NULL, "failed", "reaped_no_blob", false},	/* the reconciler: no blob after the grace period */
	{"pending", NULL, "failed", "digest_mismatch", false},	/* idem_attempt_store or the reconciler: the blob is not the one announced */
	{"pending", NULL, "failed", "target_gone", false},	/* idem_attempt_fail: the target was deleted */
	{"stored", NULL, "failed", "target_gone", false},	/* idem_attempt_fail: the target was deleted before the promotion */
	{"failed", "reaped_no_blob", "pending", NULL, true},	/* idem_attempt_reopen (or an open of the same request) */
	{"failed", "digest_mismatch", "pending", NULL, true},	/* idem_attempt_reopen (or an open of the same request) */
};

const char *const idem_key_state_names[IDEM_KEY_NSTATES] = {
	[IDEM_KEY_PENDING] = IDEM_KEY_PENDING_NAME,
	[IDEM_KEY_COMPLETED] = IDEM_KEY_COMPLETED_NAME,
	[IDEM_KEY_FAILED] = IDEM_KEY_FAILED_NAME,
	[IDEM_KEY_EXPIRED] = IDEM_KEY_EXPIRED_NAME,
};

const char *const idem_outbox_state_names[IDEM_OUTBOX_NSTATES] = {
	[IDEM_OUTBOX_PENDING] = IDEM_OUTBOX_PENDING_NAME,
	[IDEM_OUTBOX_DEAD] = IDEM_OUTBOX_DEAD_NAME,
	[IDEM_OUTBOX_PUBLISHED] = IDEM_OUTBOX_PUBLISHED_NAME,
};

const char *const idem_inbox_answers[IDEM_INBOX_NANSWERS] = {
	[IDEM_INBOX_ANSWER_PROCESS] = "process",
	[IDEM_INBOX_ANSWER_DUPLICATE] = "duplicate",
	[IDEM_INBOX_ANSWER_DEAD] = "dead",
	[IDEM_INBOX_ANSWER_MISMATCH] = "mismatch",
	[IDEM_INBOX_ANSWER_RETRY] = "retry",
};

const char *const idem_nack_outcomes[IDEM_NACK_NOUTCOMES] = {
	[IDEM_NACK_RETRY] = "retry",
	[IDEM_NACK_DEAD] = "dead",
	[IDEM_NACK_STALE] = "stale",
};
