/*-------------------------------------------------------------------------
 *
 * pg_idem.h
 *	  Declarations shared by the pg_idem modules.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PG_IDEM_H
#define PG_IDEM_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/timestamp.h"

/* Length of a cache key and of a request hash: a SHA-256 digest. */
#define IDEM_DIGEST_LEN 32

#ifndef USECS_PER_MSEC
#define USECS_PER_MSEC INT64CONST(1000)
#endif

/* Longest Idempotency-Key value accepted, in bytes (IETF draft guidance). */
#define IDEM_MAX_KEY_BYTES 255

/*
 * pg_idem's own SQLSTATEs.  Class "IL" is implementation-defined (the SQL
 * standard reserves classes starting with 0-4 and A-H).
 */
#define ERRCODE_IDEM_LEASE_LOST			MAKE_SQLSTATE('I','L','0','0','1')
#define ERRCODE_IDEM_CLAIM_UNFINISHED	MAKE_SQLSTATE('I','L','0','0','2')
#define ERRCODE_IDEM_MESSAGE_UNFINISHED	MAKE_SQLSTATE('I','L','0','0','3')
#define ERRCODE_IDEM_STALE_VERSION		MAKE_SQLSTATE('I','L','0','0','4')
#define ERRCODE_IDEM_ILLEGAL_TRANSITION	MAKE_SQLSTATE('I','L','0','0','5')
#define ERRCODE_IDEM_PROMOTION_UNPUBLISHED	MAKE_SQLSTATE('I','L','0','0','6')

/*
 * Statistics (stats.c): counted per backend as events happen and added to
 * the shared counters only when the transaction commits.  The order here
 * is the order of the idem_stats view's rows.
 */
typedef enum IdemCounter
{
	/* claim outcomes (idem_claim and idem_begin) */
	IDEM_STAT_CLAIMED,
	IDEM_STAT_RECOVERED_TTL,
	IDEM_STAT_RECOVERED_ABANDONED,
	IDEM_STAT_REPLAY,
	IDEM_STAT_MISMATCH,
	IDEM_STAT_IN_PROGRESS,
	IDEM_STAT_COOLDOWN,
	IDEM_STAT_NOT_REPLAYABLE,
	IDEM_STAT_EXPIRED,
	IDEM_STAT_FOLLOWER_WAITS,	/* claims that waited in the server */
	IDEM_STAT_FOLLOWER_WAKEUPS, /* of their sleeps, those a commit ended */
	/* what owners did with their claims */
	IDEM_STAT_FINALIZED,
	IDEM_STAT_RELEASED,
	IDEM_STAT_FAILED,
	IDEM_STAT_LEASE_LOST,		/* finalize, release or fail by a non-owner */
	IDEM_STAT_RENEWED,
	IDEM_STAT_RENEW_LOST,
	IDEM_STAT_CLEANUP_DELETED,
	IDEM_STAT_CLEANUP_EXPIRED,
	IDEM_STAT_EVICTED,
	/* outbox */
	IDEM_STAT_OUTBOX_STAGED,
	IDEM_STAT_OUTBOX_CLAIMED,
	IDEM_STAT_OUTBOX_ACKED,
	IDEM_STAT_OUTBOX_ACK_STALE,
	IDEM_STAT_OUTBOX_NACKED,
	IDEM_STAT_OUTBOX_DEAD,
	IDEM_STAT_OUTBOX_PRUNED,
	/* inbox */
	IDEM_STAT_INBOX_PROCESS,
	IDEM_STAT_INBOX_DUPLICATE,
	IDEM_STAT_INBOX_DEAD,
	IDEM_STAT_INBOX_MISMATCH,
	IDEM_STAT_INBOX_DONE,
	IDEM_STAT_INBOX_RETRY,
	IDEM_STAT_INBOX_DEAD_LETTERED,
	IDEM_STAT_INBOX_REVIVED,
	IDEM_STAT_INBOX_PRUNED,
	/* attempts */
	IDEM_STAT_ATTEMPT_OPENED,
	IDEM_STAT_ATTEMPT_TRANSITIONS,
	IDEM_STAT_ATTEMPT_STALE,
	IDEM_STAT_NCOUNTERS
} IdemCounter;

