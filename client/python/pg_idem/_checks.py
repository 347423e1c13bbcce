"""What makes a store error explain itself: the check a runner makes on its
first connection (the extension, its version, EXECUTE on the functions the
runner calls, their schema on the search_path, the lease against
idem.max_lease, and which edition answers: the C library or the SQL
edition), the fix for each SQLSTATE a misconfiguration gives, and one log
line per cause.

Without them every misconfiguration looked the same to a user: each
guarded request answered 503 idempotency-store-unavailable, and nothing
said why (issue 22)."""

import logging
import os
import re
import threading
import time

import psycopg
import psycopg.conninfo

from . import _pool
# The oldest extension this client runs against: the protocol's, the same
# for the three clients (protocol.toml says why it is that one).
from .protocol import CONNECT_MESSAGES, OLDEST_EXTENSION, STARTUP_RETRY_SQLSTATES, STARTUP_WAIT
# The functions the runner calls (EXECUTE is checked on each).
FUNCTIONS = ("idem_claim", "idem_lookup", "idem_renew", "idem_finalize", "idem_release", "idem_fail",
             "idem_begin")

log = logging.getLogger("pg_idem")


class StoreMisconfigured(psycopg.ProgrammingError):
    """The database cannot serve this runner as it is set up; str() says
    what is wrong and how to fix it. Raised by Runner.check() (and the ASGI
    middleware's start-up), answered 503 and logged once per cause on a
    request."""

    def __init__(self, message, fix):
        super().__init__("pg_idem: %s -- fix: %s" % (message, fix))
        self.problem, self.fix = message, fix


def preflight_sql():
    """One row about the extension as this role sees it (none: not installed;
    a NULL version: a PL/Proxy router, the row about its functions)."""
    fn_list = ", ".join("'%s'" % f for f in FUNCTIONS)
    return (
        "SELECT n.extversion, n.nspname, "
        "n.nspname = ANY (pg_catalog.current_schemas(false)), "
        "pg_catalog.has_schema_privilege(n.oid, 'USAGE'), "
        "(SELECT pg_catalog.string_agg(DISTINCT p.proname, ', ' ORDER BY p.proname) "
        "   FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid AND p.proname IN (" + fn_list + ") "
        "    AND NOT pg_catalog.has_function_privilege(p.oid, 'EXECUTE')), "
        # max_wait (0.3.0: a fourth argument) and lock_wait (0.6.0: a fifth).
        "EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid "
        "        AND p.proname = 'idem_claim' AND p.pronargs >= 4), "
        "EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid "
        "        AND p.proname = 'idem_begin' AND p.pronargs >= 4), "
        "EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid "
        "        AND p.proname = 'idem_claim' AND p.pronargs = 5), "
        "(SELECT s.setting::float8 * CASE s.unit WHEN 'ms' THEN 0.001 WHEN 's' THEN 1 WHEN 'min' THEN 60 END "
        "   FROM pg_catalog.pg_settings s WHERE s.name = 'idem.max_lease'), "
        "current_user, "
        # idem_edition() (0.6.0): 'c' or 'sql'; the SQL edition's plain
        # script has no extension row, and is no router.
        "EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid "
        "        AND p.proname = 'idem_edition' AND p.pronargs = 0) "
        "FROM (SELECT e.extversion, n.oid, n.nspname FROM pg_catalog.pg_extension e "
        "      JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_idem' "
        # A PL/Proxy router (docs/guides/sharding.md) has no extension: its
        # idem_* functions on the path forward to partitions that have it.
        "      UNION ALL SELECT NULL, n.oid, n.nspname FROM pg_catalog.pg_proc p "
        "      JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
        "      WHERE p.proname = 'idem_claim' AND pg_catalog.pg_function_is_visible(p.oid) "
        "        AND NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pg_idem') "
        "      LIMIT 1) AS n(extversion, oid, nspname)")


def _version(text):
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3])


