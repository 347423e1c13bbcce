'use strict';
// The single-flight runner over node-postgres: claim, lease renewal, follower
// wait, status matrix, replay, and the two exactly-once modes. A request holds a
// pooled client only while it talks to the server: not while its handler runs (lease,
// fenced: renewal takes a client per renewal) and not while it waits as a follower
// (between wait slices), so neither a storm of duplicates nor handlers using the same
// pool can starve it. The protocol is the C++ client's (client/cpp/src/runner/runner.cpp)
// without the advisory-lock wake-up: followers use the server-side wait, idem_claim(...,
// max_wait), when the server has it (0.3.0; not with serverWait: false), and poll
// idem_lookup with jittered backoff otherwise. The claims pass lock_wait where the server
// takes it (0.6.0), and set lock_timeout around the call on older servers (./statements,
// legacy). Every query is unnamed (no `name:`): it works behind a transaction-mode pooler
// and leaves no session state. Names are the protocol's constants (./protocol, generated).

const pg = require('pg');
const { Config } = require('./config');
const { poolOptions } = require('./conninfo');
const { FAIL, FINALIZE, RELEASE, REPLAY_HEADER, HeaderAllowlist, asResponse, classify, headersFromJson, makeResponse,
  problems, protocolProblem } = require('./http');
const protocol = require('./protocol');
const { OUTCOMES, Action, ClientOutcome, Event, ProblemName, ServerOutcome } = protocol;
const { TYPES, beginText, statements, parseSizeSetting } = require('./statements');
const { Keeper, lockWaitText, msText } = require('./keeper');
const { checkSetup, routerRefusal } = require('./setup');
const { Claims, isPoolExhausted } = require('./pool');
const { startUp } = require('./startup');
const { Reporter } = require('./report');
const { ClaimContext, WON, parseRow, prepareRun, result } = require('./request');

// The statuses of a request that failed validation (the protocol's list):
// with storeClientErrors off (the default, as Stripe) they free the key
// instead of being stored, so that the corrected request is run, not
// answered "key reused".
const VALIDATION_STATUSES = new Set(protocol.VALIDATION_STATUSES);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();
const jittered = (base, jitter) => Math.max(1, base * (1 - jitter + Math.random() * 2 * jitter));
const sqlstate = (e) => (e && typeof e.code === 'string' ? e.code : undefined);
const transient = (e) => ['40001', '40P01'].includes(sqlstate(e));
// The connection is gone: no SQLSTATE (the socket died), class 08, or the
// server ending the session (57P01 terminated, 57P02 crash, 57P03 starting up).
const connectionLost = (e) => !sqlstate(e) || /^(08|57P0)/.test(sqlstate(e));
// How many times a result whose handler has run is sent (each failure
// settled by reading the key) before it is left to its lease.
const STORE_ATTEMPTS = 3;

// Runs a handler once per Idempotency-Key. Share one per pool.
class Runner {
  constructor(pool, config) {
    if (typeof pool === 'string') pool = new pg.Pool(poolOptions(pool));
    if (!pool || typeof pool.connect !== 'function') throw new TypeError('pass a pg.Pool (or a connection string)');
    this.pool = pool;
    this.config = config instanceof Config ? config : new Config(config || {});
    this.allow = new HeaderAllowlist(this.config.replayHeaders);
    this.sql = statements(this.config.schema);
    this.setup = null; // the first-use check's answer (./setup) once it passed
    this.reporter = new Reporter(this.config.logger, this.config.onError);
    this.claims = new Claims(pool, () => this.checkout(), (client) => this.giveBack(client)); // ./pool
    this.warnedPrincipal = false;
  }

  // {claim, begin}: whether the server waits for followers itself (null before the first check).
  get serverWait() {
    return this.setup ? this.setup.serverWait : null;
  }

  // The claims and the renewal in the form the server takes (after the first check).
  get calls() {
    return this.setup && this.setup.lockWait ? this.sql : this.sql.legacy;
  }

