/*-------------------------------------------------------------------------
 *
 * pg_idem.c
 *	  Module entry point: settings, statistics and the cleanup worker.
 *
 *-------------------------------------------------------------------------
 */
#include "core/pg_idem.h"
#include "inbox/inbox.h"

#include "utils/guc.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/* Define the settings; loaded on first use or by shared_preload_libraries. */
void
_PG_init(void)
{
	idem_define_settings();
	idem_define_message_settings();
	idem_define_scope_setting();
	idem_define_lifetime_settings();
	idem_stats_init();
	idem_wakeup_init();
	idem_inbox_init_hooks();
	idem_worker_init();
	MarkGUCPrefixReserved("idem");
}
