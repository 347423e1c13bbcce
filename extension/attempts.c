/*-------------------------------------------------------------------------
 *
 * attempts.c
 *	  Multi-step attempts: an upload or an export that writes a blob outside
 *	  the database, then publishes it in one transaction with its outbox
 *	  event.  The replay decision table, the status + generation CAS of
 *	  every transition, object-key derivation, the replace-kind current
 *	  pointer, and the reconciler's SQL side.
 *
 * Legal transitions (within one generation unless noted):
 *
 *	  pending -> stored -> promoted [-> superseded]
 *	  pending -> failed(reaped_no_blob | digest_mismatch | target_gone)
 *	  stored  -> failed(target_gone)
 *	  failed(reaped_no_blob | digest_mismatch) -> pending, generation + 1
 *
 * Every function names the transition it makes; its UPDATE re-states the
 * expected status and the caller's generation in its WHERE clause, so under
 * READ COMMITTED a concurrent change makes it touch nothing (the
 * EvalPlanQual re-check; see SCENARIOS.md).  When the CAS misses, the row
 * is read once more to tell the caller why:
 *
 *	  - another generation, or a state that comes after the expected one in
 *		this generation: the caller lost a race, nothing changed, false;
 *	  - a state from which the transition can never follow (promoting a
 *		pending attempt, reopening a promoted one): IL005.
 *
 * The trigger idem_attempts_transition_guard holds the same table for any
 * UPDATE of idem_attempts, and idem_attempts_promotion_published refuses
 * to commit a promotion whose outbox event is missing (IL006).
 *
 *-------------------------------------------------------------------------
 */
#include "pg_idem.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_intent_hash);
PG_FUNCTION_INFO_V1(idem_attempt_safe_name);
PG_FUNCTION_INFO_V1(idem_attempt_object_key);
PG_FUNCTION_INFO_V1(idem_attempt_register_kind);
PG_FUNCTION_INFO_V1(idem_attempt_open);
PG_FUNCTION_INFO_V1(idem_attempt_store);
PG_FUNCTION_INFO_V1(idem_attempt_promote);
PG_FUNCTION_INFO_V1(idem_attempt_fail);
PG_FUNCTION_INFO_V1(idem_attempt_reopen);
PG_FUNCTION_INFO_V1(idem_attempt_current);
PG_FUNCTION_INFO_V1(idem_attempt_reconcile_batch);
PG_FUNCTION_INFO_V1(idem_attempt_sweep_batch);
PG_FUNCTION_INFO_V1(idem_attempt_swept);
PG_FUNCTION_INFO_V1(idem_attempt_prune);
PG_FUNCTION_INFO_V1(idem_attempts_transition_guard);
PG_FUNCTION_INFO_V1(idem_attempts_promotion_published);
PG_FUNCTION_INFO_V1(idem_attempt_targets_guard);

/* Longest parts of an object key, in bytes (S3 keys stop at 1024). */
#define TARGET_MAX_BYTES		512
#define KEY_PREFIX_MAX_BYTES	255
#define SAFE_NAME_MAX_BYTES		100
#define SAFE_EXT_MAX_BYTES		16
#define KIND_MAX_BYTES			63

/* How often open re-reads an attempt that changed under it. */
#define OPEN_MAX_ATTEMPTS 16

/* Largest batch of the reconciler's functions. */
#define RECONCILE_MAX_BATCH 1000000

/* A state of the machine: a status, and the reason of a failure. */
typedef struct AttemptState
{
	const char *status;
	const char *reason;			/* failed only, else NULL */
} AttemptState;

/* ----------------------------------------------------------------
 * Statements
 * ----------------------------------------------------------------
 */

static IdemStatement select_kind = {
	"SELECT mode, key_prefix FROM @extschema@.idem_attempt_kinds WHERE kind = $1",
	1, {TEXTOID}
};

static IdemStatement insert_kind = {
	"INSERT INTO @extschema@.idem_attempt_kinds (kind, mode, key_prefix)"
	" VALUES ($1, $2, $3) ON CONFLICT (kind) DO NOTHING",
	3, {TEXTOID, TEXTOID, TEXTOID}
};

/* Columns read by select_request. */
enum
{
	REQ_ATTEMPT_ID = 1,
	REQ_CREATED_BY,
	REQ_INTENT_HASH,
	REQ_GENERATION,
	REQ_STATUS,
	REQ_FAILURE_REASON,
	REQ_OBJECT_KEY,
	REQ_DECLARED_DIGEST,
	REQ_CREATED_AT,
	REQ_SUPERSEDED_BY
};

static IdemStatement select_request = {
	"SELECT attempt_id, created_by, intent_hash, generation, status,"
	" failure_reason, object_key, declared_digest, created_at, superseded_by"
	" FROM @extschema@.idem_attempts"
	" WHERE kind = $1 AND target = $2 AND client_request_id = $3",
	3, {TEXTOID, TEXTOID, TEXTOID}
};

/* The hash and the key come from the same functions callers use. */
static IdemStatement insert_attempt = {
	"INSERT INTO @extschema@.idem_attempts"
	" (attempt_id, kind, target, client_request_id, created_by, intent,"
	"  intent_hash, declared_digest, object_name, object_key)"
	" SELECT $1, k.kind, $3, $4, $5, $6, @extschema@.idem_intent_hash($6), $7, $8,"
	"  @extschema@.idem_attempt_object_key(k.key_prefix, $3, $1, 1, $8)"
	" FROM @extschema@.idem_attempt_kinds k WHERE k.kind = $2"
	" ON CONFLICT (kind, target, client_request_id) DO NOTHING"
	" RETURNING created_at, object_key",
	8, {UUIDOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID, BYTEAOID, TEXTOID}
};

static IdemStatement select_state = {
	"SELECT generation, status, failure_reason, declared_digest"
	" FROM @extschema@.idem_attempts WHERE attempt_id = $1",
	1, {UUIDOID}
};

/* The new generation rotates the key: same name, g{n+1}. */
static IdemStatement reopen_attempt = {
	"UPDATE @extschema@.idem_attempts a"
	" SET status = 'pending', failure_reason = NULL,"
	"  generation = a.generation + 1,"
	"  object_key = @extschema@.idem_attempt_object_key(k.key_prefix, a.target,"
	"   a.attempt_id, a.generation + 1, a.object_name),"
	"  updated_at = clock_timestamp()"
	" FROM @extschema@.idem_attempt_kinds k"
	" WHERE k.kind = a.kind AND a.attempt_id = $1 AND a.generation = $2"
	"  AND a.status = 'failed'"
	"  AND a.failure_reason IN ('reaped_no_blob', 'digest_mismatch')"
	" RETURNING a.generation, a.object_key",
	2, {UUIDOID, INT8OID}
};

/* A declared digest must match; exports declare theirs here. */
static IdemStatement store_attempt = {
	"UPDATE @extschema@.idem_attempts"
	" SET status = 'stored', declared_digest = COALESCE(declared_digest, $3),"
	"  updated_at = clock_timestamp()"
	" WHERE attempt_id = $1 AND generation = $2 AND status = 'pending'"
	"  AND (declared_digest IS NULL OR declared_digest = $3)",
	3, {UUIDOID, INT8OID, BYTEAOID}
};

/*
 * The failure and its event, in one statement.  Events of one target share
 * the outbox key kind/target, so they are published in order.
 */
static IdemStatement fail_attempt = {
	"WITH failed AS ("
	"  UPDATE @extschema@.idem_attempts"
	"  SET status = 'failed', failure_reason = $3, updated_at = clock_timestamp()"
	"  WHERE attempt_id = $1 AND generation = $2 AND status = ANY ($4)"
	"  RETURNING attempt_id, kind, target, generation, failure_reason, object_key)"
	" SELECT @extschema@.idem_outbox_stage(f.kind || '.failed',"
	"  COALESCE($5, '{}'::jsonb) || jsonb_build_object("
	"   'attempt_id', f.attempt_id, 'kind', f.kind, 'target', f.target,"
	"   'generation', f.generation, 'status', 'failed',"
	"   'reason', f.failure_reason, 'object_key', f.object_key),"
	"  f.kind || '/' || f.target)"
	" FROM failed f",
	5, {UUIDOID, INT8OID, TEXTOID, TEXTARRAYOID, JSONBOID}
};

