#!/usr/bin/env python3
"""The broker suite: the recipes of docs/guides/brokers.md, run as written
against a real RabbitMQ server, with consumers and relays killed.

    AMQP_URL=amqp://... python3 tests/broker/run.py [python] [node]

The page's `<!-- example: python|node broker FILE -->` blocks are written
to FILE and run as programs, in the language asked (both by default); its
SQL blocks set up the database "app" as the examples suite does
(tests/docs/run_examples.py, whose helpers this uses). The libpq
environment names the cluster and a superuser, as for run_examples.py;
the programs run as my_service_role. For each language:

  consumers  200 orders published to the exchange (some twice, as
             producers do) for two consumers; the first delivery of order
             13 sleeps in the database and its consumer is killed with
             SIGKILL there (a third consumer takes its place). Then order
             201 fails twice and succeeds, order 0 always fails (a CHECK),
             and order 200's message id comes again with another body.
             Every order is shipped exactly once; the killed attempt was
             counted; order 0 is dead after 5 attempts with its dead letter
             staged, its attempts at least the sum of their retry_after
             apart (the delay queue); 201's failures delayed it as long;
             the reused id was a mismatch and shipped nothing.
  relay      1000 events staged; a relay publishes them to the consumers and
             is killed (SIGKILL) in the middle of a batch; another relay
             finishes and stops on SIGTERM. Every order is shipped exactly
             once, every event archived once, and the events the dead relay
             held were claimed again only after its lease.

Prints "ok ..." / "not ok ..." per check and "broker recipes: N passed,
N failed" last. Test-only hooks live in the database (a trigger on
shipments, created here): the recipes are run unchanged.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pika

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "docs"))
import run_examples  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "guides", "brokers.md")
BACKOFF_BASE = 0.2   # idem.inbox_backoff_base for the consumers' role: 0.2, 0.4, 0.8, 1.6 s
LEASE = 2            # the relays' lease (s)
DEADLINE = 120       # the longest any state is waited for (s)
# Runs as the superuser after the page's SQL: the test's hooks, not the recipe's.
HOOKS = """
CREATE SEQUENCE public.test_slow_once;
CREATE SEQUENCE public.test_flaky;
CREATE FUNCTION public.test_chaos() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    IF NEW.order_id = 13 AND nextval('public.test_slow_once') = 1 THEN
        PERFORM pg_sleep(600);          -- its consumer is killed meanwhile
    END IF;
    IF NEW.order_id = 201 AND nextval('public.test_flaky') <= 2 THEN
        RAISE EXCEPTION 'the warehouse is busy';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_chaos BEFORE INSERT ON shipments FOR EACH ROW EXECUTE FUNCTION public.test_chaos();
