/*-------------------------------------------------------------------------
 *
 * sequences.h
 *	  Keeping a schema's sequences above the generations and outbox ids its
 *	  tables hold, as after a logical-replication cut-over (sequences.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_SEQUENCES_H
#define IDEM_CORE_SEQUENCES_H

/*
 * A generation sequence that has drawn no more than this many values is
 * young (a new cluster or install, as a cut-over's new writer is): its
 * values are checked against idem_keys.
 */
#define IDEM_YOUNG_SEQUENCE		1000

/*
 * Is a generation just drawn not above every generation idem_keys holds?
 * Then the sequence is advanced past them and true returned: draw again.
 * Scans idem_keys (every row version); call it only when there is reason
 * to (a young sequence, a take-over of a row not below the value drawn, a
 * subscribed sequence).
 * Runs as the tables' owner (inside the direct table access).
 */
extern bool idem_generations_catch_up(Oid namespace, int64 generation);

/*
 * Is the generation sequence to be checked because a subscription copies
 * it (PostgreSQL 19), or did until the last subscription change?  Cheap
 * (one catalog probe) and true at most once per backend and subscription
 * change; claim.c then calls idem_generations_catch_up.
 */
extern bool idem_generations_subscribed(Oid namespace);

/*
 * Before this backend's first stage (and its first after a change to
 * pg_subscription): advance idem_outbox_id_seq past every id in the queue
 * and the archive if it is behind.  Runs as the tables' owner.
 */
extern void idem_outbox_ids_catch_up(Oid namespace);

#endif							/* IDEM_CORE_SEQUENCES_H */
