#!/usr/bin/python3
"""A randomized history of inbox deliveries, checked (TAP 086 runs it).

Worker processes deliver a small set of messages, in two roles, with
random outcomes: the handler succeeds, fails under the savepoint protocol,
fails and is recorded after a full rollback, rolls back and leaves its
attempt unaccounted for, drops its wait lock (pg_advisory_unlock_all) or
its session (DISCARD ALL), dies (the client process exits without a word)
or is terminated (pg_terminate_backend), under random session settings
(read-only by default, the inbox backoff at both ends of its range).
Every run of a handler is logged by a second connection before the handler
starts.  When all workers are gone, every message is delivered once more
with a handler that succeeds (nothing may be stuck), and then, per
message:

  - it ran at most max_attempts times;
  - it is done, with exactly one committed effect and an error_count equal
    to its failed runs, or dead, with error_count = max_attempts = runs and
    no effect: every failure counted once, dead exactly at the cap.

Exit 0 when the history holds; a JSON summary on stdout either way.
"""
import argparse
import hashlib
import json
import multiprocessing
import os
import random
import sys
import time

import psycopg
from psycopg import errors

CONSUMER = "hist"
ROLES = ("hist_a", "hist_b")
CAPS = (1, 2, 3, 30)


def cap_of(message):
    return CAPS[int(hashlib.sha256(message.encode()).hexdigest(), 16) % len(CAPS)]


def setup(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("""
            DROP TABLE IF EXISTS hist_runs, hist_effects;
            CREATE TABLE hist_runs (role text, message text, worker int, step int);
            CREATE TABLE hist_effects (role text, message text);
            DO $$ BEGIN
              IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'hist_a') THEN
                CREATE ROLE hist_a IN ROLE idem_client;
                CREATE ROLE hist_b IN ROLE idem_client;
                CREATE ROLE hist_consumer LOGIN IN ROLE hist_a, hist_b;
              END IF;
            END $$;
            GRANT INSERT ON hist_runs, hist_effects TO hist_a, hist_b, hist_consumer;
            DELETE FROM idem_inbox WHERE consumer = 'hist';
            DELETE FROM idem_outbox WHERE topic = 'idem.inbox.dead' AND payload->>'consumer' = 'hist';
        """)


def payload_hash(message):
    return hashlib.sha256(message.encode()).digest()


def settle_session(conn, rng):
    """Random session settings: read-only default, backoff at its bounds."""
    if rng.random() < 0.3:
        conn.execute("SET default_transaction_read_only = %s" % rng.choice(("on", "off")))
    if rng.random() < 0.2:
        conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION %s"
                     % rng.choice(("READ ONLY", "READ WRITE")))
    if rng.random() < 0.3:
        base, top = rng.choice((("1ms", "1ms"), ("1d", "1d"), ("1ms", "1d"), ("1s", "60s")))
        conn.execute("SET idem.inbox_backoff_base = '%s'" % base)
        conn.execute("SET idem.inbox_backoff_max = '%s'" % top)


def worker(dsn, worker_id, seed, steps, messages, out):
    rng = random.Random(seed)
    # No prepared statements: DISCARD ALL drops them behind psycopg's back.
    conn = psycopg.connect(dsn + " user=hist_consumer", autocommit=True, prepare_threshold=None)
    log = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET lock_timeout = '3s'")
    counts = {}

    def note(what):
        counts[what] = counts.get(what, 0) + 1

    for step in range(steps):
        settle_session(conn, rng)
        role = rng.choice(ROLES)
        message = "m%d" % rng.randrange(messages)
        cap = cap_of(message)
        try:
            conn.execute("SET ROLE %s" % role)
            conn.execute("BEGIN READ WRITE")
            decision = conn.execute(
                "SELECT idem_inbox_begin(%s, %s, %s, %s)",
                (CONSUMER, message, payload_hash(message), cap)).fetchone()[0]
            if decision != "process":
                conn.execute("COMMIT")
                note(decision)
                continue
            log.execute("INSERT INTO hist_runs VALUES (%s, %s, %s, %s)",
                        (role, message, worker_id, step))
            action = rng.choices(
                ("ok", "savepoint_fail", "rollback_fail", "rollback_only", "unlock",
                 "fail_rolled_back", "discard", "die", "terminate"),
                weights=(12, 20, 15, 12, 7, 7, 7, 5, 5))[0]
            note(action)
            if action == "ok":
                conn.execute("INSERT INTO hist_effects VALUES (%s, %s)", (role, message))
                conn.execute("SELECT idem_inbox_done(%s, %s)", (CONSUMER, message))
                conn.execute("COMMIT")
            elif action == "savepoint_fail":
                conn.execute("SAVEPOINT handler")
                conn.execute("INSERT INTO hist_effects VALUES (%s, %s)", (role, message))
                conn.execute("ROLLBACK TO SAVEPOINT handler")
                conn.execute("SELECT idem_inbox_fail(%s, %s, 'savepoint')", (CONSUMER, message))
                conn.execute("COMMIT")
            elif action == "rollback_fail":
                conn.execute("ROLLBACK")
                conn.execute("SET ROLE %s" % role)
                conn.execute("BEGIN READ WRITE")
                conn.execute("SELECT idem_inbox_fail(%s, %s, 'after rollback')", (CONSUMER, message))
                conn.execute("COMMIT")
            elif action == "rollback_only":
                conn.execute("ROLLBACK")
            elif action == "unlock":
                conn.execute("SELECT pg_advisory_unlock_all()")
                conn.execute("ROLLBACK")
            elif action == "fail_rolled_back":
                conn.execute("SAVEPOINT handler")
                conn.execute("ROLLBACK TO SAVEPOINT handler")
                conn.execute("SELECT idem_inbox_fail(%s, %s, 'rolled back')", (CONSUMER, message))
                conn.execute("ROLLBACK")
            elif action == "discard":
                conn.execute("ROLLBACK")
                conn.execute("RESET ROLE")
                conn.execute("DISCARD ALL")
                conn.execute("SET lock_timeout = '3s'")
            elif action == "die":
                out.put((worker_id, counts, "died"))
                out.close()
                out.join_thread()
                os._exit(3)     # the client vanishes: no ROLLBACK, no goodbye
            elif action == "terminate":
                pid = conn.info.backend_pid
                log.execute("SELECT pg_terminate_backend(%s)", (pid,))
                out.put((worker_id, counts, "terminated"))
                return
        except (errors.DeadlockDetected, errors.LockNotAvailable,
                errors.ConfigurationLimitExceeded) as e:
            note(type(e).__name__)
            conn.execute("ROLLBACK")
        except psycopg.Error as e:
            out.put((worker_id, counts, "error: %s %s" % (e.sqlstate, e)))
            return
    conn.execute("RESET ROLE")
    out.put((worker_id, counts, "finished"))


