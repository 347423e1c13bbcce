/*-------------------------------------------------------------------------
 *
 * hashing.h
 *	  Cache keys, request hashes and other SHA-256 digests (hashing.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CORE_HASHING_H
#define IDEM_CORE_HASHING_H

/* Length of a cache key and of a request hash: a SHA-256 digest. */
#define IDEM_DIGEST_LEN 32

/* Longest Idempotency-Key value accepted, in bytes (IETF draft guidance). */
#define IDEM_MAX_KEY_BYTES 255

extern void idem_sha256(const uint8 *data, size_t len, uint8 *out);
extern bytea *idem_tuple_digest(const char *domain, text *const *fields, int nfields);
extern bytea *idem_digest_bytea(const uint8 *digest);

#endif							/* IDEM_CORE_HASHING_H */
