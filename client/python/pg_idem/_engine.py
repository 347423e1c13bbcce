"""The single-flight protocol, written once for the sync and asyncio runners.

Every step is a generator that yields the I/O it needs (a statement, a
connection, a sleep, the handler's call, the lease keeper) to a driver:
pg_idem.runner drives it with blocking calls and a renewal thread,
pg_idem.aio with awaits and a renewal task. The protocol is the C++
client's (client/cpp/src/runner/runner.cpp) without the advisory-lock wake-up:
followers use the server-side wait, idem_claim(..., max_wait), when the
server has it (0.3.0 and newer; not with Config(server_wait=False)), and
poll idem_lookup with jittered backoff otherwise. The claims pass
lock_wait as an argument where the server takes it (0.6.0 and newer) and
set lock_timeout around the call on older servers (_statements._Legacy).

The names of outcomes, events and problems are the protocol's constants
(pg_idem.protocol, generated from extension/protocol/protocol.toml), never
string literals: the static suite refuses a literal copy.
"""

import dataclasses
import random
import time

import psycopg

from . import protocol
from ._checks import Reporter, log, router_refusal, verify
from .protocol import Action, ClientErrors, ClientOutcome as Out, Event, ServerOutcome
from .config import Config
from .http import (FAIL, FINALIZE, RELEASE, REPLAY_HEADER, HeaderAllowlist, Response,
                   classify, headers_from_json, problems)
from .key import KeyStatus, cache_key, check_key_header, request_hash
# The I/O the engine asks its drivers for (the drivers use e.Query, e.unprepared_retry, ...).
from ._ops import (BACKEND_PID, PREPARED_STATEMENT_ERRORS, Acquire, Batch, CallHandler, Query,  # noqa: F401
                   Release, Sleep, StartKeeper, StopKeeper, pipeline_mode, unprepared_retry)
# _ms_text, _lock_wait_text and parse_size_setting are the drivers' and tests' too.
from ._statements import Statements, _lock_wait_text, _ms_text, _text, parse_row, parse_size_setting

# How many times a result whose handler has run is sent (each failure
# settled by reading the key) before it is left to its lease.
STORE_ATTEMPTS = 3
# The longest a follower waits inside one idem_claim / idem_begin call
# (protocol.toml says why). Measured: behind PgBouncer (pool 5) 20 duplicates
# of a 300 ms handler were answered after 0.62-0.70 s with 0.1 s (0.47-0.63 s
# direct); 0.25 s took 1.1 s, and a whole budget's wait 15 s with 409s.
WAIT_SLICE = protocol.DEFAULTS["wait_slice_ms"] / 1000.0
ISOLATION = {None: None, "read committed": "READ COMMITTED", "repeatable read": "REPEATABLE READ",
             "serializable": "SERIALIZABLE"}


# ---- results ------------------------------------------------------------------------

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


