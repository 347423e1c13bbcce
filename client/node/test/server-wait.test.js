'use strict';
// Followers use the server-side wait, idem_claim(..., max_wait), as soon as
// the server has it. Until the extension ships the 4-argument functions,
// this database gets stand-ins (PL/pgSQL, polling inside the server, added
// to the extension so that the runner's pg_proc check sees them); with a
// server that has them, the real ones are used.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const pg = require('pg');
const { Runner } = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_wait_test';
const STAND_INS = `
CREATE FUNCTION idem_claim(cache_key bytea, request_hash bytea, lease interval, max_wait interval)
RETURNS idem_claim_result LANGUAGE plpgsql AS $$
DECLARE
    r idem_claim_result;
    deadline timestamptz := clock_timestamp() + coalesce(max_wait, '0');
BEGIN
    LOOP
        r := idem_claim(cache_key, request_hash, lease);
        EXIT WHEN r.outcome <> 'in_progress' OR clock_timestamp() >= deadline;
        INSERT INTO server_waits VALUES (1);
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN r;
END $$;
CREATE FUNCTION idem_begin(cache_key bytea, request_hash bytea, lease interval, max_wait interval)
RETURNS idem_claim_result LANGUAGE plpgsql AS $$
DECLARE
    r idem_claim_result;
    deadline timestamptz := clock_timestamp() + coalesce(max_wait, '0');
BEGIN
    LOOP
        r := idem_begin(cache_key, request_hash, lease);
        EXIT WHEN r.outcome <> 'in_progress' OR clock_timestamp() >= deadline;
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN r;
END $$;
ALTER EXTENSION pg_idem ADD FUNCTION idem_claim(bytea, bytea, interval, interval);
ALTER EXTENSION pg_idem ADD FUNCTION idem_begin(bytea, bytea, interval, interval);
`;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const req = (target) => ({ principal: 'alice', method: 'POST', target, keys: [crypto.randomUUID()], body: '{}' });
const slowWinner = (runner, request, ms, mode = 'run') => runner[mode](request, async () => {
  await sleep(ms);
  return { status: 201, body: 'winner' };
});

test.describe('server-side follower wait', { skip }, () => {
  let pool;
  let standIn = false;
  const waits = async () => Number((await pool.query('SELECT count(*) AS n FROM server_waits')).rows[0].n);

  test.before(async () => {
    pool = new pg.Pool({ ...(await createDatabase(DB)), max: 20 });
    pool.on('error', () => {}); // idle clients whose backend was terminated (DROP DATABASE ... WITH (FORCE))
    await pool.query('CREATE TABLE server_waits (n int)');
    const has4 = Number((await pool.query("SELECT count(*) AS n FROM pg_proc WHERE proname IN ('idem_claim', 'idem_begin') "
      + 'AND pronargs = 4')).rows[0].n);
    if (has4 === 0) {
      await pool.query(STAND_INS);
      standIn = true;
    }
  });
  test.after(async () => {
    await pool.end();
    await dropDatabase(DB);
  });

  test('followers wait in the server and replay', async () => {
    const r = req('/w');
    const winner = slowWinner(new Runner(pool), r, 800);
    await sleep(200);
    const follower = new Runner(pool, { followerWaitBudget: 3000 });
    const res = await follower.run(r, async () => ({ status: 201, body: 'follower' }));
    await winner;
    assert.deepEqual(follower.serverWait, { claim: true, begin: true });
    assert.ok(res.replayed);
    assert.equal(res.response.body.toString(), 'winner');
    if (standIn) assert.ok((await waits()) > 0);
  });

  test('the server-side wait ends with the budget: 409 + Retry-After', async () => {
    const r = req('/w2');
    const winner = slowWinner(new Runner(pool), r, 1200);
    await sleep(200);
    const t0 = performance.now();
    const res = await new Runner(pool, { followerWaitBudget: 400 }).run(r, async () => ({ status: 201 }));
    const waited = performance.now() - t0;
    await winner;
    assert.equal(res.response.status, 409);
    assert.ok(waited >= 350 && waited < 1100, String(waited));
  });

  test('in-transaction followers wait in idem_begin', async () => {
    const r = req('/wtx');
    const winner = slowWinner(new Runner(pool), r, 800);
    await sleep(200);
    const res = await new Runner(pool, { followerWaitBudget: 3000 }).runInTransaction(r, async () => ({ status: 201, body: 'x' }));
    await winner;
    assert.ok(res.replayed);
    assert.equal(res.response.body.toString(), 'winner');
  });

  test('a cooldown is answered at once, not waited out', async () => {
    const r = req('/wc');
    const runner = new Runner(pool, { failureCooldown: 2000, followerWaitBudget: 3000 });
    await runner.run(r, async () => ({ status: 503 }));
    const t0 = performance.now();
    const res = await runner.run(r, async () => ({ status: 201 }));
    assert.equal(res.response.status, 503);
    assert.ok(!res.handlerRan);
    assert.ok(performance.now() - t0 < 500);
  });

  test('serverWait: false polls instead', async () => {
    const r = req('/wp');
    const before = await waits();
    const winner = slowWinner(new Runner(pool), r, 600);
    await sleep(100);
    const res = await new Runner(pool, { serverWait: false, followerWaitBudget: 3000 }).run(r, async () => ({ status: 201 }));
    await winner;
    assert.ok(res.replayed);
    assert.equal(await waits(), before);
  });
});
