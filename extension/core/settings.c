/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  Every idem.* setting, in one place: its default, range, who may set
 *	  it, and the checks between settings.
 *
 * Grouped by what they govern: claims and leases, a key's whole life,
 * role isolation, the outbox and the inbox, the cleanup worker.  The
 * functions read the variables declared in settings.h; the range of each
 * is stated in its description, as SHOW and pg_settings print it.
 *
 * Superuser-only settings (PGC_SUSET) are those that decide what happens
 * to other sessions' rows: a session that could shorten idem.ttl could
 * take over or clean up other requests' finished keys.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "core/arguments.h"
#include "core/compat.h"
#include "core/settings.h"

#include "catalog/pg_type.h"
#include "nodes/pg_list.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/varlena.h"

/* Claims and leases */
int			idem_lease_ms = 30 * 1000;
int			idem_max_lease_ms = 60 * 60 * 1000;
int			idem_ttl_s = 24 * 60 * 60;
int			idem_failure_cooldown_ms = 2 * 1000;
int			idem_max_response_bytes = 2 * 1024 * 1024;

/* A key's whole life */
int			idem_tombstone_ttl_s = 31 * 24 * 60 * 60;
int			idem_after_ttl = IDEM_AFTER_TTL_REFUSE;
int			idem_max_wait_ms = 30 * 1000;

/* Role isolation: empty for the session's own role */
char	   *idem_scope_setting = NULL;

/* The outbox and the inbox */
int			idem_outbox_max_attempts = 6;
bool		idem_outbox_archive = true;
int			idem_inbox_backoff_base_ms = 1000;
int			idem_inbox_backoff_max_ms = 60 * 1000;
int			idem_inbox_attempts_per_session = 32;
int			idem_inbox_attempts_per_role = 256;
static char *outbox_backoff_string = NULL;

/* The cleanup worker */
bool		idem_cleanup_worker = true;
int			idem_cleanup_interval_s = 60;
int			idem_cleanup_database_timeout_s = 60;
char	   *idem_database = NULL;
int			idem_cleanup_batch = 1000;
int			idem_cleanup_delay_ms = 200;
int			idem_outbox_retention_s = 7 * 24 * 60 * 60;
int			idem_inbox_retention_s = 7 * 24 * 60 * 60;
int			idem_attempt_retention_s = 31 * 24 * 60 * 60;

#define BACKOFF_MAX_STEPS		32


/* The parsed idem.outbox_backoff schedule (a GUC "extra"). */
typedef struct BackoffSchedule
{
	int			nsteps;
	int			ms[BACKOFF_MAX_STEPS];
} BackoffSchedule;

static BackoffSchedule *outbox_backoff = NULL;

/* Parse "5s, 30s, 2min" into a schedule; false (with a detail) if malformed. */
static bool
parse_backoff(const char *value, BackoffSchedule *schedule)
{
	char	   *copy = pstrdup(value);
	char	   *item;
	char	   *save = NULL;

	schedule->nsteps = 0;
	for (item = strtok_r(copy, ",", &save); item != NULL;
		 item = strtok_r(NULL, ",", &save))
	{
		const char *hint = NULL;
		int			ms;

		while (*item == ' ')
			item++;
		if (schedule->nsteps == BACKOFF_MAX_STEPS)
		{
			GUC_check_errdetail("At most %d steps are allowed.", BACKOFF_MAX_STEPS);
			return false;
		}
		if (!parse_int(item, &ms, GUC_UNIT_MS, &hint) || ms < 0)
		{
			GUC_check_errdetail("\"%s\" is not a duration such as 5s, 2min or 1h.", item);
			return false;
		}
		schedule->ms[schedule->nsteps++] = ms;
	}
	if (schedule->nsteps == 0)
	{
		GUC_check_errdetail("The schedule needs at least one duration.");
		return false;
	}
	return true;
}

/* Check hook of idem.outbox_backoff: parse once, keep the result as extra. */
static bool
check_outbox_backoff(char **newval, void **extra, GucSource source)
{
	BackoffSchedule parsed;
	BackoffSchedule *result;

	if (!parse_backoff(*newval, &parsed))
		return false;
	result = idem_guc_malloc(sizeof(BackoffSchedule));
	if (result == NULL)
		return false;
	*result = parsed;
	*extra = result;
	return true;
}

