"""A consumer or a relay in a process of its own, for the killed-process
tests (test_messaging_processes.py). Every line it prints is flushed at
once: the parent reads them to know where to kill it.

    messaging_child.py consume DSN MAX_ATTEMPTS HANG_ID ID...
        handles each ID in order for the consumer "procs" (payload "p"),
        the handler inserting msg_effects(key = ID); at HANG_ID it prints
        "handling ID" and hangs inside the handler (to be killed). Prints
        "ID OUTCOME" per message.
    messaging_child.py relay DSN BATCH LEASE DELAY HOLD_AT
        runs a Drainer whose publisher prints "published ID" and sleeps
        DELAY seconds; the HOLD_AT-th publish hangs after its line (to be
        killed there, mid-batch, however late the parent reads it).
    messaging_child.py stall DSN LEASE
        one drain_once whose publisher prints "publishing ID" for the first
        event and waits for a line on stdin (a stall past the lease); then
        prints the batch report as JSON.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pg_idem.inbox import Inbox  # noqa: E402
from pg_idem.outbox import Drainer  # noqa: E402


def say(*words):
    print(*words, flush=True)


def consume(dsn, max_attempts, hang_id, *ids):
    inbox = Inbox(dsn, max_attempts=int(max_attempts))
    for message_id in ids:
        def handler(conn, message_id=message_id):
            conn.execute("INSERT INTO msg_effects (key) VALUES (%s)", (message_id,))
            if message_id == hang_id:
                say("handling", message_id)
                time.sleep(3600)
        say(message_id, inbox.handle("procs", message_id, "p", handler).outcome.value)


def relay(dsn, batch, lease, delay, hold_at):
    publishes = []

    def publish(event):
        say("published", event.id)
        publishes.append(event.id)
        if len(publishes) == int(hold_at):
            time.sleep(3600)
        time.sleep(float(delay))
    Drainer(dsn, publish, batch=int(batch), lease=float(lease), idle_wait=0.2).run()


def stall(dsn, lease):
    def publish(event):
        if not getattr(publish, "stalled", False):
            publish.stalled = True
            say("publishing", event.id)
            sys.stdin.readline()
    say(json.dumps(Drainer(dsn, publish, lease=float(lease), lease_margin=0).drain_once().as_dict()))


if __name__ == "__main__":
    {"consume": consume, "relay": relay, "stall": stall}[sys.argv[1]](*sys.argv[2:])