/* Columns read by lock_stored. */
enum
{
	LOCK_KIND = 1,
	LOCK_MODE,
	LOCK_TARGET,
	LOCK_CREATED_AT,
	LOCK_DECLARED_DIGEST
};

static IdemStatement lock_stored = {
	"SELECT a.kind, k.mode, a.target, a.created_at, a.declared_digest"
	" FROM @extschema@.idem_attempts a"
	" JOIN @extschema@.idem_attempt_kinds k ON k.kind = a.kind"
	" WHERE a.attempt_id = $1 AND a.generation = $2 AND a.status = 'stored'"
	" FOR UPDATE OF a",
	2, {UUIDOID, INT8OID}
};

static IdemStatement lock_target = {
	"SELECT current_attempt_id, current_created_at"
	" FROM @extschema@.idem_attempt_targets WHERE kind = $1 AND target = $2"
	" FOR UPDATE",
	2, {TEXTOID, TEXTOID}
};

static IdemStatement insert_target = {
	"INSERT INTO @extschema@.idem_attempt_targets"
	" (kind, target, current_attempt_id, current_created_at)"
	" VALUES ($1, $2, $3, $4) ON CONFLICT (kind, target) DO NOTHING",
	4, {TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID}
};

/* Forward only, in (created_at, attempt_id) order; the row is locked. */
static IdemStatement flip_target = {
	"UPDATE @extschema@.idem_attempt_targets"
	" SET current_attempt_id = $3, current_created_at = $4,"
	"  flipped_at = clock_timestamp()"
	" WHERE kind = $1 AND target = $2"
	"  AND (current_created_at, current_attempt_id) < ($4, $3)",
	4, {TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID}
};

/* The promotion and its event, in one statement. */
static IdemStatement promote_attempt = {
	"UPDATE @extschema@.idem_attempts a"
	" SET status = 'promoted', updated_at = clock_timestamp(),"
	"  event_id = @extschema@.idem_outbox_stage("
	"   COALESCE($3, a.kind || '.promoted'),"
	"   COALESCE($4, '{}'::jsonb) || jsonb_build_object("
	"    'attempt_id', a.attempt_id, 'kind', a.kind, 'target', a.target,"
	"    'generation', a.generation, 'status', 'promoted',"
	"    'object_key', a.object_key,"
	"    'digest', encode(a.declared_digest, 'hex'),"
	"    'intent', a.intent, 'current_attempt_id', $5::uuid),"
	"   a.kind || '/' || a.target)"
	" WHERE a.attempt_id = $1 AND a.generation = $2 AND a.status = 'stored'",
	5, {UUIDOID, INT8OID, TEXTOID, JSONBOID, UUIDOID}
};

static IdemStatement supersede_attempt = {
	"UPDATE @extschema@.idem_attempts"
	" SET status = 'superseded', superseded_by = $2, updated_at = clock_timestamp()"
	" WHERE attempt_id = $1 AND status = 'promoted'",
	2, {UUIDOID, UUIDOID}
};

static IdemStatement select_current = {
	"SELECT current_attempt_id FROM @extschema@.idem_attempt_targets"
	" WHERE kind = $1 AND target = $2",
	2, {TEXTOID, TEXTOID}
};

/*
 * Idle live attempts, locked so that concurrent reconcilers take disjoint
 * batches; checked_at spaces out re-checks of one that stays put.  The
 * batch is picked in a MATERIALIZED CTE: SKIP LOCKED under IN (...) may
 * return more than the limit.
 */
static IdemStatement reconcile_batch = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT attempt_id FROM @extschema@.idem_attempts"
	"   WHERE status IN ('pending', 'stored')"
	"     AND GREATEST(updated_at, checked_at) < clock_timestamp() - $1"
	"   ORDER BY GREATEST(updated_at, checked_at)"
	"   LIMIT $2 FOR UPDATE SKIP LOCKED)"
	" UPDATE @extschema@.idem_attempts a SET checked_at = clock_timestamp()"
	"  FROM batch, @extschema@.idem_attempt_kinds k"
	" WHERE a.attempt_id = batch.attempt_id AND k.kind = a.kind"
	"   AND a.status IN ('pending', 'stored')"
	" RETURNING a.attempt_id, a.generation, a.status, a.kind, k.mode,"
	"  a.target, a.object_key, a.declared_digest",
	2, {INTERVALOID, INT4OID}
};

#define ABANDONED_THROUGH \
	"CASE WHEN status = 'failed' THEN generation ELSE generation - 1 END"

static IdemStatement sweep_batch = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT attempt_id FROM @extschema@.idem_attempts"
	"   WHERE swept_through < " ABANDONED_THROUGH
	"     AND updated_at < clock_timestamp() - $1"
	"   ORDER BY updated_at"
	"   LIMIT $2 FOR UPDATE SKIP LOCKED)"
	" SELECT a.attempt_id, g.generation,"
	"  @extschema@.idem_attempt_object_key(k.key_prefix, a.target,"
	"   a.attempt_id, g.generation, a.object_name)"
	" FROM batch JOIN @extschema@.idem_attempts a USING (attempt_id)"
	" JOIN @extschema@.idem_attempt_kinds k ON k.kind = a.kind"
	" CROSS JOIN LATERAL generate_series(a.swept_through + 1,"
	"  CASE WHEN a.status = 'failed' THEN a.generation ELSE a.generation - 1 END)"
	"  AS g(generation)"
	" ORDER BY a.attempt_id, g.generation",
	2, {INTERVALOID, INT4OID}
};

static IdemStatement mark_swept = {
	"UPDATE @extschema@.idem_attempts SET swept_through = $2"
	" WHERE attempt_id = $1 AND swept_through < $2"
	"   AND $2 <= " ABANDONED_THROUGH,
	2, {UUIDOID, INT8OID}
};

static IdemStatement select_abandoned = {
	"SELECT " ABANDONED_THROUGH " FROM @extschema@.idem_attempts"
	" WHERE attempt_id = $1",
	1, {UUIDOID}
};

/* The predicate stands in the DELETE too, as in cleanup.c. */
#define PRUNABLE(a) \
	a "status IN ('promoted', 'superseded', 'failed')" \
	" AND " a "updated_at < clock_timestamp() - $1" \
	" AND " a "swept_through >= CASE WHEN " a "status = 'failed'" \
	" THEN " a "generation ELSE " a "generation - 1 END"

static IdemStatement prune_attempts = {
	"WITH batch AS MATERIALIZED ("
	"  SELECT attempt_id FROM @extschema@.idem_attempts"
	"   WHERE " PRUNABLE("")
	"   LIMIT $2 FOR UPDATE SKIP LOCKED)"
	" DELETE FROM @extschema@.idem_attempts a USING batch"
	" WHERE a.attempt_id = batch.attempt_id AND " PRUNABLE("a."),
	2, {INTERVALOID, INT4OID}
};

static IdemStatement check_published = {
	"SELECT a.status IN ('promoted', 'superseded'), a.event_id,"
	"  o.id IS NOT NULL, o.payload ->> 'attempt_id' = a.attempt_id::text"
	" FROM @extschema@.idem_attempts a"
	" LEFT JOIN @extschema@.idem_outbox o ON o.id = a.event_id"
	" WHERE a.attempt_id = $1",
	1, {UUIDOID}
};

/* ----------------------------------------------------------------
 * Argument checks, names and keys
 * ----------------------------------------------------------------
 */

/* A non-NULL text argument as a C string, refused when empty. */
static char *
text_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	char	   *value;

	idem_require_arg(fcinfo, argno, name);
	value = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (value[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name)));
	return value;
}

/* A kind is a lower-case identifier: it becomes part of event topics. */
static void
check_kind(const char *kind)
{
	const char *p;
	bool		ok = strlen(kind) <= KIND_MAX_BYTES && kind[0] >= 'a' && kind[0] <= 'z';

	for (p = kind; ok && *p; p++)
		ok = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_';
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid attempt kind \"%s\"", kind),
				 errdetail("A kind is a lower-case letter followed by up to %d lower-case letters, digits or underscores.",
						   KIND_MAX_BYTES - 1)));
}

/*
 * Targets and key prefixes become object-key path segments, so they are
 * checked, not rewritten: segments of [A-Za-z0-9._-] joined by '/', none
 * empty, none "." or "..".  A bad one is a bug in the caller's code.
 */
