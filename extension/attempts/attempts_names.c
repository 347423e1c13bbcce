/*-------------------------------------------------------------------------
 *
 * attempts_names.c
 *	  Attempts: argument checks, safe names, object keys and intent hashes,
 *	  (see attempts.h for the state machine).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "core/arguments.h"
#include "core/hashing.h"
#include "attempts/attempts.h"

#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_intent_hash);
PG_FUNCTION_INFO_V1(idem_attempt_safe_name);
PG_FUNCTION_INFO_V1(idem_attempt_object_key);

/* ----------------------------------------------------------------
 * Argument checks, names and keys
 * ----------------------------------------------------------------
 */

/* A non-NULL text argument as a C string, refused when empty. */
char *
attempt_text_arg(FunctionCallInfo fcinfo, int argno, const char *name)
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
void
attempt_check_kind(const char *kind)
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
void
attempt_check_path(const char *what, const char *path, int max_bytes)
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
char *
attempt_safe_name(const char *name, int len)
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
char *
attempt_uuid_text(Datum uuid)
{
	return DatumGetCString(DirectFunctionCall1(uuid_out, uuid));
}

/* {prefix}/{target}/{attempt_id}/g{generation}/{name}, parts already checked. */
char *
attempt_object_key(const char *prefix, const char *target, Datum attempt_id,
		   int64 generation, const char *name)
{
	return psprintf("%s/%s/%s/g" INT64_FORMAT "/%s",
					prefix, target, attempt_uuid_text(attempt_id), generation, name);
}

/*
 * What idem_attempt_object_key(prefix, target, attempt_id, generation,
 * name) answers, for the functions' own statements: computed here rather
 * than by calling the SQL function, which a planted overload could shadow.
 */
char *
attempt_key_of(const char *prefix, const char *target, Datum attempt_id,
			   int64 generation, const char *name)
{
	attempt_check_path("key prefix", prefix, KEY_PREFIX_MAX_BYTES);
	attempt_check_path("target", target, TARGET_MAX_BYTES);
	return attempt_object_key(prefix, target, attempt_id, generation,
							  attempt_safe_name(name, strlen(name)));
}

/* A fresh attempt id: a random (version 4) UUID. */
Datum
attempt_new_id(void)
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
bytea *
attempt_intent_hash(Jsonb *intent)
{
	char	   *canonical = JsonbToCString(NULL, &intent->root, VARSIZE(intent));
	bytea	   *result = palloc(VARHDRSZ + IDEM_DIGEST_LEN);

	SET_VARSIZE(result, VARHDRSZ + IDEM_DIGEST_LEN);
	idem_sha256((const uint8 *) canonical, strlen(canonical),
				(uint8 *) VARDATA(result));
	return result;
}

/* A jsonb argument that must be an object (NULL allowed when optional). */
Jsonb *
attempt_object_arg(FunctionCallInfo fcinfo, int argno, const char *name, bool optional)
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
int64
attempt_generation_arg(FunctionCallInfo fcinfo, int argno)
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
Interval *
attempt_age_arg(FunctionCallInfo fcinfo, int argno, const char *name)
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
int32
attempt_batch_arg(FunctionCallInfo fcinfo, int argno)
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
bool
attempt_bytea_equal(bytea *a, bytea *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
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
	PG_RETURN_BYTEA_P(attempt_intent_hash(PG_GETARG_JSONB_P(0)));
}

/* idem_attempt_safe_name(name): the last segment of every object key. */
Datum
idem_attempt_safe_name(PG_FUNCTION_ARGS)
{
	text	   *name;

	idem_require_arg(fcinfo, 0, "name");
	name = PG_GETARG_TEXT_PP(0);
	PG_RETURN_TEXT_P(cstring_to_text(attempt_safe_name(VARDATA_ANY(name),
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
	char	   *prefix = attempt_text_arg(fcinfo, 0, "key_prefix");
	char	   *target = attempt_text_arg(fcinfo, 1, "target");
	int64		generation;
	text	   *name;

	attempt_check_path("key prefix", prefix, KEY_PREFIX_MAX_BYTES);
	attempt_check_path("target", target, TARGET_MAX_BYTES);
	idem_require_arg(fcinfo, 2, "attempt_id");
	generation = attempt_generation_arg(fcinfo, 3);
	idem_require_arg(fcinfo, 4, "name");
	name = PG_GETARG_TEXT_PP(4);
	PG_RETURN_TEXT_P(cstring_to_text(attempt_object_key(prefix, target, PG_GETARG_DATUM(2),
												generation,
												attempt_safe_name(VARDATA_ANY(name),
														  VARSIZE_ANY_EXHDR(name)))));
}

