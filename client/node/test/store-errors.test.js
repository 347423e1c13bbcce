'use strict';
// The store fails after the handler ran, against the real
// server: a finalize the server refuses (an AFTER UPDATE trigger that
// refuses to complete one key) and a backend terminated right after the
// handler. In every mode the handler runs once for the key: the runner
// never releases (or fails) a key whose handler ran because storing its
// result failed; what it cannot store stays pending to its lease and the
// caller is told the outcome is unknown.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const pg = require('pg');
const { Runner, cacheKey } = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_store_errors';
const behindPooler = Boolean(process.env.PG_IDEM_TEST_POOLER);
let pool;
let db;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const req = (k, target = '/store-errors') => ({ principal: 'alice', method: 'POST', target, keys: [k], body: '{"amount": 5}' });
const ck = (r) => cacheKey(r.principal, r.method, r.target, r.keys[0]);
const header = (res, name) => (res.headers.find(([n]) => n.toLowerCase() === name.toLowerCase()) || [])[1];
const isOutcomeUnknown = (res) => res.response.status === 503 && res.response.body.toString().includes('outcome-unknown')
  && header(res.response, 'Retry-After') !== undefined;
const refuse = (r, on = true) => (on
  ? db.query('INSERT INTO refuse_finalize VALUES ($1)', [ck(r)])
  : db.query('DELETE FROM refuse_finalize WHERE cache_key = $1', [ck(r)]));
const state = async (r) => ((await db.query('SELECT state FROM idem_keys WHERE cache_key = $1', [ck(r)])).rows[0] || {}).state;
const effects = async (k) => Number((await db.query('SELECT count(*) AS n FROM effects WHERE k = $1', [k])).rows[0].n);

async function waitForLeaseExpiry(r) {
  const until = Date.now() + 60000;
  while (Date.now() < until) {
    const row = (await db.query('SELECT lease_expires_at < clock_timestamp() AS over FROM idem_keys WHERE cache_key = $1', [ck(r)])).rows[0];
    if (row && row.over) return true;
    await sleep(50);
  }
  return false;
}

async function terminate(pid) {
  await db.query('SELECT pg_terminate_backend($1)', [pid]);
  const until = Date.now() + 30000;
  while (Date.now() < until && (await db.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid])).rows.length) await sleep(5);
}

test.describe('the store fails after the handler ran', { skip }, () => {
  test.before(async () => {
    const options = await createDatabase(DB);
    pool = new pg.Pool({ ...options, max: 20 });
    pool.on('error', () => {}); // idle clients whose backend was terminated
    db = new pg.Client(options);
    await db.connect();
    await db.query('CREATE TABLE refuse_finalize (cache_key bytea PRIMARY KEY)');
    await db.query("CREATE FUNCTION refuse_finalize() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.state = 'completed' "
      + 'AND EXISTS (SELECT 1 FROM public.refuse_finalize r WHERE r.cache_key = NEW.cache_key) THEN '
      + "RAISE EXCEPTION 'finalize refused for this key (test)'; END IF; RETURN NULL; END $$");
    await db.query('CREATE TRIGGER refuse_finalize AFTER UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION refuse_finalize()');
  });
  test.after(async () => {
    await db.end();
    await pool.end();
    await dropDatabase(DB);
  });

  test('lease: a refused finalize leaves the pending key to its lease; duplicates do not run', async () => {
    const r = new Runner(pool, { lease: 6000, followerWaitBudget: 300 });
    const rq = req(crypto.randomUUID());
    await refuse(rq);
    let runs = 0;
    const h = async () => {
      runs += 1;
      return { status: 201, body: 'charged' };
    };
    const res = await r.run(rq, h);
    assert.ok(res.handlerRan && res.outcomeUnknown);
    assert.equal(res.outcome, 'failed');
    assert.ok(isOutcomeUnknown(res), res.response.body.toString());
    assert.equal(res.error && res.error.code, 'P0001');
    assert.equal(await state(rq), 'pending'); // never released, never failed
    const dups = await Promise.all(Array.from({ length: 6 }, () => r.run(rq, h)));
    assert.ok(dups.every((d) => !d.handlerRan && d.response.status !== 201));
    assert.equal(runs, 1);
    // Once the lease is over the same request recovers the key, once.
    await refuse(rq, false);
    assert.ok(await waitForLeaseExpiry(rq));
    const again = await r.run(rq, h);
    assert.equal(again.response.status, 201);
    assert.equal(again.outcome, 'won_completed');
    assert.equal(runs, 2);
    assert.ok((await r.run(rq, h)).replayed);
    assert.equal(runs, 2);
  });

  for (const mode of ['runFenced', 'runInTransaction']) {
    test(`${mode}: a refused finalize is answered, not thrown, and the handler does not run again`, async () => {
      const r = new Runner(pool, { lease: 6000, followerWaitBudget: 300, failureCooldown: 5000 });
      const k = crypto.randomUUID();
      const rq = req(k, `/store-errors/${mode}`);
      await refuse(rq);
      let runs = 0;
      const h = async (tx, claim) => {
        runs += 1;
        await tx.query("INSERT INTO effects VALUES ($1, $2, 'refused')", [k, claim.generation.toString()]);
        return { status: 201, body: 'paid' };
      };
      const res = await r[mode](rq, h);
      assert.ok(res.handlerRan);
      assert.equal(res.outcome, 'failed');
      assert.ok(isOutcomeUnknown(res), res.response.body.toString());
      assert.equal(res.error && res.error.code, 'P0001');
      assert.equal(await effects(k), 0);
      // fenced: the claim committed first and stays pending to its lease;
      // in-transaction: everything rolled back together but a cooldown.
      assert.equal(await state(rq), mode === 'runFenced' ? 'pending' : 'failed');
      for (let i = 0; i < 3; i++) assert.ok(!(await r[mode](rq, h)).handlerRan);
      assert.equal(runs, 1);
    });

    test(`${mode}: a backend terminated right after the handler does not run it again`, { skip: behindPooler && 'needs the transaction\'s own server session' }, async () => {
      const r = new Runner(pool, { lease: 6000, followerWaitBudget: 300 });
      const k = crypto.randomUUID();
      const rq = req(k, `/store-errors/terminated/${mode}`);
      let runs = 0;
      const h = async (tx, claim) => {
        runs += 1;
        await tx.query("INSERT INTO effects VALUES ($1, $2, 'terminated')", [k, claim.generation.toString()]);
        await terminate(tx.processID);
        return { status: 201, body: 'paid' };
      };
      const res = await r[mode](rq, h);
      assert.equal(runs, 1);
      assert.ok(res.handlerRan);
      assert.ok(isOutcomeUnknown(res), res.response.body.toString());
      assert.equal(await effects(k), 0);
      if (mode === 'runFenced') {
        assert.equal(await state(rq), 'pending');
        for (let i = 0; i < 3; i++) assert.ok(!(await r.runFenced(rq, h)).handlerRan);
        assert.equal(runs, 1);
      }
    });
  }
});