static void
check_path(const char *what, const char *path, int max_bytes)
{
	int			len = strlen(path);
	int			start = 0;
	int			i;

	if (len > max_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at most %d bytes", what, max_bytes),
				 errdetail("The %s given is %d bytes long.", what, len)));
	for (i = 0; i <= len; i++)
	{
		char		c = path[i];

		if (c == '/' || c == '\0')
		{
			int			seg = i - start;

			if (seg == 0 ||
				(seg == 1 && path[start] == '.') ||
				(seg == 2 && path[start] == '.' && path[start + 1] == '.'))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("invalid %s \"%s\"", what, path),
						 errdetail("A path segment is empty, \".\" or \"..\"."),
						 errhint("Use segments of letters, digits, '.', '-' and '_' joined by '/'.")));
			start = i + 1;
		}
		else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
				   (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid %s \"%s\"", what, path),
					 errdetail("The byte at offset %d is not a letter, digit, '.', '-', '_' or '/'.", i),
					 errhint("Use segments of letters, digits, '.', '-' and '_' joined by '/'.")));
	}
}

/* Keep one byte of a file name as is? */
static bool
safe_byte(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

/*
 * A client's file name as one safe object-key segment: the part after the
 * last '/' or '\', every other character outside [A-Za-z0-9._-] replaced
 * by '_' (runs collapsed), leading and trailing dots removed, at most
 * SAFE_NAME_MAX_BYTES bytes with a short extension kept.  Sanitizing a
 * safe name leaves it unchanged.
 */
static char *
safe_name(const char *name, int len)
{
	StringInfoData buf;
	int			i;
	int			start = 0;
	int			from;
	int			to;
	char	   *kept;

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("object name must not be empty")));

	for (i = 0; i < len; i++)
		if (name[i] == '/' || name[i] == '\\')
			start = i + 1;

	initStringInfo(&buf);
	for (i = start; i < len;)
	{
		int			clen = pg_mblen(name + i);
		unsigned char c = (unsigned char) name[i];

		if (clen == 1 && safe_byte(c) && c != '_')
			appendStringInfoChar(&buf, (char) c);
		else if (buf.len == 0 || buf.data[buf.len - 1] != '_')
			appendStringInfoChar(&buf, '_');
		i += Min(clen, len - i);
	}

	/* No hidden files, no ".." (leading dots go first). */
	from = 0;
	while (from < buf.len && buf.data[from] == '.')
		from++;
	kept = buf.data + from;
	to = buf.len - from;

	/* Cut a long name in its stem, keeping a short extension. */
	if (to > SAFE_NAME_MAX_BYTES)
	{
		const char *dot = strrchr(kept, '.');
		int			ext_len = 0;

		if (dot != NULL && dot != kept && strlen(dot) <= SAFE_EXT_MAX_BYTES)
			ext_len = strlen(dot);
		memmove(kept + SAFE_NAME_MAX_BYTES - ext_len, kept + to - ext_len, ext_len + 1);
		to = SAFE_NAME_MAX_BYTES;
	}

	/* No trailing dot (last, so that sanitizing again changes nothing). */
	while (to > 0 && kept[to - 1] == '.')
		to--;
	if (to == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("object name \"%s\" has no usable characters", pnstrdup(name, len)),
				 errdetail("Names keep letters, digits, '.', '-' and '_' of their last path segment, without leading or trailing dots.")));
	kept[to] = '\0';
	return pstrdup(kept);
}

/* uuid as text. */
static char *
uuid_text(Datum uuid)
{
	return DatumGetCString(DirectFunctionCall1(uuid_out, uuid));
}

/* {prefix}/{target}/{attempt_id}/g{generation}/{name}, parts already checked. */
static char *
object_key(const char *prefix, const char *target, Datum attempt_id,
		   int64 generation, const char *name)
{
	return psprintf("%s/%s/%s/g" INT64_FORMAT "/%s",
					prefix, target, uuid_text(attempt_id), generation, name);
}

/* A fresh attempt id: a random (version 4) UUID. */
static Datum
new_attempt_id(void)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));

	if (!pg_strong_random(uuid->data, UUID_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random attempt id")));
	uuid->data[6] = (uuid->data[6] & 0x0f) | 0x40;
	uuid->data[8] = (uuid->data[8] & 0x3f) | 0x80;
	return UUIDPGetDatum(uuid);
}

/*
 * SHA-256 of the jsonb text output.  jsonb_out is canonical: object keys
 * are sorted (by length, then bytes), duplicates are gone, whitespace is
 * fixed.  Numbers keep their written scale, so 1.0 and 1 differ.
 */
static bytea *
intent_hash(Jsonb *intent)
{
	char	   *canonical = JsonbToCString(NULL, &intent->root, VARSIZE(intent));
	bytea	   *result = palloc(VARHDRSZ + IDEM_DIGEST_LEN);

	SET_VARSIZE(result, VARHDRSZ + IDEM_DIGEST_LEN);
	idem_sha256((const uint8 *) canonical, strlen(canonical),
				(uint8 *) VARDATA(result));
	return result;
}

/* A jsonb argument that must be an object (NULL allowed when optional). */
static Jsonb *
object_arg(FunctionCallInfo fcinfo, int argno, const char *name, bool optional)
{
	Jsonb	   *value;

	if (PG_ARGISNULL(argno))
	{
		if (optional)
			return NULL;
		idem_require_arg(fcinfo, argno, name);
	}
	value = PG_GETARG_JSONB_P(argno);
	if (JB_ROOT_IS_SCALAR(value) || !JB_ROOT_IS_OBJECT(value))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON object", name)));
	return value;
}

/* A generation argument: not NULL, at least 1. */
static int64
generation_arg(FunctionCallInfo fcinfo, int argno)
{
	int64		generation;

	idem_require_arg(fcinfo, argno, "generation");
	generation = PG_GETARG_INT64(argno);
	if (generation < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("generation must be at least 1"),
				 errdetail("The generation given is " INT64_FORMAT ".", generation)));
	return generation;
}

/* A grace or retention argument: not NULL, not negative. */
static Interval *
age_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	Interval   *age;
	Interval	zero = {0};

	idem_require_arg(fcinfo, argno, name);
	age = PG_GETARG_INTERVAL_P(argno);
	if (DatumGetBool(DirectFunctionCall2(interval_lt, IntervalPGetDatum(age),
										 IntervalPGetDatum(&zero))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be negative", name)));
	return age;
}

/* A batch size argument. */
static int32
batch_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		batch;

	idem_require_arg(fcinfo, argno, "batch");
	batch = PG_GETARG_INT32(argno);
	if (batch < 1 || batch > RECONCILE_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", RECONCILE_MAX_BATCH),
				 errdetail("The batch given is %d.", batch)));
	return batch;
}

/* Are two bytea values byte-equal? */
static bool
bytea_equal(bytea *a, bytea *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/* ----------------------------------------------------------------
 * The state machine
 * ----------------------------------------------------------------
 */

/* "failed(reaped_no_blob)", or the bare status. */
static const char *
state_name(AttemptState s)
{
	return s.reason && strcmp(s.status, "failed") == 0 ?
		psprintf("%s(%s)", s.status, s.reason) : s.status;
}

static bool
is_reopenable(const char *reason)
{
	return reason != NULL &&
		(strcmp(reason, "reaped_no_blob") == 0 || strcmp(reason, "digest_mismatch") == 0);
}

/* Is from -> to one of the legal transitions (within its generation)? */
static bool
legal_transition(AttemptState from, AttemptState to)
{
	if (strcmp(from.status, "pending") == 0)
		return strcmp(to.status, "stored") == 0 || strcmp(to.status, "failed") == 0;
	if (strcmp(from.status, "stored") == 0)
		return strcmp(to.status, "promoted") == 0 ||
			(strcmp(to.status, "failed") == 0 && to.reason != NULL &&
			 strcmp(to.reason, "target_gone") == 0);
	if (strcmp(from.status, "promoted") == 0)
		return strcmp(to.status, "superseded") == 0;
	if (strcmp(from.status, "failed") == 0)
		return strcmp(to.status, "pending") == 0 && is_reopenable(from.reason);
	return false;
}

/*
 * Can state s follow state from within one generation?  Then a CAS that
 * expected from and found s lost a race and is stale, not illegal.
 */
static bool
comes_after(AttemptState from, AttemptState s)
{
	if (strcmp(from.status, "pending") == 0)
		return strcmp(s.status, "pending") != 0;
	if (strcmp(from.status, "stored") == 0)
		return strcmp(s.status, "promoted") == 0 ||
			strcmp(s.status, "superseded") == 0 ||
			(strcmp(s.status, "failed") == 0 && s.reason != NULL &&
			 strcmp(s.reason, "target_gone") == 0);
	if (strcmp(from.status, "promoted") == 0)
		return strcmp(s.status, "superseded") == 0;
	return false;
}

/* Raise IL005 for from -> to. */
static void
report_illegal(const char *attempt, AttemptState from, AttemptState to)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
			 errmsg("illegal attempt transition"),
			 errdetail("Attempt %s cannot go from %s to %s.",
					   attempt, state_name(from), state_name(to)),
			 errhint("Legal: pending -> stored -> promoted -> superseded, pending -> failed, stored -> failed(target_gone), failed(reaped_no_blob or digest_mismatch) -> pending by a reopen.")));
}

