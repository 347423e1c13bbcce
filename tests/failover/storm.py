#!/usr/bin/env python3
"""A storm of claims, renewals and finalizes that rides through a failover.

    storm.py CONNINFO CLIENTS LOG STOPFILE

CONNINFO lists every node (host=a,b port=1,2 target_session_attrs=read-write),
so a client that loses its primary reconnects to whichever node is the
primary now.  Each of CLIENTS threads runs requests with keys of its own:
claim (lease 30 s), renew, the "handler", finalize.  Every answer the
server acknowledged is appended to LOG as one line:

    claimed KEY CLAIM_ID GENERATION    the claim committed
    ran KEY                            the handler ran (once per key, at most)
    finalized KEY                      idem_finalize returned true
    settled KEY                        a finalize of unknown outcome was found committed
    reconnected KEY STEP               the connection broke during STEP; reconnected

A statement whose connection broke has an unknown outcome; the client
settles it on the new primary by reading the key, never by running the
handler again: a finalize found completed is settled, one found still
pending (it did not commit) is sent again with the same claim id and the
same stored response; a claim of unknown outcome is given up (the key is
recovered after its lease by the next request).  The threads stop when
STOPFILE exists.
"""
import hashlib
import os
import sys
import threading
import time

import psycopg

CONNINFO, CLIENTS, LOG, STOPFILE = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
log_lock = threading.Lock()


def log(*fields):
    """Append one acknowledged event to the log, flushed at once."""
    with log_lock, open(LOG, "a") as f:
        f.write(" ".join(str(x) for x in fields) + "\n")
        f.flush()


def connect():
    """A connection to the current primary; waits out the failover (60 s at most).

    client_encoding UTF8: on a SQL_ASCII cluster (initdb without a locale)
    psycopg would return text columns as bytes, and b"claimed" is not
    "claimed" (see also text())."""
    deadline = time.time() + 60
    while True:
        try:
            return psycopg.connect(CONNINFO, autocommit=True, client_encoding="UTF8")
        except psycopg.OperationalError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def key_of(label):
    """The cache key the test recomputes: SHA-256 of 'storm:' || label."""
    return hashlib.sha256(b"storm:" + label.encode()).digest()


def text(v):
    """A text column as str, whatever the connection's encoding."""
    return bytes(v).decode() if isinstance(v, (bytes, bytearray, memoryview)) else v


def one(conn, sql, args):
    """One autocommit statement, its first row (text columns as str)."""
    row = conn.execute(sql, args).fetchone()
    return None if row is None else tuple(text(v) for v in row)


def client(n):
    """Requests until the stop file appears; every acknowledgment logged."""
    conn = connect()
    i = 0
    while not os.path.exists(STOPFILE):
        i += 1
        label = "c%d-%d" % (n, i)
        key, body = key_of(label), ("body " + label).encode()
        h = hashlib.sha256(body).digest()
        step, claim_id = "claim", None
        while step != "done":
            try:
                if step == "claim":
                    outcome, claim_id, gen = one(conn, "SELECT outcome, claim_id, generation "
                                                 "FROM idem_claim(%s, %s, '30 seconds')", (key, h))
                    if outcome not in ("claimed", "recovered_abandoned"):
                        step = "done"  # only an unknown claim of our own leads here
                        continue
                    log("claimed", label, claim_id, gen)
                    step = "renew"
                elif step == "renew":
                    one(conn, "SELECT idem_renew(%s, %s, '30 seconds')", (key, claim_id))
                    log("ran", label)
                    step = "finalize"
                elif step == "finalize":
                    (ok,) = one(conn, "SELECT idem_finalize(%s, %s, 201, '{\"content-type\": \"text/plain\"}', %s)",
                                (key, claim_id, body))
                    if ok:
                        log("finalized", label)
                    step = "done"
            except psycopg.OperationalError:
                conn = connect()
                log("reconnected", label, step)
                # The statement's outcome is unknown: read the key.
                (outcome,) = one(conn, "SELECT outcome FROM idem_lookup(%s, %s)", (key, h))
                if step == "finalize" and outcome == "replay":
                    log("settled", label)
                    step = "done"
                elif step == "claim" and outcome in ("absent", "claimable"):
                    pass  # it did not commit: claim again
                elif step == "claim":
                    step = "done"  # committed or not, it is not known to be ours: leave it
                # renew and finalize of a still pending claim: send again (no new handler run)


threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