  // The start-up check, to await before listening: the first-use check
  // (./setup), made now; the role and database exist; a server that does
  // not answer yet is waited for up to `wait` ms (./startup). Rejects with
  // a SetupError saying what to fix; resolves once it passed.
  ready({ wait } = {}) {
    return startUp(this, wait);
  }

  // Which edition the first-use check found: 'c' (the library) or 'sql'
  // (the SQL edition); null before it, and through a router.
  get edition() {
    return this.setup ? this.setup.edition : null;
  }

  // The first-use check (./setup): the extension, its version, the role's
  // privileges and path, the lease within idem.max_lease, on `client` (or
  // one of the pool's). Resolves once it passed (then never again); rejects
  // with a SetupError saying what to fix. Every run checks it first.
  async checked(client) {
    if (this.setup) return this.setup;
    let own = null;
    try {
      if (!client) client = own = await this.checkout();
      this.setup = await checkSetup(client, this.config);
      return this.setup;
    } finally {
      if (own) this.giveBack(own);
    }
  }

  event(name) {
    const m = this.config.metrics;
    if (m && m.onEvent) m.onEvent(name);
  }

  // What the winner does with its handler's response: the protocol's
  // storage rules, but for validation failures when they are not stored.
  storage(status) {
    const action = classify(status);
    if (action === FINALIZE && !this.config.storeClientErrors && VALIDATION_STATUSES.has(status)) return RELEASE;
    return action;
  }

  // Every public run goes through here: its store error logged (once per
  // cause) and given to onError, its outcome and events counted.
  async observe(run) {
    const m = this.config.metrics;
    let res;
    try {
      res = await run();
    } catch (e) {
      if (m && m.onOutcome) m.onOutcome(ClientOutcome.FAILED); // the handler threw: the caller sees the error
      throw e;
    }
    if (res.error) this.reporter.report(res.error);
    if (res.leaseStolen) this.event(Event.LEASE_STOLEN);
    if (res.outcomeUnknown) this.event(Event.UNKNOWN_OUTCOME);
    if (m && m.onOutcome) m.onOutcome(res.outcome);
    return res;
  }

  // The claim's connection: held from the claim that wins to the end of the
  // call, handed back between a follower's rounds, so that waiting
  // duplicates hold no pooled connection (behind a transaction-mode pooler,
  // no server connection either) while the winner needs one to finish.
  async hold(c) {
    if (!c.client) c.client = await this.claims.take(c, Math.max(0, c.deadline - now()));
    return c.client;
  }

  handBack(c) {
    if (!c.client) return;
    this.claims.release(c.client);
    if (c.broken) c.client.idemBroken = true; // the claim's client goes back to be destroyed, not reused
    this.giveBack(c.client);
    c.client = null;
    c.broken = false;
  }

  // One unnamed statement; its first row.
  async q(client, text, values) {
    const r = await client.query({ text, values, types: TYPES });
    return r.rows[0];
  }

  // ---- shared pieces -------------------------------------------------------

  finish(c, outcome) {
    c.res.outcome = outcome;
    return c.res;
  }

  answer(c, response, outcome) {
    c.res.response = response;
    return this.finish(c, outcome);
  }

  unavailable(c, err) {
    // No client of the pool came free (./pool): a duplicate's budget ran
    // out meanwhile (its answer is the budget's), or connection-pool-exhausted.
    if (isPoolExhausted(err) && c.waited) return this.timedOut(c);
    c.res.error = c.res.error || err;
    if (isPoolExhausted(err)) {
      this.event(protocol.POOL.event);
      return this.answer(c, protocolProblem(protocol.POOL.problem, this.config.profile, { retryMs: this.config.retryAfter }),
        protocol.POOL.result);
    }
    return this.answer(c, problems.storeUnavailable(this.config.profile, this.config.retryAfter), ClientOutcome.FAILED);
  }

  timedOut(c) {
    return this.answer(c, problems.inProgress(this.config.profile, this.config.retryAfter), OUTCOMES.in_progress.result);
  }

  // {early} when the request goes no further; {c: null} to run unguarded (./request).
  prepare(raw) {
    return prepareRun(raw, this.config, now(), () => this.warnPrincipal());
  }

