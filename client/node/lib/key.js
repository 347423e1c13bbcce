'use strict';
// Idempotency-Key validation, the cache key and the request hash,
// byte-identical to the server's idem_key() and idem_request_hash():
//
//   cache key    = SHA-256("pg_idem key v1" || for each of principal, method,
//                  target, key: uint32_be(UTF-8 byte length) || UTF-8 bytes)
//   request hash = SHA-256(body)

const crypto = require('node:crypto');

const { KEY_DOMAIN, MAX_KEY_BYTES, KeyStatus, KEY_STATUS_DESCRIPTIONS } = require('./protocol');

const DOMAIN = Buffer.from(KEY_DOMAIN, 'utf8');

class InvalidKeyError extends Error {}

// A sentence for a problem-details "detail" member.
function describe(status) {
  return KEY_STATUS_DESCRIPTIONS[status];
}

// A JS string with a lone surrogate has no UTF-8 form (Buffer.from would
// silently replace it with U+FFFD).
function hasLoneSurrogate(s) {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = s.charCodeAt(i + 1);
      if (!(d >= 0xdc00 && d <= 0xdfff)) return true;
      i++;
    } else if (c >= 0xdc00 && c <= 0xdfff) {
      return true;
    }
  }
  return false;
}

// Bytes of a key or field: a Buffer as it is, a string as UTF-8 (null when it has none).
function toBytes(value) {
  if (Buffer.isBuffer(value)) return value;
  if (value instanceof Uint8Array) return Buffer.from(value);
  if (typeof value === 'string') return hasLoneSurrogate(value) ? null : Buffer.from(value, 'utf8');
  throw new TypeError(`a key is a string or a Buffer, not ${typeof value}`);
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

// Well-formed UTF-8 as PostgreSQL accepts it (no overlongs, no surrogates,
// nothing above U+10FFFF): the WHATWG decoder in fatal mode refuses exactly those.
function isValidUtf8(buf) {
  try {
    strictUtf8.decode(buf);
    return true;
  } catch {
    return false;
  }
}

// Checks one key value (never ABSENT or DUPLICATED).
function checkKey(key) {
  const raw = toBytes(key);
  if (raw === null) return KeyStatus.INVALID_UTF8;
  if (raw.length === 0) return KeyStatus.EMPTY;
  if (raw.length > MAX_KEY_BYTES) return KeyStatus.TOO_LONG;
  if (raw.includes(0)) return KeyStatus.CONTAINS_NUL;
  if (!isValidUtf8(raw)) return KeyStatus.INVALID_UTF8;
  return KeyStatus.OK;
}

// Checks the header values as received: zero, one or several fields.
function checkKeyHeader(values) {
  const v = values || [];
  if (v.length === 0) return KeyStatus.ABSENT;
  if (v.length > 1) return KeyStatus.DUPLICATED;
  return checkKey(v[0]);
}

function field(value) {
  const raw = toBytes(value === undefined || value === null ? '' : value);
  if (raw === null) throw new InvalidKeyError('a field is not valid UTF-8');
  const len = Buffer.alloc(4);
  len.writeUInt32BE(raw.length);
  return Buffer.concat([len, raw]);
}

// The server's idem_key(principal, method, target, key) as a 32-byte Buffer;
// throws InvalidKeyError when the server would refuse the key.
function cacheKey(principal, method, target, key) {
  const status = checkKey(key);
  if (status !== KeyStatus.OK) throw new InvalidKeyError(describe(status));
  const h = crypto.createHash('sha256');
  h.update(DOMAIN);
  for (const part of [principal, method, target, key]) h.update(field(part));
  return h.digest();
}

// The server's idem_request_hash(body).
function requestHash(body) {
  const b = body === undefined || body === null ? Buffer.alloc(0) : typeof body === 'string' ? Buffer.from(body, 'utf8') : Buffer.from(body);
  return crypto.createHash('sha256').update(b).digest();
}

module.exports = {
  MAX_KEY_BYTES, KeyStatus, InvalidKeyError, describe, checkKey, checkKeyHeader, cacheKey, requestHash, isValidUtf8,
};
