'use strict';
// Integration tests against the real server (PG_IDEM_TEST_DSN): the contract
// of the C++ client, request by request.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const pg = require('pg');
const { Runner, cacheKey } = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_test';
let options;
let pool;
let db;

const key = () => crypto.randomUUID();
const req = (k, body = '{"amount": 1}', principal = 'alice', target = '/payments') => (
  { principal, method: 'POST', target, keys: k === null ? [] : [k], body });
const ok = (body = '{"ok": true}', status = 201, headers = [['Content-Type', 'application/json']]) => async () => ({ status, headers, body });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const header = (res, name) => (res.headers.find(([n]) => n.toLowerCase() === name.toLowerCase()) || [])[1];
const count = async (k) => Number((await db.query('SELECT count(*) AS n FROM effects WHERE k = $1', [k])).rows[0].n);

test.describe('against the server', { skip }, () => {
  test.before(async () => {
    options = await createDatabase(DB);
    pool = new pg.Pool({ ...options, max: 40 });
    pool.on('error', () => {}); // idle clients whose backend was terminated (DROP DATABASE ... WITH (FORCE))
    db = new pg.Client(options);
    await db.connect();
  });
  test.after(async () => {
    await db.end();
    await pool.end();
    await dropDatabase(DB);
  });

  test('cacheKey equals idem_key on random tuples, unicode included', async () => {
    const alphabet = [...'abcXYZ09 /?&=-_.~%é中文🎉\u00a0\u2028\'"\\'];
    const pick = (n) => Array.from({ length: Math.floor(Math.random() * (n + 1)) }, () => alphabet[Math.floor(Math.random() * alphabet.length)]).join('');
    const tuples = [];
    for (let i = 0; i < 600; i++) tuples.push([pick(40), ['POST', 'PATCH', 'put', ''][i % 4], pick(80), pick(60) || 'k']);
    tuples.push(['p', 'POST', '/', 'é'.repeat(127)], ['p', 'POST', '/', 'x'.repeat(255)]);
    const cols = [0, 1, 2, 3].map((i) => tuples.map((t) => t[i]));
    const r = await db.query('SELECT idem_key(u.p, u.m, u.t, u.k) AS k FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) '
      + 'WITH ORDINALITY AS u(p, m, t, k, n) ORDER BY u.n', cols);
    assert.equal(r.rows.length, tuples.length);
    r.rows.forEach((row, i) => assert.deepEqual(row.k, cacheKey(...tuples[i]), JSON.stringify(tuples[i])));
  });

  test('replay with allowlisted headers and the marker; generations are BigInt', async () => {
    const r = new Runner(pool, { replayHeaders: ['X-Request-Id'] });
    const k = key();
    const first = await r.run(req(k), ok('{"ok": true}', 201, [['Content-Type', 'application/json'], ['Set-Cookie', 'sid=1'],
      ['Authorization', 'x'], ['X-Request-Id', 'r1'], ['X-Session', 's'], ['Location', '/payments/1']]));
    assert.equal(first.outcome, 'won_completed');
    assert.equal(typeof first.generation, 'bigint');
    assert.ok(first.generation > 0n);
    assert.equal(header(first.response, 'set-cookie'), 'sid=1');
    const again = await r.run(req(k), ok('never'));
    assert.ok(again.replayed && !again.handlerRan);
    assert.equal(again.response.body.toString(), '{"ok": true}');
    assert.equal(header(again.response, 'Idempotent-Replayed'), 'true');
    assert.equal(header(again.response, 'x-request-id'), 'r1');
    assert.equal(header(again.response, 'location'), '/payments/1');
    for (const n of ['set-cookie', 'authorization', 'x-session']) assert.equal(header(again.response, n), undefined);
    // The application's own queries keep pg's defaults: int8 as a string.
    assert.equal(typeof (await pool.query('SELECT 1::int8 AS n')).rows[0].n, 'string');
  });

  test('another body: 422 (IETF) / 409 (conflict409)', async () => {
    const k = key();
    await new Runner(pool).run(req(k), ok());
    assert.equal((await new Runner(pool).run(req(k, 'other'), ok())).response.status, 422);
    assert.equal((await new Runner(pool, { profile: 'conflict409' }).run(req(k, 'other'), ok())).response.status, 409);
  });

  test('absent key: unguarded, or 400 when required', async () => {
    const r = new Runner(pool);
    assert.equal((await r.run(req(null), ok())).outcome, 'unguarded');
    assert.equal((await r.run({ ...req(null), keyRequired: true }, ok())).response.status, 400);
  });

  test('401/403/3xx release the key; 404 is stored', async () => {
    const r = new Runner(pool);
    for (const status of [401, 403, 302]) {
      const k = key();
      await r.run(req(k), ok('', status));
      assert.ok((await r.run(req(k), ok())).handlerRan, String(status));
    }
    const k = key();
    await r.run(req(k), ok('nf', 404));
    const again = await r.run(req(k), ok());
    assert.ok(again.replayed);
    assert.equal(again.response.status, 404);
  });

  test('5xx: cooldown with Retry-After, then one retry runs; a throwing handler too', async () => {
    // 1 s: the longest cooldown whose Retry-After is still "1", so a slow
    // machine has the most time to send the retry within it.
    const r = new Runner(pool, { failureCooldown: 1000 });
    const k = key();
    assert.equal((await r.run(req(k), ok('', 503))).response.status, 503);
    const cool = await r.run(req(k), ok());
    assert.equal(cool.response.status, 503);
    assert.equal(header(cool.response, 'retry-after'), '1');
    assert.ok(!cool.handlerRan);
    await sleep(1100);
    assert.ok((await r.run(req(k), ok())).handlerRan);
    const k2 = key();
    await assert.rejects(r.run(req(k2), async () => { throw new Error('boom'); }), /boom/);
    assert.equal((await r.run(req(k2), ok())).response.status, 503);
  });

  test('concurrent duplicates run once', async () => {
    const r = new Runner(pool, { followerWaitBudget: 3000 });
    const k = key();
    let runs = 0;
    const results = await Promise.all(Array.from({ length: 8 }, () => r.run(req(k), async () => {
      runs += 1;
      await sleep(300);
      return { status: 201, body: 'once' };
    })));
    assert.equal(runs, 1);
    assert.ok(results.every((x) => x.response.status === 201 && x.response.body.toString() === 'once'));
    assert.equal(results.filter((x) => x.replayed).length, 7);
  });

  test('past the wait budget: 409 + Retry-After (IETF), 503 (conflict409)', async () => {
    const k = key();
    // The slow winner holds the key until both followers have answered, so
    // their waits end with their budgets, not with the winner (no upper
    // bound on the time, which a busy machine would break).
    let holding;
    let release;
    const held = new Promise((res) => { holding = res; });
    const released = new Promise((res) => { release = res; });
    let slowDone = false;
    const slow = new Runner(pool).run(req(k), async () => { holding(); await released; return { status: 201, body: 'x' }; });
    slow.then(() => { slowDone = true; });
    await held;
    const t0 = performance.now();
    const r = await new Runner(pool, { followerWaitBudget: 300 }).run(req(k), ok());
    const waited = performance.now() - t0;
    const s = await new Runner(pool, { followerWaitBudget: 200, profile: 'conflict409' }).run(req(k), ok());
    const slowStillRunning = !slowDone;
    release();
    await slow;
    assert.equal(r.response.status, 409);
    assert.equal(header(r.response, 'retry-after'), '1');
    assert.equal(r.outcome, 'timeout');
    assert.ok(slowStillRunning, 'the waits ended before the winner did');
    assert.ok(waited >= 250, String(waited));
    assert.equal(s.response.status, 503);
  });

  test('the lease is renewed while the handler runs', async () => {
    // Renewed every 100 ms, the 1 s lease has 900 ms of slack per renewal;
    // read at 1.5 s, it is live only because it was renewed.
    const r = new Runner(pool, { lease: 1000, renewInterval: 100 });
    const k = key();
    let lost;
    const run = r.run(req(k), async (claim) => { await sleep(2500); lost = claim.lost; return { status: 201, body: 'long' }; });
    await sleep(1500);
    const st = (await db.query('SELECT state, lease_expires_at > now() AS live FROM idem_keys WHERE cache_key = $1',
      [cacheKey('alice', 'POST', '/payments', k)])).rows[0];
    const res = await run;
    assert.deepEqual({ ...st }, { state: 'pending', live: true });
    assert.equal(res.outcome, 'won_completed');
    assert.ok(!res.leaseStolen && lost === false);
  });

  test('an over-cap body is stored not replayable', async () => {
    const r = new Runner(pool, { maxCacheableResponseBytes: 10 });
    const k = key();
    const first = await r.run(req(k), ok('x'.repeat(100)));
    assert.equal(first.outcome, 'completed_uncacheable');
    assert.equal(first.response.body.length, 100);
    assert.equal((await r.run(req(k), ok())).response.status, 409);
  });

  test('fenced: writes commit with the response; a failure rolls them back', async () => {
    const r = new Runner(pool, { failureCooldown: 5000 });
    const k = key();
    const pay = async (tx, claim) => {
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'fenced')", [k, claim.generation.toString()]);
      return { status: 201, body: 'paid' };
    };
    assert.equal((await r.runFenced(req(k), pay)).outcome, 'won_completed');
    assert.ok((await r.runFenced(req(k), pay)).replayed);
    assert.equal(await count(k), 1);
    const k2 = key();
    const fail = async (tx, claim) => {
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'fail')", [k2, claim.generation.toString()]);
      return { status: 500, body: 'no' };
    };
    assert.equal((await r.runFenced(req(k2), fail)).response.status, 500);
    assert.equal(await count(k2), 0);
    assert.equal((await r.runFenced(req(k2), fail)).response.status, 503);
  });

  test('fenced: a stolen claim rolls back and answers from the key', async () => {
    const k = key();
    const ck = cacheKey('alice', 'POST', '/payments', k);
    const thief = async (tx, claim) => {
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'thief')", [k, claim.generation.toString()]);
      return { status: 201, body: 'thief' };
    };
    const res = await new Runner(pool).runFenced(req(k), async (tx, claim) => {
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'victim')", [k, claim.generation.toString()]);
      await db.query('SELECT idem_evict($1)', [ck]);
      assert.equal((await new Runner(pool).runFenced(req(k), thief)).outcome, 'won_completed');
      return { status: 201, body: 'victim' };
    });
    assert.ok(res.leaseStolen && res.replayed);
    assert.equal(res.response.body.toString(), 'thief');
    assert.deepEqual((await db.query('SELECT note FROM effects WHERE k = $1', [k])).rows.map((x) => x.note), ['thief']);
  });

  test('in-transaction: duplicates wait in idem_begin and replay; a 5xx keeps the cooldown, not the writes', async () => {
    const r = new Runner(pool, { followerWaitBudget: 3000 });
    const k = key();
    let runs = 0;
    const h = async (tx, claim) => {
      runs += 1;
      await sleep(300);
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'tx')", [k, claim.generation.toString()]);
      return { status: 201, body: 'tx' };
    };
    const results = await Promise.all([1, 2, 3, 4].map(() => r.runInTransaction(req(k), h)));
    assert.equal(runs, 1);
    assert.equal(results.filter((x) => x.replayed).length, 3);
    assert.equal(await count(k), 1);
    const k2 = key();
    const down = async (tx, claim) => {
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'down')", [k2, claim.generation.toString()]);
      return { status: 503, body: 'down' };
    };
    assert.equal((await r.runInTransaction(req(k2), down)).response.status, 503);
    assert.equal(await count(k2), 0);
    const again = await r.runInTransaction(req(k2), down);
    assert.equal(again.response.status, 503);
    assert.ok(!again.handlerRan);
  });

  test('in-transaction: a database error in the handler keeps a cooldown, not the writes', async () => {
    const r = new Runner(pool, { failureCooldown: 5000 });
    const k = key();
    const h = async (tx, claim) => {
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'dup')", [k, claim.generation.toString()]);
      await tx.query('SELECT 1/0');
      return { status: 201 };
    };
    await assert.rejects(r.runInTransaction(req(k), h), (e) => e.code === '22012');
    assert.equal(await count(k), 0);
    const again = await r.runInTransaction(req(k), h);
    assert.equal(again.response.status, 503);
    assert.ok(!again.handlerRan);
  });

  test('the decorator', async () => {
    const r = new Runner(pool);
    const pay = r.idempotent(async (request, tx, claim) => {
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'decorated')", [request.keys[0], claim.generation.toString()]);
      return { status: 201, body: 'ok' };
    }, { mode: 'fenced' });
    const k = key();
    assert.equal((await pay(req(k))).outcome, 'won_completed');
    assert.ok((await pay(req(k))).replayed);
  });

  test('the server-side wait is detected once per runner', async () => {
    const r = new Runner(pool);
    await r.run(req(key()), ok());
    const has4 = (await db.query("SELECT count(*) > 0 AS b FROM pg_proc WHERE proname = 'idem_claim' AND pronargs = 4")).rows[0].b;
    assert.equal(r.serverWait.claim, has4);
    const has5 = (await db.query("SELECT count(*) > 0 AS b FROM pg_proc WHERE proname = 'idem_claim' AND pronargs = 5")).rows[0].b;
    assert.ok(has5, 'the current extension takes lock_wait');
    assert.equal(r.calls, r.sql, 'and the runner passes it');
    const polling = new Runner(pool, { serverWait: false });
    await polling.run(req(key()), ok());
    assert.deepEqual(polling.serverWait, { claim: false, begin: false });
  });

  test('no session state is left behind', async () => {
    const one = new pg.Pool({ ...options, max: 1 });
    one.on('error', () => {}); // idle clients whose backend was terminated (DROP DATABASE ... WITH (FORCE))
    const r = new Runner(one, { maxCacheableResponseBytes: 4 });
    await r.run(req(key()), ok('xxxxxxxx'));
    await r.runInTransaction(req(key()), async () => ({ status: 201, body: 'x' }));
    const c = await one.connect();
    try {
      assert.equal((await c.query('SHOW lock_timeout')).rows[0].lock_timeout, '0');
      assert.notEqual((await c.query("SELECT current_setting('idem.max_response_bytes', true) AS v")).rows[0].v, '0');
      assert.equal((await c.query('SELECT count(*)::int AS n FROM pg_prepared_statements')).rows[0].n, 0);
    } finally {
      c.release();
      await one.end();
    }
  });
});