/* Assign hook of idem.outbox_backoff. */
static void
assign_outbox_backoff(const char *newval, void *extra)
{
	outbox_backoff = (BackoffSchedule *) extra;
}

static const struct config_enum_entry after_ttl_options[] = {
	{"refuse", IDEM_AFTER_TTL_REFUSE, false},
	{"rerun", IDEM_AFTER_TTL_RERUN, false},
	{NULL, 0, false}
};

/*
 * Whether a check hook applies the cross-setting rules to a value from
 * this source: a SET or RESET, ALTER ROLE/DATABASE/SYSTEM ... SET (checked
 * as PGC_S_TEST) and postgresql.conf.  Values applied at session start
 * (per database or role, PGOPTIONS) arrive in no particular order, so a
 * refusal there could depend on which came first: those are left to the
 * check every function makes when it uses the value.
 */
static bool
cross_check_applies(GucSource source)
{
	return source == PGC_S_FILE || source == PGC_S_ARGV ||
		source >= PGC_S_INTERACTIVE;
}

/* idem.lease must not exceed idem.max_lease. */
static bool
check_lease(int *newval, void **extra, GucSource source)
{
	if (!cross_check_applies(source) || *newval <= idem_max_lease_ms)
		return true;
	GUC_check_errmsg("idem.lease must be between 1ms and idem.max_lease (%s)",
					 idem_format_ms(idem_max_lease_ms));
	GUC_check_errdetail("The value given is %s.", idem_format_ms(*newval));
	GUC_check_errhint("Choose a shorter lease and renew it while the work runs, or have a superuser raise idem.max_lease first.");
	return false;
}

/* idem.failure_cooldown must not exceed idem.max_lease. */
static bool
check_failure_cooldown(int *newval, void **extra, GucSource source)
{
	if (!cross_check_applies(source) || *newval <= idem_max_lease_ms)
		return true;
	GUC_check_errmsg("idem.failure_cooldown must be between 0 and idem.max_lease (%s)",
					 idem_format_ms(idem_max_lease_ms));
	GUC_check_errdetail("The value given is %s.", idem_format_ms(*newval));
	GUC_check_errhint("Choose a shorter cooldown, or have a superuser raise idem.max_lease first.");
	return false;
}

/*
 * idem.max_lease must not fall below this session's idem.lease or
 * idem.failure_cooldown, when set in a session.  postgresql.conf, ALTER
 * SYSTEM and ALTER ROLE ... SET are exempt: at server start
 * idem.max_lease is defined before the two it bounds, and a file that
 * lowers all three at once must not depend on their order; idem.lease and
 * idem.failure_cooldown are checked against it when they are applied.
 */
static bool
check_max_lease(int *newval, void **extra, GucSource source)
{
	const char *name;
	int			bounded;

	if (source != PGC_S_SESSION && source != PGC_S_INTERACTIVE)
		return true;
	if (*newval >= idem_lease_ms && *newval >= idem_failure_cooldown_ms)
		return true;
	name = *newval < idem_lease_ms ? "idem.lease" : "idem.failure_cooldown";
	bounded = *newval < idem_lease_ms ? idem_lease_ms : idem_failure_cooldown_ms;
	GUC_check_errmsg("idem.max_lease must be at least %s (%s) in this session",
					 name, idem_format_ms(bounded));
	GUC_check_errdetail("The value given is %s.", idem_format_ms(*newval));
	GUC_check_errhint("Lower %s first.", name);
	return false;
}

/* idem.database must be a comma-separated list of database names. */
static bool
check_database_list(char **newval, void **extra, GucSource source)
{
	char	   *copy = pstrdup(*newval);
	List	   *names;
	bool		ok = SplitIdentifierString(copy, ',', &names);

	list_free(names);
	pfree(copy);
	if (!ok)
	{
		GUC_check_errdetail("idem.database is a comma-separated list of database names, or empty for every database.");
		return false;
	}
	return true;
}

/* The backoff schedule as an interval[] for the nack statement. */
ArrayType *
idem_outbox_backoff_array(void)
{
	Datum		steps[BACKOFF_MAX_STEPS];
	int			i;

	if (outbox_backoff == NULL)
		elog(ERROR, "idem.outbox_backoff is not set");
	for (i = 0; i < outbox_backoff->nsteps; i++)
		steps[i] = IntervalPGetDatum(idem_ms_interval(outbox_backoff->ms[i]));
	return construct_array(steps, outbox_backoff->nsteps, INTERVALOID,
						   sizeof(Interval), false, TYPALIGN_DOUBLE);
}