/* The row as the last miss found it. */
typedef struct AttemptRow
{
	int64		generation;
	AttemptState state;
	bytea	   *declared_digest;	/* NULL if none */
} AttemptRow;

/* Read an attempt's state, or raise when there is no such attempt. */
static void
read_state(Oid namespace, Datum attempt_id, AttemptRow *row)
{
	bool		isnull;
	Datum		d;

	if (idem_execute(&select_state, namespace, &attempt_id, NULL, false, 1) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt %s does not exist", uuid_text(attempt_id)),
				 errdetail("It was never opened, or it was pruned after its retention.")));
	row->generation = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												  SPI_tuptable->tupdesc, 1, &isnull));
	row->state.status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	row->state.reason = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4, &isnull);
	row->declared_digest = isnull ? NULL : DatumGetByteaPP(d);
}

/*
 * A CAS from one of sources to `to` missed: stale (false) if the attempt
 * moved to another generation or past the expected state; IL005 if the
 * transition can never follow the state it is in.  A row still in a
 * source state is returned as true for the caller to explain.
 */
static bool
explain_miss(Oid namespace, Datum attempt_id, int64 generation,
			 const AttemptState *sources, int nsources, AttemptState to,
			 AttemptRow *row)
{
	int			i;

	read_state(namespace, attempt_id, row);
	if (row->generation != generation)
	{
		idem_count(IDEM_STAT_ATTEMPT_STALE, 1);
		return false;
	}
	for (i = 0; i < nsources; i++)
	{
		if (strcmp(row->state.status, sources[i].status) == 0 &&
			(sources[i].reason == NULL ||
			 (row->state.reason && strcmp(row->state.reason, sources[i].reason) == 0)))
			return true;
	}
	for (i = 0; i < nsources; i++)
	{
		if (comes_after(sources[i], row->state))
		{
			idem_count(IDEM_STAT_ATTEMPT_STALE, 1);
			return false;
		}
	}
	report_illegal(uuid_text(attempt_id), row->state, to);
	return false;				/* not reached */
}

/* Raise: the blob's digest is not the one the attempt declared. */
static void
report_digest_mismatch(Datum attempt_id, bytea *declared, bytea *given)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("digest does not match the attempt's declared digest"),
			 errdetail("Attempt %s declared %s; the blob's digest is %s.",
					   uuid_text(attempt_id),
					   DatumGetCString(DirectFunctionCall1(byteaout, PointerGetDatum(declared))),
					   DatumGetCString(DirectFunctionCall1(byteaout, PointerGetDatum(given)))),
			 errhint("Never promote a blob whose digest differs: record it with idem_attempt_fail(attempt_id, generation, 'digest_mismatch') while the attempt is pending.")));
}

/* ----------------------------------------------------------------
 * Pure functions
 * ----------------------------------------------------------------
 */

/* idem_intent_hash(intent): what open compares to tell resume from mismatch. */
Datum
idem_intent_hash(PG_FUNCTION_ARGS)
{
	idem_require_arg(fcinfo, 0, "intent");
	PG_RETURN_BYTEA_P(intent_hash(PG_GETARG_JSONB_P(0)));
}

/* idem_attempt_safe_name(name): the last segment of every object key. */
Datum
idem_attempt_safe_name(PG_FUNCTION_ARGS)
{
	text	   *name;

	idem_require_arg(fcinfo, 0, "name");
	name = PG_GETARG_TEXT_PP(0);
	PG_RETURN_TEXT_P(cstring_to_text(safe_name(VARDATA_ANY(name),
											   VARSIZE_ANY_EXHDR(name))));
}

/*
 * idem_attempt_object_key(key_prefix, target, attempt_id, generation,
 * name): where a generation's blob goes; the reconciler and clients derive
 * the same key without reading the row.
 */
Datum
idem_attempt_object_key(PG_FUNCTION_ARGS)
{
	char	   *prefix = text_arg(fcinfo, 0, "key_prefix");
	char	   *target = text_arg(fcinfo, 1, "target");
	int64		generation;
	text	   *name;

	check_path("key prefix", prefix, KEY_PREFIX_MAX_BYTES);
	check_path("target", target, TARGET_MAX_BYTES);
	idem_require_arg(fcinfo, 2, "attempt_id");
	generation = generation_arg(fcinfo, 3);
	idem_require_arg(fcinfo, 4, "name");
	name = PG_GETARG_TEXT_PP(4);
	PG_RETURN_TEXT_P(cstring_to_text(object_key(prefix, target, PG_GETARG_DATUM(2),
												generation,
												safe_name(VARDATA_ANY(name),
														  VARSIZE_ANY_EXHDR(name)))));
}

/* ----------------------------------------------------------------
 * Kinds
 * ----------------------------------------------------------------
 */

/*
 * idem_attempt_register_kind(kind, mode, key_prefix): true when registered
 * now, false when already registered the same way.  A kind's mode and
 * prefix never change: old generations' keys are derived from them.
 */
Datum
idem_attempt_register_kind(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	char	   *kind = text_arg(fcinfo, 0, "kind");
	char	   *mode = text_arg(fcinfo, 1, "mode");
	char	   *prefix = text_arg(fcinfo, 2, "key_prefix");
	Datum		values[3];
	bool		inserted;

	check_kind(kind);
	if (strcmp(mode, "append") != 0 && strcmp(mode, "replace") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid attempt mode \"%s\"", mode),
				 errdetail("The mode is append (the caller inserts an entity per promotion) or replace (a current pointer per target flips).")));
	check_path("key prefix", prefix, KEY_PREFIX_MAX_BYTES);

	values[0] = CStringGetTextDatum(kind);
	values[1] = CStringGetTextDatum(mode);
	values[2] = CStringGetTextDatum(prefix);
	SPI_connect();
	inserted = idem_execute(&insert_kind, namespace, values, NULL, false, 0) == 1;
	if (!inserted)
	{
		char	   *old_mode;
		char	   *old_prefix;

		idem_execute(&select_kind, namespace, values, NULL, false, 1);
		old_mode = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		old_prefix = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
		if (strcmp(old_mode, mode) != 0 || strcmp(old_prefix, prefix) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("attempt kind \"%s\" is already registered differently", kind),
					 errdetail("It is registered with mode %s and key prefix \"%s\".",
							   old_mode, old_prefix),
					 errhint("A kind's mode and prefix never change; register a new kind.")));
	}
	SPI_finish();
	PG_RETURN_BOOL(inserted);
}

/* ----------------------------------------------------------------
 * Open: the replay decision table
 * ----------------------------------------------------------------
 */

/* Columns of idem_attempt_decision. */
enum
{
	DEC_DECISION,
	DEC_ATTEMPT_ID,
	DEC_GENERATION,
	DEC_STATUS,
	DEC_FAILURE_REASON,
	DEC_NEXT_STEP,
	DEC_OBJECT_KEY,
	DEC_DECLARED_DIGEST,
	DEC_CURRENT_ATTEMPT_ID,
	DEC_CREATED_AT,
	DEC_NATTS
};

/* What open decided; values point into SPI memory until formed. */
typedef struct Decision
{
	Datum		values[DEC_NATTS];
	bool		nulls[DEC_NATTS];
} Decision;

