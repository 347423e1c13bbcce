"""Idempotency-Key validation, the cache key and the request hash.

The digests are byte-identical to the server's ``idem_key()`` and
``idem_request_hash()``, so they are computed without a round trip::

    cache key    = SHA-256(b"pg_idem key v1" || for each of principal, method,
                   target, key: uint32_be(UTF-8 byte length) || UTF-8 bytes)
    request hash = SHA-256(body)
"""

import enum
import hashlib
import struct

MAX_KEY_BYTES = 255
_DOMAIN = b"pg_idem key v1"


class KeyStatus(enum.Enum):
    """What is wrong with the Idempotency-Key header(s) of a request, if anything."""

    OK = "ok"
    ABSENT = "absent"
    EMPTY = "empty"
    DUPLICATED = "duplicated"
    TOO_LONG = "too_long"
    CONTAINS_NUL = "contains_nul"
    INVALID_UTF8 = "invalid_utf8"


_DESCRIPTIONS = {
    KeyStatus.OK: "The Idempotency-Key is valid.",
    KeyStatus.ABSENT: "This operation requires an Idempotency-Key header.",
    KeyStatus.EMPTY: "The Idempotency-Key header is empty.",
    KeyStatus.DUPLICATED: "The request has more than one Idempotency-Key header.",
    KeyStatus.TOO_LONG: "The Idempotency-Key is longer than 255 bytes.",
    KeyStatus.CONTAINS_NUL: "The Idempotency-Key contains a NUL byte.",
    KeyStatus.INVALID_UTF8: "The Idempotency-Key is not valid UTF-8.",
}


class InvalidKey(ValueError):
    """The server would refuse this key (empty, too long, NUL, invalid UTF-8)."""


def describe(status):
    """A sentence for a problem-details ``detail`` member."""
    return _DESCRIPTIONS[status]


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
