'use strict';
// The claim connections of a runner's requests, and what an exhausted pool
// is, told apart from a server that cannot be reached (issue 31;
// protocol.toml [client.pool]).
//
// A request holds a client of the pool for its claim: a winner to the end
// of its call (not while its handler runs in lease and fenced mode), a
// duplicate one wait slice at a time. A pg.Pool that is full queues the
// request (first come, first served); the runner waits for a full pool as
// long as the pool's connectionTimeoutMillis, or the protocol's pool wait
// if it has none (node-postgres' default is to wait forever), a duplicate
// at most its remaining wait budget, and
// duplicates hold at most their share of the pool at once, so that
// duplicates of a slow request cannot keep the requests that would run
// waiting. A wait that runs out is a PoolExhaustedError: answered
// connection-pool-exhausted and logged with the pool's size, what held it
// and the fix, never as "the server cannot be reached".

const { POOL } = require('./protocol');

class PoolExhaustedError extends Error {
  constructor(max, waitedMs) {
    super(`no client of the pool${max ? ` (max ${max})` : ''} came free within ${Math.round(waitedMs)} ms`);
    this.name = 'PoolExhaustedError';
    this.code = 'PG_IDEM_POOL_EXHAUSTED';
    this.max = max;
    this.held = undefined; // what held the pool's clients, in words (set by Claims)
  }
}

// node-postgres' own words when a pool's connectionTimeoutMillis ends a
// wait for a client of a full pool (a new client's connect that times out
// says "Connection terminated due to connection timeout").
const PG_POOL_TIMEOUT = 'timeout exceeded when trying to connect';

function isPoolExhausted(err) {
  return Boolean(err) && (err.code === 'PG_IDEM_POOL_EXHAUSTED' || err.message === PG_POOL_TIMEOUT);
}

// The fix in an exhausted pool's log line: the protocol's, with the pool's
// size and what held its clients.
function poolFix(err) {
  const known = [];
  if (err.max) known.push(`the pool has ${err.max} client${err.max === 1 ? '' : 's'}`);
  if (err.held) known.push(`this runner's requests held ${err.held}`);
  return `${known.length ? `${known.join('; ')}: ` : ''}${POOL.fix} (the pg.Pool's max; followerWaitBudget)`;
}

const maxOf = (pool) => (pool && pool.options && Number.isInteger(pool.options.max) && pool.options.max > 0
  ? pool.options.max : undefined);

// A pg.Pool with every client out and none idle: connect() queues.
const full = (pool) => maxOf(pool) !== undefined && pool.totalCount >= maxOf(pool) && pool.idleCount === 0;

// The duplicates' share of a pool: first come, first served, each wait bounded.
class Slots {
  constructor(size) {
    this.size = size;
    this.free = size;
    this.queue = [];
  }

  take(waitMs) {
    if (this.free > 0 && this.queue.length === 0) {
      this.free--;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const waiter = { resolve };
      waiter.timer = setTimeout(() => {
        this.queue.splice(this.queue.indexOf(waiter), 1);
        reject(new PoolExhaustedError(this.size, waitMs));
      }, Math.max(0, waitMs));
      this.queue.push(waiter);
    });
  }

  giveBack() {
    const next = this.queue.shift();
    if (!next) {
      this.free++;
      return;
    }
    clearTimeout(next.timer);
    next.resolve();
  }
}

class Claims {
  // checkout() -> a client, giveBack(client): the runner's.
  constructor(pool, checkout, giveBack) {
    const max = maxOf(pool);
    Object.assign(this, { pool, checkout, giveBack });
    this.slots = max ? new Slots(Math.max(1, Math.floor(max * POOL.duplicatesShare))) : null;
    this.held = { all: 0, duplicates: 0 };
  }

  heldText() {
    return `${this.held.all} client${this.held.all === 1 ? '' : 's'}, ${this.held.duplicates} of them duplicates waiting for their first request`;
  }

  // checkout() within waitMs when the pool is full (a client that comes
  // after that is given back); the pool's own timeout, if it has one, ends
  // the wait of a request that is not a duplicate.
  within(waitMs, duplicate) {
    if (!full(this.pool) || (!duplicate && this.pool.options.connectionTimeoutMillis)) return this.checkout();
    return new Promise((resolve, reject) => {
      let late = false;
      const timer = setTimeout(() => {
        late = true;
        reject(new PoolExhaustedError(maxOf(this.pool), waitMs));
      }, Math.max(0, waitMs));
      this.checkout().then((client) => {
        if (late) this.giveBack(client);
        else {
          clearTimeout(timer);
          resolve(client);
        }
      }, (err) => {
        if (late) return;
        clearTimeout(timer);
        reject(err);
      });
    });
  }

  // A client for request c's next round: a duplicate (c.waited) within its
  // remaining budget and its share, any other within the pool wait.
  async take(c, remainingMs) {
    const duplicate = Boolean(c.waited);
    const waitMs = duplicate ? remainingMs : POOL.waitMs;
    let slot = false;
    let client;
    try {
      if (duplicate && this.slots) {
        await this.slots.take(waitMs);
        slot = true;
      }
      client = await this.within(waitMs, duplicate);
    } catch (e) {
      if (slot) this.slots.giveBack();
      if (isPoolExhausted(e) && e.held === undefined) e.held = this.heldText();
      throw e;
    }
    client.idemHeld = { duplicate, slot };
    this.held.all++;
    if (duplicate) this.held.duplicates++;
    return client;
  }

  // Before the client goes back to the pool.
  release(client) {
    const h = client.idemHeld;
    if (!h) return;
    delete client.idemHeld;
    this.held.all--;
    if (h.duplicate) this.held.duplicates--;
    if (h.slot) this.slots.giveBack();
  }
}

module.exports = { Claims, PoolExhaustedError, isPoolExhausted, poolFix, PG_POOL_TIMEOUT };