extern void idem_stats_init(void);
extern void idem_worker_init(void);
extern void idem_count(IdemCounter counter, int64 n);

/*
 * Waking waiters after a commit (wakeup.c): claim followers wait on their
 * key's channel, drainers on their queue's.
 */
typedef struct IdemWaiter
{
	uint32		channel;
	int			poll_ms;		/* the fallback poll's next sleep */
} IdemWaiter;

/* Queues with a channel of their own (idem_wake_queue_channel). */
#define IDEM_WAKE_QUEUE_OUTBOX	1

extern void idem_wakeup_init(void);
extern uint32 idem_wake_channel(const uint8 *digest);
extern uint32 idem_wake_queue_channel(uint32 queue);
extern void idem_wake_after_commit(uint32 channel);
extern void idem_wake_prepare(IdemWaiter *waiter, uint32 channel);
extern bool idem_wake_sleep(IdemWaiter *waiter, TimestampTz until);
extern void idem_wake_done(IdemWaiter *waiter);

/* Role isolation (scope.c): the scope of the caller's rows. */
extern void idem_define_scope_setting(void);
extern text *idem_current_scope(void);

/* Settings (settings.c). */
extern int	idem_lease_ms;
extern int	idem_max_lease_ms;
extern int	idem_ttl_s;
extern int	idem_failure_cooldown_ms;
extern int	idem_max_response_bytes;

extern void idem_define_settings(void);
extern Interval *idem_lease_argument(FunctionCallInfo fcinfo, int argno,
									 const char *what, bool allow_zero,
									 int default_ms);
extern Interval *idem_ms_interval(int64 ms);
extern int64 idem_interval_usecs(const Interval *span);
extern TimestampTz idem_time_plus(TimestampTz ts, Interval *span);
extern char *idem_format_ms(int64 ms);

/* A key's whole life (lifetime.c). */
typedef enum IdemAfterTtl
{
	IDEM_AFTER_TTL_REFUSE,
	IDEM_AFTER_TTL_RERUN
} IdemAfterTtl;

extern int	idem_tombstone_ttl_s;
extern int	idem_after_ttl;
extern int	idem_max_wait_ms;
extern void idem_define_lifetime_settings(void);

/* Argument checks shared by every SQL-callable function (settings.c). */
extern void idem_require_arg(FunctionCallInfo fcinfo, int argno, const char *name);
extern bytea *idem_digest_arg(FunctionCallInfo fcinfo, int argno, const char *name);

/* Hashing (key.c). */
extern void idem_sha256(const uint8 *data, size_t len, uint8 *out);
extern bytea *idem_tuple_digest(const char *domain, text *const *fields, int nfields);

/*
 * A cached, schema-qualified SPI statement (statements.c).  "@extschema@"
 * in the text is replaced by the extension's schema, so the functions work
 * whatever the caller's search_path is.
 */
typedef struct IdemStatement
{
	const char *sql;
	int			nargs;
	Oid			argtypes[12];
	const char *unscoped_sql;	/* the text for a 0.2 schema, NULL: the same */
	SPIPlanPtr	plan;			/* kept plan, or NULL before first use */
	Oid			namespace;		/* schema the plan was prepared for */
	bool		unscoped;		/* the plan is unscoped_sql's */
} IdemStatement;

extern Oid	idem_function_namespace(FunctionCallInfo fcinfo);
extern bool idem_schema_scoped(Oid namespace);
extern int	idem_execute(IdemStatement *stmt, Oid namespace, Datum *values,
						 const char *nulls, bool read_only, long count);

#endif							/* PG_IDEM_H */