  warnPrincipal() {
    if (this.warnedPrincipal) return;
    this.warnedPrincipal = true;
    this.reporter.log('pg-idem: a request with an Idempotency-Key has no principal: it is answered 401 principal-missing, '
      + 'not run. If it was authenticated, the principal is read before the authentication sets it (put pg-idem after it); '
      + 'a route without users names its callers as one principal (a fixed string)');
  }

  parseRow(row) {
    return parseRow(row);
  }

  async claim(c, client, wait) {
    const caps = (await this.checked(client)).serverWait;
    const rem = Math.max(0, c.deadline - now());
    const lease = msText(this.config.lease);
    if (wait && caps.claim) {
      // The server's own wait, one slice at a time; lock_timeout only guards it.
      const slice = Math.min(rem, this.config.waitSlice);
      return this.parseRow(await this.q(client, this.calls.claimWait, [c.ck, c.rh, lease, msText(slice), lockWaitText(slice + 1000)]));
    }
    return this.parseRow(await this.q(client, this.calls.claim, [c.ck, c.rh, lease, lockWaitText(rem)]));
  }

  async lookup(c, client) {
    return this.parseRow(await this.q(client, this.sql.lookup, [c.ck, c.rh]));
  }

  // A follower's answer, or 'wait' / 'claim'.
  onRow(c, row) {
    const o = OUTCOMES[row.outcome];
    if (!o || o.action === Action.RUN) throw new Error(`pg-idem: unexpected claim outcome '${row.outcome}'`);
    if (o.action === Action.REPLAY) {
      const headers = headersFromJson(row.headersJson);
      headers.push([REPLAY_HEADER, 'true']);
      c.res.response = makeResponse(row.status || 200, headers, row.body || Buffer.alloc(0));
      c.res.replayed = true;
      return this.finish(c, o.result);
    }
    if (o.action === Action.ANSWER) {
      if (o.problem === ProblemName.COOLDOWN) this.event(Event.RETRYABLE_COOLDOWN);
      const retryMs = row.retryAfter ?? this.config.retryAfter;
      return this.answer(c, protocolProblem(o.problem, this.config.profile, { retryMs }), o.result);
    }
    return o.action; // 'wait' or 'claim'
  }

  // The answer, or {claim, wait} for the next round.
  async follow(c, row, serverWait) {
    let n;
    try {
      n = this.onRow(c, row);
    } catch (e) {
      return this.unavailable(c, e);
    }
    if (typeof n === 'object') return n;
    if (n === Action.CLAIM) return { claim: true, wait: false };
    if (!c.waited) this.event(Event.PENDING_WAIT);
    c.waited = true;
    if (now() >= c.deadline) return this.timedOut(c);
    if (serverWait) return { claim: true, wait: true }; // claim again, waiting in the server
    let nap = jittered(c.backoff, this.config.pollJitter);
    if (row.retryAfter !== null) nap = Math.min(nap, row.retryAfter + 1);
    nap = Math.min(nap, Math.max(0, c.deadline - now()));
    c.backoff = Math.min(c.backoff * 2, this.config.pollMax);
    if (nap > 0) await sleep(nap);
    return { claim: false, wait: false };
  }

  // The 503 for a mode that cannot go through a PL/Proxy router (./setup),
  // before anything is claimed; undefined when the server is not one.
  async refuseRouter(c, mode) {
    try {
      if ((await this.checked(await this.hold(c))).router) throw routerRefusal(mode);
    } catch (e) {
      return this.unavailable(c, e);
    }
    return undefined;
  }

