"""What an exhausted connection pool is, told apart from a server that
cannot be reached (issue 31).

A pool that gives no connection in time raises PoolExhausted (pg_idem's
SimplePool and AsyncSimplePool) or psycopg_pool.PoolTimeout (an
application's psycopg_pool): the runner answers the protocol's
pool_exhausted problem, counts its event and logs the pool's size, what
held it and the fix (protocol.toml [client.pool]). Before, it was answered
store_unavailable and logged "the server cannot be reached: check the
dsn", while the server was fine and waiting duplicates held the pool."""

import asyncio
import threading

import psycopg

from . import protocol


class PoolExhausted(psycopg.OperationalError):
    """No connection of the pool came free in time. An OperationalError,
    as psycopg_pool's PoolTimeout is, for code that catches those."""

    def __init__(self, max_size, waited):
        super().__init__("pg_idem: no connection of the pool (max_size %d) came free within %g s"
                         % (max_size, waited))
        self.max_size, self.waited = max_size, waited
        self.held = None  # what held the pool's connections, in words (set by the runner)


def is_pool_exhausted(error):
    """pg_idem's PoolExhausted, or psycopg_pool's PoolTimeout (not imported:
    psycopg_pool is the application's choice)."""
    if isinstance(error, PoolExhausted):
        return True
    t = type(error)
    return t.__name__ == "PoolTimeout" and t.__module__.startswith("psycopg_pool")


def getconn_args(pool, overflow, timeout):
    """The keyword arguments of pool.getconn(): pg_idem's pools take overflow
    and timeout, psycopg_pool's timeout; any other pool none."""
    own = type(pool).__name__ in ("SimplePool", "AsyncSimplePool") and type(pool).__module__.startswith("pg_idem")
    if own:
        return {"overflow": overflow, "timeout": timeout}
    if type(pool).__module__.startswith("psycopg_pool") and timeout is not None:
        return {"timeout": timeout}
    return {}


def explain(error):
    """The fix for an exhausted pool: the protocol's, with the pool's size and
    what held its connections when the runner knows it."""
    size = getattr(error, "max_size", None)
    held = getattr(error, "held", None)
    parts = []
    if size is not None:
        parts.append("the pool has %d connection%s" % (size, "" if size == 1 else "s"))
    if held:
        parts.append("this runner's requests held %s" % held)
    known = ("; ".join(parts) + ": ") if parts else ""
    return "%s%s (SimplePool(max_size=...) or psycopg_pool's max_size; Config.follower_wait_budget)" % (
        known, protocol.POOL_EXHAUSTED_FIX)


def duplicate_slots(pool):
    """How many of the pool's connections waiting duplicates may hold at once
    (protocol.toml [client.pool] duplicates_share), or None for a pool whose
    size is not known (any pool without max_size)."""
    size = getattr(pool, "max_size", None)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return None
    return max(1, int(size * protocol.POOL_DUPLICATES_SHARE))


class Slots:
    """The duplicates' share of a pool, for the blocking runner: a duplicate
    takes a slot before it asks the pool for its next round's connection
    and gives it back with the connection, so that duplicates of a slow
    request never hold more than their share of the pool."""

    def __init__(self, pool):
        self.size = duplicate_slots(pool)
        self._sem = threading.BoundedSemaphore(self.size) if self.size else None
        self._held = set()  # id() of the connections a duplicate holds a slot with

    def take(self, timeout):
        """A slot within timeout seconds, or PoolExhausted; False without a share."""
        if self._sem is None:
            return False
        if not self._sem.acquire(timeout=max(0.0, timeout or 0.0)):
            raise PoolExhausted(self.size, timeout or 0.0)
        return True

    def bind(self, conn):
        self._held.add(id(conn))

    def give_back(self, conn=None):
        """Gives the slot of conn (held with one), or an unbound slot (conn None) back."""
        if conn is None or id(conn) in self._held:
            self._held.discard(id(conn))
            self._sem.release()


class AsyncSlots(Slots):
    """The same for the asyncio runner: a semaphore of the running loop (a
    test client may run each request in a loop of its own)."""

    def __init__(self, pool):
        super().__init__(pool)
        self._sem, self._loop = None, None

    def _bind_loop(self):
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._sem, self._loop = asyncio.BoundedSemaphore(self.size), loop

    async def take(self, timeout):
        if not self.size:
            return False
        self._bind_loop()
        try:
            await asyncio.wait_for(self._sem.acquire(), max(0.0, timeout or 0.0))
        except asyncio.TimeoutError:
            raise PoolExhausted(self.size, timeout or 0.0) from None
        return True
