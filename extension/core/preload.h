/*-------------------------------------------------------------------------
 *
 * preload.h
 *	  What pg_idem without shared_preload_libraries costs, said once
 *	  (preload.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_PRELOAD_H
#define IDEM_CORE_PRELOAD_H

extern void idem_preload_init(void);

/*
 * A function that needs the preload calls this: a WARNING, once per
 * backend, when the library was not preloaded.
 */
extern void idem_warn_without_preload(void);

#endif							/* IDEM_CORE_PRELOAD_H */