-- A killed consumer's backend notices within 100 ms even inside pg_sleep.
ALTER DATABASE app SET client_connection_check_interval = '100ms';
ALTER ROLE my_service_role IN DATABASE app SET idem.inbox_backoff_base = '%dms';
""" % (BACKOFF_BASE * 1000)


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, ok, what, detail=""):
        print("%s %s%s" % ("ok" if ok else "not ok", what, "" if ok or not detail else ": %s" % detail), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok


class Lab:
    """One language's run: the database, the broker, the programs."""

    def __init__(self, lang, runner, tmp, checks):
        self.lang, self.runner, self.tmp, self.checks = lang, runner, tmp, checks
        self.procs = []
        self.files = {}
        self.amqp = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
        self.channel = self.amqp.channel()

    # ---- the database ----------------------------------------------------------

    def sql(self, text, user=None):
        """Runs text with psql in app; its rows (tab-separated, unaligned)."""
        r = self.runner.psql("-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", db=run_examples.DB, user=user, input=text)
        if r.returncode:
            raise RuntimeError("psql: %s\n%s" % (text.strip()[:200], r.stderr))
        return [line.split("\t") for line in r.stdout.splitlines() if line]

    def value(self, text):
        rows = self.sql(text)
        return rows[0][0] if rows else None

    def prepare(self):
        """A fresh app database set up by the page's SQL, the hooks, and the programs written out."""
        self.runner.prepare(empty=False)
        n = 0
        for b in run_examples.blocks(PAGE):
            kind, opts, prelude = run_examples.parse_marker(b)
            if kind == "sql":
                code, out, err = self.runner.execute(kind, opts, prelude + b.body, n)
                n += 1
                if code:
                    raise RuntimeError("%s: %s" % (b.where(), err))
            elif opts[:1] == ["broker"] and kind == self.lang:
                path = os.path.join(self.tmp, opts[1])
                with open(path, "w", encoding="utf-8") as f:
                    f.write(prelude + b.body)
                self.files[opts[1]] = path
        self.sql(HOOKS)
        self.sql("DELETE FROM idem_outbox_queue; DELETE FROM idem_outbox_archive")  # the page's own event
        want = {"consumer.py", "relay.py"} if self.lang == "python" else {"consumer.js", "relay.js"}
        if set(self.files) != want:
            raise RuntimeError("the page has programs %s for %s, not %s" % (sorted(self.files), self.lang, sorted(want)))
        for q in ("shipping", "shipping.delay", "dead_letters"):
            self.channel.queue_delete(q)
        self.channel.exchange_delete("outbox")

    # ---- the programs ----------------------------------------------------------

    def start(self, program, name):
        env = dict(os.environ, PGDATABASE=run_examples.DB, PGUSER=run_examples.APP_ROLE, PGAPPNAME=name,
                   OUTBOX_LEASE=str(LEASE), OUTBOX_LEASE_MS=str(LEASE * 1000), PGOPTIONS="")
        if self.lang == "python":
            env["PYTHONPATH"] = os.path.join(ROOT, "client", "python")
            cmd = [sys.executable, self.files[program]]
        else:
            env["NODE_PATH"] = os.pathsep.join([os.path.join(ROOT, "tests", "broker", "node_modules"),
                                                self.runner.node_modules()])
            cmd = ["node", self.files[program]]
        log = open(os.path.join(self.tmp, "%s.log" % name), "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)
        p.name, p.log = name, log.name
        self.procs.append(p)
        return p

    def kill(self, p, sig=signal.SIGKILL):
        if p.poll() is None:
            p.send_signal(sig)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        return p.returncode

    def stop_all(self):
        for p in self.procs:
            self.kill(p)

    def output(self, p):
        with open(p.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def outputs(self):
        return "".join(self.output(p) for p in self.procs)

    def wait(self, what, condition):
        """Waits for condition() (a state, never a time); False after DEADLINE."""
        until = time.monotonic() + DEADLINE
        while time.monotonic() < until:
            if condition():
                return True
            for p in self.procs:
                if p.poll() is not None and p.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM):
                    raise RuntimeError("%s exited with %s:\n%s" % (p.name, p.returncode, self.output(p)[-3000:]))
            time.sleep(0.05)
        errors = self.sql("SELECT state, translate(left(last_error, 200), E'\n\t', '  '), count(*) FROM idem_inbox GROUP BY 1, 2 ORDER BY 3 DESC")
        self.checks.check(False, "%s %s in %d s" % (self.lang, what, DEADLINE),
                          "inbox: %s\n%s" % (errors, self.outputs()[-2000:]))
        return False

    # ---- the broker ------------------------------------------------------------

    def publish(self, message_id, order):
        self.channel.basic_publish("outbox", "orders.created", json.dumps(order).encode(),
                                   pika.BasicProperties(message_id=message_id, delivery_mode=2))

    def queue_ready(self, name):
        return self.channel.queue_declare(name, passive=True).method.message_count

    # ---- the scenarios ---------------------------------------------------------

    def consumers(self):
        L, check = self.lang, self.checks.check
        c1, c2 = self.start("consumer." + self.ext, "consumer-1"), self.start("consumer." + self.ext, "consumer-2")
        if not self.wait("consumers declare their queues", lambda: self._exists("shipping.delay")):
            return
        self.channel.confirm_delivery()
        for i in range(1, 201):
            self.publish("a-%d" % i, {"order": i})
            if i % 25 == 0:
                self.publish("a-%d" % i, {"order": i})  # sent twice, as producers do
        sleeper = []
        if not self.wait("the first delivery of order 13 sleeps in a consumer's handler", lambda: sleeper.extend(
                r[0] for r in self.sql("SELECT application_name FROM pg_stat_activity WHERE datname = 'app'"
                                       " AND wait_event = 'PgSleep'")) or sleeper):
            return
        victim = c1 if sleeper[0] == c1.name else c2
        self.kill(victim)
        self.start("consumer." + self.ext, "consumer-3")
        if not self.wait("200 orders settled", lambda: self.value(
                "SELECT count(*) FROM idem_inbox WHERE consumer = 'shipping' AND state = 'done'") == "200"):
            return
        # Then: a flaky order, a poison order, a message id reused with another body.
        self.publish("a-201", {"order": 201})
        self.publish("a-0", {"order": 0})
        self.publish("a-200", {"order": 999})
        if not self.wait("the flaky, poison and reused messages settled", lambda: self.value(
                "SELECT count(*) FROM idem_inbox WHERE consumer = 'shipping' AND state IN ('done', 'dead')") == "202"
                and "a-200 mismatch" in self.outputs()):
            return
        shipped = dict(self.sql("SELECT order_id, count(*) FROM shipments WHERE order_id < 1000 GROUP BY 1"))
        want = {str(i): "1" for i in range(1, 202)}
        check(shipped == want, "%s consumers: every order shipped exactly once, none missing, after a consumer was "
              "killed in its handler" % L,
              "twice: %s; missing: %s" % ([k for k, v in shipped.items() if v != "1"], sorted(set(want) - set(shipped))))
        killed = self.sql("SELECT state, error_count FROM idem_inbox WHERE message_id = 'a-13'")
        check(killed and killed[0][0] == "done" and int(killed[0][1]) >= 1,
              "%s consumers: the attempt killed in the handler was counted (a-13 done, error_count >= 1)" % L, killed)
        dead = self.sql("SELECT state, error_count, extract(epoch FROM dead_at - received_at) FROM idem_inbox"
                        " WHERE message_id = 'a-0'")
        delays = sum(BACKOFF_BASE * 2 ** k for k in range(4))
        check(dead and dead[0][:2] == ["dead", "5"], "%s consumers: the poison order is dead after 5 attempts" % L, dead)
        check(dead and float(dead[0][2]) >= delays - 0.01,
              "%s consumers: its attempts came back through the delay queue no sooner than retry_after "
              "(%.2f s >= %.2f s)" % (L, float(dead[0][2]) if dead else -1, delays))
        check(self.value("SELECT count(*) FROM idem_outbox WHERE topic = 'idem.inbox.dead'"
                         " AND payload ->> 'message_id' = 'a-0'") == "1", "%s consumers: its dead letter is staged" % L)
        flaky = self.sql("SELECT state, error_count, extract(epoch FROM processed_at - received_at) FROM idem_inbox"
                         " WHERE message_id = 'a-201'")
        check(flaky and flaky[0][:2] == ["done", "2"] and float(flaky[0][2]) >= 3 * BACKOFF_BASE - 0.01,
              "%s consumers: a flaky order succeeded on its third attempt, after its retry_after delays" % L, flaky)
        check(self.value("SELECT count(*) FROM shipments WHERE order_id = 999") == "0",
              "%s consumers: a message id reused with another body was a mismatch and shipped nothing" % L)

    def _exists(self, queue):
        try:
            ch = self.amqp.channel()
            ch.queue_declare(queue, passive=True)
            ch.close()
            return True
        except pika.exceptions.ChannelClosedByBroker:
            return False

    def relay(self):
        L, check = self.lang, self.checks.check
        self.channel.queue_declare("dead_letters", durable=True)   # where idem.inbox.dead events go
        self.channel.queue_bind("dead_letters", "outbox", "idem.#")
        self.sql("SELECT count(*) FROM (SELECT idem_outbox_stage('orders.created', jsonb_build_object('order', g),"
                 " key => 'order/' || (g % 100)) FROM generate_series(1001, 2000) g) s", user=run_examples.APP_ROLE)
        leased = []
        for attempt in range(5):
            r = self.start("relay." + self.ext, "relay-%d" % (attempt + 1))
            # Kill it while it holds a batch, once some batches are through.
            self.wait("a relay publishing", lambda: int(self.value(
                "SELECT count(*) FROM idem_outbox_archive WHERE topic = 'orders.created'")) >= 300
                and self.value("SELECT count(*) FROM idem_outbox_claimed WHERE state = 'pending'"
                               " AND claim_token IS NOT NULL AND available_at > clock_timestamp()") != "0")
            self.kill(r)
            leased = self.sql("SELECT id, available_at FROM idem_outbox_claimed WHERE state = 'pending'"
                              " AND claim_token IS NOT NULL AND available_at > clock_timestamp()")
            if leased:
                break
        if not check(bool(leased), "%s relay: killed while it held a batch" % L):
            return
        lease_end = max(t for _, t in leased)
        finisher = self.start("relay." + self.ext, "relay-last")
        if not self.wait("1000 events published and shipped", lambda: self.value(
                "SELECT count(DISTINCT order_id) FROM shipments WHERE order_id > 1000") == "1000"
                and self.value("SELECT count(*) FROM idem_outbox_archive WHERE topic = 'orders.created'") == "1000"):
            return
        check(self.kill(finisher, signal.SIGTERM) == 0, "%s relay: SIGTERM stops the relay cleanly" % L,
              self.output(finisher)[-2000:])
        twice = self.value("SELECT count(*) FROM (SELECT order_id FROM shipments WHERE order_id > 1000"
                           " GROUP BY 1 HAVING count(*) > 1) s")
        check(twice == "0", "%s relay: every order shipped exactly once after the relay was killed mid-batch" % L,
              "%s shipped twice" % twice)
        check(self.value("SELECT count(*) = count(DISTINCT id) FROM idem_outbox_archive") == "t"
              and self.value("SELECT count(*) FROM idem_outbox WHERE topic = 'orders.created'"
                             " AND state <> 'published'") == "0",
              "%s relay: every event archived once, none left behind" % L)
        late = self.sql("SELECT count(*) FROM idem_outbox_archive WHERE id = ANY('{%s}'::bigint[])"
                        " AND (attempts < 2 OR available_at - interval '%d s' < '%s'::timestamptz)"
                        % (",".join(i for i, _ in leased), LEASE, lease_end))
        check(late == [["0"]], "%s relay: the %d events the dead relay held were claimed again only after its lease"
              % (L, len(leased)), late)
        held = {i for i, _ in leased}
        dups = sum(1 for line in self.outputs().splitlines() if line.endswith(" duplicate") and line.split()[0] in held)
        print("   (%s relay: %d events leased when it was killed; the consumers answered %d of their redeliveries "
              "duplicate)" % (L, len(leased), dups), flush=True)

    @property
    def ext(self):
        return "py" if self.lang == "python" else "js"

    def close(self):
        self.stop_all()
        try:
            self.amqp.close()
        except Exception:
            pass


def main(langs):
    checks = Checks()
    tmp = tempfile.mkdtemp(prefix="pg_idem.broker.")
    runner = run_examples.Runner(tmp)
    for lang in langs or ["python", "node"]:
        started = time.monotonic()
        roles = runner.roles()
        lab = Lab(lang, runner, os.path.join(tmp, lang), checks)
        os.makedirs(lab.tmp, exist_ok=True)
        try:
            lab.prepare()
            lab.consumers()
            lab.relay()
        except Exception as e:  # noqa: BLE001 - reported as a failed check, the next language still runs
            checks.check(False, "%s recipes" % lang, "%s: %s\n%s" % (type(e).__name__, e, lab.outputs()[-3000:]))
        finally:
            lab.close()
            runner.drop_database()
            runner.drop_roles(runner.roles() - roles)
        print("   (%s: %.1f s)" % (lang, time.monotonic() - started), flush=True)
    print("broker recipes: %d passed, %d failed" % (checks.passed, checks.failed))
    if checks.failed or not checks.passed:
        print("   (the examples' sources and outputs are kept in %s)" % tmp)
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
