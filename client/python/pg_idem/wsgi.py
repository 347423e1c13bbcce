"""WSGI middleware (Flask, any WSGI app): one line makes an app idempotent.

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, dsn="dbname=app", principal=header("X-User"))

WSGI servers join repeated header fields into one value (PEP 3333), so a
repeated Idempotency-Key arrives as one key "a, b" here and is used as it
is; the ASGI middleware and the other clients refuse it with 400.

WSGI has no start-up event: the middleware's construction is the start-up,
and it runs the runner's check (check_at_startup=False skips it).
"""

import http
import io

from .config import with_options
from ._engine import Request
from .http import Response
from .runner import Runner, SimplePool

CLAIM = "pg_idem.claim"
CONN = "pg_idem.conn"


def header(name):
    """A principal function that reads a request header."""
    env = "HTTP_" + name.upper().replace("-", "_")
    return lambda environ: environ.get(env) or None


def remote_user(environ):
    """The principal a WSGI server or an auth middleware put in REMOTE_USER."""
    return environ.get("REMOTE_USER") or None


class IdempotencyMiddleware:
    """As pg_idem.asgi.IdempotencyMiddleware, with a blocking Runner; the
    claim is environ["pg_idem.claim"], the transaction's connection (fenced,
    in_transaction) environ["pg_idem.conn"]. check_at_startup: the runner's
    check, here, in the constructor: a store it cannot use raises
    pg_idem.StoreMisconfigured, which stops the application's start."""

    def __init__(self, app, runner=None, *, dsn=None, pool=None, config=None, principal=None,
                 methods=("POST", "PATCH"), mode="lease", key_required=False, on_error=None, metrics=None,
                 check_at_startup=True, startup_wait=None, namespace=None, fingerprint=None,
                 client_errors=None):
        if runner is None:
            if pool is None and dsn is None:
                raise TypeError("IdempotencyMiddleware needs runner=, pool= or dsn=")
            runner = Runner(pool if pool is not None else dsn,
                            with_options(config, namespace, fingerprint, client_errors),
                            on_error=on_error, metrics=metrics)
        elif (namespace, fingerprint, client_errors) != (None, None, None):
            raise TypeError("with runner=, namespace, fingerprint and client_errors are the runner's Config")
        if mode not in ("lease", "fenced", "in_transaction"):
            raise ValueError("mode must be 'lease', 'fenced' or 'in_transaction'")
        self.app, self.runner, self.mode = app, runner, mode
        if principal is None:
            raise TypeError("IdempotencyMiddleware needs principal=: the authenticated actor is part of the key "
                            "(header(name), remote_user, or lambda environ: 'my-service' for a service without users)")
        self.principal = principal
        self.methods = frozenset(m.upper() for m in methods)
        self.key_required = key_required
        if check_at_startup:
            runner.check(startup_wait)
            if isinstance(runner.pool, SimplePool):
                # Nothing open is inherited by the workers a preforking server
                # (gunicorn --preload) forks after the import.
                runner.pool.close()

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET").upper()
        if method not in self.methods:
            return self.app(environ, start_response)
        raw_key = environ.get("HTTP_IDEMPOTENCY_KEY")
        if raw_key is None and not self.key_required:
            return self.app(environ, start_response)
        principal = self.principal(environ) or ""  # refused by the runner: 401 principal-missing
        keys = [] if raw_key is None else [raw_key.encode("latin-1")]  # PEP 3333: bytes as latin-1
        limit = self.runner.config.max_request_body_bytes
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        body = environ["wsgi.input"].read(min(length, limit + 1)) if length > 0 else b""
        target = (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")) or "/"
        if environ.get("QUERY_STRING"):
            target += "?" + environ["QUERY_STRING"]
        req = Request(principal, method, target, keys, body, self.key_required)

        def call_app(claim, conn=None):
            inner = dict(environ)
            inner["wsgi.input"] = io.BytesIO(body)
            inner["CONTENT_LENGTH"] = str(len(body))
            inner[CLAIM] = claim
            if conn is not None:
                inner[CONN] = conn
            got = {}

            def capture(status, headers, exc_info=None):
                got["status"], got["headers"] = status, headers
                return lambda data: got.setdefault("written", []).append(data)

            it = self.app(inner, capture)
            try:
                data = b"".join(it)
            finally:
                if hasattr(it, "close"):
                    it.close()
            data = b"".join(got.get("written", [])) + data
            return Response(int(got["status"].split(" ", 1)[0]), list(got["headers"]), data)

        if self.mode == "lease":
            result = self.runner.run(req, call_app)
        elif self.mode == "fenced":
            result = self.runner.run_fenced(req, lambda conn, claim: call_app(claim, conn))
        else:
            result = self.runner.run_in_transaction(req, lambda conn, claim: call_app(claim, conn))
        r = result.response
        try:
            phrase = http.HTTPStatus(r.status).phrase
        except ValueError:
            phrase = ""
        start_response("%d %s" % (r.status, phrase), list(r.headers))
        return [r.body]
