"""The payments service of the conformance storm, in Python (pg_idem.Runner,
fenced mode): the same interface as client/cpp/examples/demo/server.cpp.

    python3 client/python/examples/demo_server.py --port 8080 [--bind 127.0.0.1]
        [--dsn CONNINFO] [--wait-budget-ms 1000] [--cooldown-ms 1000]
        [--port-file F] [--pid-file F]

POST /payments (Idempotency-Key and X-Demo-User required; body
{"amount": <int>, "to": "<name>"}), GET /payments/{id}, GET /stats,
GET /healthz. Test hooks X-Demo-Delay-Ms: N and X-Demo-Fail: STATUS.
"""

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from the source tree without installing

import pg_idem  # noqa: E402
from pg_idem import Config, Request, Response, Runner, SimplePool, problem  # noqa: E402


class Refusal(Exception):
    """A request refused before the runner sees it."""

    def __init__(self, status, title, detail):
        super().__init__(title)
        self.response = problem(status, title, detail)


def parse_int(text, lo, hi):
    if not text or not re.fullmatch(r"[0-9]{1,12}", text):
        return None
    v = int(text)
    return v if lo <= v <= hi else None


def hook(headers, name, lo, hi):
    """An optional numeric test-hook header within [lo, hi]; 0 when absent."""
    value = headers.get(name)
    if value is None:
        return 0
    v = parse_int(value, lo, hi)
    if v is None:
        raise Refusal(400, "invalid test hook", "%s must be a whole number from %d to %d." % (name, lo, hi))
    return v


SHAPE = 'The body must be a JSON object {"amount": <integer>, "to": "<name>"}.'


def parse_payment(headers, body):
    """The body, validated before any key is claimed."""
    ctype = headers.get("Content-Type") or ""
    if ctype and not ctype.startswith("application/json"):
        raise Refusal(415, "unsupported media type", "The body must be application/json.")
    try:
        j = json.loads(body)
    except ValueError:
        raise Refusal(400, "invalid body", SHAPE)
    if not isinstance(j, dict):
        raise Refusal(400, "invalid body", SHAPE)
    for k in j:
        if k not in ("amount", "to"):
            raise Refusal(400, "invalid body", 'Unknown member "%s". %s' % (k, SHAPE))
    amount = j.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool):
        raise Refusal(400, "invalid amount", '"amount" must be an integer number of cents.')
    if not 1 <= amount <= 1000000000:
        raise Refusal(400, "invalid amount", '"amount" must be from 1 to 1000000000.')
    to = j.get("to")
    if not isinstance(to, str) or not to or len(to.encode("utf-8")) > 100:
        raise Refusal(400, "invalid recipient", '"to" must be a name of 1 to 100 bytes.')
    return amount, to


