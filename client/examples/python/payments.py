#!/usr/bin/env python3
"""pg_idem from Python (psycopg 3): claim -> work -> finalize, replays,
waiting followers, a mismatch and a failure's cooldown.

Run as the application role (GRANT idem_client) with the usual libpq
environment (PGHOST, PGPORT, PGDATABASE, PGUSER, ...), in a database with
pg_idem and this table, created once by its owner:

    CREATE TABLE example_payments (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL);
    GRANT SELECT, INSERT ON example_payments TO my_service_role;
    GRANT USAGE ON SEQUENCE example_payments_id_seq TO my_service_role;

Every run uses fresh Idempotency-Keys and counts only its own rows, so it
never touches other data.  Exits non-zero if pg_idem does not behave as
documented (EXPECTED_CHARGES=2 in the environment makes it fail on purpose:
run-example.sh checks that it does).
"""
import json
import os
import threading
import time
import uuid

import psycopg

DSN = ""  # libpq environment variables
WAIT_BUDGET = 5.0  # seconds a duplicate waits for the first request, at most


class HandlerFailed(Exception):
    """The payment provider refused: the key gets a cooldown."""


def claim_waits_in_server(conn):
    """Whether idem_claim has 0.3.0's max_wait argument (checked once)."""
    return conn.execute(
        "SELECT to_regprocedure('idem_claim(bytea, bytea, interval, interval)') IS NOT NULL"
    ).fetchone()[0]


def handle_payment(principal, idempotency_key, body, charges, fail=False, keep_response=True):
    """One HTTP request: (status, body, headers). The handler runs once per key."""
    problem = lambda title: json.dumps({"title": title}).encode()
    with psycopg.connect(DSN, autocommit=True) as conn:
        cache_key, request_hash = conn.execute(
            "SELECT idem_key(%s, 'POST', '/payments', %s), idem_request_hash(%s)",
            (principal, idempotency_key, body)).fetchone()
        server_wait = claim_waits_in_server(conn)
        deadline = time.monotonic() + WAIT_BUDGET
        while True:
            left = max(deadline - time.monotonic(), 0.0)
            if server_wait:
                # The server blocks until the first request finishes (or left runs out).
                row = conn.execute(
                    "SELECT outcome, claim_id, response_status, response_headers, response_body,"
                    "       extract(epoch FROM retry_after)"
                    "  FROM idem_claim(%s, %s, NULL, make_interval(secs => %s))",
                    (cache_key, request_hash, left)).fetchone()
            else:
                row = conn.execute(
                    "SELECT outcome, claim_id, response_status, response_headers, response_body,"
                    "       extract(epoch FROM retry_after)"
                    "  FROM idem_claim(%s, %s)", (cache_key, request_hash)).fetchone()
            outcome, claim_id, status, headers, response, retry_after = row
            retry_after = float(retry_after or 1)

            if outcome in ("claimed", "recovered_ttl", "recovered_abandoned"):
                if fail:
                    # The handler failed: a cooldown bounds the retries.
                    conn.execute("SELECT idem_fail(%s, %s)", (cache_key, claim_id))
                    return 502, problem("payment provider refused"), {}
                # Fenced mode: the effect and the finalize commit together.
                with conn.transaction():
                    if not keep_response:
                        # As if the response were over idem.max_response_bytes.
                        conn.execute("SET LOCAL idem.max_response_bytes = 0")
                    charges.append(json.loads(body))
                    payment_id = conn.execute(
                        "INSERT INTO example_payments (key, amount) VALUES (%s, %s) RETURNING id",
                        (idempotency_key, json.loads(body)["amount"])).fetchone()[0]
                    response = json.dumps({"payment": payment_id}).encode()
                    conn.execute(
                        "SELECT idem_finalize(%s, %s, 201, %s, %s, strict => true)",
                        (cache_key, claim_id, '{"content-type": "application/json"}', response))
                return 201, response, {}
            if outcome == "replay":
                return status, bytes(response), {"Idempotent-Replayed": "true"}
            if outcome == "in_progress":
                # Another request runs the handler: wait (bounded), then tell the client to retry.
                if left > 0:
                    if not server_wait:
                        time.sleep(min(retry_after, left, 0.05))
                    continue
                return 409, problem("a request with this key is in progress"), \
                    {"Retry-After": str(max(1, round(retry_after)))}
            if outcome == "cooldown":
                return 503, problem("the last attempt failed; retry later"), \
                    {"Retry-After": str(max(1, round(retry_after)))}
            if outcome == "mismatch":
                return 422, problem("key reused with another body"), {}
            if outcome == "not_replayable":
                return 409, problem("the request ran; its response was too large to keep"), {}
            if outcome == "expired":
                return 410, problem("the key's response is no longer kept; use a new key"), {}
            raise RuntimeError(f"unexpected outcome {outcome}")


def main():
    expected_charges = int(os.environ.get("EXPECTED_CHARGES", "1"))
    run = uuid.uuid4()
    key = f"py-order-{run}"
    charges = []
    body = b'{"amount": 100}'
    results = []

    def request():
        results.append(handle_payment("alice", key, body, charges))

    threads = [threading.Thread(target=request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    statuses = {r[0] for r in results}
    bodies = {r[1] for r in results}
    replays = sum(1 for r in results if r[2].get("Idempotent-Replayed"))
    retry = handle_payment("alice", key, body, charges)
    other = handle_payment("alice", key, b'{"amount": 999}', charges)
    first_charges = len(charges)

    # A failing handler: the retry within the cooldown is not run again.
    failing_key = f"py-failing-{run}"
    failed = handle_payment("alice", failing_key, body, charges, fail=True)
    cooling = handle_payment("alice", failing_key, body, charges)

    # A response too large to keep: the request ran once, its retry is told so.
    large_key = f"py-large-{run}"
    large = handle_payment("alice", large_key, body, charges, keep_response=False)
    large_retry = handle_payment("alice", large_key, body, charges)

    with psycopg.connect(DSN) as conn:
        rows = conn.execute("SELECT count(*) FROM example_payments WHERE key IN (%s, %s, %s)",
                            (key, failing_key, large_key)).fetchone()[0]

    print(f"8 concurrent requests: statuses {sorted(statuses)}, "
          f"{len(bodies)} distinct body, {replays} replays, {first_charges} charge")
    print(f"retry: status {retry[0]}, replayed={bool(retry[2])}, body {retry[1].decode()}")
    print(f"same key, another body: status {other[0]}")
    print(f"failing handler: status {failed[0]}; retry at once: status {cooling[0]},"
          f" Retry-After {cooling[2].get('Retry-After')}")
    print(f"response not kept: status {large[0]}; its retry: status {large_retry[0]}")
    print(f"payments table: {rows} rows of this run")

    ok = (statuses == {201} and len(bodies) == 1 and replays == 7
          and first_charges == expected_charges and len(charges) == first_charges + 1
          and retry[0] == 201 and retry[1] == results[0][1] and retry[2]
          and other[0] == 422 and failed[0] == 502
          and cooling[0] == 503 and "Retry-After" in cooling[2]
          and large[0] == 201 and large_retry[0] == 409 and rows == 2)
    print("python example:", "ok" if ok else "FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