  async loop(c, win, claimFirst = true) {
    let doClaim = claimFirst;
    let wait = false;
    for (;;) {
      // A server-side wait slice is bounded by the deadline, not counted.
      if (!wait && ++c.iterations > this.config.maxIterations) return this.timedOut(c);
      let row;
      try {
        const client = await this.hold(c);
        row = doClaim ? await this.claim(c, client, wait) : await this.lookup(c, client);
      } catch (e) {
        if (sqlstate(e) === '55P03') { // locked by an idem_begin transaction
          if (now() >= c.deadline) return this.timedOut(c);
          continue;
        }
        if (sqlstate(e) === '40001' || sqlstate(e) === '40P01') {
          await sleep(jittered(this.config.pollMin, this.config.pollJitter));
          continue;
        }
        return this.unavailable(c, e);
      }
      if (doClaim && row.won) {
        this.event(row.outcome);
        return win(row);
      }
      this.handBack(c);
      const n = await this.follow(c, row, this.setup.serverWait.claim);
      if (n.response !== undefined) return n;
      ({ claim: doClaim, wait } = n);
    }
  }

  // Releases or fails the claim, on `client` or on one of the pool's.
  async giveUp(c, client, claimId, action) {
    let own = null;
    try {
      if (!client) client = own = await this.checkout();
      const row = action === FAIL
        ? await this.q(client, this.sql.fail, [c.ck, claimId, msText(this.config.failureCooldown)])
        : await this.q(client, this.sql.release, [c.ck, claimId]);
      if (!row || !row.ok) c.res.leaseStolen = true;
    } catch (e) {
      this.event(Event.RELEASE_ERROR);
      c.res.error = c.res.error || e;
      if (own) own.idemBroken = true;
    } finally {
      if (own) this.giveBack(own);
    }
  }

  finalizeParams(c, claimId, resp, strict) {
    const over = resp.body.length > this.config.maxCacheableResponseBytes;
    return [c.ck, claimId, resp.status, this.allow.toJson(resp.headers), over ? resp.body.subarray(0, 1) : resp.body, strict, over];
  }

  uncached(resp, setting) {
    const cap = parseSizeSetting(setting);
    return resp.body.length > this.config.maxCacheableResponseBytes || (cap !== undefined && resp.body.length > cap);
  }

  // A client from the pool with an 'error' listener while we hold it: a
  // backend that dies while its client is checked out and idle (the claim's
  // client while the handler runs) emits 'error', which would otherwise be
  // an uncaught exception.
  async checkout() {
    const client = await this.pool.connect();
    const onError = () => { client.idemBroken = true; };
    client.on('error', onError);
    client.idemOnError = onError;
    return client;
  }

  // Gives the client back; a broken one is destroyed, not reused.
  giveBack(client) {
    client.removeListener('error', client.idemOnError);
    const broken = client.idemBroken;
    delete client.idemOnError;
    delete client.idemBroken;
    client.release(broken ? true : undefined);
  }

  // ---- lease mode ------------------------------------------------------------

  // handler(claim) -> {status, headers, body}, with no transaction open.
  run(request, handler) {
    return this.observe(() => this.runLease(request, handler));
  }

  async runLease(request, handler) {
    const { early, c } = this.prepare(request);
    if (early) return early;
    if (!c) {
      const res = result();
      res.handlerRan = true;
      res.response = asResponse(await handler(new ClaimContext()));
      res.outcome = ClientOutcome.UNGUARDED;
      return res;
    }
    try {
      return await this.loop(c, (row) => this.winLease(c, row, handler));
    } finally {
      this.handBack(c);
    }
  }

  async winLease(c, row, handler) {
    c.res.generation = row.generation;
    // The claim is committed: no client is held while the handler runs
    // (renewal, release and finalize take one from the pool each).
    this.handBack(c);
    const keeper = new Keeper(this, null, c.ck, row.claimId);
    const ctx = new ClaimContext(row.generation, row.claimId, c.ck, keeper);
    let resp;
    try {
      c.res.handlerRan = true;
      resp = asResponse(await handler(ctx));
    } catch (e) {
      await keeper.stop();
      await this.giveUp(c, null, row.claimId, FAIL);
      this.finish(c, ClientOutcome.FAILED);
      throw e;
    }
    await keeper.stop();
    const action = this.storage(resp.status);
    if (action !== FINALIZE) {
      await this.giveUp(c, null, row.claimId, action);
      c.res.outcome = action === FAIL ? ClientOutcome.FAILED : ClientOutcome.WON_COMPLETED;
    } else await this.storeLease(c, null, row, resp);
    // Not stored: the caller is told so, never given a response a retry could not replay.
    c.res.response = c.res.outcomeUnknown ? problems.outcomeUnknown(this.config.profile, this.config.retryAfter) : resp;
    return this.finish(c, c.res.outcome);
  }

