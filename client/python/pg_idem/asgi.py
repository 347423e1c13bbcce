"""Pure ASGI middleware (Starlette, FastAPI): one line makes an app idempotent.

    app.add_middleware(IdempotencyMiddleware, dsn="dbname=app", principal=header("x-user"))

Requests with an unsafe method (POST, PATCH by default) and an
Idempotency-Key run the app once per key; duplicates get the stored
response with Idempotent-Replayed: true, or an RFC 9457 problem. Requests
without a key pass through unguarded (or get 400 with key_required=True);
one with a key but no principal gets 401 principal-missing. The response
is buffered (no streaming) so that it can be stored. At the lifespan
start-up the runner's check refuses to start on a store it cannot use.
"""

from .aio import AsyncRunner
from .config import with_options
from ._engine import Request
from .http import Response

CLAIM = "pg_idem.claim"   # scope key: the ClaimContext the app runs under
CONN = "pg_idem.conn"     # scope key: the transaction's connection (fenced, in_transaction)


def header(name):
    """A principal function that reads a request header (e.g. set by an auth proxy)."""
    raw = name.lower().encode("latin-1")

    def principal(scope):
        for k, v in scope.get("headers", ()):
            if k == raw:
                return v.decode("latin-1")
        return None  # no principal: a guarded request is refused (401 principal-missing)
    return principal


def authenticated_user(scope):
    """The principal of Starlette's AuthenticationMiddleware: scope["user"].identity."""
    user = scope.get("user")
    identity = getattr(user, "identity", None) if user is not None else None
    return str(identity) if identity else None


class IdempotencyMiddleware:
    """runner: an AsyncRunner (or dsn= / pool= with config=); principal(scope) ->
    the authenticated actor (required: without it one user's key would replay
    another's response; a guarded request for which it gives None or "" is
    answered 401 principal-missing, never run: protocol.toml
    [client.missing_principal]; a route without users names its callers as
    one principal, lambda scope: "webhooks"); mode "lease" (default),
    "fenced" or "in_transaction" (the app finds the transaction's
    AsyncConnection in scope["pg_idem.conn"]). namespace, fingerprint and
    client_errors set the Config's (see pg_idem.Config); on_error and
    metrics are the runner's; check_at_startup: the runner's check at the
    ASGI lifespan start-up, which a store it cannot use fails (after
    waiting up to startup_wait seconds for a server that does not answer
    yet: AsyncRunner.check)."""

    def __init__(self, app, runner=None, *, dsn=None, pool=None, config=None, principal=None,
                 methods=("POST", "PATCH"), mode="lease", key_required=False, on_error=None, metrics=None,
                 check_at_startup=True, startup_wait=None, namespace=None, fingerprint=None,
                 client_errors=None):
        if runner is None:
            if pool is None and dsn is None:
                raise TypeError("IdempotencyMiddleware needs runner=, pool= or dsn=")
            runner = AsyncRunner(pool if pool is not None else dsn,
                                 with_options(config, namespace, fingerprint, client_errors),
                                 on_error=on_error, metrics=metrics)
        elif (namespace, fingerprint, client_errors) != (None, None, None):
            raise TypeError("with runner=, namespace, fingerprint and client_errors are the runner's Config")
        self.check_at_startup, self.startup_wait = check_at_startup, startup_wait
        if mode not in ("lease", "fenced", "in_transaction"):
            raise ValueError("mode must be 'lease', 'fenced' or 'in_transaction'")
        self.app, self.runner, self.mode = app, runner, mode
        if principal is None:
            raise TypeError("IdempotencyMiddleware needs principal=: the authenticated actor is part of the key "
                            "(header(name), authenticated_user, or lambda scope: 'my-service' for a service without users)")
        self.principal = principal
        self.methods = frozenset(m.upper() for m in methods)
        self.key_required = key_required

    async def _lifespan(self, scope, receive, send):
        """At the application's start-up, the runner's check: a store this
        runner cannot use (a role, database or extension missing, a role
        without EXECUTE, a server silent for startup_wait) stops the start
        with what to fix (uvicorn exits), instead of a 503 on every request."""
        refused = []

        async def checked_receive():
            message = await receive()
            if message["type"] == "lifespan.startup" and self.check_at_startup:
                try:
                    await self.runner.check(self.startup_wait)
                except Exception as e:  # noqa: BLE001 -- whatever it is, the start stops with it
                    refused.append(e)
            return message

        async def checked_send(message):
            if refused and message["type"].startswith("lifespan.startup."):
                if len(refused) == 1:  # once: the app's own "failed" that follows is dropped
                    # The server logs the message (uvicorn: "ERROR: pg_idem: ... -- fix: ...").
                    refused.append(None)
                    await send({"type": "lifespan.startup.failed", "message": str(refused[0])})
                raise refused[0]  # the server stops (uvicorn: "Application startup failed. Exiting.")
            await send(message)
        return await self.app(scope, checked_receive, checked_send)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(scope, receive, send)
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            return await self.app(scope, receive, send)
        keys = [v for k, v in scope.get("headers", ()) if k.lower() == b"idempotency-key"]
        if not keys and not self.key_required:
            return await self.app(scope, receive, send)
        # None or "" is refused by the runner (401 principal-missing).
        principal = self.principal(scope) or ""

        limit = self.runner.config.max_request_body_bytes
        chunks, size, more = [], 0, True
        while more and size <= limit:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        body = b"".join(chunks)
        target = scope.get("raw_path") or scope.get("path", "/").encode("utf-8")
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        req = Request(principal, scope["method"].upper(), target.decode("latin-1"),
                      keys, body, self.key_required)

        async def call_app(claim, conn=None):
            sent = []
            delivered = False

            async def replay_receive():
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            async def capture(message):
                sent.append(message)

            inner = dict(scope)
            inner[CLAIM] = claim
            if conn is not None:
                inner[CONN] = conn
            await self.app(inner, replay_receive, capture)
            start = next((m for m in sent if m["type"] == "http.response.start"), None)
            if start is None:
                return Response(500, [], b"")
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", ())]
            data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
            return Response(start["status"], headers, data)

        if self.mode == "lease":
            result = await self.runner.run(req, call_app)
        elif self.mode == "fenced":
            result = await self.runner.run_fenced(req, lambda conn, claim: call_app(claim, conn))
        else:
            result = await self.runner.run_in_transaction(req, lambda conn, claim: call_app(claim, conn))
        r = result.response
        await send({"type": "http.response.start", "status": r.status,
                    "headers": [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in r.headers]})
        await send({"type": "http.response.body", "body": r.body})
