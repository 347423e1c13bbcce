"""What a run is given and gives back (Request, ClaimContext, RunResult),
one request's state while the protocol runs (_Call), and the small helpers
the lease mode (pg_idem._engine) and the transaction modes
(pg_idem._transactions) share."""

import dataclasses
import random
import time

from . import protocol
from .http import Response
from .key import cache_key, request_hash
from .protocol import ClientOutcome as Out

# The longest a follower waits inside one idem_claim / idem_begin call
# (protocol.toml says why). Measured: behind PgBouncer (pool 5) 20 duplicates
# of a 300 ms handler were answered after 0.62-0.70 s with 0.1 s (0.47-0.63 s
# direct); 0.25 s took 1.1 s, and a whole budget's wait 15 s with 409s.
WAIT_SLICE = protocol.DEFAULTS["wait_slice_ms"] / 1000.0
ISOLATION = {None: None, "read committed": "READ COMMITTED", "repeatable read": "REPEATABLE READ",
             "serializable": "SERIALIZABLE"}


@dataclasses.dataclass
class Request:
    """What the runner needs of an incoming request.

    keys is every Idempotency-Key field value as received (zero, one or
    several); principal is the authenticated actor; target is path and query."""
    principal: str
    method: str
    target: str
    keys: list = dataclasses.field(default_factory=list)
    body: bytes = b""
    key_required: bool = False

    def __post_init__(self):
        if isinstance(self.body, str):
            self.body = self.body.encode("utf-8")
        if self.body is None:
            self.body = b""
        if isinstance(self.keys, (str, bytes)):
            self.keys = [self.keys]
        self.keys = list(self.keys or [])


class ClaimContext:
    """What a handler knows about the claim it runs under."""

    def __init__(self, generation=0, claim_id=None, cache_key=None, keeper=None):
        self.generation = generation  # fencing number; strictly increasing per key
        self.claim_id = claim_id      # None when the request runs unguarded
        self.cache_key = cache_key
        self._keeper = keeper

    @property
    def guarded(self):
        return self.claim_id is not None

    @property
    def lost(self):
        """True once renewal found the claim taken over (its result will not be stored)."""
        return bool(self._keeper is not None and self._keeper.lost)


@dataclasses.dataclass
class RunResult:
    """response is what to send; the rest says what happened."""
    response: Response = None
    outcome: str = Out.FAILED  # a protocol.ClientOutcome
    handler_ran: bool = False
    replayed: bool = False
    lease_stolen: bool = False
    outcome_unknown: bool = False
    generation: int = 0
    error: BaseException = None
    # The claim's lifecycle events in this run (protocol.Event, the metrics' event label).
    events: list = dataclasses.field(default_factory=list)


class _Call:
    """Per request state."""

    def __init__(self, cfg, req):
        # The namespace (a service's name) goes where protocol.toml says,
        # as in the other clients, so replicas of one service in two
        # languages share their keys.
        self.ck = cache_key(req.principal, req.method, protocol.namespaced_target(cfg.namespace, req.target),
                            req.keys[0])
        self.rh = request_hash(req.body if cfg.fingerprint is None else cfg.fingerprint(req.body))
        self.deadline = time.monotonic() + cfg.follower_wait_budget
        self.iterations = 0
        self.backoff = cfg.poll_min
        self.discard = False  # the claim's connection goes back closed
        self.conn = None  # the claim's connection while held (Engine.hold)
        self.following = False  # it saw the key in progress: a duplicate
        self.held_as = None  # what Engine.hold counted it as
        self.res = RunResult()


def _remaining(deadline):
    return max(0.0, deadline - time.monotonic())


def _jittered(base, jitter):
    return max(0.001, base * random.uniform(1.0 - jitter, 1.0 + jitter))


def _as_response(value):
    if isinstance(value, Response):
        return value
    if isinstance(value, tuple):
        return Response(*value)
    raise TypeError("a pg_idem handler returns a pg_idem.Response, not %s" % type(value).__name__)


def _sqlstate(e):
    return getattr(e, "sqlstate", None)
