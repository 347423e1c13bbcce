"""Consumers and relays killed with SIGKILL (or stalled past their lease)
in processes of their own (messaging_child.py), against the real server:
every effect happens exactly once, nothing is lost, the attempt cap holds,
leased events come back after the lease, and a late ack changes nothing."""

import datetime
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from pg_idem.inbox import Inbox, InboxOutcome
from pg_idem.outbox import Drainer

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "messaging_child.py")
SESSION_ENDED = "consumer session ended during the attempt"


@pytest.fixture(scope="module")
def proc_dsn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS msg_effects (key text, note text)")
    return dsn


@pytest.fixture
def empty_outbox(proc_dsn):
    with psycopg.connect(proc_dsn, autocommit=True) as c:
        c.execute("DELETE FROM idem_outbox")
    return proc_dsn


def rows(dsn, sql, *params):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql, params).fetchall()


class Child:
    """A messaging_child.py process; lines() reads what it printed so far."""

    def __init__(self, *args):
        self.p = subprocess.Popen([sys.executable, CHILD] + [str(a) for a in args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.out = []

    def wait_for(self, predicate, timeout=60):
        """Reads lines until predicate(line) (or the end); the line, or None."""
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            line = self.p.stdout.readline()
            if not line:
                return None
            self.out.append(line.strip())
            if predicate(line.strip()):
                return line.strip()
        return None

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def finish(self):
        rest, _ = self.p.communicate(timeout=120)
        self.out += [line for line in rest.strip().split("\n") if line]
        return self.p.returncode


def wait_until_recorded(dsn, message_id, n):
    """The state once the killed consumer's backend has ended and recorded
    its attempt, the n-th failure (its 'processing' was never committed:
    only the count tells)."""
    until = time.monotonic() + 60
    while time.monotonic() < until:
        state = rows(dsn, "SELECT state, error_count FROM idem_inbox WHERE consumer = 'procs' AND message_id = %s",
                     message_id)
        if state and state[0][1] >= n:
            return state[0][0]
        time.sleep(0.02)
    raise AssertionError("the killed attempt at %s was never recorded" % message_id)


def test_a_consumer_killed_mid_handler_loses_nothing_and_repeats_nothing(proc_dsn):
    ids = ["k-%s-%02d" % (uuid.uuid4().hex[:8], i) for i in range(40)]
    victim = ids[20]
    a = Child("consume", proc_dsn, 5, victim, *ids)
    assert a.wait_for(lambda line: line == "handling " + victim), a.out
    a.kill()  # inside the handler: its insert is in the open transaction
    assert all(line.endswith(" processed") for line in a.out[:20]), a.out

    # The broker redelivers everything that was not acked (and, at least
    # once, some that were): a new consumer gets the whole stream again.
    b = Child("consume", proc_dsn, 5, "-", *ids)
    assert b.finish() == 0
    outcomes = dict(line.split() for line in b.out)
    assert [outcomes[i] for i in ids[:20]] == ["duplicate"] * 20
    assert [outcomes[i] for i in ids[20:]] == ["processed"] * 20
    effects = dict(rows(proc_dsn, "SELECT key, count(*) FROM msg_effects WHERE key = ANY(%s) GROUP BY key", ids))
    assert effects == {i: 1 for i in ids}
    states = rows(proc_dsn, "SELECT message_id, state, error_count, last_error FROM idem_inbox"
                            " WHERE consumer = 'procs' AND message_id = ANY(%s)", ids)
    assert {s for _, s, _, _ in states} == {"done"} and len(states) == len(ids)
    # The killed attempt counted once, with the server's own reason.
    assert [(n, e) for m, _, n, e in states if n] == [(1, SESSION_ENDED)]
    assert [m for m, _, n, _ in states if n] == [victim]


def test_the_cap_holds_when_consumers_are_killed_at_a_poison_message(proc_dsn):
    poison = "poison-" + uuid.uuid4().hex
    for attempt in (1, 2):
        c = Child("consume", proc_dsn, 2, poison, poison)
        assert c.wait_for(lambda line: line.startswith("handling")), c.out
        c.kill()
        assert wait_until_recorded(proc_dsn, poison, attempt) == ("failed" if attempt == 1 else "dead")
    last = Child("consume", proc_dsn, 2, poison, poison)
    assert last.finish() == 0
    assert last.out == [poison + " dead"]  # answered dead; the handler did not run a third time
    assert rows(proc_dsn, "SELECT count(*) FROM msg_effects WHERE key = %s", poison) == [(0,)]
    assert rows(proc_dsn, "SELECT state, error_count FROM idem_inbox WHERE message_id = %s", poison) == [("dead", 2)]
    assert rows(proc_dsn, "SELECT count(*) FROM idem_outbox WHERE topic = 'idem.inbox.dead'"
                          " AND payload ->> 'message_id' = %s", poison) == [(1,)]
    # An in-process consumer agrees.
    assert Inbox(proc_dsn, max_attempts=2).handle("procs", poison, "p", lambda conn: None).outcome \
        == InboxOutcome.DEAD


def test_a_relay_killed_mid_batch_loses_nothing(empty_outbox):
    dsn = empty_outbox
    with psycopg.connect(dsn) as c:
        ids = [r[0] for r in c.execute("SELECT idem_outbox_stage('procs', jsonb_build_object('n', g),"
                                       " CASE WHEN g % 3 = 0 THEN 'key-' || (g % 7) END)"
                                       " FROM generate_series(1, 300) g ORDER BY 1").fetchall()]
    # It hangs at its 150th publish, halfway through its second batch (the
    # first acked by then); the lease leaves the first batch's 100 publishes
    # time on a loaded machine.
    r = Child("relay", dsn, 100, 5, 0.005, 150)
    assert r.wait_for(lambda line: line.startswith("published") and len(r.out) >= 150), r.out[-3:]
    r.kill()
    killed = {int(line.split()[1]) for line in r.out if line.startswith("published")}
    leased = rows(dsn, "SELECT id, available_at FROM idem_outbox_claimed"
                       " WHERE state = 'pending' AND claim_token IS NOT NULL ORDER BY id")
    batch = {i for i, _ in leased}  # the batch it was in: held by its lease
    lease_end = max(t for _, t in leased)
    acked = killed - batch
    assert len(acked) == 100 and killed & batch and batch - killed, "killed mid-batch"

    published = []

    def publish(e):
        published.append((e.id, e.attempts, e.lease_expires_at))
    d = Drainer(dsn, publish, batch=100, lease=30)
    until = time.monotonic() + 60
    while time.monotonic() < until and len(published) < 300 - len(acked):
        if d.drain_once().claimed == 0:
            time.sleep(0.05)
    # Everything not acked, once: nothing lost, nothing acked published again.
    assert sorted(i for i, _, _ in published) == sorted(set(ids) - acked)
    for i, attempts, lease_expires_at in published:
        if i in batch:
            # Came back only after the dead relay's lease, claimed a second time.
            assert attempts == 2 and lease_expires_at - datetime.timedelta(seconds=30) >= lease_end, i
        else:
            assert attempts == 1, i
    assert rows(dsn, "SELECT count(*), count(DISTINCT id) FROM idem_outbox_archive WHERE id = ANY(%s)", ids) \
        == [(300, 300)]
    assert rows(dsn, "SELECT count(*) FROM idem_outbox WHERE state <> 'published'") == [(0,)]


def test_a_stalled_relay_s_late_ack_changes_nothing(empty_outbox):
    dsn = empty_outbox
    with psycopg.connect(dsn) as c:
        ids = [r[0] for r in c.execute("SELECT idem_outbox_stage('stall', jsonb_build_object('n', g))"
                                       " FROM generate_series(1, 5) g ORDER BY 1").fetchall()]
    s = Child("stall", dsn, 1)
    assert s.wait_for(lambda line: line.startswith("publishing")) == "publishing %d" % ids[0]
    time.sleep(1.2)  # past its lease: another relay takes the batch over and publishes it
    taken = Drainer(dsn, lambda e: None).drain_once()
    assert (taken.claimed, taken.acked) == (5, 5)
    archived = rows(dsn, "SELECT id, claim_token, published_at FROM idem_outbox_archive ORDER BY id")
    s.p.stdin.write("go\n")
    s.p.stdin.flush()
    assert s.finish() == 0
    report = json.loads(s.out[-1])
    assert (report["published"], report["acked"], report["lease_lost"], report["expired"]) == (1, 0, 1, 4)
    # The late ack changed nothing: the same archive rows, tokens and times.
    assert rows(dsn, "SELECT id, claim_token, published_at FROM idem_outbox_archive ORDER BY id") == archived
    assert [i for i, _, _ in archived] == ids
