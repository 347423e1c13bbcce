'use strict';
// The outbox relay: publishes the events staged with idem_outbox_stage (in
// your transactions) to your broker, at least once, in per-key order, from
// as many relays as you like (the C++ client's idem::drainer,
// client/cpp/include/idem/outbox.hpp, with the same protocol).
//
//   const drainer = new Drainer(pool, async (event) => {
//     await channel.publish('orders', event.topic, event.body, { messageId: String(event.id) });
//   });                                        // throw when the broker did not take it
//   const running = drainer.run();             // until drainer.stop()
//
// Each batch, on one pooled client and with no transaction held while
// publishing:
//
//   SELECT ... FROM idem_outbox_claim(batch, lease)    -- at most batch events, leased to one token
//   publish each event in id order
//   SELECT idem_outbox_ack(token, published ids)       -- how many were still held
//   SELECT ... FROM idem_outbox_nack(token, id, error) -- per failure: retry | dead | stale
//
// and between empty claims `SELECT idem_outbox_wait(slice)`, which returns
// as soon as an event is claimable (woken by commits).
//
// At least once: an event whose ack is lost (the relay died or stalled past
// its lease, the connection failed) is published again; consumers
// deduplicate by event id (./inbox). Per-key order: the server hands out
// no event while an earlier one of its key is unpublished; when publishing
// one fails, the batch's later events of that key are held back and come
// back after the lease, behind it. Events are not published once less than
// leaseMargin is left of the lease (expired). stop() interrupts an idle
// wait at once (a cancel request), never a publish: with 'finish_batch'
// (the default) run() publishes and acks the rest of the batch, with
// 'abandon_rest' it acks what was published and leaves the rest to the
// lease. A batch's report counts protocol.RELAY_COUNTS.

const net = require('node:net');
const { ConfigError } = require('./config');
const { TYPES } = require('./statements');
const protocol = require('./protocol');
const m = require('./messages');

const { NACK_COUNT, RELAY_COUNTS, NackOutcome } = protocol;
const NACK_OUTCOMES = new Set(Object.values(NackOutcome));
const FINISH_BATCH = 'finish_batch';
const ABANDON_REST = 'abandon_rest';
// Longest single idem_outbox_wait: a cancel request that reaches the
// server before the statement starts is ignored, so stop() takes effect
// within a slice.
const WAIT_SLICE = 1000;

const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });

// A report with every count at zero (protocol.RELAY_COUNTS).
function emptyReport() {
  return Object.fromEntries(RELAY_COUNTS.map((name) => [name, 0]));
}

function addReport(total, rep) {
  for (const name of RELAY_COUNTS) total[name] += rep[name];
  return total;
}

// One claimed event, as idem_outbox_claim returned it. id is a BigInt.
function eventOf(row) {
  return {
    id: row.id,
    topic: row.topic,
    key: row.key, //                     null: no per-key order
    payload: row.payload, //             a jsonb payload as JSON text, or null
    payloadBytes: row.payload_bytes, //  a bytea payload (a Buffer), or null
    headers: row.headers, //             an object of strings, or null
    attempts: row.attempts, //           publish attempts, this one included
    createdAt: row.created_at,
    claimToken: row.claim_token,
    leaseExpiresAt: row.lease_expires_at,
    // The payload's bytes: the binary payload, or the JSON text in UTF-8.
    get body() {
      if (this.payloadBytes) return this.payloadBytes;
      return this.payload === null ? null : Buffer.from(this.payload, 'utf8');
    },
  };
}

function duration(name, value, low, high) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < low || value > high) {
    throw new ConfigError(`drainer: ${name} must be between ${low} and ${high} milliseconds`);
  }
  return value;
}

