/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  The transactional outbox as its own files (outbox_stage.c,
 *	  outbox_claim.c, outbox_wait.c) and its other users share it: staging
 *	  an event from C (the attempts' events, the inbox's dead letters) and
 *	  the outbox's argument checks.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_OUTBOX_H
#define IDEM_OUTBOX_OUTBOX_H

#include "core/settings.h"
#include "core/statements.h"
#include "core/wakeup.h"

#include "utils/jsonb.h"

/* Topic of the dead-letter events the inbox stages in the outbox. */
#define IDEM_INBOX_DEAD_TOPIC "idem.inbox.dead"

/*
 * Stage one outbox event in the current transaction, as idem_outbox_stage
 * does (same checks, same errors), for C callers: the attempts' events,
 * the inbox's dead letters.  namespace is the extension's schema
 * (idem_function_namespace); key, headers and delay may be NULL (no key,
 * no headers, no delay).  The event gets the caller's scope and wakes
 * idle drainers when the transaction commits.  Works connected to SPI or
 * not.  Returns the event's id.
 */
extern int64 idem_outbox_stage_event(Oid namespace, text *topic, Jsonb *payload,
									 text *key, Jsonb *headers, Interval *delay);

/*
 * Stage the dead-letter event of an inbox message in the outbox, in the
 * current transaction, in the scope of the role that began the attempt
 * (which may not be the caller: the cleanup worker records attempts that
 * sessions handed over); the caller is connected to SPI.
 */
extern void idem_outbox_stage_dead_letter(Oid namespace, Oid scope, Datum consumer,
										  Datum message_id, int32 error_count,
										  Datum last_error, bool last_error_null);

/* Argument checks shared by the outbox's functions (outbox_stage.c). */
extern int32 idem_outbox_batch_arg(FunctionCallInfo fcinfo, int argno, int32 max);
extern Interval *idem_outbox_interval_arg(FunctionCallInfo fcinfo, int argno,
										  const char *name);

/* The wake-up channel of this database's outbox. */
#define IDEM_OUTBOX_CHANNEL() idem_wake_queue_channel(IDEM_WAKE_QUEUE_OUTBOX)

#endif							/* IDEM_OUTBOX_OUTBOX_H */