def verify(row, cfg, database):
    """(server waits for claims, for begins, takes lock_wait, is a PL/Proxy
    router, the schema to ask idem_edition() in or None) if the row shows a
    usable extension; raises StoreMisconfigured with the fix otherwise."""
    if row is None:
        raise StoreMisconfigured(
            "the extension pg_idem is not installed in the database %s (nor is it a PL/Proxy router: "
            "no idem_claim on the search_path)" % database,
            "run CREATE EXTENSION pg_idem (as a superuser; see the README's Getting started)")
    # On a SQL_ASCII database psycopg hands text columns over as bytes.
    version, schema, on_path, usage, denied, claim_wait, begin_wait, lock_wait, max_lease, user, has_edition = (
        bytes(v).decode("utf-8", "replace") if isinstance(v, (bytes, memoryview)) else v for v in row)
    # No version: a router, whose partitions' versions it does not show
    # (docs/guides/sharding.md), or the SQL edition's plain script (it has
    # idem_edition, and is at least 0.6.0); the rest is checked on its own
    # functions.
    if version is not None and _version(version) < _version(OLDEST_EXTENSION):
        raise StoreMisconfigured(
            "the extension pg_idem is version %s; this client needs %s or newer" % (version, OLDEST_EXTENSION),
            "run ALTER EXTENSION pg_idem UPDATE")
    if not usage:
        raise StoreMisconfigured("the role %s may not use the schema %s of pg_idem" % (user, schema),
                                 "GRANT idem_client TO %s" % user)
    if denied:
        raise StoreMisconfigured("the role %s may not execute %s" % (user, denied),
                                 "GRANT idem_client TO %s" % user)
    if cfg.schema is None and not on_path:
        raise StoreMisconfigured(
            "the schema %s of pg_idem is not on the search_path of the role %s" % (schema, user),
            "pass Config(schema=%r), or ALTER ROLE %s SET search_path = %s, public" % (schema, user, schema))
    if cfg.schema is not None and cfg.schema != schema:
        raise StoreMisconfigured("Config(schema=%r) but pg_idem is installed in the schema %s" % (cfg.schema, schema),
                                 "pass Config(schema=%r)" % schema)
    if max_lease is not None and cfg.lease > max_lease:
        raise StoreMisconfigured(
            "Config.lease is %g s, over the server's idem.max_lease (%g s)" % (cfg.lease, max_lease),
            "durations in pg_idem.Config are seconds (or datetime.timedelta): pass a shorter lease")
    return (bool(claim_wait), bool(begin_wait), bool(lock_wait), version is None and not has_edition,
            schema if has_edition else None)


def edition_sql(schema):
    """What says which edition answers, once the check found idem_edition."""
    return "SELECT %s.idem_edition()" % '"%s"' % schema.replace('"', '""')


def describe_edition(edition, version, schema):
    """The log line of the first-use check: which edition it found."""
    name = {"c": "the C edition", "sql": "the SQL edition"}.get(edition, "pg_idem (edition %s)" % edition)
    return "pg_idem: %s%s in schema %s" % (name, " %s" % version if version else " (plain script)" if edition == "sql" else "",
                                          schema)


class StartupWait:
    """What a runner's start-up check (Runner.check) does with an error
    (protocol.toml [client.startup]): a server that does not answer yet is
    tried again for up to `wait` seconds; anything else, and a server still
    silent then, stops the start with StoreMisconfigured saying what to fix,
    instead of a 503 on every request."""

    def __init__(self, wait=None, pool=None):
        self.wait = STARTUP_WAIT if wait is None else wait
        self.where = address(pool)
        self.deadline = time.monotonic() + self.wait
        self.tries = 0

    def pause(self, error):
        """The seconds to wait before the next try, or raises the refusal."""
        if isinstance(error, StoreMisconfigured):
            raise error
        if not isinstance(error, psycopg.Error):
            raise error
        state = sqlstate_of(error)
        line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        # No SQLSTATE and not the server's words: nothing answered (no socket,
        # connection refused, a name that does not resolve, a timeout).
        unanswered = state is None and "FATAL:" not in str(error)
        silent = isinstance(error, psycopg.OperationalError) and (
            unanswered or (state or "").startswith("08") or state in STARTUP_RETRY_SQLSTATES)
        if not silent:
            raise StoreMisconfigured("the database refused this runner at start-up: %s" % line,
                                     explain(error)[1]) from error
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise StoreMisconfigured(
                "no server answered%s within %g s at start-up: %s" % (
                    " at " + self.where if self.where else "", self.wait, line),
                "check the dsn's host and port (or socket directory), and that PostgreSQL (or the pooler) "
                "runs there") from error
        self.tries += 1
        if self.tries == 1:
            log.warning("pg_idem: waiting up to %g s for the server at start-up: %s", self.wait, line)
        return min(left, 1.0, 0.05 * 2 ** self.tries)


def address(pool):
    """Where the pool connects, in words (socket "/run/.s.PGSQL.5432",
    db:5432), from its conninfo and libpq's environment; None if unknown."""
    conninfo = getattr(pool, "conninfo", None)
    if not isinstance(conninfo, str):
        return None
    try:
        d = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return None
    host = str(d.get("host") or d.get("hostaddr") or os.environ.get("PGHOST") or "/var/run/postgresql")
    port = str(d.get("port") or os.environ.get("PGPORT") or "5432")
    if host.startswith("/"):
        return 'socket "%s"' % os.path.join(host, ".s.PGSQL." + port)
    return "%s:%s" % (host, port)


