/*-------------------------------------------------------------------------
 *
 * attempts.h
 *	  Multi-step attempts: an upload or an export that writes a blob outside
 *	  the database, then publishes it in one transaction with its outbox
 *	  event.  Shared by the attempts modules:
 *
 *	  attempts_names.c		  argument checks, safe names, object keys and
 *							  intent hashes (all computed in C)
 *	  attempts_open.c		  kinds and the replay decision table
 *	  attempts_transitions.c  store, promote, fail, reopen
 *	  attempts_reconciler.c	  the reconciler's batches, sweep and prune
 *	  attempts_guards.c		  the state machine and the triggers that hold
 *							  it for every write
 *
 * The legal transitions are the protocol's (protocol.toml, generated into
 * core/protocol.h and shown in docs/reference/protocol.md).
 *
 * Every function names the transition it makes; its UPDATE re-states the
 * expected status and the caller's generation in its WHERE clause, so under
 * READ COMMITTED a concurrent change makes it touch nothing (an UPDATE
 * that waited for a concurrent writer re-checks its WHERE clause against
 * the newest row version: EvalPlanQual).  When the CAS misses, the row
 * is read once more to tell the caller why:
 *
 *	  - another generation, or a state that comes after the expected one in
 *		this generation: the caller lost a race, nothing changed, false;
 *	  - a state from which the transition can never follow (promoting a
 *		pending attempt, reopening a promoted one): IL005.
 *
 * The trigger idem_attempts_transition_guard holds the same table for any
 * UPDATE of idem_attempts, and idem_attempts_promotion_published refuses
 * to commit a promotion whose outbox event is missing (IL006).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_ATTEMPTS_ATTEMPTS_H
#define IDEM_ATTEMPTS_ATTEMPTS_H


#include "utils/jsonb.h"

/* Longest parts of an object key, in bytes (S3 keys stop at 1024). */
#define TARGET_MAX_BYTES		512
#define KEY_PREFIX_MAX_BYTES	255
#define SAFE_NAME_MAX_BYTES		100
#define SAFE_EXT_MAX_BYTES		16
#define KIND_MAX_BYTES			63

/* How often open re-reads an attempt that changed under it. */
#define OPEN_MAX_ATTEMPTS 16

/* Largest batch of the reconciler's functions. */
#define RECONCILE_MAX_BATCH 1000000

/* A state of the machine: a status, and the reason of a failure. */
typedef struct AttemptState
{
	const char *status;
	const char *reason;			/* failed only, else NULL */
} AttemptState;

/* Argument checks, names and keys (attempts_names.c). */
extern char *attempt_text_arg(FunctionCallInfo fcinfo, int argno, const char *name);
extern void attempt_check_kind(const char *kind);
extern void attempt_check_path(const char *what, const char *path, int max_bytes);
extern char *attempt_safe_name(const char *name, int len);
extern char *attempt_uuid_text(Datum uuid);
extern char *attempt_object_key(const char *prefix, const char *target,
								Datum attempt_id, int64 generation,
								const char *name);
extern char *attempt_key_of(const char *prefix, const char *target,
							Datum attempt_id, int64 generation,
							const char *name);
extern Datum attempt_new_id(void);
extern bytea *attempt_intent_hash(Jsonb *intent);
extern Jsonb *attempt_object_arg(FunctionCallInfo fcinfo, int argno,
								 const char *name, bool optional);
extern int64 attempt_generation_arg(FunctionCallInfo fcinfo, int argno);
extern Interval *attempt_age_arg(FunctionCallInfo fcinfo, int argno, const char *name);
extern int32 attempt_batch_arg(FunctionCallInfo fcinfo, int argno);
extern bool attempt_bytea_equal(bytea *a, bytea *b);

/* The state machine (attempts_guards.c). */
extern bool attempt_is_reopenable(const char *reason);
extern bool attempt_legal_transition(AttemptState from, AttemptState to);
extern bool attempt_comes_after(AttemptState from, AttemptState s);
extern void attempt_report_illegal(const char *attempt, AttemptState from,
								   AttemptState to);

/* The reopen CAS, shared by open and reopen (attempts_transitions.c). */
extern bool attempt_reopen_cas(Oid namespace, Datum attempt_id, int64 generation,
							   Datum *new_generation, Datum *new_key);

#endif							/* IDEM_ATTEMPTS_ATTEMPTS_H */