class Engine:
    """The protocol; shared (and thread safe) between the requests of one runner."""

    def __init__(self, cfg=None, on_error=None, metrics=None):
        self.cfg = cfg or Config()
        if not isinstance(self.cfg, Config):
            raise TypeError("cfg must be a pg_idem.Config")
        if on_error is not None and not callable(on_error):
            raise TypeError("on_error must be callable (it is given a pg_idem.ErrorReport)")
        self.reporter = Reporter(on_error)
        self.metrics = metrics
        self.allow = HeaderAllowlist(self.cfg.replay_headers)
        self.sql = Statements(self.cfg.schema)
        self.server_wait = None  # (claim, begin) once checked; per runner, i.e. per pool
        self.lock_wait = False  # the server takes lock_wait (0.6.0), once checked
        self.router = False  # the server is a PL/Proxy router (no extension), once checked

    # ---- shared pieces ----------------------------------------------------------

    def finish(self, c, outcome):
        c.res.outcome = outcome
        return c.res

    def answer(self, c, response, outcome):
        c.res.response = response
        return self.finish(c, outcome)

    def unavailable(self, c, err):
        c.res.error = c.res.error or err
        return self.answer(c, problems.store_unavailable(self.cfg.profile, self.cfg.retry_after), Out.FAILED)

    def timed_out(self, c):
        """The answer of a follower whose wait budget ran out (the protocol's in_progress)."""
        o = protocol.OUTCOMES[ServerOutcome.IN_PROGRESS]
        return self.answer(c, problems.by_name(o.problem, self.cfg.profile, self.cfg.retry_after), o.result)

    def prepare(self, req):
        """(early answer, call): the answer when the request goes no further;
        call None for a request without a key that may run unguarded."""
        p = self.cfg.profile
        ks = check_key_header(req.keys)
        if ks is KeyStatus.ABSENT and req.key_required:
            return RunResult(problems.missing_key(p), Out.REJECTED), None
        if ks not in (KeyStatus.ABSENT, KeyStatus.OK):
            return RunResult(problems.invalid_key(p, ks), Out.REJECTED), None
        if len(req.body) > self.cfg.max_request_body_bytes:
            return RunResult(problems.request_too_large(p, self.cfg.max_request_body_bytes), Out.REJECTED), None
        if ks is KeyStatus.ABSENT:
            return None, None
        return None, _Call(self.cfg, req)

    def classify(self, status):
        """The protocol's storage rule, but for the validation failures (400,
        422) under Config.client_errors="release" (the default, as Stripe):
        not stored, so that the corrected retry with the same key runs."""
        action = classify(status)
        if (action == FINALIZE and status in protocol.VALIDATION_STATUSES
                and self.cfg.client_errors == ClientErrors.RELEASE):
            return RELEASE
        return action

    def capabilities(self, conn, again=False):
        """Checks once per runner (until it passes) that the extension is
        there, new enough (or a router has the functions the runner calls),
        callable by this role and on its path; raises StoreMisconfigured
        with the fix when it is not usable. (claim, begin): whether the
        runner lets followers wait in the server."""
        if self.server_wait is None or again:
            t = yield Query(conn, self.sql.preflight, None, False)
            claim_wait, begin_wait, self.lock_wait, self.router = verify(t, self.cfg, conn.info.dbname)
            self.server_wait = (False, False) if self.cfg.server_wait is False else (claim_wait, begin_wait)
        return self.server_wait

    @property
    def calls(self):
        """The claims and the renewal in the form the server takes (after capabilities())."""
        return self.sql if self.lock_wait else self.sql.legacy

    def refuse_router(self, c, conn, mode):
        """The 503 for a mode that cannot go through a PL/Proxy router
        (_checks.router_refusal), before anything is claimed; None when the
        server is not one."""
        try:
            yield from self.capabilities(conn)
        except psycopg.Error as e:
            return self.unavailable(c, e)
        return self.unavailable(c, router_refusal(mode)) if self.router else None

    def check(self):
        """Runner.check(): the first-use check, now, on a connection of the pool."""
        conn = yield Acquire()
        try:
            yield from self.capabilities(conn, again=True)
        finally:
            yield Release(conn)

    def observe(self, req, res):
        """After a run: a store error is logged once per cause and handed to
        on_error; the metrics count the outcome."""
        if res is None:
            return res
        if res.error is not None:
            self.reporter.report(res.error, req)
        if res.lease_stolen and Event.LEASE_STOLEN not in res.events:
            res.events.append(Event.LEASE_STOLEN)
        if res.outcome_unknown and Event.UNKNOWN_OUTCOME not in res.events:
            res.events.append(Event.UNKNOWN_OUTCOME)
        if self.metrics is not None:
            try:
                self.metrics.on_outcome(res.outcome)
                for name in res.events:
                    self.metrics.on_event(name)
            except Exception:  # counting must never change the answer
                log.exception("pg_idem: the metrics hook raised")
        return res

    def claim(self, c, conn, wait):
        caps = yield from self.capabilities(conn)
        rem = _remaining(c.deadline)
        lease = _ms_text(self.cfg.lease)
        if wait and caps[0]:
            # The server's own wait ends first; lock_timeout only guards it.
            # In slices: a waiting follower holds a server connection only
            # for a slice, so behind a transaction-mode pooler with fewer
            # server connections than followers the winner still gets one
            # to store its result (the server wakes a follower the moment
            # the winner commits, so a slice costs no latency).
            part = min(rem, WAIT_SLICE)
            t = yield Query(conn, self.calls.claim_wait, dict(ck=c.ck, rh=c.rh, lease=lease, wait=_ms_text(part),
                                                              lock=_lock_wait_text(part + 1.0)))
        else:
            t = yield Query(conn, self.calls.claim, dict(ck=c.ck, rh=c.rh, lease=lease, lock=_lock_wait_text(rem)))
        return parse_row(t)

    def lookup(self, c, conn):
        return parse_row((yield Query(conn, self.sql.lookup, (c.ck, c.rh))))

    def on_row(self, c, row):
        """A follower's answer, or "wait" / "claim": what the protocol's
        OUTCOMES table says a client does with the row's outcome."""
        o = protocol.OUTCOMES.get(row.outcome)
        if o is None or o.action == Action.RUN:
            # A win is the claim's (loop), never a follower's or a lookup's.
            raise psycopg.DataError("pg_idem: unexpected claim outcome '%s'" % row.outcome)
        if o.action == Action.REPLAY:
            headers = headers_from_json(row.headers_json)
            headers.append((REPLAY_HEADER, "true"))
            c.res.response = Response(row.status or 200, headers, row.body or b"")
            c.res.replayed = True
            return self.finish(c, o.result)
        if o.action == Action.ANSWER:
            if o.name == ServerOutcome.COOLDOWN:
                c.res.events.append(Event.RETRYABLE_COOLDOWN)
            ra = row.retry_after if row.retry_after is not None else self.cfg.retry_after
            return self.answer(c, problems.by_name(o.problem, self.cfg.profile, ra), o.result)
        return o.action  # Action.WAIT or Action.CLAIM

    def follow(self, c, row, server_wait):
        """The answer, or (claim?, wait in the server?) for the next round."""
        try:
            n = self.on_row(c, row)
        except psycopg.Error as e:
            return self.unavailable(c, e)
        if isinstance(n, RunResult):
            return n
        if n == Action.CLAIM:
            return (True, False)
        if Event.PENDING_WAIT not in c.res.events:
            c.res.events.append(Event.PENDING_WAIT)
        if time.monotonic() >= c.deadline:
            return self.timed_out(c)
        if server_wait:
            return (True, True)  # claim again, waiting in the server up to the budget
        nap = _jittered(c.backoff, self.cfg.poll_jitter)
        if row.retry_after is not None:
            nap = min(nap, row.retry_after + 0.001)
        nap = min(nap, _remaining(c.deadline))
        c.backoff = min(c.backoff * 2, self.cfg.poll_max)
        if nap > 0:
            yield Sleep(nap)
        return (False, False)

    def loop(self, c, conn, win, claim_first=True):
        do_claim, wait = claim_first, False
        while True:
            c.iterations += 0 if wait else 1  # slices of a wait are bounded by its deadline
            if c.iterations > self.cfg.max_iterations:
                return self.timed_out(c)
            try:
                row = (yield from self.claim(c, conn, wait)) if do_claim else (yield from self.lookup(c, conn))
            except psycopg.errors.LockNotAvailable:
                # The key is locked by an idem_begin transaction.
                if time.monotonic() >= c.deadline:
                    return self.timed_out(c)
                continue
            except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected):
                yield Sleep(_jittered(self.cfg.poll_min, self.cfg.poll_jitter))
                continue
            except psycopg.Error as e:
                return self.unavailable(c, e)
            if do_claim and row.won:
                c.res.events.append(row.outcome)  # a winner's outcome is its event (protocol.toml)
                return (yield from win(row))
            caps = self.server_wait or (False, False)
            n = yield from self.follow(c, row, caps[0])
            if isinstance(n, RunResult):
                return n
            do_claim, wait = n

    def give_up(self, c, conn, claim_id, action):
        """idem_release / idem_fail by status; a lost claim is lease_stolen."""
        fresh = None
        try:
            if conn is None or conn.broken:
                conn = fresh = yield Acquire(second=True)
            if action == FAIL:
                t = yield Query(conn, self.sql.fail, (c.ck, claim_id, _ms_text(self.cfg.failure_cooldown)))
            else:
                t = yield Query(conn, self.sql.release, (c.ck, claim_id))
            if not t or not t[0]:
                c.res.lease_stolen = True
        except psycopg.Error as e:
            c.res.error = c.res.error or e
            c.res.events.append(Event.RELEASE_ERROR)
        finally:
            if fresh is not None:
                yield Release(fresh)

    def finalize_params(self, c, claim_id, resp, strict):
        over = len(resp.body) > self.cfg.max_cacheable_response_bytes
        body = resp.body[:1] if over else resp.body
        return (c.ck, claim_id, resp.status, self.allow.to_json(resp.headers), body, strict, over)

    def uncached(self, resp, setting):
        cap = parse_size_setting(setting)
        return len(resp.body) > self.cfg.max_cacheable_response_bytes or (cap is not None and len(resp.body) > cap)

    def settle(self, c, claim_id, generation):
        """After a finalize lost with its connection or refused: did it commit?
        Renewing waits for a commit in flight and says whether the claim is
        still ours (and gives it a full lease). Unprepared: a statement cache
        the server session does not share may be what failed."""
        try:
            conn = yield Acquire(second=True)
        except psycopg.Error as e:
            c.res.error = c.res.error or e
            return "unknown", None
        try:
            t = yield Query(conn, self.calls.renew, dict(ck=c.ck, claim=claim_id, lease=_ms_text(self.cfg.lease),
                                                         lock=_lock_wait_text(self.cfg.follower_wait_budget)), False)
            if t and t[0]:
                return "not_committed", conn
            row = parse_row((yield Query(conn, self.sql.lookup, (c.ck, c.rh), False)))
            if (row.outcome in (ServerOutcome.REPLAY, ServerOutcome.NOT_REPLAYABLE)
                    and row.generation in (0, generation)):
                return "committed", conn
            return "lost", conn
        except psycopg.Error as e:
            c.res.error = c.res.error or e
            return "unknown", conn

    # ---- lease mode ---------------------------------------------------------------------

    def run(self, req, handler):
        early, c = self.prepare(req)
        if early is not None:
            return early
        if c is None:
            res = RunResult(handler_ran=True)
            res.response = _as_response((yield CallHandler(handler, (ClaimContext(),))))
            res.outcome = Out.UNGUARDED
            return res
        try:
            conn = yield Acquire()
        except psycopg.Error as e:
            return self.unavailable(c, e)
        try:
            return (yield from self.loop(c, conn, lambda row: self.win_lease(c, conn, row, handler)))
        finally:
            yield Release(conn, c.discard)

    def win_lease(self, c, conn, row, handler):
        c.res.generation = row.generation
        keeper = yield StartKeeper(conn, c.ck, row.claim_id)
        ctx = ClaimContext(row.generation, row.claim_id, c.ck, keeper)
        try:
            c.res.handler_ran = True
            resp = _as_response((yield CallHandler(handler, (ctx,))))
        except Exception:
            yield StopKeeper(keeper)
            yield from self.give_up(c, conn, row.claim_id, FAIL)
            self.finish(c, Out.FAILED)
            raise
        yield StopKeeper(keeper)
        yield from self.store_lease(c, conn, row, resp)
        # Not stored: the caller is told so, never given a response a retry could not replay.
        c.res.response = (problems.outcome_unknown(self.cfg.profile, self.cfg.retry_after)
                          if c.res.outcome_unknown else resp)
        return self.finish(c, c.res.outcome)

    def store_lease(self, c, conn, row, resp):
        action = self.classify(resp.status)
        if action != FINALIZE:
            yield from self.give_up(c, conn, row.claim_id, action)
            c.res.outcome = Out.FAILED if action == FAIL else Out.WON_COMPLETED
            return
        params = self.finalize_params(c, row.claim_id, resp, False)
        # The handler has run: whatever goes wrong from here, the key is
        # never released or failed (a duplicate would run the handler again).
        # A failed finalize is sent again on a fresh connection, unprepared
        # (a pooler's prepared-statement error is the usual cause), once
        # reading the key shows it still ours and empty; what cannot be
        # stored stays pending to its lease, and the same request recovers it.
        target, prepare = conn, None
        for _ in range(STORE_ATTEMPTS):
            fresh = None
            try:
                if target is None or target.broken:
                    target = fresh = yield Acquire(second=True)
                t = yield Query(target, self.sql.finalize, params, prepare)
            except psycopg.Error as e:
                c.res.error = e
                c.res.events.append(Event.FINALIZE_ERROR)
                discard = target is not None and (target.broken or _sqlstate(e) in PREPARED_STATEMENT_ERRORS)
                if fresh is not None:
                    yield Release(fresh, discard)
                elif discard:
                    c.discard = True
                target, prepare = None, False
                # It may have committed (a lost connection): read the key, never re-run.
                state, probe = yield from self.settle(c, row.claim_id, row.generation)
                if probe is not None:
                    yield Release(probe)
                if state == "not_committed":
                    continue
                if state == "committed":
                    c.res.outcome = Out.WON_COMPLETED
                elif state == "lost":
                    c.res.lease_stolen, c.res.outcome = True, Out.WON_COMPLETED
                else:
                    c.res.outcome_unknown, c.res.outcome = True, Out.FAILED
                return
            if fresh is not None:
                yield Release(fresh)
            if not t or not t[0]:
                c.res.lease_stolen, c.res.outcome = True, Out.WON_COMPLETED
                return
            c.res.outcome = Out.COMPLETED_UNCACHEABLE if self.uncached(resp, _text(t[1])) else Out.WON_COMPLETED
            c.res.events.append(Event.FINALIZED)
            return
        c.res.outcome_unknown, c.res.outcome = True, Out.FAILED

    # ---- transactions ----------------------------------------------------------------

    # Transaction control is never prepared: psycopg prepares a statement
    # after prepare_threshold uses, and a COMMIT refused by a pooler's
    # prepared-statement clash would take the handler's writes down.
    def begin_query(self, conn, isolation):
        level = ISOLATION.get(isolation)
        return Query(conn, "BEGIN ISOLATION LEVEL " + level if level else "BEGIN", None, False)

    def begin(self, conn, isolation):
        yield self.begin_query(conn, isolation)

    def rollback_quietly(self, conn, flight=False):
        """flight: in-transaction mode's, sent as a Batch. psycopg, when it
        sees a ROLLBACK, forgets its prepared statements and sends
        DEALLOCATE ALL, which would take the flights' prepared claim with
        them; prepared statements outlive a rollback, so it need not."""
        if conn is not None and not conn.broken:
            try:
                rollback = Query(conn, "ROLLBACK", None, False)
                yield Batch([rollback]) if flight else rollback
            except psycopg.Error:
                pass

    def unguarded_tx(self, handler, isolation):
        res = RunResult(handler_ran=True)
        for attempt in range(1, self.cfg.transaction_attempts + 1):
            tx = yield Acquire()
            try:
                yield from self.begin(tx, isolation)
                resp = _as_response((yield CallHandler(handler, (tx, ClaimContext()))))
                yield Query(tx, "ROLLBACK" if classify(resp.status) == FAIL else "COMMIT", None, False)
                res.response, res.outcome = resp, Out.UNGUARDED
                return res
            except psycopg.Error as e:
                yield from self.rollback_quietly(tx)
                if _sqlstate(e) in ("40001", "40P01") and attempt < self.cfg.transaction_attempts:
                    continue
                raise
            except Exception:
                yield from self.rollback_quietly(tx)
                raise
            finally:
                yield Release(tx)

    # ---- fenced mode -------------------------------------------------------------------

    def run_fenced(self, req, handler, isolation=None):
        early, c = self.prepare(req)
        if early is not None:
            return early
        if c is None:
            return (yield from self.unguarded_tx(handler, isolation))
        try:
            conn = yield Acquire()
        except psycopg.Error as e:
            return self.unavailable(c, e)
        try:
            refused = yield from self.refuse_router(c, conn, "fenced")
            if refused is not None:
                return refused
            return (yield from self.loop(c, conn, lambda row: self.win_fenced(c, conn, row, handler, isolation)))
        finally:
            yield Release(conn)

    def win_fenced(self, c, conn, row, handler, isolation):
        c.res.generation = row.generation
        keeper = yield StartKeeper(conn, c.ck, row.claim_id)
        ctx = ClaimContext(row.generation, row.claim_id, c.ck, keeper)
        todo, action, result, resp, err = "give_up", FAIL, Out.FAILED, None, None
        for attempt in range(1, self.cfg.transaction_attempts + 1):
            try:
                tx = yield Acquire(second=True)
            except psycopg.Error as e:
                err = e
                break
            try:
                try:
                    yield from self.begin(tx, isolation)
                    c.res.handler_ran = True
                    resp = _as_response((yield CallHandler(handler, (tx, ctx))))
                except Exception as e:
                    yield from self.rollback_quietly(tx)
                    if _sqlstate(e) in ("40001", "40P01") and attempt < self.cfg.transaction_attempts:
                        continue
                    err, action = e, FAIL
                    break
                # The handler has returned: an error from here on is the
                # store's, never a reason to free the key (a duplicate would
                # run the handler again), but for the server's own "retry
                # the transaction" (40001 / 40P01) and a lost claim (IL001).
                committing = False
                try:
                    action = self.classify(resp.status)
                    if action == FAIL:
                        yield from self.rollback_quietly(tx)  # a failure leaves none of its writes behind
                        break
                    if action == RELEASE:
                        yield Query(tx, "COMMIT", None, False)
                        result = Out.WON_COMPLETED
                        break
                    # The fence: raises IL001 if the claim is no longer ours,
                    # taking the handler's writes down with it (COMMIT, in
                    # the same flight, is skipped). Unprepared, so that no
                    # statement cache can abort the transaction.
                    committing = True  # a connection lost in this flight may have committed
                    t = (yield Batch([Query(tx, self.sql.finalize, self.finalize_params(c, row.claim_id, resp, True),
                                            False),
                                      Query(tx, "COMMIT", None, False)]))[0]
                    result = Out.COMPLETED_UNCACHEABLE if self.uncached(resp, _text(t[1])) else Out.WON_COMPLETED
                    c.res.events.append(Event.FINALIZED)
                    todo = "done"
                    break
                except psycopg.Error as e:
                    broken = tx.broken
                    yield from self.rollback_quietly(tx)
                    if _sqlstate(e) == "IL001":
                        c.res.lease_stolen = True
                        todo = "follow"
                        break
                    if _sqlstate(e) in ("40001", "40P01") and attempt < self.cfg.transaction_attempts:
                        continue
                    c.res.error, todo = e, "unsettled"
                    c.res.events.append(Event.FINALIZE_ERROR)
                    if committing and broken:
                        # The COMMIT was in flight: read the key, never re-run.
                        state, probe = yield from self.settle(c, row.claim_id, row.generation)
                        if probe is not None:
                            yield Release(probe)
                        if state == "committed":
                            result = Out.COMPLETED_UNCACHEABLE if self.uncached(resp, None) else Out.WON_COMPLETED
                            todo = "done"
                        elif state == "lost":
                            todo = "follow"
                    break
            finally:
                yield Release(tx)
        yield StopKeeper(keeper)
        if todo == "give_up":
            yield from self.give_up(c, conn, row.claim_id, action)
        if err is not None:
            self.finish(c, Out.FAILED)
            raise err
        if todo == "follow":
            c.deadline = time.monotonic() + self.cfg.follower_wait_budget
            return (yield from self.loop(c, conn, lambda r: self.win_fenced(c, conn, r, handler, isolation),
                                         claim_first=False))
        if todo == "unsettled":
            # Nothing of this run is stored and the key stays ours until its
            # lease runs out; a retry with the same key is answered from it then.
            c.res.outcome_unknown = True
            resp, result = problems.outcome_unknown(self.cfg.profile, self.cfg.retry_after), Out.FAILED
        c.res.response = resp
        return self.finish(c, result)

    # ---- in-transaction mode --------------------------------------------------------

    def keep_cooldown(self, c, conn, claim_id):
        """After the handler raised or its result could not be stored: roll its
        writes back to the savepoint and commit the claim failed, with a cooldown."""
        try:
            yield Batch(self.failing(conn, c, claim_id) + [Query(conn, "COMMIT", None, False)])
        except psycopg.Error:
            yield from self.rollback_quietly(conn, True)

    def failing(self, conn, c, claim_id):
        """The statements that drop the handler's writes and keep the claim failed, with a cooldown."""
        return [Query(conn, "ROLLBACK TO SAVEPOINT idem_handler", None, False),
                Query(conn, self.sql.fail, (c.ck, claim_id, _ms_text(self.cfg.failure_cooldown)), False)]

    def run_in_transaction(self, req, handler, isolation=None):
        early, c = self.prepare(req)
        if early is not None:
            return early
        if c is None:
            return (yield from self.unguarded_tx(handler, isolation))
        try:
            conn = yield Acquire()
        except psycopg.Error as e:
            return self.unavailable(c, e)
        try:
            refused = yield from self.refuse_router(c, conn, "in-transaction")
            if refused is not None:
                return refused
            return (yield from self.in_tx_loop(c, conn, handler, isolation))
        finally:
            yield Release(conn)

    def in_tx_loop(self, c, conn, handler, isolation):
        do_claim, wait, attempts = True, False, 0
        while True:
            c.iterations += 0 if wait else 1
            if c.iterations > self.cfg.max_iterations:
                return self.timed_out(c)
            in_tx = False
            try:
                if not do_claim:
                    row = yield from self.lookup(c, conn)
                else:
                    # Asked before BEGIN: a failed catalog read must not abort the transaction.
                    caps = yield from self.capabilities(conn)
                    rem = _remaining(c.deadline)
                    lease = _ms_text(self.cfg.lease)
                    # Duplicates wait inside idem_begin for the first
                    # transaction, bounded by the budget.
                    if wait and caps[1]:
                        part = min(rem, WAIT_SLICE)  # in slices, as claim()'s
                        claim = Query(conn, self.calls.begin_wait, dict(ck=c.ck, rh=c.rh, lease=lease, wait=_ms_text(part),
                                                                        lock=_lock_wait_text(part + 1.0)))
                    else:
                        claim = Query(conn, self.calls.begin, dict(ck=c.ck, rh=c.rh, lease=lease,
                                                                   lock=_lock_wait_text(rem)))
                    # BEGIN, the claim and the handler's savepoint in one
                    # flight (a follower rolls the savepoint back with the rest).
                    in_tx = True
                    t = yield Batch([self.begin_query(conn, isolation), claim,
                                     Query(conn, "SAVEPOINT idem_handler", None, False)])
                    row = parse_row(t[1])
            except psycopg.errors.LockNotAvailable:
                yield from self.rollback_quietly(conn, True)
                if time.monotonic() >= c.deadline:
                    return self.timed_out(c)
                continue
            except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected) as e:
                yield from self.rollback_quietly(conn, True)
                attempts += 1
                if attempts >= self.cfg.transaction_attempts:
                    return self.unavailable(c, e)
                continue
            except psycopg.Error as e:
                if in_tx:
                    yield from self.rollback_quietly(conn, True)
                return self.unavailable(c, e)

            if do_claim and row.won:
                c.res.events.append(row.outcome)
                c.res.generation = row.generation
                ctx = ClaimContext(row.generation, row.claim_id, c.ck)
                try:
                    c.res.handler_ran = True
                    resp = _as_response((yield CallHandler(handler, (conn, ctx))))
                except Exception as e:
                    if _sqlstate(e) in ("40001", "40P01") and attempts + 1 < self.cfg.transaction_attempts:
                        attempts += 1
                        yield from self.rollback_quietly(conn, True)
                        do_claim, wait = True, False
                        continue  # everything rolled back, the claim too: run it again
                    # The handler raised: keep a cooldown, drop its writes.
                    yield from self.keep_cooldown(c, conn, row.claim_id)
                    self.finish(c, Out.FAILED)
                    raise
                # The handler has returned: an error from here on is the
                # store's. It is answered, not raised, and never runs the
                # handler again in this call (but for the server's own "retry
                # the transaction", 40001 / 40P01, which rolled everything back).
                try:
                    action = self.classify(resp.status)
                    setting = None
                    # Unprepared: no statement cache may abort the handler's
                    # transaction. With COMMIT in one flight: a statement
                    # that fails skips it, and the transaction is left
                    # aborted, as when COMMIT was never sent.
                    if action == FINALIZE:
                        store = [Query(conn, self.sql.finalize, self.finalize_params(c, row.claim_id, resp, True),
                                       False)]
                    elif action == RELEASE:
                        store = [Query(conn, self.sql.release, (c.ck, row.claim_id), False)]
                    else:
                        # A failure keeps none of the handler's writes but keeps the cooldown.
                        store = self.failing(conn, c, row.claim_id)
                    t = yield Batch(store + [Query(conn, "COMMIT", None, False)])
                    if action == FINALIZE:
                        setting = _text(t[0][1])
                except psycopg.Error as e:
                    if _sqlstate(e) in ("40001", "40P01") and attempts + 1 < self.cfg.transaction_attempts:
                        attempts += 1
                        yield from self.rollback_quietly(conn, True)
                        do_claim, wait = True, False
                        continue  # everything rolled back, the claim too
                    # Nothing of this request is committed. Keep a cooldown
                    # (duplicates waiting in idem_begin are not run at once)
                    # and tell the caller that its result was not stored.
                    c.res.error = e
                    c.res.events.append(Event.FINALIZE_ERROR)
                    c.res.outcome_unknown = conn.broken
                    yield from self.keep_cooldown(c, conn, row.claim_id)
                    return self.answer(c, problems.outcome_unknown(self.cfg.profile, self.cfg.retry_after), Out.FAILED)
                c.res.response = resp
                if action == FINALIZE:
                    c.res.events.append(Event.FINALIZED)
                    return self.finish(c, Out.COMPLETED_UNCACHEABLE if self.uncached(resp, setting) else Out.WON_COMPLETED)
                return self.finish(c, Out.FAILED if action == FAIL else Out.WON_COMPLETED)

            if in_tx:
                yield from self.rollback_quietly(conn, True)
            n = yield from self.follow(c, row, (self.server_wait or (False, False))[1])
            if isinstance(n, RunResult):
                return n
            do_claim, wait = n