test.describe('a killed claim connection', { skip }, () => {
  test('scenario 22: the backend holding the claim dies before the finalize; the result is still stored once', async () => {
    const options = await createDatabase(`${DB}_kill`);
    const victims = new pg.Pool({ ...options, application_name: 'idem_victim', max: 4 });
    victims.on('error', () => {}); // idle clients whose backend was terminated (DROP DATABASE ... WITH (FORCE))
    const admin = new pg.Client(options);
    await admin.connect();
    try {
      const k = key();
      const res = await new Runner(victims).run(req(k), async () => {
        await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idem_victim' "
          + 'AND datname = current_database()');
        await sleep(50);
        return { status: 201, body: 'survived' };
      });
      assert.equal(res.outcome, 'won_completed');
      assert.equal(res.response.body.toString(), 'survived');
      assert.ok(!res.outcomeUnknown && !res.leaseStolen);
      const again = await new Runner(victims).run(req(k), ok());
      assert.ok(again.replayed);
      assert.equal(again.response.body.toString(), 'survived');
    } finally {
      await admin.end();
      await victims.end();
      await dropDatabase(`${DB}_kill`);
    }
  });
});

test.describe('transaction retries', { skip }, () => {
  for (const mode of ['runFenced', 'runInTransaction']) {
    test(`${mode}: a serialization failure reruns the transaction, stored once`, async () => {
      const options = await createDatabase(`${DB}_${mode.toLowerCase()}`);
      const p = new pg.Pool(options);
      p.on('error', () => {});
      try {
        const r = new Runner(p);
        const k = key();
        let calls = 0;
        const h = async (tx, claim) => {
          calls += 1;
          await tx.query("INSERT INTO effects VALUES ($1, $2, 'retry')", [k, claim.generation.toString()]);
          if (calls === 1) await tx.query("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$");
          return { status: 201, body: 'second' };
        };
        const res = await r[mode](req(k), h, 'serializable');
        assert.equal(res.response.body.toString(), 'second');
        assert.equal(res.outcome, 'won_completed');
        assert.equal(calls, 2);
        assert.equal(Number((await p.query('SELECT count(*) AS n FROM effects WHERE k = $1', [k])).rows[0].n), 1);
        assert.ok((await r[mode](req(k), h)).replayed);
      } finally {
        await p.end();
        await dropDatabase(`${DB}_${mode.toLowerCase()}`);
      }
    });
  }
});
