/*-------------------------------------------------------------------------
 *
 * module.c
 *	  The module's entry point: each part's init, in dependency order.
 *
 * It lives above the folders so that no folder depends on another's
 * init: core/ depends on nothing else, and each part's init is called
 * from here only.  Parts without an init (table/, keys/, outbox/,
 * attempts/, guards/) need nothing at load time: they keep their
 * per-backend state from their first call on.
 *
 * Loaded by shared_preload_libraries (then the shared-memory parts and
 * the cleanup launcher are set up) or on first use in a session (then
 * counters and server-side waits run without shared memory; see each
 * part's init).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/preload.h"
#include "core/settings.h"
#include "core/stats.h"
#include "core/wakeup.h"
#include "inbox/inbox.h"
#include "workers/worker.h"

#include "fmgr.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	/* core/: whether preloaded, then the settings every other part reads */
	idem_preload_init();
	idem_settings_init();
	idem_stats_init();
	idem_wakeup_init();
	/* the parts, after core/ */
	idem_inbox_init();
	idem_workers_init();
}