  // The handler has run: whatever goes wrong from here, the key is never
  // released or failed (a duplicate would run the handler again). A failed
  // finalize (a lost connection, a killed backend, a refusal) is sent again
  // on a fresh client once reading the key shows it still ours and empty;
  // what cannot be stored stays pending to its lease, and the same request
  // recovers it after that.
  async storeLease(c, client, row, resp) {
    const params = this.finalizeParams(c, row.claimId, resp, false);
    let target = client;
    for (let attempt = 0; attempt < STORE_ATTEMPTS; attempt++) {
      let fresh = null;
      let r;
      try {
        if (!target) target = fresh = await this.checkout();
        r = await this.q(target, this.sql.finalize, params);
      } catch (e) {
        this.event(Event.FINALIZE_ERROR);
        c.res.error = e;
        if (fresh) {
          fresh.idemBroken = true;
          this.giveBack(fresh);
        } else if (target === client) c.broken = true; // the claim's client goes back to be destroyed, not reused
        target = null;
        const state = await this.settle(c, row);
        if (state === 'not_committed') continue;
        if (state === 'unknown') {
          c.res.outcomeUnknown = true;
          c.res.outcome = ClientOutcome.FAILED;
        } else if (state === 'lost') {
          c.res.leaseStolen = true;
          c.res.outcome = ClientOutcome.WON_COMPLETED;
        } else c.res.outcome = state;
        return;
      }
      if (fresh) this.giveBack(fresh);
      if (!r || !r.ok) {
        c.res.leaseStolen = true;
        c.res.outcome = ClientOutcome.WON_COMPLETED;
        return;
      }
      this.event(Event.FINALIZED);
      c.res.outcome = this.uncached(resp, r.cap) ? ClientOutcome.COMPLETED_UNCACHEABLE : ClientOutcome.WON_COMPLETED;
      return;
    }
    c.res.outcomeUnknown = true;
    c.res.outcome = ClientOutcome.FAILED;
  }

  // Did a finalize whose connection was lost, or that failed, commit? On a
  // fresh client, renewing waits for a commit in flight and says whether
  // the claim is still ours ('not_committed': nothing stored, and a full
  // lease again); otherwise the stored row tells: 'won_completed',
  // 'completed_uncacheable', 'lost', or 'unknown' when it cannot be read.
  async settle(c, row) {
    let probe;
    try {
      probe = await this.checkout();
      const renewed = await this.q(probe, this.calls.renew,
        [c.ck, row.claimId, msText(this.config.lease), lockWaitText(this.config.followerWaitBudget)]);
      if (renewed && renewed.ok) return 'not_committed';
      const seen = await this.lookup(c, probe);
      if ([ServerOutcome.REPLAY, ServerOutcome.NOT_REPLAYABLE].includes(seen.outcome) && (seen.generation === 0n || seen.generation === row.generation)) {
        return seen.outcome === ServerOutcome.REPLAY ? ClientOutcome.WON_COMPLETED : ClientOutcome.COMPLETED_UNCACHEABLE;
      }
      return 'lost';
    } catch (e) {
      c.res.error = c.res.error || e;
      if (probe) probe.idemBroken = true;
      return 'unknown';
    } finally {
      if (probe) this.giveBack(probe);
    }
  }

  // ---- transactions ----------------------------------------------------------

  async begin(client, isolation) {
    await client.query(beginText(isolation));
  }

  async rollbackQuietly(client) {
    try {
      await client.query('ROLLBACK');
    } catch {
      // the connection is gone: nothing to roll back
    }
  }