static void
set_value(Decision *d, int column, Datum value)
{
	d->values[column] = value;
	d->nulls[column] = false;
}

/* Fill the decision's columns from the row select_request returned. */
static void
describe_row(Decision *d, HeapTuple tuple, TupleDesc desc)
{
	static const int map[][2] = {
		{DEC_ATTEMPT_ID, REQ_ATTEMPT_ID},
		{DEC_GENERATION, REQ_GENERATION},
		{DEC_STATUS, REQ_STATUS},
		{DEC_FAILURE_REASON, REQ_FAILURE_REASON},
		{DEC_OBJECT_KEY, REQ_OBJECT_KEY},
		{DEC_DECLARED_DIGEST, REQ_DECLARED_DIGEST},
		{DEC_CREATED_AT, REQ_CREATED_AT},
	};
	int			i;

	for (i = 0; i < (int) lengthof(map); i++)
		d->values[map[i][0]] = SPI_getbinval(tuple, desc, map[i][1],
											 &d->nulls[map[i][0]]);
}

/* The current attempt of a replace-kind target, or NULL. */
static bool
current_attempt(Oid namespace, Datum kind, Datum target, Datum *current)
{
	Datum		values[2] = {kind, target};
	bool		isnull;

	if (idem_execute(&select_current, namespace, values, NULL, false, 1) == 0)
		return false;
	*current = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return !isnull;
}

/*
 * idem_attempt_open(kind, target, client_request_id, created_by, intent,
 * object_name, declared_digest): the replay decision table.
 *
 *	  no row (or pruned)                         new: pending, generation 1
 *	  another created_by                         forbidden, nothing revealed
 *	  another intent (or declared digest)        mismatch, nothing written
 *	  pending / stored                           resume, with the next step
 *	  promoted / superseded                      promoted / superseded, with
 *												 the current attempt
 *	  failed(reaped_no_blob | digest_mismatch)   reopened: generation + 1
 *	  failed(target_gone)                        gone
 */
Datum
idem_attempt_open(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	char	   *kind = text_arg(fcinfo, 0, "kind");
	char	   *target = text_arg(fcinfo, 1, "target");
	char	   *request_id = text_arg(fcinfo, 2, "client_request_id");
	char	   *created_by = text_arg(fcinfo, 3, "created_by");
	Jsonb	   *intent = object_arg(fcinfo, 4, "intent", false);
	bytea	   *hash = intent_hash(intent);
	bytea	   *declared = NULL;
	text	   *name_arg;
	char	   *name;
	char	   *mode;
	Datum		values[3];
	MemoryContext outer = CurrentMemoryContext;
	Decision	d;
	TupleDesc	tupdesc;
	HeapTuple	result;
	int			attempt;

	check_kind(kind);
	check_path("target", target, TARGET_MAX_BYTES);
	if (strlen(request_id) > IDEM_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("client_request_id must be at most %d bytes", IDEM_MAX_KEY_BYTES),
				 errdetail("The client_request_id given is %d bytes long.",
						   (int) strlen(request_id))));
	idem_require_arg(fcinfo, 5, "object_name");
	name_arg = PG_GETARG_TEXT_PP(5);
	name = safe_name(VARDATA_ANY(name_arg), VARSIZE_ANY_EXHDR(name_arg));
	if (!PG_ARGISNULL(6))
		declared = idem_digest_arg(fcinfo, 6, "declared_digest");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	memset(&d, 0, sizeof(d));
	memset(d.nulls, true, sizeof(d.nulls));

	SPI_connect();
	values[0] = CStringGetTextDatum(kind);
	if (idem_execute(&select_kind, namespace, values, NULL, false, 1) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt kind \"%s\" is not registered", kind),
				 errhint("Register it with idem_attempt_register_kind(kind, mode, key_prefix).")));
	mode = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

	values[1] = CStringGetTextDatum(target);
	values[2] = CStringGetTextDatum(request_id);

	for (attempt = 0; attempt < OPEN_MAX_ATTEMPTS; attempt++)
	{
		HeapTuple	row;
		TupleDesc	desc;
		bool		isnull;
		char	   *status;
		Datum		stored_declared;
		bool		declared_null;

		CHECK_FOR_INTERRUPTS();

		if (idem_execute(&select_request, namespace, values, NULL, false, 1) == 0)
		{
			Datum		id = new_attempt_id();
			Datum		ins[8];
			char		ins_nulls[8];

			memset(ins_nulls, ' ', sizeof(ins_nulls));
			ins[0] = id;
			ins[1] = values[0];
			ins[2] = values[1];
			ins[3] = values[2];
			ins[4] = CStringGetTextDatum(created_by);
			ins[5] = JsonbPGetDatum(intent);
			ins[6] = PointerGetDatum(declared);
			if (declared == NULL)
				ins_nulls[6] = 'n';
			ins[7] = CStringGetTextDatum(name);
			if (idem_execute(&insert_attempt, namespace, ins, ins_nulls, false, 1) == 1)
			{
				set_value(&d, DEC_DECISION, CStringGetTextDatum("new"));
				set_value(&d, DEC_ATTEMPT_ID, id);
				set_value(&d, DEC_GENERATION, Int64GetDatum(1));
				set_value(&d, DEC_STATUS, CStringGetTextDatum("pending"));
				set_value(&d, DEC_NEXT_STEP, CStringGetTextDatum("upload"));
				set_value(&d, DEC_OBJECT_KEY,
						  SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
				if (declared != NULL)
					set_value(&d, DEC_DECLARED_DIGEST, PointerGetDatum(declared));
				set_value(&d, DEC_CREATED_AT,
						  SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
				idem_count(IDEM_STAT_ATTEMPT_OPENED, 1);
				break;
			}
			continue;			/* a concurrent open inserted it: read theirs */
		}

		row = SPI_tuptable->vals[0];
		desc = SPI_tuptable->tupdesc;

		/* Another principal's attempt: say nothing about it. */
		if (strcmp(SPI_getvalue(row, desc, REQ_CREATED_BY), created_by) != 0)
		{
			set_value(&d, DEC_DECISION, CStringGetTextDatum("forbidden"));
			break;
		}

		describe_row(&d, row, desc);
		stored_declared = SPI_getbinval(row, desc, REQ_DECLARED_DIGEST, &declared_null);
		if (!bytea_equal(DatumGetByteaPP(SPI_getbinval(row, desc, REQ_INTENT_HASH, &isnull)), hash) ||
			(declared != NULL &&
			 (declared_null || !bytea_equal(DatumGetByteaPP(stored_declared), declared))))
		{
			set_value(&d, DEC_DECISION, CStringGetTextDatum("mismatch"));
			break;
		}

		status = SPI_getvalue(row, desc, REQ_STATUS);
		if (strcmp(status, "pending") == 0 || strcmp(status, "stored") == 0)
		{
			set_value(&d, DEC_DECISION, CStringGetTextDatum("resume"));
			set_value(&d, DEC_NEXT_STEP,
					  CStringGetTextDatum(status[0] == 'p' ? "upload" : "promote"));
			break;
		}
		if (strcmp(status, "promoted") == 0)
		{
			set_value(&d, DEC_DECISION, CStringGetTextDatum("promoted"));
			set_value(&d, DEC_CURRENT_ATTEMPT_ID, d.values[DEC_ATTEMPT_ID]);
			break;
		}
		if (strcmp(status, "superseded") == 0)
		{
			Datum		current;

			set_value(&d, DEC_DECISION, CStringGetTextDatum("superseded"));
			if (strcmp(mode, "replace") == 0 &&
				current_attempt(namespace, values[0], values[1], &current))
				set_value(&d, DEC_CURRENT_ATTEMPT_ID, current);
			else
				d.values[DEC_CURRENT_ATTEMPT_ID] =
					SPI_getbinval(row, desc, REQ_SUPERSEDED_BY, &d.nulls[DEC_CURRENT_ATTEMPT_ID]);
			break;
		}

		/* failed */
		if (!is_reopenable(SPI_getvalue(row, desc, REQ_FAILURE_REASON)))
		{
			set_value(&d, DEC_DECISION, CStringGetTextDatum("gone"));
			break;
		}
		else
		{
			Datum		cas[2];

			cas[0] = d.values[DEC_ATTEMPT_ID];
			cas[1] = d.values[DEC_GENERATION];
			if (idem_execute(&reopen_attempt, namespace, cas, NULL, false, 1) == 1)
			{
				set_value(&d, DEC_DECISION, CStringGetTextDatum("reopened"));
				set_value(&d, DEC_GENERATION,
						  SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
				set_value(&d, DEC_OBJECT_KEY,
						  SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
				set_value(&d, DEC_STATUS, CStringGetTextDatum("pending"));
				d.nulls[DEC_FAILURE_REASON] = true;
				set_value(&d, DEC_NEXT_STEP, CStringGetTextDatum("upload"));
				idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, 1);
				break;
			}
			/* reopened concurrently: read it again */
			memset(d.nulls, true, sizeof(d.nulls));
		}
	}

	if (attempt == OPEN_MAX_ATTEMPTS)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not open attempt: it changed concurrently %d times",
						OPEN_MAX_ATTEMPTS),
				 errhint("The transaction might succeed if retried.")));

	/* heap_form_tuple copies every value, so the SPI memory may go. */
	{
		MemoryContext old = MemoryContextSwitchTo(outer);

		result = heap_form_tuple(BlessTupleDesc(tupdesc), d.values, d.nulls);
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	PG_RETURN_DATUM(HeapTupleGetDatum(result));
}

