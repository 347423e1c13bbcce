/*-------------------------------------------------------------------------
 *
 * settings.h
 *	  Every idem.* setting (settings.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_SETTINGS_H
#define IDEM_CORE_SETTINGS_H

#include "utils/array.h"

/* Claims and leases */
extern int	idem_lease_ms;
extern int	idem_max_lease_ms;
extern int	idem_ttl_s;
extern int	idem_failure_cooldown_ms;
extern int	idem_max_response_bytes;

/* A key's whole life: what a retry gets once idem.ttl has passed. */
typedef enum IdemAfterTtl
{
	IDEM_AFTER_TTL_REFUSE,
	IDEM_AFTER_TTL_RERUN
} IdemAfterTtl;

extern int	idem_tombstone_ttl_s;
extern int	idem_after_ttl;
extern int	idem_max_wait_ms;

/* Role isolation (scope.c reads it) */
extern char *idem_scope_setting;

/* The outbox and the inbox */
extern int	idem_outbox_max_attempts;
extern bool idem_outbox_archive;
extern int	idem_inbox_backoff_base_ms;
extern int	idem_inbox_backoff_max_ms;
extern int	idem_inbox_attempts_per_session;
extern int	idem_inbox_attempts_per_role;
extern ArrayType *idem_outbox_backoff_array(void);

/* The cleanup worker */
extern bool idem_cleanup_worker;
extern int	idem_cleanup_interval_s;
extern int	idem_cleanup_database_timeout_s;
extern char *idem_database;
extern int	idem_cleanup_batch;
extern int	idem_cleanup_delay_ms;
extern int	idem_outbox_retention_s;
extern int	idem_inbox_retention_s;
extern int	idem_attempt_retention_s;

extern void idem_settings_init(void);

#endif							/* IDEM_CORE_SETTINGS_H */
