/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  Shared by the cleanup launcher (launcher.c) and its workers (worker.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

extern bool idem_cleanup_worker;
extern int	idem_cleanup_interval_s;
extern char *idem_database;

extern void idem_launcher_register(void);

#endif							/* IDEM_WORKER_H */
