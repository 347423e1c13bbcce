"""What the engine asks its drivers to do (pg_idem._engine yields these;
pg_idem.runner and pg_idem.aio carry them out with blocking calls or
awaits), and the one recovery the drivers make on their own."""

import dataclasses

import psycopg

# A statement the server session does not have (26000) or has already
# under that name (42P05): what a transaction-mode pooler does to psycopg's
# prepared statements. The same statement sent unprepared works.
PREPARED_STATEMENT_ERRORS = ("26000", "42P05")
# The server backend's pid: a pooler (PgBouncer, pgcat, Odyssey) gives its
# clients a backend key of its own, so conn.info.backend_pid differs from it
# there. A transaction-mode pooler gives each transaction any server
# session, where psycopg's prepared statements do not exist (26000), clash
# (42P05) or are another client's: such a connection must not prepare.
BACKEND_PID = "SELECT pg_catalog.pg_backend_pid()"
# Whether the drivers send a Batch in one flight: pipeline mode needs
# libpq 14 or later, at run time and where psycopg was built (psycopg says
# so); with libpq 13 a Batch is sent one statement at a time.
PIPELINE = psycopg.Pipeline.is_supported()


def pipeline_mode():
    """Whether a Batch goes in one flight (the tests turn PIPELINE off to run the fallback)."""
    return PIPELINE


@dataclasses.dataclass
class Query:
    """Run one statement on conn; the driver sends back its first row (or None).

    prepare is psycopg's: None leaves it to the connection (prepare_threshold),
    False sends the statement unprepared."""
    conn: object
    sql: str
    params: tuple = None
    prepare: bool = None


@dataclasses.dataclass
class Batch:
    """Run the queries, all on one connection, in one flight (libpq's
    pipeline mode, pg_idem._flight: one Sync, one round trip); the driver
    sends back the first row (or None) of each. The first that fails
    raises its error and the server skips the rest, as if they had been
    sent one by one and the sequence had stopped there. Where pipeline
    mode is missing (libpq older than 14) they are sent one by one: the
    same results and errors, a round trip each."""
    queries: list


@dataclasses.dataclass
class Acquire:
    """A connection from the pool, in autocommit, no transaction open.

    second: the request already holds one (fenced mode's transaction, a
    fresh connection to store or settle a result). pg_idem's own pools
    give it at once even when max_size are out, so that requests holding
    every connection never wait for each other's second one.

    timeout: the longest to wait for one (seconds; None: the pool's own),
    for a pool that takes it (pg_idem's, psycopg_pool's). Running out
    raises the pool's exhausted error (pg_idem._pool).

    duplicate: for a duplicate's next round, within the duplicates' share
    of the pool (pg_idem._pool.Slots)."""
    second: bool = False
    timeout: float = None
    duplicate: bool = False


@dataclasses.dataclass
class Release:
    """Give conn back to the pool as it was; discard: close it first (the pool drops it)."""
    conn: object
    discard: bool = False


@dataclasses.dataclass
class Sleep:
    seconds: float


@dataclasses.dataclass
class CallHandler:
    """Call fn(*args) (awaiting it when it returns an awaitable); send back its value."""
    fn: object
    args: tuple


@dataclasses.dataclass
class StartKeeper:
    """Renew the claim on conn every renew_interval until StopKeeper; send back the keeper."""
    conn: object
    cache_key: bytes
    claim_id: str


@dataclasses.dataclass
class StopKeeper:
    keeper: object


def _sqlstate(e):
    return getattr(e, "sqlstate", None)


def unprepared_retry(query, error):
    """Whether a driver sends the query again, unprepared: a pooler's
    prepared-statement error (the statement did not run) outside a
    transaction, on a pool the application made with prepare_threshold set.
    That connection prepares nothing from then on."""
    conn = query.conn
    if _sqlstate(error) not in PREPARED_STATEMENT_ERRORS or query.prepare is False or conn.broken:
        return False
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    conn.prepare_threshold = None
    return True
