/*-------------------------------------------------------------------------
 *
 * hashing.c
 *	  Cache keys and request hashes.
 *
 * A cache key is the SHA-256 of a canonical, length-delimited tuple
 * (principal, method, target, key): each field is preceded by its length,
 * so no two distinct tuples can produce the same byte string by moving a
 * delimiter.  Only the digest is stored, never the caller's raw strings.
 * The clients compute the same bytes (client/cpp/src/keys/key.cpp,
 * client/python/pg_idem/key.py, client/node/lib/key.js), checked against
 * the shared vectors of client/conformance/protocol.json.
 *
 *-------------------------------------------------------------------------
 */

#include "postgres.h"

#include "core/arguments.h"
#include "core/compat.h"
#include "core/hashing.h"
#include "common/cryptohash.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(idem_key);
PG_FUNCTION_INFO_V1(idem_request_hash);

/* Domain tag: a version for the canonical form, and no collision with plain sha256(). */
static const char key_domain[] = "pg_idem key v1";

/* SHA-256 of one buffer. */
void
idem_sha256(const uint8 *data, size_t len, uint8 *out)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, data, len) < 0 ||
		pg_cryptohash_final(ctx, out, IDEM_DIGEST_LEN) < 0)
		elog(ERROR, "could not compute SHA-256 digest: %s",
			 pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
}

/* Append one length-prefixed field (4-byte big-endian length, then bytes). */
static void
update_field(pg_cryptohash_ctx *ctx, const text *field)
{
	uint32		len = VARSIZE_ANY_EXHDR(field);
	uint8		prefix[4];

	prefix[0] = (len >> 24) & 0xFF;
	prefix[1] = (len >> 16) & 0xFF;
	prefix[2] = (len >> 8) & 0xFF;
	prefix[3] = len & 0xFF;
	if (pg_cryptohash_update(ctx, prefix, sizeof(prefix)) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) VARDATA_ANY(field), len) < 0)
		elog(ERROR, "could not compute SHA-256 digest: %s",
			 pg_cryptohash_error(ctx));
}

/*
 * SHA-256 of a domain tag followed by length-prefixed fields, as a bytea:
 * the canonical form of every key pg_idem derives from caller strings.
 */
bytea *
idem_tuple_digest(const char *domain, text *const *fields, int nfields)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	bytea	   *result = palloc(VARHDRSZ + IDEM_DIGEST_LEN);
	int			i;

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) domain, strlen(domain)) < 0)
		elog(ERROR, "could not compute SHA-256 digest: %s",
			 pg_cryptohash_error(ctx));
	for (i = 0; i < nfields; i++)
		update_field(ctx, fields[i]);

	SET_VARSIZE(result, VARHDRSZ + IDEM_DIGEST_LEN);
	if (pg_cryptohash_final(ctx, (uint8 *) VARDATA(result), IDEM_DIGEST_LEN) < 0)
		elog(ERROR, "could not compute SHA-256 digest: %s",
			 pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
	return result;
}

/*
 * The Idempotency-Key value must be usable as an identifier: not empty,
 * at most 255 bytes, valid UTF-8 whatever the database encoding.  (A NUL
 * cannot reach a text value: PostgreSQL refuses it on input.)
 */
static void
check_key_value(const text *key)
{
	int			len = VARSIZE_ANY_EXHDR(key);
	const unsigned char *p = (const unsigned char *) VARDATA_ANY(key);
	int			i = 0;

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key must not be empty")));
	if (len > IDEM_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key must be at most %d bytes",
						IDEM_MAX_KEY_BYTES),
				 errdetail("The key given is %d bytes long.", len)));
	while (i < len)
	{
		int			clen = pg_utf_mblen(p + i);

		if (p[i] == '\0' || clen > len - i || !pg_utf8_islegal(p + i, clen))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("idempotency key must be valid UTF-8 without NUL bytes"),
					 errdetail("Invalid byte sequence at byte offset %d.", i)));
		i += clen;
	}
}

/* idem_key(principal, method, target, key): the cache key of a request. */
Datum
idem_key(PG_FUNCTION_ARGS)
{
	static const char *const names[] = {"principal", "method", "target", "key"};
	text	   *fields[4];
	int			i;

	for (i = 0; i < 4; i++)
	{
		idem_require_arg(fcinfo, i, names[i]);
		fields[i] = PG_GETARG_TEXT_PP(i);
	}
	check_key_value(fields[3]);
	PG_RETURN_BYTEA_P(idem_tuple_digest(key_domain, fields, 4));
}

/* idem_request_hash(body): SHA-256 of the body, what claims compare. */
Datum
idem_request_hash(PG_FUNCTION_ARGS)
{
	bytea	   *body;
	bytea	   *result;

	idem_require_arg(fcinfo, 0, "body");
	body = PG_GETARG_BYTEA_PP(0);
	result = palloc(VARHDRSZ + IDEM_DIGEST_LEN);
	SET_VARSIZE(result, VARHDRSZ + IDEM_DIGEST_LEN);
	idem_sha256((const uint8 *) VARDATA_ANY(body), VARSIZE_ANY_EXHDR(body),
				(uint8 *) VARDATA(result));
	PG_RETURN_BYTEA_P(result);
}

/* A digest as a 32-byte bytea. */
bytea *
idem_digest_bytea(const uint8 *digest)
{
	bytea	   *result = palloc(VARHDRSZ + IDEM_DIGEST_LEN);

	SET_VARSIZE(result, VARHDRSZ + IDEM_DIGEST_LEN);
	memcpy(VARDATA(result), digest, IDEM_DIGEST_LEN);
	return result;
}