/* ----------------------------------------------------------------
 * Transitions
 * ----------------------------------------------------------------
 */

/*
 * idem_attempt_store(attempt_id, generation, digest): the blob is at the
 * generation's key and its digest, read back from the store, is digest.
 * pending -> stored; an attempt opened without a digest (an export)
 * declares it here.  False when stale.
 */
Datum
idem_attempt_store(PG_FUNCTION_ARGS)
{
	static const AttemptState sources[] = {{"pending", NULL}};
	static const AttemptState to = {"stored", NULL};
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[3];
	AttemptRow	row;
	bool		done;

	idem_require_arg(fcinfo, 0, "attempt_id");
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int64GetDatum(generation_arg(fcinfo, 1));
	values[2] = PointerGetDatum(idem_digest_arg(fcinfo, 2, "digest"));

	SPI_connect();
	done = idem_execute(&store_attempt, namespace, values, NULL, false, 0) == 1;
	if (!done &&
		explain_miss(namespace, values[0], DatumGetInt64(values[1]), sources, 1, to, &row))
		report_digest_mismatch(values[0], row.declared_digest,
							   DatumGetByteaPP(values[2]));
	SPI_finish();
	if (done)
		idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, 1);
	PG_RETURN_BOOL(done);
}

/*
 * Flip a replace-kind target's pointer to the attempt if it is the newer
 * (created_at, attempt_id).  Sets *current to the pointer's value after
 * the flip and *previous to the attempt it displaced (if any).
 */
static void
flip_pointer(Oid namespace, Datum kind, Datum target, Datum attempt_id,
			 Datum created_at, Datum *current, Datum *previous, bool *has_previous)
{
	Datum		values[4] = {kind, target, attempt_id, created_at};
	int			i;

	*has_previous = false;
	for (i = 0; i < OPEN_MAX_ATTEMPTS; i++)
	{
		bool		isnull;

		if (idem_execute(&lock_target, namespace, values, NULL, false, 1) == 0)
		{
			if (idem_execute(&insert_target, namespace, values, NULL, false, 0) == 1)
			{
				*current = attempt_id;
				return;
			}
			continue;			/* a concurrent promotion created it: lock theirs */
		}
		*previous = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (idem_execute(&flip_target, namespace, values, NULL, false, 0) == 1)
		{
			*has_previous = true;
			*current = attempt_id;
		}
		else
			*current = *previous;	/* a newer attempt holds it: keep it */
		return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not flip the current attempt: the target changed concurrently %d times",
					OPEN_MAX_ATTEMPTS),
			 errhint("The transaction might succeed if retried.")));
}

/*
 * idem_attempt_promote(attempt_id, generation, digest, event_topic,
 * event_payload): stored -> promoted in the caller's transaction, which
 * also inserts the caller's entity (append kinds).  A replace kind's
 * target pointer flips to the attempt unless a newer (created_at,
 * attempt_id) holds it, in which case the attempt is superseded at once;
 * the attempt the pointer leaves is superseded.  The outbox event
 * (topic default '<kind>.promoted', payload naming the attempt) is staged
 * in the same statement; the deferred trigger refuses a commit without it.
 * digest is the one the caller verified on the blob: never promote on
 * bare existence.  False when stale.
 */
Datum
idem_attempt_promote(PG_FUNCTION_ARGS)
{
	static const AttemptState sources[] = {{"stored", NULL}};
	static const AttemptState to = {"promoted", NULL};
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[5];
	char		nulls[5];
	bytea	   *digest;
	AttemptRow	row;
	HeapTuple	locked;
	TupleDesc	desc;
	bool		isnull;
	Datum		current;
	Datum		previous = (Datum) 0;
	bool		has_previous = false;
	int			transitions = 1;
	Datum		attempt_id;
	Datum		kind;
	Datum		target;

	idem_require_arg(fcinfo, 0, "attempt_id");
	attempt_id = PG_GETARG_DATUM(0);
	values[0] = attempt_id;
	values[1] = Int64GetDatum(generation_arg(fcinfo, 1));
	digest = idem_digest_arg(fcinfo, 2, "digest");
	memset(nulls, ' ', sizeof(nulls));
	if (PG_ARGISNULL(3))
		nulls[2] = 'n';
	else
	{
		char	   *topic = text_arg(fcinfo, 3, "event_topic");

		values[2] = CStringGetTextDatum(topic);
	}
	if (object_arg(fcinfo, 4, "event_payload", true) == NULL)
		nulls[3] = 'n';
	else
		values[3] = PG_GETARG_DATUM(4);

	SPI_connect();
	if (idem_execute(&lock_stored, namespace, values, NULL, false, 1) == 0)
	{
		explain_miss(namespace, attempt_id, DatumGetInt64(values[1]), sources, 1, to, &row);
		SPI_finish();			/* explain_miss raised unless stale */
		PG_RETURN_BOOL(false);
	}
	locked = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	if (!bytea_equal(DatumGetByteaPP(SPI_getbinval(locked, desc, LOCK_DECLARED_DIGEST, &isnull)),
					 digest))
		report_digest_mismatch(attempt_id,
							   DatumGetByteaPP(SPI_getbinval(locked, desc, LOCK_DECLARED_DIGEST, &isnull)),
							   digest);

	kind = SPI_getbinval(locked, desc, LOCK_KIND, &isnull);
	target = SPI_getbinval(locked, desc, LOCK_TARGET, &isnull);
	current = attempt_id;
	if (strcmp(SPI_getvalue(locked, desc, LOCK_MODE), "replace") == 0)
		flip_pointer(namespace, kind, target, attempt_id,
					 SPI_getbinval(locked, desc, LOCK_CREATED_AT, &isnull),
					 &current, &previous, &has_previous);

	values[4] = current;
	if (idem_execute(&promote_attempt, namespace, values, nulls, false, 0) != 1)
		elog(ERROR, "attempt %s changed while locked", uuid_text(attempt_id));

	if (DatumGetUUIDP(current) != DatumGetUUIDP(attempt_id) &&
		memcmp(DatumGetUUIDP(current)->data, DatumGetUUIDP(attempt_id)->data, UUID_LEN) != 0)
	{
		/* Lost to a newer attempt: promoted and superseded at once. */
		Datum		sup[2] = {attempt_id, current};

		if (idem_execute(&supersede_attempt, namespace, sup, NULL, false, 0) == 1)
			transitions++;
	}
	else if (has_previous)
	{
		Datum		sup[2] = {previous, attempt_id};

		/* The displaced attempt may have been pruned meanwhile. */
		if (idem_execute(&supersede_attempt, namespace, sup, NULL, false, 0) == 1)
			transitions++;
	}
	SPI_finish();
	idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, transitions);
	PG_RETURN_BOOL(true);
}

/*
 * idem_attempt_fail(attempt_id, generation, reason, event_payload):
 * pending -> failed(reaped_no_blob | digest_mismatch | target_gone) or
 * stored -> failed(target_gone), with the '<kind>.failed' outbox event in
 * the same statement.  False when stale.
 */