/* Claims and leases.  idem.max_lease comes first, so that the values of
 * idem.lease and idem.failure_cooldown in postgresql.conf are checked
 * against its configured value at start. */
static void
define_claim_settings(void)
{
	DefineCustomIntVariable("idem.max_lease",
							"Longest lease or cooldown a caller may ask for (1ms .. 24 days).",
							NULL,
							&idem_max_lease_ms,
							60 * 60 * 1000, IDEM_MIN_LEASE_MS, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							check_max_lease, NULL, NULL);

	DefineCustomIntVariable("idem.lease",
							"Default lease of a claim (1ms .. idem.max_lease).",
							"Used when idem_claim or idem_renew is given no lease.",
							&idem_lease_ms,
							30 * 1000, IDEM_MIN_LEASE_MS, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							check_lease, NULL, NULL);

	/*
	 * Superuser only: a session that shortened it could take over, or
	 * clean up, other requests' finished keys.
	 */
	DefineCustomIntVariable("idem.ttl",
							"How long a finished key is kept and replayed (1s .. 68 years).",
							"Older finished keys are reclaimed by new requests and deleted by idem_cleanup.",
							&idem_ttl_s,
							24 * 60 * 60, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.failure_cooldown",
							"Default cooldown after idem_fail (0 .. idem.max_lease).",
							"During the cooldown, claims of the same request get the outcome cooldown.",
							&idem_failure_cooldown_ms,
							2 * 1000, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							check_failure_cooldown, NULL, NULL);

	DefineCustomIntVariable("idem.max_response_bytes",
							"Largest response body stored for replay (0 .. 1GB; 1GB: any body, a bytea holds less).",
							"A larger body is recorded as completed but not replayable.",
							&idem_max_response_bytes,
							2 * 1024 * 1024, 0, 1024 * 1024 * 1024,
							PGC_USERSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

/* A key's whole life: its two horizons and a follower's wait. */
static void
define_lifetime_settings(void)
{
	/*
	 * Superuser only, like idem.ttl: they decide what happens to other
	 * requests' keys.
	 */
	DefineCustomIntVariable("idem.tombstone_ttl",
							"How long a finished key's fingerprint is kept after its claim (0 .. 68 years; 0: as long as idem.ttl).",
							"Between idem.ttl and this, a retry gets expired (or reruns, see idem.after_ttl); after it the key is new.",
							&idem_tombstone_ttl_s,
							31 * 24 * 60 * 60, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("idem.after_ttl",
							 "What a retry of a finished key gets once idem.ttl has passed: refuse (outcome expired) or rerun (outcome recovered_ttl).",
							 NULL,
							 &idem_after_ttl,
							 IDEM_AFTER_TTL_REFUSE, after_ttl_options,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_wait",
							"Longest max_wait a follower may ask idem_claim or idem_begin for (0 .. 1h).",
							"A follower's wait holds a connection; 0 turns server-side waits off.",
							&idem_max_wait_ms,
							30 * 1000, 0, 60 * 60 * 1000,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* Role isolation (scope.c). */
static void
define_scope_setting(void)
{
	DefineCustomStringVariable("idem.scope",
							   "Role whose idempotency keys, inbox messages and outbox events this session uses.",
							   "Empty for the session's own role; otherwise a role the session has the privileges of.",
							   &idem_scope_setting,
							   "",
							   PGC_USERSET, 0,
							   NULL, NULL, NULL);
}

/* The outbox and the inbox. */
static void
define_message_settings(void)
{
	/* Superuser only: they decide the fate of every drainer's events. */
	DefineCustomIntVariable("idem.outbox_max_attempts",
							"Publish attempts of an outbox event before it is dead (1 .. 1000).",
							"Attempts are counted when a drainer claims the event.",
							&idem_outbox_max_attempts,
							6, 1, 1000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomStringVariable("idem.outbox_backoff",
							   "Delays before retrying a nacked outbox event, one per attempt.",
							   "A comma-separated list of durations; the last one repeats.",
							   &outbox_backoff_string,
							   "5s, 30s, 2min, 5min, 15min, 30min",
							   PGC_SUSET, 0,
							   check_outbox_backoff, assign_outbox_backoff, NULL);

	DefineCustomBoolVariable("idem.outbox_archive",
							 "Whether an ack keeps published outbox events (in idem_outbox_claimed).",
							 "Off deletes them at the ack (no retention: idem.outbox_retention does not apply).",
							 &idem_outbox_archive,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idem.inbox_backoff_base",
							"Retry delay after an inbox message's first failure (1ms .. 1 day).",
							"The delay doubles with every failure, up to idem.inbox_backoff_max.",
							&idem_inbox_backoff_base_ms,
							1000, 1, 24 * 60 * 60 * 1000,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.inbox_backoff_max",
							"Longest retry delay of an inbox message (1ms .. 1 day).",
							NULL,
							&idem_inbox_backoff_max_ms,
							60 * 1000, 1, 24 * 60 * 60 * 1000,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.inbox_attempts_per_session",
							"Inbox attempts one session may have not accounted for at once (1 .. 1000).",
							"Messages begun, or failures recorded, in its open transaction; its orphans are handed over to make room.",
							&idem_inbox_attempts_per_session,
							32, 1, 1000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.inbox_attempts_per_role",
							"Inbox attempts one role may have not accounted for at once, over every session (1 .. 1000000).",
							"At most a quarter of the registry (32 entries per connection slot) whatever the setting.",
							&idem_inbox_attempts_per_role,
							256, 1, 1000000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);
}

/* The cleanup worker (workers/). */
static void
define_worker_settings(void)
{
	DefineCustomBoolVariable("idem.cleanup_worker",
							 "Whether the cleanup worker deletes expired keys.",
							 "Needs pg_idem in shared_preload_libraries; off pauses the worker.",
							 &idem_cleanup_worker, true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.cleanup_interval",
							"Time between two cleanup passes (1s .. 1d).",
							NULL,
							&idem_cleanup_interval_s, 60, 1, 24 * 60 * 60,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.cleanup_database_timeout",
							"Longest time a cleanup pass spends in one database before it is skipped until the next pass (1s .. 1d).",
							"A worker that waits longer (a lock held by an open transaction, for example) is stopped with a WARNING naming the database and what it waits for.",
							&idem_cleanup_database_timeout_s, 60, 1, 24 * 60 * 60,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.cleanup_batch",
							"Rows the cleanup worker deletes per transaction (1 .. 1000000).",
							NULL,
							&idem_cleanup_batch, 1000, 1, 1000000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);

	/*
	 * Like autovacuum_vacuum_cost_delay: a backlog cleaned at full speed
	 * takes a core the claims need (tests/bench/growth.sh, pacing).
	 */
	DefineCustomIntVariable("idem.cleanup_delay",
							"Pause of the cleanup worker after each full batch, before the next (0 .. 10s; 0: no pause).",
							"Paces the cleanup of a backlog so that it leaves the requests their share of the cores; idem_cleanup itself never pauses.",
							&idem_cleanup_delay_ms, 200, 0, 10 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.outbox_retention",
							"Age after which the worker prunes published and dead outbox events (1s .. 68 years).",
							NULL,
							&idem_outbox_retention_s, 7 * 24 * 60 * 60, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.inbox_retention",
							"Age after which the worker prunes done and dead inbox messages, the dedup window (1s .. 68 years).",
							NULL,
							&idem_inbox_retention_s, 7 * 24 * 60 * 60, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.attempt_retention",
							"Age after which the worker prunes finished attempts (1s .. 68 years).",
							NULL,
							&idem_attempt_retention_s, 31 * 24 * 60 * 60, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomStringVariable("idem.database",
							   "Databases the cleanup worker serves: a comma-separated list, empty for every database with pg_idem.",
							   NULL,
							   &idem_database, "",
							   PGC_SIGHUP, GUC_LIST_INPUT,
							   check_database_list, NULL, NULL);

}

/* Register every idem.* setting; called first from _PG_init. */
void
idem_settings_init(void)
{
	define_claim_settings();
	define_lifetime_settings();
	define_scope_setting();
	define_message_settings();
	define_worker_settings();
	MarkGUCPrefixReserved("idem");
}
