"""The two exactly-once modes of the protocol (pg_idem._engine has the rest):
fenced, where the claim commits first and the handler's transaction
stores the response fenced by it, and in-transaction, where claim,
handler and response commit together (idem_begin). A mixin of Engine:
it uses Engine's claim loop, follower answers and settling."""

import time

import psycopg

from ._call import ISOLATION, WAIT_SLICE, ClaimContext, RunResult, _as_response, _remaining, _sqlstate
from .http import FAIL, FINALIZE, RELEASE, classify, problems
from ._ops import Acquire, Batch, CallHandler, Query, Release, StartKeeper, StopKeeper
from ._statements import _lock_wait_text, _ms_text, _text, parse_row
from .protocol import ClientOutcome as Out, Event


class TransactionModes:
    """Engine's run_fenced and run_in_transaction."""

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
            refused = yield from self.refuse_router(c, "fenced")
            if refused is not None:
                return refused
            return (yield from self.loop(c, lambda row: self.win_fenced(c, c.conn, row, handler, isolation)))
        finally:
            yield from self.hand_back(c)

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
            return (yield from self.loop(c, lambda r: self.win_fenced(c, c.conn, r, handler, isolation),
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
            refused = yield from self.refuse_router(c, "in-transaction")
            if refused is not None:
                return refused
            return (yield from self.in_tx_loop(c, handler, isolation))
        finally:
            yield from self.hand_back(c)

    def in_tx_loop(self, c, handler, isolation):
        do_claim, wait, attempts = True, False, 0
        while True:
            c.iterations += 0 if wait else 1
            if c.iterations > self.cfg.max_iterations:
                return self.timed_out(c)
            in_tx = False
            try:
                conn = yield from self.hold(c)
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
            yield from self.hand_back(c)
            n = yield from self.follow(c, row, (self.server_wait or (False, False))[1])
            if isinstance(n, RunResult):
                return n
            do_claim, wait = n
