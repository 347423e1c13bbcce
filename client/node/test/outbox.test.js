'use strict';
// The outbox relay (lib/outbox.js) against the real server: the C++
// client's drainer tests (client/cpp/tests/integration_messages_test.cpp).
// Each test starts from an empty outbox.

const test = require('node:test');
const assert = require('node:assert/strict');
const pg = require('pg');
const { Drainer, ConfigError, prometheus } = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_outbox_test';
let options;
let db;

const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });
const one = async (sql, params = []) => (await db.query(sql, params)).rows[0];
const poolWith = (extra = {}, settings = '') => {
  const p = new pg.Pool({ ...options, ...extra, ...(settings ? { options: settings } : {}) });
  p.on('error', () => {});
  return p;
};

async function stage(topic, n, keys = []) {
  const r = await db.query(`SELECT idem_outbox_stage($1, jsonb_build_object('seq', g),
    CASE WHEN cardinality($3::text[]) > 0 THEN ($3::text[])[1 + (g % cardinality($3::text[]))] END) AS id
    FROM generate_series(0, $2 - 1) g ORDER BY g`, [topic, n, keys]);
  return r.rows.map((row) => BigInt(row.id));
}

async function eventually(check, timeout = 30000) {
  const until = Date.now() + timeout;
  while (Date.now() < until) {
    if (await check()) return true;
    await sleep(10);
  }
  return check();
}

