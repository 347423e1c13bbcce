#!/usr/bin/env python3
"""pg_idem from Python (psycopg 3): claim -> work -> finalize, and a replay.

Run with the usual libpq environment (PGHOST, PGPORT, PGDATABASE, ...).
Exits non-zero if pg_idem does not behave as documented.
"""
import json
import threading

import psycopg

DSN = ""  # libpq environment variables


def handle_payment(principal, idempotency_key, body, charges):
    """Run the handler once per key; duplicates get the stored response."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        cache_key = conn.execute(
            "SELECT idem_key(%s, 'POST', '/payments', %s)",
            (principal, idempotency_key)).fetchone()[0]
        request_hash = conn.execute(
            "SELECT idem_request_hash(%s)", (body,)).fetchone()[0]
        while True:
            outcome, claim_id, status, response = conn.execute(
                "SELECT outcome, claim_id, response_status, response_body"
                "  FROM idem_claim(%s, %s)", (cache_key, request_hash)).fetchone()
            if outcome in ("claimed", "recovered_ttl", "recovered_abandoned"):
                # Fenced mode: the effect and the finalize commit together.
                with conn.transaction():
                    charges.append(json.loads(body))
                    payment_id = conn.execute(
                        "INSERT INTO example_payments (amount) VALUES (%s) RETURNING id",
                        (json.loads(body)["amount"],)).fetchone()[0]
                    response = json.dumps({"payment": payment_id}).encode()
                    conn.execute(
                        "SELECT idem_finalize(%s, %s, 201, %s, %s, strict => true)",
                        (cache_key, claim_id, '{"content-type": "application/json"}', response))
                return 201, response, False
            if outcome == "replay":
                return status, bytes(response), True
            if outcome == "in_progress":
                # Another request is running the handler: poll until it is done.
                conn.execute("SELECT pg_sleep(0.02)")
                continue
            if outcome == "mismatch":
                return 422, b'{"title": "key reused with another body"}', False
            raise RuntimeError(f"unexpected outcome {outcome}")


def main():
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS example_payments"
                     " (id bigserial PRIMARY KEY, amount int NOT NULL)")
        conn.execute("TRUNCATE example_payments")

    charges = []
    body = b'{"amount": 100}'
    results = []

    def request():
        results.append(handle_payment("alice", "py-order-1", body, charges))

    threads = [threading.Thread(target=request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    statuses = {r[0] for r in results}
    bodies = {r[1] for r in results}
    replays = sum(1 for r in results if r[2])
    retry = handle_payment("alice", "py-order-1", body, charges)
    other = handle_payment("alice", "py-order-1", b'{"amount": 999}', charges)

    with psycopg.connect(DSN) as conn:
        rows = conn.execute("SELECT count(*) FROM example_payments").fetchone()[0]

    print(f"8 concurrent requests: statuses {sorted(statuses)}, "
          f"{len(bodies)} distinct body, {replays} replays, {len(charges)} charge")
    print(f"retry: status {retry[0]}, replayed={retry[2]}, body {retry[1].decode()}")
    print(f"same key, another body: status {other[0]}")
    print(f"payments table: {rows} row")

    ok = (statuses == {201} and len(bodies) == 1 and replays == 7 and len(charges) == 1
          and retry == (201, results[0][1], True) and other[0] == 422 and rows == 1)
    print("python example:", "ok" if ok else "FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