class Drainer {
  // pool: a pg.Pool or a connection string; publish(event): resolves when
  // the broker took the event, rejects (or resolves false) when it did not:
  // the error's message is recorded by idem_outbox_nack. Options (durations
  // in milliseconds): batch (events per claim, 1..10000), lease (how long a
  // claim holds its events; the server refuses more than idem.max_lease),
  // leaseMargin (publishing stops this long before the lease ends; default
  // lease / 5), idleWait (longest idem_outbox_wait between empty claims),
  // errorBackoff (run()'s pause after a database error), onStop
  // ('finish_batch' or 'abandon_rest'), maxErrorBytes, schema,
  // onBatch(report) after every batch that claimed something,
  // onError(error) with each database error run() recovers from, metrics
  // ({onRelay(report)}, e.g. require('pg-idem').prometheus()).
  constructor(pool, publish, options = {}) {
    if (typeof publish !== 'function') throw new ConfigError('drainer: the publisher must be a function');
    const o = { batch: 100, lease: 30000, idleWait: 5000, errorBackoff: 1000, onStop: FINISH_BATCH, maxErrorBytes: 2000,
      ...options };
    this.pool = m.poolOf(pool);
    this.publish = publish;
    this.batch = m.integer('drainer', 'batch', o.batch, 1, 10000);
    this.lease = duration('lease', o.lease, 10, 86400000);
    this.leaseMargin = o.leaseMargin === undefined ? this.lease / 5 : duration('leaseMargin', o.leaseMargin, 0, this.lease);
    if (this.leaseMargin >= this.lease) throw new ConfigError('drainer: leaseMargin must be less than the lease');
    this.idleWait = duration('idleWait', o.idleWait, 1, 3600000);
    this.errorBackoff = duration('errorBackoff', o.errorBackoff, 1, 3600000);
    if (![FINISH_BATCH, ABANDON_REST].includes(o.onStop)) throw new ConfigError("drainer: onStop must be 'finish_batch' or 'abandon_rest'");
    this.onStop = o.onStop;
    this.maxErrorBytes = m.integer('drainer', 'maxErrorBytes', o.maxErrorBytes, 16, 1024 * 1024);
    this.onBatch = o.onBatch;
    this.onError = o.onError;
    this.metrics = o.metrics;
    this.sql = {
      claim: 'SELECT id, topic, key, payload::text, payload_bytes, headers, attempts, created_at,'
        + ` claim_token::text, lease_expires_at FROM ${m.qualified(o.schema, 'idem_outbox_claim')}($1, $2::interval)`,
      ack: `SELECT ${m.qualified(o.schema, 'idem_outbox_ack')}($1::uuid, $2::bigint[]) AS acked`,
      nack: `SELECT n.outcome FROM ${m.qualified(o.schema, 'idem_outbox_nack')}($1::uuid, $2::bigint, $3) n`,
      wait: `SELECT ${m.qualified(o.schema, 'idem_outbox_wait')}($1::interval) AS found`,
    };
    this.total = emptyReport();
    this.stopping = false;
    this.running = false;
    this.waiting = null; // {client} while run() is inside idem_outbox_wait
    this.wake = null; //    resolves run()'s pause when stop() is called
  }

  // A statement, run again when it was canceled: a cancel request meant for
  // idem_outbox_wait (stop()) can land on the statement after it.
  async query(client, text, values) {
    try {
      return await client.query({ text, values, types: TYPES });
    } catch (e) {
      if (m.sqlstate(e) !== m.QUERY_CANCELED) throw e;
      return client.query({ text, values, types: TYPES });
    }
  }

  async drain(client) {
    const rep = emptyReport();
    const sent = performance.now();
    const { rows } = await this.query(client, this.sql.claim, [this.batch, `${this.lease} milliseconds`]);
    rep.claimed = rows.length;
    if (rows.length === 0) return rep;
    const deadline = sent + this.lease - this.leaseMargin;
    const token = rows[0].claim_token;
    const published = [];
    const failed = [];
    const blocked = new Set();
    for (const row of rows) {
      const event = eventOf(row);
      if (this.stopping && this.onStop === ABANDON_REST) {
        rep.abandoned++;
        continue;
      }
      if (performance.now() >= deadline) {
        rep.expired++;
        continue;
      }
      if (event.key !== null && blocked.has(event.key)) {
        rep.held_back++;
        continue;
      }
      let error;
      try {
        if ((await this.publish(event)) === false) error = 'the publisher answered false';
      } catch (e) {
        error = e === undefined ? 'publish failed' : e;
      }
      if (error === undefined) {
        published.push(String(event.id));
        rep.published++;
        continue;
      }
      if (event.key !== null) blocked.add(event.key);
      failed.push([String(event.id), m.errorText(error, this.maxErrorBytes)]);
    }

    // Ack first: a published event that is not acked is published again.
    if (published.length > 0) {
      const acked = (await this.query(client, this.sql.ack, [token, published])).rows[0].acked;
      rep.acked = acked;
      rep.lease_lost = published.length - acked;
    }
    for (const [id, error] of failed) {
      const { outcome } = (await this.query(client, this.sql.nack, [token, id, error])).rows[0];
      rep[NACK_OUTCOMES.has(outcome) ? NACK_COUNT[outcome] : NACK_COUNT[NackOutcome.STALE]]++;
    }
    addReport(this.total, rep);
    if (this.metrics && this.metrics.onRelay) this.metrics.onRelay(rep);
    if (this.onBatch) this.onBatch(rep);
    return rep;
  }