test.describe('the relay against the server', { skip }, () => {
  test.before(async () => {
    options = await createDatabase(DB);
    db = new pg.Client(options);
    await db.connect();
  });
  test.beforeEach(async () => {
    await db.query('DELETE FROM idem_outbox');
  });
  test.after(async () => {
    await db.end();
    await dropDatabase(DB);
  });

  test('relays publish every event once, in per-key order', async () => {
    const keys = ['k0', 'k1', 'k2', 'k3', 'k4', 'k5', 'k6', 'k7'];
    let staged = [];
    for (let round = 0; round < 4; round++) staged = staged.concat(await stage('orders', 40, keys), await stage('orders', 10));
    const log = [];
    const pool = poolWith({ max: 8 });
    const publish = async (e) => {
      if (e.id % 7n === 0n) await sleep(1);
      log.push(e);
    };
    const drainers = [0, 1, 2].map(() => new Drainer(pool, publish, { batch: 16, idleWait: 200 }));
    const runs = drainers.map((d) => d.run());
    const all = await eventually(() => log.length >= staged.length);
    await sleep(50);
    drainers.forEach((d) => d.stop());
    await Promise.all(runs);
    await pool.end();
    assert.ok(all, `published ${log.length} of ${staged.length}`);
    const ids = log.map((e) => e.id);
    assert.equal(new Set(ids).size, ids.length, 'an event was published twice');
    assert.deepEqual([...ids].sort((a, b) => (a < b ? -1 : 1)), staged);
    const last = {};
    for (const e of log) {
      assert.match(e.payload, /^\{"seq": \d+\}$/);
      if (e.key === null) continue;
      assert.ok(e.id > (last[e.key] || 0n), `key ${e.key} out of order`);
      last[e.key] = e.id;
    }
    assert.equal(drainers.reduce((n, d) => n + d.totals().acked, 0), staged.length);
    assert.equal(drainers.reduce((n, d) => n + d.totals().lease_lost, 0), 0);
    assert.equal(Number((await one("SELECT count(*) AS n FROM idem_outbox WHERE state = 'published' AND topic = 'orders'")).n),
      staged.length);
  });

  test('a failing publisher is retried after the backoff, then dead', async () => {
    const pool = poolWith({}, '-c idem.outbox_backoff=1s -c idem.outbox_max_attempts=3');
    const [id] = await stage('payments', 1);
    const calls = [];
    const d = new Drainer(pool, async (e) => { calls.push(e.attempts); throw new Error('broker down'); });
    const b1 = await d.drainOnce();
    assert.deepEqual([b1.claimed, b1.retried], [1, 1]);
    assert.equal((await d.drainOnce()).claimed, 0);
    await sleep(1100);
    assert.equal((await d.drainOnce()).retried, 1);
    await sleep(1100);
    assert.equal((await d.drainOnce()).dead, 1);
    assert.deepEqual(calls, [1, 2, 3]);
    assert.deepEqual({ ...(await one('SELECT state, attempts, last_error FROM idem_outbox WHERE id = $1', [id])) },
      { state: 'dead', attempts: 3, last_error: 'broker down' });
    await sleep(1100);
    assert.equal((await d.drainOnce()).claimed, 0);
    await pool.end();
  });

  test('a failed event holds its key until it is published', async () => {
    const pool = poolWith({}, '-c idem.outbox_backoff=1s');
    const ids = await stage('payments', 3, ['acct-1']);
    const published = [];
    let failed = false;
    const d = new Drainer(pool, async (e) => {
      if (!failed) {
        failed = true;
        throw new Error('timeout talking to the broker');
      }
      published.push(e.id);
    });
    assert.equal((await d.drainOnce()).retried, 1);
    assert.equal((await d.drainOnce()).claimed, 0);
    assert.equal((await one('SELECT last_error FROM idem_outbox WHERE id = $1', [ids[0]])).last_error, 'timeout talking to the broker');
    assert.ok(await eventually(async () => { await d.drainOnce(); return published.length === 3; }));
    assert.deepEqual(published, ids);
    await pool.end();
  });

  test('stop() interrupts the idle wait', async () => {
    const pool = poolWith();
    const d = new Drainer(pool, async () => {}, { idleWait: 30000 });
    const running = d.run();
    assert.ok(await eventually(async () => Number((await one("SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'active'"
      + " AND query LIKE '%idem_outbox_wait%' AND pid <> pg_backend_pid()")).n) > 0));
    const asked = Date.now();
    d.stop();
    await running;
    assert.ok(Date.now() - asked < 600, `stopped after ${Date.now() - asked} ms`);
    assert.ok(d.stopRequested);
    assert.equal(pool.idleCount, 1);
    await pool.end();
  });

  for (const mode of ['finish_batch', 'abandon_rest']) {
    test(`stop() with ${mode}`, async () => {
      const pool = poolWith();
      await stage('exports', 6);
      let published = 0;
      const d = new Drainer(pool, async () => {
        if (published++ === 0) d.stop();
        await sleep(10);
      }, { lease: 2000, onStop: mode }); // the abandoned rest stays leased while a slow machine looks
      await d.run();
      const t = d.totals();
      assert.equal(t.claimed, 6);
      if (mode === 'finish_batch') {
        assert.equal(t.acked, 6);
      } else {
        assert.deepEqual([t.acked, t.abandoned], [1, 5]);
        const again = new Drainer(pool, async () => {});
        assert.equal((await again.drainOnce()).claimed, 0);
        await sleep(2100);
        const b = await again.drainOnce();
        assert.deepEqual([b.claimed, b.acked], [5, 5]);
      }
      await pool.end();
    });
  }

  test('an ack after the lease was taken over is reported', async () => {
    const pool = poolWith();
    await stage('slow', 1);
    let entered;
    const inside = new Promise((r) => { entered = r; });
    let release;
    const gate = new Promise((r) => { release = r; });
    const slow = new Drainer(pool, async () => { entered(); await gate; }, { lease: 1500, leaseMargin: 0 }); // a slow claim still leaves the publish its lease
    const late = slow.drainOnce();
    await inside;
    await sleep(1600);
    const b = await new Drainer(pool, async () => {}).drainOnce();
    assert.deepEqual([b.claimed, b.acked], [1, 1]);
    release();
    const l = await late;
    assert.deepEqual([l.published, l.acked, l.lease_lost], [1, 0, 1]);
    assert.equal(Number((await one('SELECT count(*) AS n FROM idem_outbox_archive')).n), 1);
    await pool.end();
  });

  test('batches are counted; bad settings are refused', async () => {
    const prom = require('prom-client'); // eslint-disable-line global-require
    const registry = new prom.Registry();
    const pool = poolWith();
    await stage('counted', 3, ['x']);
    const reports = [];
    await new Drainer(pool, async () => { throw new Error('no route to broker'); },
      { metrics: prometheus({ registry }), onBatch: (r) => reports.push(r) }).drainOnce();
    const text = await registry.metrics();
    assert.match(text, /idem_client_outbox_events_total\{result="claimed"\} 1/);
    assert.match(text, /idem_client_outbox_events_total\{result="retried"\} 1/);
    assert.match(text, /idem_client_outbox_events_total\{result="acked"\} 0/);
    assert.deepEqual([reports.length, reports[0].claimed, reports[0].retried], [1, 1, 1]);
    for (const bad of [{ batch: 0 }, { lease: 0 }, { lease: 100, leaseMargin: 100 }, { idleWait: 0 }, { onStop: 'later' },
      { maxErrorBytes: 4 }]) {
      assert.throws(() => new Drainer(pool, async () => {}, bad), ConfigError, JSON.stringify(bad));
    }
    assert.throws(() => new Drainer(pool, null), ConfigError);
    await pool.end();
  });
});
