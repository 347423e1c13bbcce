/*-------------------------------------------------------------------------
 *
 * messages.h
 *	  Declarations shared by the message inbox (inbox.c), the transactional
 *	  outbox (outbox*.c) and the attempts, which stage outbox events.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MESSAGES_H
#define IDEM_MESSAGES_H

#include "core/settings.h"
#include "core/statements.h"
#include "core/wakeup.h"

#include "utils/jsonb.h"

/* Topic of the dead-letter events the inbox stages in the outbox. */
#define IDEM_INBOX_DEAD_TOPIC "idem.inbox.dead"

/* Settings of the inbox and the outbox (outbox_settings.c). */
extern int	idem_outbox_max_attempts;
extern bool idem_outbox_archive;
extern int	idem_inbox_backoff_base_ms;
extern int	idem_inbox_backoff_max_ms;

extern void idem_define_message_settings(void);
extern ArrayType *idem_outbox_backoff_array(void);

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
 * current transaction; the caller is connected to SPI.
 */
extern void idem_outbox_stage_dead_letter(Oid namespace, Datum consumer,
										  Datum message_id, int32 error_count,
										  Datum last_error, bool last_error_null);

/* Argument checks shared by the outbox's functions (outbox.c). */
extern int32 idem_outbox_batch_arg(FunctionCallInfo fcinfo, int argno, int32 max);
extern Interval *idem_outbox_interval_arg(FunctionCallInfo fcinfo, int argno,
										  const char *name);

/* The wake-up channel of this database's outbox. */
#define IDEM_OUTBOX_CHANNEL() idem_wake_queue_channel(IDEM_WAKE_QUEUE_OUTBOX)

#endif							/* IDEM_MESSAGES_H */
