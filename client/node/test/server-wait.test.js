'use strict';
// Followers use the server-side wait, idem_claim(..., max_wait), as soon as
// the server has it (pg_idem 0.3.0). Whether a follower really waited
// inside the server is read off the extension's own counter, idem_stats'
// follower_waits (the test cluster preloads pg_idem).

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const pg = require('pg');
const { Runner } = require('..');
const { createDatabase, dropDatabase, waitFor, skip } = require('./support');

const DB = 'idem_node_wait_test';
const req = (target) => ({ principal: 'alice', method: 'POST', target, keys: [crypto.randomUUID()], body: '{}' });
// A winner whose handler runs until released; resolves once it holds the
// key (no fixed sleep for it to get there) with its run and the release.
const heldWinner = async (runner, request) => {
  let holding;
  let release;
  const held = new Promise((r) => { holding = r; });
  const released = new Promise((r) => { release = r; });
  const run = runner.run(request, async () => {
    holding();
    await released;
    return { status: 201, body: 'winner' };
  });
  await held;
  return { run, release };
};

test.describe('server-side follower wait', { skip }, () => {
  let pool;
  const waits = async () => Number((await pool.query(
    "SELECT value AS n FROM idem_stats WHERE counter = 'follower_waits'")).rows[0].n);
  // Resolves once a claim of this database sleeps inside the server (its
  // wait event is the extension's), so a release comes after the wait began
  // however slowly the follower got there.
  const followerSleeping = (fn = 'idem_claim') => waitFor(async () => (await pool.query(
    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
    + "AND wait_event_type = 'Extension' AND query LIKE $1 AND pid <> pg_backend_pid()", [`%${fn}%`])).rows.length > 0,
  `a follower sleeping in ${fn}`);

  test.before(async () => {
    pool = new pg.Pool({ ...(await createDatabase(DB)), max: 20 });
    pool.on('error', () => {}); // idle clients whose backend was terminated (DROP DATABASE ... WITH (FORCE))
    const has4 = Number((await pool.query("SELECT count(*) AS n FROM pg_proc WHERE proname IN ('idem_claim', 'idem_begin') "
      + 'AND pronargs = 4')).rows[0].n);
    assert.equal(has4, 2, "the server's pg_idem has no max_wait");
  });
  test.after(async () => {
    await pool.end();
    await dropDatabase(DB);
  });

  test('followers wait in the server and replay', async () => {
    const r = req('/w');
    const before = await waits();
    const { run: winner, release } = await heldWinner(new Runner(pool), r);
    const follower = new Runner(pool, { followerWaitBudget: 30000 });
    const answered = follower.run(r, async () => ({ status: 201, body: 'follower' }));
    await followerSleeping();
    release();
    const res = await answered;
    await winner;
    assert.deepEqual(follower.serverWait, { claim: true, begin: true });
    assert.ok(res.replayed);
    assert.equal(res.response.body.toString(), 'winner');
    assert.ok((await waits()) > before, 'the follower waited inside the server');
  });

  test('the server-side wait ends with the budget: 409 + Retry-After', async () => {
    const r = req('/w2');
    // The winner holds the key until the follower has answered: the wait
    // ended with the budget, not with the winner (no upper bound on the
    // time, which a busy machine would break).
    const { run: winner, release } = await heldWinner(new Runner(pool), r);
    let winnerDone = false;
    winner.then(() => { winnerDone = true; });
    const t0 = performance.now();
    const res = await new Runner(pool, { followerWaitBudget: 400 }).run(r, async () => ({ status: 201 }));
    const waited = performance.now() - t0;
    const winnerStillRunning = !winnerDone;
    release();
    await winner;
    assert.equal(res.response.status, 409);
    assert.ok(winnerStillRunning, 'the wait ended before the winner did');
    assert.ok(waited >= 350, String(waited));
  });

  test('in-transaction followers wait in idem_begin', async () => {
    const r = req('/wtx');
    const { run: winner, release } = await heldWinner(new Runner(pool), r);
    const answered = new Runner(pool, { followerWaitBudget: 30000 }).runInTransaction(r, async () => ({ status: 201, body: 'x' }));
    await followerSleeping('idem_begin');
    release();
    const res = await answered;
    await winner;
    assert.ok(res.replayed);
    assert.equal(res.response.body.toString(), 'winner');
  });

  test('a cooldown is answered at once, not waited out', async () => {
    const r = req('/wc');
    // Budget and cooldown far longer than a busy machine's delays: an
    // answer before the budget ran out was not waited out.
    const runner = new Runner(pool, { failureCooldown: 120000, followerWaitBudget: 60000 });
    await runner.run(r, async () => ({ status: 503 }));
    const t0 = performance.now();
    const res = await runner.run(r, async () => ({ status: 201 }));
    assert.equal(res.response.status, 503);
    assert.ok(!res.handlerRan);
    assert.ok(performance.now() - t0 < 60000);
  });

  test('serverWait: false polls instead', async () => {
    const r = req('/wp');
    const before = await waits();
    const { run: winner, release } = await heldWinner(new Runner(pool), r);
    setTimeout(release, 500);
    const res = await new Runner(pool, { serverWait: false, followerWaitBudget: 30000 }).run(r, async () => ({ status: 201 }));
    await winner;
    assert.ok(res.replayed);
    assert.equal(await waits(), before);
  });
});

// A follower whose claim waits on an in-transaction winner's uncommitted key
// gives up with its budget, answered in progress while the winner still
// runs: lock_wait as an argument on the current extension, lock_timeout set
// around the call on 0.5.0's (the legacy form).
for (const version of ['current', '0.5.0']) {
  test.describe(`a lock wait ends with the budget (${version})`, { skip }, () => {
    const db = `idem_node_lock_${version.replace(/\./g, '_')}`;
    let pool;
    test.before(async () => {
      pool = new pg.Pool({ ...(await createDatabase(db, version === 'current' ? undefined : version)), max: 10 });
      pool.on('error', () => {});
    });
    test.after(async () => {
      await pool.end();
      await dropDatabase(db);
    });

    test('answered in progress while the winner runs', async () => {
      const r = req('/lock');
      let holding;
      let release;
      const held = new Promise((ok) => { holding = ok; });
      const released = new Promise((ok) => { release = ok; });
      const winner = new Runner(pool).runInTransaction(r, async () => {
        holding();
        await released;
        return { status: 201, body: 'winner' };
      });
      await held;
      const follower = new Runner(pool, { followerWaitBudget: 400 });
      let settled = false;
      winner.then(() => { settled = true; });
      const res = await follower.run(r, async () => ({ status: 201, body: 'follower' }));
      const winnerStillRunning = !settled;
      release();
      await winner;
      assert.equal(follower.calls === follower.sql, version === 'current', 'lock_wait where the server takes it');
      assert.equal(res.response.status, 409);
      assert.ok(!res.handlerRan);
      assert.ok(winnerStillRunning);
    });
  });
}