Datum
idem_attempt_fail(PG_FUNCTION_ARGS)
{
	static const AttemptState pending_only[] = {{"pending", NULL}};
	static const AttemptState pending_or_stored[] = {{"pending", NULL}, {"stored", NULL}};
	Oid			namespace = idem_function_namespace(fcinfo);
	char	   *reason = text_arg(fcinfo, 2, "reason");
	bool		gone = strcmp(reason, "target_gone") == 0;
	AttemptState to = {"failed", reason};
	Datum		values[5];
	char		nulls[5];
	Datum		sources[2];
	AttemptRow	row;
	bool		done;

	if (!gone && !is_reopenable(reason))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid failure reason \"%s\"", reason),
				 errdetail("The reason is reaped_no_blob, digest_mismatch or target_gone.")));
	idem_require_arg(fcinfo, 0, "attempt_id");
	memset(nulls, ' ', sizeof(nulls));
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int64GetDatum(generation_arg(fcinfo, 1));
	values[2] = CStringGetTextDatum(reason);
	sources[0] = CStringGetTextDatum("pending");
	sources[1] = CStringGetTextDatum("stored");
	values[3] = PointerGetDatum(construct_array(sources, gone ? 2 : 1, TEXTOID,
												-1, false, TYPALIGN_INT));
	if (object_arg(fcinfo, 3, "event_payload", true) == NULL)
		nulls[4] = 'n';
	else
		values[4] = PG_GETARG_DATUM(3);

	SPI_connect();
	done = idem_execute(&fail_attempt, namespace, values, nulls, false, 0) == 1;
	if (!done)
		explain_miss(namespace, values[0], DatumGetInt64(values[1]),
					 gone ? pending_or_stored : pending_only, gone ? 2 : 1, to, &row);
	SPI_finish();
	if (done)
		idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, 1);
	PG_RETURN_BOOL(done);
}

/*
 * idem_attempt_reopen(attempt_id, generation): failed(reaped_no_blob |
 * digest_mismatch) -> pending under generation + 1 and its new key; the
 * new generation, NULL when stale.  idem_attempt_open reopens by itself;
 * this is for callers that hold the attempt id.
 */
Datum
idem_attempt_reopen(PG_FUNCTION_ARGS)
{
	static const AttemptState sources[] = {{"failed", "reaped_no_blob"},
	{"failed", "digest_mismatch"}};
	static const AttemptState to = {"pending", NULL};
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	AttemptRow	row;
	int64		generation = 0;
	bool		done;

	idem_require_arg(fcinfo, 0, "attempt_id");
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int64GetDatum(generation_arg(fcinfo, 1));

	SPI_connect();
	done = idem_execute(&reopen_attempt, namespace, values, NULL, false, 1) == 1;
	if (done)
	{
		bool		isnull;

		generation = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												 SPI_tuptable->tupdesc, 1, &isnull));
	}
	else if (explain_miss(namespace, values[0], DatumGetInt64(values[1]), sources, 2, to, &row))
		elog(ERROR, "reopen of attempt %s missed a reopenable row", uuid_text(values[0]));
	SPI_finish();
	if (!done)
		PG_RETURN_NULL();
	idem_count(IDEM_STAT_ATTEMPT_TRANSITIONS, 1);
	PG_RETURN_INT64(generation);
}

/* idem_attempt_current(kind, target): what a replace-kind target shows now. */
Datum
idem_attempt_current(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		current;
	bool		found;

	idem_require_arg(fcinfo, 0, "kind");
	idem_require_arg(fcinfo, 1, "target");
	SPI_connect();
	found = current_attempt(namespace, PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), &current);
	if (found)
		current = SPI_datumTransfer(current, false, UUID_LEN);
	SPI_finish();
	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(current);
}

/* ----------------------------------------------------------------
 * The reconciler's side
 * ----------------------------------------------------------------
 */

/* Run a batch statement and return its rows as the function's result set. */
static Datum
batch_result(FunctionCallInfo fcinfo, IdemStatement *stmt)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	uint64		i;

	values[0] = IntervalPGetDatum(age_arg(fcinfo, 0, "grace"));
	values[1] = Int32GetDatum(batch_arg(fcinfo, 1));
	InitMaterializedSRF(fcinfo, 0);

	SPI_connect();
	idem_execute(stmt, namespace, values, NULL, false, 0);
	for (i = 0; i < SPI_processed; i++)
	{
		int			natts = rsinfo->setDesc->natts;
		Datum	   *out = palloc(natts * sizeof(Datum));
		bool	   *isnull = palloc(natts * sizeof(bool));
		int			j;

		for (j = 0; j < natts; j++)
			out[j] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
								   j + 1, &isnull[j]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, isnull);
	}
	SPI_finish();
	return (Datum) 0;
}

/*
 * idem_attempt_reconcile_batch(grace, batch): at most batch pending or
 * stored attempts idle for longer than grace, locked FOR UPDATE SKIP
 * LOCKED until the caller's transaction ends, so that several reconcilers
 * take disjoint batches.  The reconciler checks each blob and calls
 * store/promote/fail in the same transaction.
 */
Datum
idem_attempt_reconcile_batch(PG_FUNCTION_ARGS)
{
	return batch_result(fcinfo, &reconcile_batch);
}

/*
 * idem_attempt_sweep_batch(grace, batch): the keys of abandoned
 * generations (every generation before the current one, and the current
 * one of a failed attempt) not yet swept, of at most batch attempts idle
 * for longer than grace.  A put that lands after its key was swept is an
 * orphan no attempt will ever promote.
 */
Datum
idem_attempt_sweep_batch(PG_FUNCTION_ARGS)
{
	return batch_result(fcinfo, &sweep_batch);
}

/*
 * idem_attempt_swept(attempt_id, generation): the blobs of generations up
 * to generation are deleted.  False when already recorded.
 */
Datum
idem_attempt_swept(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	bool		done;

	idem_require_arg(fcinfo, 0, "attempt_id");
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int64GetDatum(generation_arg(fcinfo, 1));
	SPI_connect();
	done = idem_execute(&mark_swept, namespace, values, NULL, false, 0) == 1;
	if (!done)
	{
		bool		isnull;
		int64		through;

		if (idem_execute(&select_abandoned, namespace, values, NULL, false, 1) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("attempt %s does not exist", uuid_text(values[0])),
					 errdetail("It was never opened, or it was pruned after its retention.")));
		through = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull));
		if (DatumGetInt64(values[1]) > through)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("generation " INT64_FORMAT " is not abandoned",
							DatumGetInt64(values[1])),
					 errdetail("The abandoned generations of attempt %s end at " INT64_FORMAT ".",
							   uuid_text(values[0]), through),
					 errhint("Only keys returned by idem_attempt_sweep_batch may be deleted.")));
	}
	SPI_finish();
	PG_RETURN_BOOL(done);
}

/*
 * idem_attempt_prune(retention, batch): delete at most batch promoted,
 * superseded or failed attempts idle for longer than retention whose
 * abandoned blobs are swept.  An open after that is new: the documented
 * boundary of the decision table.
 */
Datum
idem_attempt_prune(PG_FUNCTION_ARGS)
{
	Oid			namespace = idem_function_namespace(fcinfo);
	Datum		values[2];
	int			deleted;

	values[0] = IntervalPGetDatum(age_arg(fcinfo, 0, "retention"));
	values[1] = Int32GetDatum(batch_arg(fcinfo, 1));
	SPI_connect();
	deleted = idem_execute(&prune_attempts, namespace, values, NULL, false, 0);
	SPI_finish();
	PG_RETURN_INT64(deleted);
}

/* ----------------------------------------------------------------
 * Triggers
 * ----------------------------------------------------------------
 */

/* Refuse a trigger call that is not BEFORE/AFTER UPDATE FOR EACH ROW. */
static TriggerData *
update_trigger(FunctionCallInfo fcinfo, const char *name, bool before)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"%s\" was not called by trigger manager", name)));
	if ((before ? !TRIGGER_FIRED_BEFORE(trigdata->tg_event) :
		 !TRIGGER_FIRED_AFTER(trigdata->tg_event)) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"%s\" must be fired %s UPDATE FOR EACH ROW",
						name, before ? "BEFORE" : "AFTER")));
	return trigdata;
}