class Service:
    def __init__(self, opts):
        self.pool = SimplePool(opts.dsn, max_size=64, max_idle=16)  # the storm sends 50 at once
        self.runner = Runner(self.pool, Config(lease=10.0, follower_wait_budget=opts.wait_budget_ms / 1000.0,
                                               failure_cooldown=opts.cooldown_ms / 1000.0, retry_after=1.0))
        self.executions = 0
        self.outcomes = {}
        self.lock = threading.Lock()

    def prepare(self):
        with self.pool.connection() as conn:
            if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_idem'").fetchone() is None:
                print("demo_server: the extension is missing in this database; run CREATE EXTENSION "
                      "pg_idem first", file=sys.stderr)
                return False
            conn.execute("CREATE TABLE IF NOT EXISTS payments ("
                         " id bigserial PRIMARY KEY, principal text NOT NULL,"
                         " amount bigint NOT NULL CHECK (amount > 0), recipient text NOT NULL,"
                         " generation bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())")
        return True

    @staticmethod
    def principal(headers):
        user = headers.get("X-Demo-User")
        if not user:
            raise Refusal(401, "missing user", "The X-Demo-User header names the payer; it is required.")
        if len(user.encode("latin-1", "replace")) > 100:
            raise Refusal(400, "invalid user", "X-Demo-User is at most 100 bytes.")
        return user

    def create_payment(self, target, headers, body):
        user = self.principal(headers)
        delay = hook(headers, "X-Demo-Delay-Ms", 0, 60000)
        fail = hook(headers, "X-Demo-Fail", 400, 599)
        amount, to = parse_payment(headers, body)
        keys = [k.encode("latin-1") for k in headers.get_all("Idempotency-Key") or []]

        def handler(tx, claim):
            with self.lock:
                self.executions += 1
            if delay:
                time.sleep(delay / 1000.0)
            if fail:
                return problem(fail, "demo failure", "X-Demo-Fail asked for this status; nothing was written.")
            pid = tx.execute("INSERT INTO payments (principal, amount, recipient, generation) "
                             "VALUES (%s, %s, %s, %s) RETURNING id", (user, amount, to, claim.generation)).fetchone()[0]
            return Response(201, [("Content-Type", "application/json"), ("Location", "/payments/%d" % pid)],
                            json.dumps({"id": pid, "amount": amount, "to": to, "user": user}))

        r = self.runner.run_fenced(Request(user, "POST", target, keys, body, key_required=True), handler)
        with self.lock:
            self.outcomes[r.outcome] = self.outcomes.get(r.outcome, 0) + 1
        print("POST %s user=%s key=%s -> %d %s%s" % (target, user, keys[0].decode("latin-1") if keys else "-",
                                                     r.response.status, r.outcome, " (ran)" if r.handler_ran else ""),
              file=sys.stderr)
        return r.response

    def show_payment(self, headers, pid):
        user = self.principal(headers)
        with self.pool.connection() as conn:
            row = conn.execute("SELECT amount, recipient FROM payments WHERE id = %s AND principal = %s",
                               (pid, user)).fetchone()
        if row is None:
            raise Refusal(404, "not found", "No payment %d of this user." % pid)
        return Response(200, [("Content-Type", "application/json")],
                        json.dumps({"id": pid, "amount": row[0], "to": row[1], "user": user}))

    def stats(self):
        with self.pool.connection() as conn:
            rows = conn.execute("SELECT count(*) FROM payments").fetchone()[0]
        with self.lock:
            j = {"handler_executions": self.executions, "executions": self.executions, "payments": rows,
                 "outcomes": dict(self.outcomes)}
        return Response(200, [("Content-Type", "application/json")], json.dumps(j))


def make_handler(svc):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n > 1024 * 1024:
                raise Refusal(413, "request too large", "The body is over 1048576 bytes.")
            return self.rfile.read(n) if n > 0 else b""

        def _send(self, r):
            self.send_response(r.status)
            for n, v in r.headers:
                self.send_header(n, v)
            self.send_header("Content-Length", str(len(r.body)))
            self.end_headers()
            self.wfile.write(r.body)

        def _answer(self, route):
            try:
                self._send(route())
            except Refusal as r:
                self._send(r.response)
            except Exception as e:  # noqa: BLE001
                print("demo_server: request failed: %r" % e, file=sys.stderr)
                self._send(problem(500, "internal error", "The request failed; the server log has the reason."))

        def do_POST(self):
            if self.path.split("?", 1)[0] != "/payments":
                self._body()  # drain it: the connection is kept alive
                return self._send(problem(404, "not found", "No such route."))

            def route():
                return svc.create_payment(self.path, self.headers, self._body())
            self._answer(route)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                return self._send(Response(200, [("Content-Type", "text/plain")], b"ok\n"))
            if path == "/stats":
                return self._answer(svc.stats)
            m = re.fullmatch(r"/payments/(\d{1,18})", path)
            if m:
                return self._answer(lambda: svc.show_payment(self.headers, int(m.group(1))))
            self._send(problem(404, "not found", "No such route."))

    return Handler


def write_file(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.rename(tmp, path)


def main():
    ap = argparse.ArgumentParser(description="pg_idem demo payments service (Python)")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--dsn", default="")
    ap.add_argument("--wait-budget-ms", type=int, default=1000)
    ap.add_argument("--cooldown-ms", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=64)  # accepted for the C++ interface; one thread per request
    ap.add_argument("--port-file")
    ap.add_argument("--pid-file")
    opts = ap.parse_args()
    if not 0 <= opts.port <= 65535 or not 1 <= opts.wait_budget_ms <= 600000 or not 1 <= opts.cooldown_ms <= 600000:
        ap.error("a value is out of range")
    svc = Service(opts)
    if not svc.prepare():
        return 1
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer((opts.bind, opts.port), make_handler(svc))
    port = server.server_address[1]
    if opts.pid_file:
        write_file(opts.pid_file, str(os.getpid()))
    if opts.port_file:
        write_file(opts.port_file, str(port))
    print("pg_idem %s demo server (python) listening on http://%s:%d (wait budget %d ms, cooldown %d ms)"
          % (pg_idem.__version__, opts.bind, port, opts.wait_budget_ms, opts.cooldown_ms), flush=True)
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    print("demo server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