  async unguardedTx(handler, isolation) {
    const res = result();
    res.handlerRan = true;
    for (let attempt = 1; ; attempt++) {
      const tx = await this.checkout();
      try {
        await this.begin(tx, isolation);
        const resp = asResponse(await handler(tx, new ClaimContext()));
        await tx.query(classify(resp.status) === FAIL ? 'ROLLBACK' : 'COMMIT');
        res.response = resp;
        res.outcome = ClientOutcome.UNGUARDED;
        return res;
      } catch (e) {
        await this.rollbackQuietly(tx);
        if (['40001', '40P01'].includes(sqlstate(e)) && attempt < this.config.transactionAttempts) continue;
        throw e;
      } finally {
        this.giveBack(tx);
      }
    }
  }

  // ---- fenced mode -------------------------------------------------------------

  // Claim first; handler(client, claim) runs in a transaction on a second
  // connection, in which the response is stored, fenced by the claim.
  runFenced(request, handler, isolation) {
    return this.observe(() => this.fencedRun(request, handler, isolation));
  }

  async fencedRun(request, handler, isolation) {
    const { early, c } = this.prepare(request);
    if (early) return early;
    if (!c) return this.unguardedTx(handler, isolation);
    try {
      const refused = await this.refuseRouter(c, 'fenced');
      if (refused) return refused;
      return await this.loop(c, (row) => this.winFenced(c, row, handler, isolation));
    } finally {
      this.handBack(c);
    }
  }

  async winFenced(c, row, handler, isolation) {
    c.res.generation = row.generation;
    // Only the handler's transaction holds a client while it runs (two per
    // request would deadlock a pool of n under n requests).
    this.handBack(c);
    const keeper = new Keeper(this, null, c.ck, row.claimId);
    const ctx = new ClaimContext(row.generation, row.claimId, c.ck, keeper);
    let todo = 'give_up';
    let action = FAIL;
    let outcome = ClientOutcome.FAILED;
    let resp = null;
    let err = null;
    for (let attempt = 1; attempt <= this.config.transactionAttempts; attempt++) {
      let tx;
      try {
        tx = await this.checkout();
      } catch (e) {
        err = e;
        break;
      }
      try {
        try {
          await this.begin(tx, isolation);
          c.res.handlerRan = true;
          resp = asResponse(await handler(tx, ctx));
        } catch (e) {
          await this.rollbackQuietly(tx);
          if (transient(e) && attempt < this.config.transactionAttempts) continue;
          err = e;
          action = FAIL;
          break;
        }
        // The handler has returned: an error from here on is the store's,
        // never a reason to free the key (a duplicate would run the handler
        // again), but for the server's own "retry the transaction" (40001 /
        // 40P01) and a lost claim (IL001).
        let committing = false;
        try {
          action = this.storage(resp.status);
          if (action === FAIL) {
            await this.rollbackQuietly(tx); // a failure leaves none of its writes behind
            break;
          }
          if (action === RELEASE) {
            await tx.query('COMMIT');
            outcome = ClientOutcome.WON_COMPLETED;
            break;
          }
          // The fence: IL001 if the claim is no longer ours, taking the writes down.
          const r = await this.q(tx, this.sql.finalize, this.finalizeParams(c, row.claimId, resp, true));
          committing = true;
          await tx.query('COMMIT');
          this.event(Event.FINALIZED);
          outcome = this.uncached(resp, r.cap) ? ClientOutcome.COMPLETED_UNCACHEABLE : ClientOutcome.WON_COMPLETED;
          todo = 'done';
          break;
        } catch (e) {
          await this.rollbackQuietly(tx);
          if (sqlstate(e) === 'IL001') {
            c.res.leaseStolen = true;
            todo = 'follow';
            break;
          }
          if (transient(e) && attempt < this.config.transactionAttempts) continue;
          this.event(Event.FINALIZE_ERROR);
          c.res.error = e;
          todo = 'unsettled';
          if (connectionLost(e)) tx.idemBroken = true;
          if (committing && connectionLost(e)) {
            // The connection went while COMMIT was in flight: read the key, never re-run.
            const state = await this.settle(c, row);
            if (state === ClientOutcome.WON_COMPLETED || state === ClientOutcome.COMPLETED_UNCACHEABLE) {
              outcome = this.uncached(resp, undefined) ? ClientOutcome.COMPLETED_UNCACHEABLE : state;
              todo = 'done';
            } else if (state === 'lost') todo = 'follow';
          }
          break;
        }
      } finally {
        this.giveBack(tx);
      }
    }
    await keeper.stop();
    if (todo === 'give_up') await this.giveUp(c, null, row.claimId, action);
    if (err) {
      this.finish(c, ClientOutcome.FAILED);
      throw err;
    }
    if (todo === 'follow') {
      c.deadline = now() + this.config.followerWaitBudget;
      return this.loop(c, (r) => this.winFenced(c, r, handler, isolation), false);
    }
    if (todo === 'unsettled') {
      // Nothing of this run is stored and the key stays ours until its
      // lease runs out; a retry with the same key is answered from it then.
      c.res.outcomeUnknown = true;
      resp = problems.outcomeUnknown(this.config.profile, this.config.retryAfter);
      outcome = ClientOutcome.FAILED;
    }
    c.res.response = resp;
    return this.finish(c, outcome);
  }

