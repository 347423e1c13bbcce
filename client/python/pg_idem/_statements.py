"""The SQL the runner sends and the rows it reads back (the C++ client's
src/runner/statements.cpp): statements schema-qualified when configured, the
arguments' text forms, and the decoding of a claim function's row."""

import dataclasses
import re

import psycopg

from . import protocol
from ._checks import preflight_sql

WON = tuple(o.name for o in protocol.OUTCOMES.values() if o.role == "win")


@dataclasses.dataclass
class Row:
    outcome: str
    claim_id: str
    generation: int
    retry_after: float
    status: int
    headers_json: str
    body: bytes

    @property
    def won(self):
        return self.outcome in WON


def _quote_ident(s):
    return '"' + s.replace('"', '""') + '"'


def _ms_text(seconds):
    return "%d milliseconds" % max(1, int(round(seconds * 1000)))


def _lock_wait_text(seconds):
    """The lock_wait argument: what is left of the budget, at least a
    millisecond (the server rounds up to whole milliseconds)."""
    return "%dms" % max(1, int(round(seconds * 1000)))


def parse_size_setting(text):
    """idem.max_response_bytes as current_setting shows it ("2MB", "1024", "-1")."""
    if not text:
        return None
    m = re.match(r"^(\d+)(B|kB|MB|GB|TB)?$", text)
    if not m:
        return None
    mult = {None: 1, "B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}[m.group(2)]
    return int(m.group(1)) * mult


class Statements:
    """The SQL the runner sends, schema-qualified when configured. The
    claims and the renewal take named parameters, ck, rh, claim, lease,
    wait (max_wait) and lock (lock_wait, the longest each wait on another
    transaction's lock on the key may last), the same in both forms: with
    lock_wait as an argument (pg_idem 0.6.0 and newer), and in `legacy`
    the older servers' form, which sets it as lock_timeout with
    set_config(..., true), local to the statement's transaction (and, for
    idem_begin in the caller's transaction, sets the caller's value back).
    The others are positional (%s) in text order."""

    def __init__(self, schema):
        p = _quote_ident(schema) + "." if schema else ""
        cols = ("SELECT r.outcome, r.claim_id::text, r.generation, "
                "ceil(extract(epoch FROM r.retry_after) * 1000)::int8, "
                "r.response_status, r.response_headers::text, r.response_body")
        args = "%(ck)s::bytea, %(rh)s::bytea, %(lease)s::interval, "
        # A claim stuck behind an idem_begin transaction gives up with the budget.
        self.claim = cols + " FROM " + p + "idem_claim(" + args + "NULL::interval, %(lock)s::interval) r"
        self.claim_wait = cols + " FROM " + p + "idem_claim(" + args + "%(wait)s::interval, %(lock)s::interval) r"
        # In the caller's transaction: lock_wait holds for idem_begin only.
        self.begin = cols + " FROM " + p + "idem_begin(" + args + "NULL::interval, %(lock)s::interval) r"
        self.begin_wait = cols + " FROM " + p + "idem_begin(" + args + "%(wait)s::interval, %(lock)s::interval) r"
        self.renew = ("SELECT " + p + "idem_renew(%(ck)s::bytea, %(claim)s::uuid, %(lease)s::interval, "
                      "%(lock)s::interval) IS NOT NULL")
        self.legacy = _Legacy(p, cols)
        self.lookup = cols + " FROM " + p + "idem_lookup(%s::bytea, %s::bytea) r"
        # Over the client's cap: the server stores a body over
        # idem.max_response_bytes as completed, not replayable, so that
        # setting goes to 0 for this transaction and one byte is sent.
        self.finalize = ("SELECT " + p + "idem_finalize(%s::bytea, %s::uuid, %s::int4, %s::jsonb, "
                         "%s::bytea, %s::boolean), pg_catalog.current_setting('idem.max_response_bytes', true)"
                         " FROM (SELECT CASE WHEN %s::boolean THEN pg_catalog.set_config("
                         "'idem.max_response_bytes', '0', true) END AS forced) s")
        self.release = "SELECT " + p + "idem_release(%s::bytea, %s::uuid)"
        self.fail = "SELECT " + p + "idem_fail(%s::bytea, %s::uuid, %s::interval)"
        # The extension as this role sees it (pg_idem._checks.verify reads it).
        self.preflight = preflight_sql()


class _Legacy:
    """The claims and the renewal for pg_idem 0.3.0 - 0.5.x, which have no
    lock_wait: the same named parameters, lock set as lock_timeout before
    the call runs (the LATERAL reference orders them). It goes when
    protocol.OLDEST_EXTENSION reaches 0.6.0."""

    def __init__(self, p, cols):
        lt = " FROM (SELECT pg_catalog.set_config('lock_timeout', %(lock)s, true) AS lt) s CROSS JOIN LATERAL "
        call = "(%(ck)s::bytea, %(rh)s::bytea, CASE WHEN s.lt IS NOT NULL THEN %(lease)s::interval END"
        self.claim = cols + lt + p + "idem_claim" + call + ") r"
        self.claim_wait = cols + lt + p + "idem_claim" + call + ", %(wait)s::interval) r"
        begin = (", pg_catalog.set_config('lock_timeout', s.old, true) FROM (SELECT "
                 "pg_catalog.current_setting('lock_timeout') AS old, "
                 "pg_catalog.set_config('lock_timeout', %(lock)s, true) AS lt) s CROSS JOIN LATERAL ")
        self.begin = cols + begin + p + "idem_begin" + call + ") r"
        self.begin_wait = cols + begin + p + "idem_begin" + call + ", %(wait)s::interval) r"
        self.renew = ("SELECT CASE WHEN s.lt IS NOT NULL THEN " + p
                      + "idem_renew(%(ck)s::bytea, %(claim)s::uuid, %(lease)s::interval) IS NOT NULL END"
                      " FROM (SELECT pg_catalog.set_config('lock_timeout', %(lock)s, true) AS lt) s")


def _text(v):
    """A text column as str. On a SQL_ASCII database psycopg returns text
    columns as bytes (it cannot know their encoding); pg_idem's own text
    (outcomes, claim ids, settings, the JSON of the stored headers, which the
    client sent as UTF-8) is UTF-8 there too."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "surrogateescape")
    return v


def parse_row(t):
    if t is None:
        raise psycopg.DataError("pg_idem: expected one row from the claim function")
    body = t[6]
    if isinstance(body, memoryview):
        body = body.tobytes()
    return Row(_text(t[0]) or "", _text(t[1]), t[2] or 0, None if t[3] is None else t[3] / 1000.0,
               t[4], _text(t[5]), body)
