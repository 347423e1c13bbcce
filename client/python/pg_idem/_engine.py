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

import threading
import time

import psycopg

from . import protocol
from ._checks import Reporter, describe_edition, edition_sql, log, router_refusal, verify
from ._pool import is_pool_exhausted
from .protocol import Action, ClientErrors, ClientOutcome as Out, Event, ServerOutcome
from .config import Config
from .http import (FAIL, FINALIZE, RELEASE, REPLAY_HEADER, HeaderAllowlist, Response,
                   classify, headers_from_json, problems)
from .key import KeyStatus, check_key_header
# Request, ClaimContext and RunResult are the package's (pg_idem/__init__.py); _Call the tests'.
from ._call import (WAIT_SLICE, ClaimContext, Request, RunResult, _Call, _as_response,  # noqa: F401
                    _jittered, _remaining, _sqlstate)
from ._transactions import TransactionModes
# The I/O the engine asks its drivers for (the drivers use e.Query, e.unprepared_retry, ...).
from ._ops import (BACKEND_PID, PREPARED_STATEMENT_ERRORS, Acquire, Batch, CallHandler, Query,  # noqa: F401
                   Release, Sleep, StartKeeper, StopKeeper, pipeline_mode, unprepared_retry)
# _ms_text, _lock_wait_text and parse_size_setting are the drivers' and tests' too.
from ._statements import Statements, _lock_wait_text, _ms_text, _text, parse_row, parse_size_setting


# How many times a result whose handler has run is sent (each failure
# settled by reading the key) before it is left to its lease.
STORE_ATTEMPTS = 3


class Engine(TransactionModes):
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
        # The claim connections this runner's requests hold, for an exhausted
        # pool's log line: all of them, and those of waiting duplicates.
        self._held = {"all": 0, "duplicates": 0}
        self._held_lock = threading.Lock()
        self._warned_principal = False
        self.edition = None  # "c" or "sql" (idem_edition()), once checked; None for a router

    # ---- shared pieces ----------------------------------------------------------

    def finish(self, c, outcome):
        c.res.outcome = outcome
        return c.res

    def answer(self, c, response, outcome):
        c.res.response = response
        return self.finish(c, outcome)

    def unavailable(self, c, err):
        if is_pool_exhausted(err):
            return self.exhausted(c, err)
        c.res.error = c.res.error or err
        return self.answer(c, problems.store_unavailable(self.cfg.profile, self.cfg.retry_after), Out.FAILED)

    def exhausted(self, c, err):
        """No connection of the pool came free: the protocol's pool_exhausted.
        A duplicate waits for its next round's connection only as long as
        its budget runs: its answer is then the budget's (the key is still in
        progress), as it would be had it waited in the server."""
        if c.following:
            return self.timed_out(c)
        c.res.error = c.res.error or err
        c.res.events.append(protocol.POOL_EXHAUSTED_EVENT)
        return self.answer(c, problems.by_name(protocol.POOL_EXHAUSTED, self.cfg.profile, self.cfg.retry_after),
                           protocol.POOL_EXHAUSTED_RESULT)

    def hold(self, c):
        """The claim's connection for this round. A winner keeps it to the end
        of its call; a duplicate hands it back between its rounds (hand_back)
        and waits for the next one at most its remaining budget, so that
        duplicates of a slow request cannot hold the pool's connections from
        the requests that would run (issue 31)."""
        if c.conn is None:
            try:
                c.conn = yield Acquire(timeout=_remaining(c.deadline) if c.following else None,
                                       duplicate=c.following)
            except psycopg.Error as e:
                if is_pool_exhausted(e):
                    e.held = self.held_text()
                raise
            c.held_as = "duplicates" if c.following else "all"
            with self._held_lock:
                self._held["all"] += 1
                self._held[c.held_as] += c.held_as == "duplicates"
        return c.conn

    def hand_back(self, c):
        if c.conn is not None:
            conn, c.conn, discard, c.discard = c.conn, None, c.discard, False
            with self._held_lock:
                self._held["all"] -= 1
                self._held[c.held_as] -= c.held_as == "duplicates"
            yield Release(conn, discard)

    def held_text(self):
        with self._held_lock:
            return "%d connection%s, %d of them duplicates waiting for their first request" % (
                self._held["all"], "" if self._held["all"] == 1 else "s", self._held["duplicates"])

    def timed_out(self, c):
        """The answer of a follower whose wait budget ran out (the protocol's in_progress)."""
        o = protocol.OUTCOMES[ServerOutcome.IN_PROGRESS]
        return self.answer(c, problems.by_name(o.problem, self.cfg.profile, self.cfg.retry_after), o.result)

    def prepare(self, req):
        """(early answer, call): the answer when the request goes no further;
        call None for a request without a key that may run unguarded."""
        p = self.cfg.profile
        ks = check_key_header(req.keys)
        if (ks is not KeyStatus.ABSENT or req.key_required) and not req.principal:
            # protocol.toml [client.missing_principal]: refused, never keyed on
            # "" (one caller's replay to another) nor run unguarded (twice).
            self.warn_principal()
            return RunResult(problems.by_name(protocol.MISSING_PRINCIPAL, p), protocol.MISSING_PRINCIPAL_RESULT), None
        if ks is KeyStatus.ABSENT and req.key_required:
            return RunResult(problems.missing_key(p), Out.REJECTED), None
        if ks not in (KeyStatus.ABSENT, KeyStatus.OK):
            return RunResult(problems.invalid_key(p, ks), Out.REJECTED), None
        if len(req.body) > self.cfg.max_request_body_bytes:
            return RunResult(problems.request_too_large(p, self.cfg.max_request_body_bytes), Out.REJECTED), None
        if ks is KeyStatus.ABSENT:
            return None, None
        return None, _Call(self.cfg, req)

    def warn_principal(self):
        if not self._warned_principal:
            self._warned_principal = True
            log.warning("pg_idem: a request with an Idempotency-Key has no principal: it is answered 401 "
                        "principal-missing, not run. If it was authenticated, the principal is read before the "
                        "authentication sets it (put pg_idem's middleware after it); a route without users "
                        "names its callers as one principal (a fixed string)")

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
            claim_wait, begin_wait, self.lock_wait, self.router, edition_schema = verify(
                t, self.cfg, conn.info.dbname)
            if edition_schema is not None:
                e = yield Query(conn, edition_sql(edition_schema), None, False)
                self.edition = e[0]
                log.info(describe_edition(self.edition, t[0], edition_schema))
            else:
                self.edition = None if self.router else "c"
            self.server_wait = (False, False) if self.cfg.server_wait is False else (claim_wait, begin_wait)
        return self.server_wait

    @property
    def calls(self):
        """The claims and the renewal in the form the server takes (after capabilities())."""
        return self.sql if self.lock_wait else self.sql.legacy

    def refuse_router(self, c, mode):
        """The 503 for a mode that cannot go through a PL/Proxy router
        (_checks.router_refusal), before anything is claimed; None when the
        server is not one."""
        try:
            yield from self.capabilities((yield from self.hold(c)))
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
        c.following = True
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

    def loop(self, c, win, claim_first=True):
        do_claim, wait = claim_first, False
        while True:
            c.iterations += 0 if wait else 1  # slices of a wait are bounded by its deadline
            if c.iterations > self.cfg.max_iterations:
                return self.timed_out(c)
            try:
                conn = yield from self.hold(c)
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
            yield from self.hand_back(c)
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
            return (yield from self.loop(c, lambda row: self.win_lease(c, c.conn, row, handler)))
        finally:
            yield from self.hand_back(c)

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