  // ---- in-transaction mode -----------------------------------------------------

  // After the handler threw or its result could not be stored: roll its
  // writes back to the savepoint and commit the claim failed, with a cooldown.
  async keepCooldown(c, client, claimId) {
    try {
      await client.query('ROLLBACK TO SAVEPOINT idem_handler');
      await this.q(client, this.sql.fail, [c.ck, claimId, msText(this.config.failureCooldown)]);
      await client.query('COMMIT');
    } catch {
      await this.rollbackQuietly(client);
    }
  }

  // BEGIN; idem_begin; handler(client, claim); idem_finalize; COMMIT.
  runInTransaction(request, handler, isolation) {
    return this.observe(() => this.inTxRun(request, handler, isolation));
  }

  async inTxRun(request, handler, isolation) {
    const { early, c } = this.prepare(request);
    if (early) return early;
    if (!c) return this.unguardedTx(handler, isolation);
    try {
      const refused = await this.refuseRouter(c, 'in-transaction');
      if (refused) return refused;
      return await this.inTxLoop(c, handler, isolation);
    } finally {
      this.handBack(c);
    }
  }

  async inTxLoop(c, handler, isolation) {
    let doClaim = true;
    let wait = false;
    let attempts = 0;
    for (;;) {
      if (!wait && ++c.iterations > this.config.maxIterations) return this.timedOut(c);
      let inTx = false;
      let row;
      let client;
      try {
        client = await this.hold(c);
        if (!doClaim) row = await this.lookup(c, client);
        else {
          const caps = (await this.checked(client)).serverWait;
          const rem = Math.max(0, c.deadline - now());
          const slice = Math.min(rem, this.config.waitSlice);
          const lease = msText(this.config.lease);
          // Duplicates wait inside idem_begin for the first transaction, a slice at a time.
          const values = wait && caps.begin
            ? [c.ck, c.rh, lease, msText(slice), lockWaitText(slice + 1000)]
            : [c.ck, c.rh, lease, lockWaitText(rem)];
          // BEGIN, the claim and the handler's savepoint in one flight:
          // node-postgres sends a query without parameters as one
          // simple-protocol Query, which may hold several statements (the
          // server skips the rest after one fails). The claim's values are
          // literals there, quoted by node-postgres: two hashes and the
          // runner's own interval texts. A follower rolls the savepoint
          // back with the rest.
          const text = `${beginText(isolation)}; ${this.calls.beginInline(values)}; SAVEPOINT idem_handler`;
          inTx = true;
          const rs = await client.query({ text, types: TYPES });
          row = this.parseRow(rs[1].rows[0]);
        }
      } catch (e) {
        if (inTx) await this.rollbackQuietly(client);
        if (sqlstate(e) === '55P03') {
          if (now() >= c.deadline) return this.timedOut(c);
          continue;
        }
        if (['40001', '40P01'].includes(sqlstate(e))) {
          if (++attempts >= this.config.transactionAttempts) return this.unavailable(c, e);
          continue;
        }
        return this.unavailable(c, e);
      }

      if (doClaim && row.won) {
        this.event(row.outcome);
        c.res.generation = row.generation;
        const ctx = new ClaimContext(row.generation, row.claimId, c.ck);
        let resp;
        try {
          c.res.handlerRan = true;
          resp = asResponse(await handler(client, ctx));
        } catch (e) {
          if (['40001', '40P01'].includes(sqlstate(e)) && attempts + 1 < this.config.transactionAttempts) {
            attempts++;
            await this.rollbackQuietly(client); // everything rolled back, the claim too: run it again
            doClaim = true;
            wait = false;
            continue;
          }
          // The handler threw: keep a cooldown, drop its writes.
          await this.keepCooldown(c, client, row.claimId);
          this.finish(c, ClientOutcome.FAILED);
          throw e;
        }
        // The handler has returned: an error from here on is the store's.
        // It is answered, not thrown, and never runs the handler again in
        // this call (but for the server's own "retry the transaction", 40001
        // / 40P01, which rolled everything back).
        try {
          const action = this.storage(resp.status);
          let setting;
          if (action === FINALIZE) setting = (await this.q(client, this.sql.finalize, this.finalizeParams(c, row.claimId, resp, true))).cap;
          else if (action === RELEASE) await this.q(client, this.sql.release, [c.ck, row.claimId]);
          else {
            // A failure keeps none of the handler's writes but keeps the cooldown.
            await client.query('ROLLBACK TO SAVEPOINT idem_handler');
            await this.q(client, this.sql.fail, [c.ck, row.claimId, msText(this.config.failureCooldown)]);
          }
          await client.query('COMMIT');
          c.res.response = resp;
          if (action === FINALIZE) this.event(Event.FINALIZED);
          if (action === FINALIZE) return this.finish(c, this.uncached(resp, setting) ? ClientOutcome.COMPLETED_UNCACHEABLE : ClientOutcome.WON_COMPLETED);
          return this.finish(c, action === FAIL ? ClientOutcome.FAILED : ClientOutcome.WON_COMPLETED);
        } catch (e) {
          if (transient(e) && attempts + 1 < this.config.transactionAttempts) {
            attempts++;
            await this.rollbackQuietly(client);
            doClaim = true;
            wait = false;
            continue; // everything rolled back, the claim too
          }
          // Nothing of this request is committed. Keep a cooldown (duplicates
          // waiting in idem_begin are not run at once) and tell the caller
          // that its result was not stored.
          this.event(Event.FINALIZE_ERROR);
          c.res.error = e;
          if (connectionLost(e)) {
            c.res.outcomeUnknown = true; // a COMMIT may have been in flight
            client.idemBroken = true;
          }
          await this.keepCooldown(c, client, row.claimId);
          return this.answer(c, problems.outcomeUnknown(this.config.profile, this.config.retryAfter), ClientOutcome.FAILED);
        }
      }
      if (inTx) await this.rollbackQuietly(client);
      this.handBack(c);
      const n = await this.follow(c, row, this.setup.serverWait.begin);
      if (n.response !== undefined) return n;
      ({ claim: doClaim, wait } = n);
    }
  }

  // Decorator: wraps fn(request, claim) (lease) or fn(request, client, claim)
  // (fenced, in_transaction) into request => Promise<RunResult>.
  idempotent(fn, { mode = 'lease', isolation } = {}) {
    if (!['lease', 'fenced', 'in_transaction'].includes(mode)) throw new TypeError("mode must be 'lease', 'fenced' or 'in_transaction'");
    return (request) => {
      if (mode === 'lease') return this.run(request, (claim) => fn(request, claim));
      const h = (client, claim) => fn(request, client, claim);
      return mode === 'fenced' ? this.runFenced(request, h, isolation) : this.runInTransaction(request, h, isolation);
    };
  }
}

Runner.WON = WON; // the claim outcomes whose caller runs the handler

module.exports = { Runner, ClaimContext, parseSizeSetting, TYPES };