def settle_and_check(dsn, messages):
    violations = []
    finals = {}
    with psycopg.connect(dsn + " user=hist_consumer", autocommit=True) as conn:
        conn.execute("SET lock_timeout = '60s'")
        for role in ROLES:
            for i in range(messages):
                message = "m%d" % i
                conn.execute("SET ROLE %s" % role)
                conn.execute("BEGIN")
                try:
                    d = conn.execute("SELECT idem_inbox_begin(%s, %s, %s, %s)",
                                     (CONSUMER, message, payload_hash(message),
                                      cap_of(message))).fetchone()[0]
                except psycopg.Error as e:
                    violations.append("%s %s: the final delivery failed: %s" % (role, message, e))
                    conn.execute("ROLLBACK")
                    continue
                if d == "process":
                    conn.execute("INSERT INTO hist_runs VALUES (%s, %s, -1, -1)", (role, message))
                    conn.execute("INSERT INTO hist_effects VALUES (%s, %s)", (role, message))
                    conn.execute("SELECT idem_inbox_done(%s, %s)", (CONSUMER, message))
                conn.execute("COMMIT")
                finals[d] = finals.get(d, 0) + 1
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute("""
            SELECT r.role, r.message, r.runs, coalesce(e.effects, 0),
                   m.state, m.error_count, m.max_attempts
              FROM (SELECT role, message, count(*) AS runs FROM hist_runs GROUP BY 1, 2) r
              LEFT JOIN (SELECT role, message, count(*) AS effects FROM hist_effects GROUP BY 1, 2) e
                USING (role, message)
              LEFT JOIN idem_inbox m
                ON m.consumer = 'hist' AND m.message_id = r.message AND m.scope = r.role::regrole
             ORDER BY 1, 2""").fetchall()
        for role, message, runs, effects, state, error_count, cap in rows:
            where = "%s %s (cap %s, runs %s, effects %s, %s %s)" % (
                role, message, cap_of(message), runs, effects, state, error_count)
            if runs > cap_of(message):
                violations.append("ran more than max_attempts: " + where)
            if effects > 1:
                violations.append("more than one committed effect: " + where)
            if state == "done":
                if effects != 1:
                    violations.append("done without exactly one effect: " + where)
                if error_count != runs - 1:
                    violations.append("done, but error_count is not its failed runs: " + where)
            elif state == "dead":
                if effects != 0 or error_count != cap_of(message) or runs != cap_of(message):
                    violations.append("dead, but not exactly at the cap: " + where)
            else:
                violations.append("neither done nor dead after the final delivery: " + where)
        dead_letters = c.execute("""
            SELECT count(*) FROM idem_outbox WHERE topic = 'idem.inbox.dead'
               AND payload->>'consumer' = 'hist'""").fetchone()[0]
        dead = sum(1 for r in rows if r[4] == "dead")
        if dead_letters != dead:
            violations.append("%d dead messages but %d dead letters" % (dead, dead_letters))
    return rows, finals, violations


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400, help="deliveries in all")
    ap.add_argument("--messages", type=int, default=20, help="per role")
    a = ap.parse_args()

    setup(a.dsn)
    rng = random.Random(a.seed)
    out = multiprocessing.Queue()
    per_life = 40
    remaining = a.steps
    running = {}
    outcomes = {}
    endings = {}
    next_id = 0
    while remaining > 0 or running:
        while remaining > 0 and len(running) < a.workers:
            n = min(per_life, remaining)
            remaining -= n
            p = multiprocessing.Process(target=worker, args=(
                a.dsn, next_id, rng.randrange(1 << 30), n, a.messages, out))
            p.start()
            running[next_id] = p
            next_id += 1
        wid, counts, ending = out.get(timeout=600)
        running.pop(wid).join(timeout=60)
        for k, v in counts.items():
            outcomes[k] = outcomes.get(k, 0) + v
        key = ending if not ending.startswith("error") else "error"
        endings[key] = endings.get(key, 0) + 1
        if ending.startswith("error"):
            print("worker %d: %s" % (wid, ending), file=sys.stderr)
    rows, finals, violations = settle_and_check(a.dsn, a.messages)
    if endings.get("error"):
        violations.append("%d workers ended with an unexpected error" % endings["error"])
    summary = {
        "seed": a.seed, "workers": next_id, "endings": endings, "outcomes": outcomes,
        "final_deliveries": finals, "messages": len(rows),
        "runs": sum(r[2] for r in rows), "violations": violations,
    }
    print(json.dumps(summary, sort_keys=True))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