def router_refusal(mode):
    """Fenced and in-transaction modes need the handler's transaction on the
    partition that owns the key: a PL/Proxy router runs each call in a
    transaction of its own there (and has no idem_begin), so through it the
    finalize would commit apart from the handler's writes."""
    return StoreMisconfigured(
        "%s mode cannot run through a PL/Proxy router, which runs each call in a transaction of its own "
        "on the partition, apart from the handler's" % mode,
        "use lease mode through the router, or a pool connected to the partition that owns the key (the "
        "router's idem_key_partition() and idem_partition_map() name it; docs/guides/sharding.md)")


# The fix for each SQLSTATE a misconfigured store answers with.
FIXES = {
    "42883": "the pg_idem functions are not on the role's search_path: pass Config(schema='...') "
             "or ALTER ROLE ... SET search_path",
    "3F000": "Config(schema=...) names a schema that does not exist",
    "42501": "the role lacks a privilege: GRANT idem_client TO the role",
    "26000": "a transaction-mode pooler (PgBouncer) dropped a prepared statement: create your pool's "
             "connections with prepare_threshold=None (the dsn= pool does)",
    "42P05": "a transaction-mode pooler (PgBouncer) shares prepared statements between clients: create "
             "your pool's connections with prepare_threshold=None (the dsn= pool does)",
    "22023": "a value is out of the server's range (is Config.lease over idem.max_lease? durations are seconds)",
    "53300": "the server has no connection slot left: lower the pool's size or raise max_connections",
    "53400": "a server limit was reached (max_connections, a pooler's pool)",
    "57014": "a statement was cancelled (statement_timeout?)",
    "57P01": "the server was shut down or the backend terminated",
    "28000": "the server refused the role: check the dsn's user (does the role exist, may it log in?) and "
             "pg_hba.conf",
    "28P01": "the password was refused: check the dsn",
    "3D000": "the dsn names a database that does not exist",
}


def sqlstate_of(error):
    """The error's SQLSTATE; for a connection the server refused, which libpq
    gives without one, read from the server's words (protocol.toml
    [[connect_message]])."""
    state = getattr(error, "sqlstate", None)
    if state is None and isinstance(error, psycopg.OperationalError):
        text = str(error)
        for code, pattern in CONNECT_MESSAGES:
            if re.search(pattern, text):
                return code
    return state


def explain(error):
    """(sqlstate or None, the fix): what a user should do about this error."""
    fix = getattr(error, "fix", None)
    state = sqlstate_of(error)
    if fix:
        return state, fix
    if _pool.is_pool_exhausted(error):  # an OperationalError, but the server was never asked
        return None, _pool.explain(error)
    if state in FIXES:
        return state, FIXES[state]
    if state and state.startswith("08") or isinstance(error, psycopg.OperationalError):
        return state, "the server cannot be reached: check the dsn and that PostgreSQL (or the pooler) runs"
    return state, "see the PostgreSQL error; the request was answered 503 idempotency-store-unavailable"


class ErrorReport:
    """What on_error is given: the error, its SQLSTATE, the fix, the request,
    and whether this is the first time this cause was seen."""

    def __init__(self, error, request, sqlstate, fix, first):
        self.error, self.request, self.sqlstate, self.fix, self.first = error, request, sqlstate, fix, first

    def __repr__(self):
        return "ErrorReport(%r, sqlstate=%r, fix=%r)" % (self.error, self.sqlstate, self.fix)


class Reporter:
    """Logs a store error once per cause (its SQLSTATE, or its kind, and its
    first line) to the "pg_idem" logger and calls on_error for every one."""

    MAX_CAUSES = 256

    def __init__(self, on_error=None):
        self.on_error = on_error
        self._seen = set()
        self._lock = threading.Lock()

    def report(self, error, request=None):
        state, fix = explain(error)
        text = getattr(error, "problem", None) or str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        cause = (state, type(error).__name__, re.sub(r"\d+", "#", first_line))
        with self._lock:
            first = cause not in self._seen
            if first and len(self._seen) < self.MAX_CAUSES:
                self._seen.add(cause)
        if first:
            log.error("pg_idem: %s%s: %s -- fix: %s",
                      "connection pool exhausted" if _pool.is_pool_exhausted(error) else "store error",
                      " (SQLSTATE %s)" % state if state else "", first_line, fix)
        if self.on_error is not None:
            try:
                self.on_error(ErrorReport(error, request, state, fix, first))
            except Exception:  # a hook must not turn a 503 into a 500
                log.exception("pg_idem: the on_error hook raised")
