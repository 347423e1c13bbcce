"""Idempotency-Key validation, the cache key and the request hash.

The digests are byte-identical to the server's ``idem_key()`` and
``idem_request_hash()``, so they are computed without a round trip::

    cache key    = SHA-256(b"pg_idem key v1" || for each of principal, method,
                   target, key: uint32_be(UTF-8 byte length) || UTF-8 bytes)
    request hash = SHA-256(body)
"""

import hashlib
import struct

from . import protocol

MAX_KEY_BYTES = protocol.MAX_KEY_BYTES
_DOMAIN = protocol.KEY_DOMAIN.encode("utf-8")
KeyStatus = protocol.KeyStatus


class InvalidKey(ValueError):
    """The server would refuse this key (empty, too long, NUL, invalid UTF-8)."""


def describe(status):
    """A sentence for a problem-details ``detail`` member."""
    return protocol.KEY_STATUS_DESCRIPTIONS[status]


def _as_bytes(value):
    """Header values arrive as bytes (ASGI, raw) or str (WSGI latin-1, str APIs)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: not UTF-8
            return None
    raise TypeError("a key is bytes or str, not %s" % type(value).__name__)


def check_key(key):
    """Checks one key value (never ABSENT or DUPLICATED)."""
    raw = _as_bytes(key)
    if raw is None:
        return KeyStatus.INVALID_UTF8
    if not raw:
        return KeyStatus.EMPTY
    if len(raw) > MAX_KEY_BYTES:
        return KeyStatus.TOO_LONG
    if b"\x00" in raw:
        return KeyStatus.CONTAINS_NUL
    try:
        # Python's strict UTF-8 decoder refuses overlongs, surrogates and
        # code points above U+10FFFF, as PostgreSQL does.
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return KeyStatus.INVALID_UTF8
    return KeyStatus.OK


def check_key_header(values):
    """Checks the header values as received: zero, one or several fields."""
    values = list(values or [])
    if not values:
        return KeyStatus.ABSENT
    if len(values) > 1:
        return KeyStatus.DUPLICATED
    return check_key(values[0])


def _field(value):
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return struct.pack(">I", len(raw)) + raw


def cache_key(principal, method, target, key):
    """The server's idem_key(principal, method, target, key), as 32 bytes.

    Raises InvalidKey when the server would refuse the key."""
    status = check_key(key)
    if status is not KeyStatus.OK:
        raise InvalidKey(describe(status))
    h = hashlib.sha256(_DOMAIN)
    for part in (principal, method, target, key):
        h.update(_field(part))
    return h.digest()


def request_hash(body):
    """The server's idem_request_hash(body): SHA-256 of the body bytes."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    return hashlib.sha256(body or b"").digest()
