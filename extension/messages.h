/*-------------------------------------------------------------------------
 *
 * messages.h
 *	  Declarations shared by the message inbox (inbox.c) and the
 *	  transactional outbox (outbox.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MESSAGES_H
#define IDEM_MESSAGES_H

#include "pg_idem.h"

/* Topic of the dead-letter events the inbox stages in the outbox. */
#define IDEM_INBOX_DEAD_TOPIC "idem.inbox.dead"

/* Settings of the inbox and the outbox (outbox.c). */
extern int	idem_outbox_max_attempts;
extern int	idem_inbox_backoff_base_ms;
extern int	idem_inbox_backoff_max_ms;

extern void idem_define_message_settings(void);

/*
 * Stage the dead-letter event of an inbox message in the outbox, in the
 * current transaction; the caller is connected to SPI.
 */
extern void idem_outbox_stage_dead_letter(Oid namespace, Datum consumer,
										  Datum message_id, int32 error_count,
										  Datum last_error, bool last_error_null);

#endif							/* IDEM_MESSAGES_H */