  // Claims one batch and publishes it (claimed === 0: nothing was
  // claimable). Database errors reject.
  async drainOnce() {
    const client = await m.checkout(this.pool);
    let ok = false;
    try {
      const rep = await this.drain(client);
      ok = true;
      return rep;
    } finally {
      m.giveBack(client, !ok);
    }
  }

  // Drains until stop(): claims while batches come back, waits with
  // idem_outbox_wait when one comes back empty; recovers from database
  // errors (onError, errorBackoff, a new client). Resolves once stopped.
  async run() {
    if (this.running) throw new Error('drainer.run: already running');
    this.running = true;
    let client = null;
    try {
      while (!this.stopping) {
        try {
          if (!client) client = await m.checkout(this.pool);
          if ((await this.drain(client)).claimed > 0) continue;
          if (!(await this.waitForWork(client))) break;
        } catch (e) {
          if (this.onError) this.onError(e);
          if (client) m.giveBack(client, true);
          client = null;
          if (!this.stopping) {
            await new Promise((resolve) => {
              this.wake = resolve;
              setTimeout(resolve, this.errorBackoff);
            });
          }
        }
      }
    } finally {
      if (client) m.giveBack(client, false);
      this.running = false;
    }
  }

  // False when stopped; true when work is claimable or idleWait passed.
  async waitForWork(client) {
    const until = performance.now() + this.idleWait;
    for (;;) {
      const left = until - performance.now();
      if (left <= 0) return !this.stopping;
      if (this.stopping) return false;
      let found;
      try {
        found = await this.waitSlice(client, Math.max(1, Math.min(left, WAIT_SLICE)));
      } catch (e) {
        if (this.stopping && m.sqlstate(e) === m.QUERY_CANCELED) return false;
        throw e;
      }
      if (this.stopping) return false;
      if (found) return true;
    }
  }

  async waitSlice(client, ms) {
    this.waiting = { client };
    try {
      return (await client.query(this.sql.wait, [`${Math.round(ms)} milliseconds`])).rows[0].found;
    } finally {
      this.waiting = null;
    }
  }

  // Asks run() to return; cannot be undone. An idle wait is canceled at
  // once: a CancelRequest (the protocol's 16 bytes: length, 80877102, the
  // backend's key) on a connection of its own, best effort (the slice
  // ends by itself anyway).
  stop() {
    this.stopping = true;
    if (this.wake) this.wake();
    const w = this.waiting;
    if (!w || !w.client.processID) return;
    const { host, port, processID, secretKey } = w.client;
    const message = Buffer.alloc(16);
    message.writeInt32BE(16, 0);
    message.writeInt32BE(80877102, 4);
    message.writeInt32BE(processID, 8);
    message.writeInt32BE(secretKey, 12);
    const socket = host && host.startsWith('/') ? net.connect(`${host}/.s.PGSQL.${port}`) : net.connect(port, host);
    socket.on('error', () => {});
    socket.on('connect', () => socket.end(message));
  }

  get stopRequested() {
    return this.stopping;
  }

  // The sum of every batch so far.
  totals() {
    return { ...this.total };
  }
}

module.exports = { Drainer, FINISH_BATCH, ABANDON_REST, emptyReport };
