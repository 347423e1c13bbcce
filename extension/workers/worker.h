/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The cleanup launcher (launcher.c) and its per-database workers
 *	  (worker.c); their settings are in core/settings.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKERS_WORKER_H
#define IDEM_WORKERS_WORKER_H

extern void idem_workers_init(void);

#endif							/* IDEM_WORKERS_WORKER_H */