/* A column of a trigger tuple by name. */
static Datum
column(TriggerData *trigdata, HeapTuple tuple, const char *name, bool *isnull)
{
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	int			attnum = SPI_fnumber(desc, name);

	if (attnum <= 0)
		elog(ERROR, "column \"%s\" of \"%s\" is missing", name,
			 RelationGetRelationName(trigdata->tg_relation));
	return heap_getattr(tuple, attnum, desc, isnull);
}

/* A text column of a trigger tuple as a C string, or NULL. */
static char *
column_text(TriggerData *trigdata, HeapTuple tuple, const char *name)
{
	bool		isnull;
	Datum		d = column(trigdata, tuple, name, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * BEFORE UPDATE on idem_attempts: every write, the functions' or anyone
 * else's, follows the legal transitions; the generation grows by one on a
 * reopen and never otherwise; what identifies the attempt never changes.
 */
Datum
idem_attempts_transition_guard(PG_FUNCTION_ARGS)
{
	static const char *const identity[] = {
		"attempt_id", "kind", "target", "client_request_id", "created_by",
		"intent", "intent_hash", "created_at"
	};
	TriggerData *trigdata = update_trigger(fcinfo, "idem_attempts_transition_guard", true);
	HeapTuple	old = trigdata->tg_trigtuple;
	HeapTuple	new = trigdata->tg_newtuple;
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	AttemptState from;
	AttemptState to;
	int64		old_gen;
	int64		new_gen;
	bool		isnull;
	bool		reopen = false;
	int			i;

	for (i = 0; i < (int) lengthof(identity); i++)
	{
		int			attnum = SPI_fnumber(desc, identity[i]);
		Form_pg_attribute att = TupleDescAttr(desc, attnum - 1);
		bool		old_null;
		bool		new_null;
		Datum		a = heap_getattr(old, attnum, desc, &old_null);
		Datum		b = heap_getattr(new, attnum, desc, &new_null);

		if (old_null != new_null ||
			(!old_null && !datum_image_eq(a, b, att->attbyval, att->attlen)))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
					 errmsg("attempt column \"%s\" cannot change", identity[i]),
					 errdetail("An attempt's identity is fixed when it is opened."),
					 errtablecol(trigdata->tg_relation, attnum)));
	}

	from.status = column_text(trigdata, old, "status");
	from.reason = column_text(trigdata, old, "failure_reason");
	to.status = column_text(trigdata, new, "status");
	to.reason = column_text(trigdata, new, "failure_reason");
	old_gen = DatumGetInt64(column(trigdata, old, "generation", &isnull));
	new_gen = DatumGetInt64(column(trigdata, new, "generation", &isnull));
	if (from.status == NULL || to.status == NULL)
		return PointerGetDatum(new);	/* NOT NULL refuses it */

	/* A write that keeps the state (checked_at, swept_through) is no transition. */
	if (strcmp(from.status, to.status) != 0 ||
		(from.reason == NULL) != (to.reason == NULL) ||
		(from.reason && strcmp(from.reason, to.reason) != 0))
	{
		if (!legal_transition(from, to))
			report_illegal(uuid_text(column(trigdata, old, "attempt_id", &isnull)), from, to);
		reopen = strcmp(from.status, "failed") == 0;
	}

	if (reopen && new_gen != old_gen + 1)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
				 errmsg("illegal attempt generation change"),
				 errdetail("Attempt %s is reopened from generation " INT64_FORMAT ", so its generation must become " INT64_FORMAT ", not " INT64_FORMAT ".",
						   uuid_text(column(trigdata, old, "attempt_id", &isnull)),
						   old_gen, old_gen + 1, new_gen),
				 errhint("The generation grows by one on a reopen and never changes otherwise.")));
	if (!reopen && new_gen != old_gen)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
				 errmsg("illegal attempt generation change"),
				 errdetail("Attempt %s cannot change its generation from " INT64_FORMAT " to " INT64_FORMAT " outside a reopen.",
						   uuid_text(column(trigdata, old, "attempt_id", &isnull)),
						   old_gen, new_gen),
				 errhint("The generation grows by one on a reopen and never changes otherwise.")));
	return PointerGetDatum(new);
}

/*
 * Deferred constraint trigger, queued for every promotion: at commit the
 * attempt, if still promoted or superseded, must name an outbox event
 * that exists and names the attempt.  Reads the attempt's newest version,
 * so a promotion that was superseded later in the transaction is checked
 * with the event it kept.
 */
Datum
idem_attempts_promotion_published(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = update_trigger(fcinfo, "idem_attempts_promotion_published", false);
	Oid			namespace = idem_function_namespace(fcinfo);
	bool		isnull;
	Datum		attempt_id = column(trigdata, trigdata->tg_newtuple, "attempt_id", &isnull);
	bool		ok = true;
	char	   *why = NULL;

	SPI_connect();
	if (idem_execute(&check_published, namespace, &attempt_id, NULL, false, 1) == 1)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		promoted = DatumGetBool(SPI_getbinval(row, desc, 1, &isnull));
		bool		no_event;
		bool		found;
		bool		names;
		bool		names_null;

		SPI_getbinval(row, desc, 2, &no_event);
		found = DatumGetBool(SPI_getbinval(row, desc, 3, &isnull));
		names = DatumGetBool(SPI_getbinval(row, desc, 4, &names_null));
		if (promoted)
		{
			if (no_event)
				why = "it has no outbox event";
			else if (!found)
				why = psprintf("its outbox event %s does not exist",
							   SPI_getvalue(row, desc, 2));
			else if (names_null || !names)
				why = "its outbox event does not name it in its payload's \"attempt_id\"";
			ok = why == NULL;
		}
	}
	SPI_finish();

	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_PROMOTION_UNPUBLISHED),
				 errmsg("attempt promotion committed without its outbox event"),
				 errdetail("Attempt %s is promoted, but %s.", uuid_text(attempt_id), why),
				 errhint("Promote with idem_attempt_promote(), which stages the event in the same statement."),
				 errtableconstraint(trigdata->tg_relation, "idem_attempts_promotion_published")));
	return PointerGetDatum(NULL);
}

/*
 * BEFORE UPDATE on idem_attempt_targets: the current pointer never moves
 * back to an older (created_at, attempt_id), and stays on its target.
 * (NOT NULL keeps it from going NULL.)
 */
Datum
idem_attempt_targets_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = update_trigger(fcinfo, "idem_attempt_targets_guard", true);
	HeapTuple	old = trigdata->tg_trigtuple;
	HeapTuple	new = trigdata->tg_newtuple;
	bool		isnull;
	char	   *old_kind = column_text(trigdata, old, "kind");
	char	   *new_kind = column_text(trigdata, new, "kind");
	char	   *old_target = column_text(trigdata, old, "target");
	char	   *new_target = column_text(trigdata, new, "target");
	Datum		old_id = column(trigdata, old, "current_attempt_id", &isnull);
	Datum		new_id;
	bool		new_null;
	TimestampTz old_at = DatumGetTimestampTz(column(trigdata, old, "current_created_at", &isnull));
	TimestampTz new_at;
	int			cmp;

	if (new_kind == NULL || new_target == NULL ||
		strcmp(old_kind, new_kind) != 0 || strcmp(old_target, new_target) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
				 errmsg("the current pointer cannot move to another target"),
				 errtable(trigdata->tg_relation)));
	new_id = column(trigdata, new, "current_attempt_id", &new_null);
	new_at = DatumGetTimestampTz(column(trigdata, new, "current_created_at", &isnull));
	if (new_null || isnull || DatumGetPointer(old_id) == NULL)
		return PointerGetDatum(new);	/* NOT NULL refuses it */

	cmp = new_at < old_at ? -1 : new_at > old_at ? 1 :
		memcmp(DatumGetUUIDP(new_id)->data, DatumGetUUIDP(old_id)->data, UUID_LEN);
	if (cmp < 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_ILLEGAL_TRANSITION),
				 errmsg("the current pointer cannot move back"),
				 errdetail("Target %s/%s points at attempt %s; attempt %s is older in (created_at, attempt_id) order.",
						   old_kind, old_target, uuid_text(old_id), uuid_text(new_id)),
				 errtable(trigdata->tg_relation)));
	return PointerGetDatum(new);
}
