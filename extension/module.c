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
#include "utils/builtins.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(idem_edition);

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

/*
 * idem_edition(): which edition answers, 'c' here; the SQL edition's
 * function of the same name answers 'sql' (extension/sql_edition/), so a
 * client can tell them apart with one call.
 */
Datum
idem_edition(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text("c"));
}
