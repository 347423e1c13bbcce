/*-------------------------------------------------------------------------
 *
 * lifetime.c
 *	  The settings of a key's whole life: how long its response is kept,
 *	  how long its fingerprint is kept, what a late retry gets, and how
 *	  long a follower may wait in the server.
 *
 *	  created ─ idem.ttl ─▶ response dropped ─ idem.tombstone_ttl ─▶ row deleted
 *	            (replay)     (expired | rerun)                      (a new key)
 *
 * The decisions themselves are in claims.c (what a claim answers) and
 * cleanup.c (what the cleanup drops and deletes).
 *
 *-------------------------------------------------------------------------
 */
#include "core/pg_idem.h"

#include "utils/guc.h"

int			idem_tombstone_ttl_s = 31 * 24 * 60 * 60;
int			idem_after_ttl = IDEM_AFTER_TTL_REFUSE;
int			idem_max_wait_ms = 30 * 1000;

static const struct config_enum_entry after_ttl_options[] = {
	{"refuse", IDEM_AFTER_TTL_REFUSE, false},
	{"rerun", IDEM_AFTER_TTL_RERUN, false},
	{NULL, 0, false}
};

/* Define the lifetime settings; called from _PG_init. */
void
idem_define_lifetime_settings(void)
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
