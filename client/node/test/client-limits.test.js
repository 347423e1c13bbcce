'use strict';
// A client's own limits (issue 31), as the three clients agree on them by
// client/conformance/protocol.json (protocol.toml [client.missing_principal],
// [client.pool], [client.startup]), against the real server:
//
//   * a guarded request without a principal is refused, 401
//     principal-missing (Express and Fastify alike), never run;
//   * an exhausted pool is answered 503 connection-pool-exhausted, counted
//     and logged with its fix, never "the server cannot be reached";
//     duplicates of a slow request keep to their share of the pool;
//   * the start-up check (runner.ready(), the middleware's ready(),
//     Fastify's ready()) refuses to start for a role, database or socket
//     that does not exist, and waits for a server that comes up meanwhile.
//
// No test waits a fixed time: handlers block on promises the test
// resolves, and the tests wait for states with generous deadlines.

const { test, describe, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const path = require('node:path');
const os = require('node:os');
const { spawn } = require('node:child_process');
const readline = require('node:readline');
const pg = require('pg');
const express = require('express');
const idem = require('..');
const { DSN, createDatabase, dropDatabase, waitFor, skip } = require('./support');

const SPEC = require('../../conformance/protocol.json');

const DB = 'idem_node_limits';
const RELAY = path.join(__dirname, '..', '..', 'conformance', 'flight_relay.py');

function counting() {
  const seen = { outcomes: [], events: [] };
  return { seen, metrics: { onOutcome: (o) => seen.outcomes.push(o), onEvent: (e) => seen.events.push(e) } };
}

function assertProblem(response, c, profile = 'ietf') {
  const body = JSON.parse(response.body.toString());
  assert.equal(response.status, c.status[profile]);
  assert.equal(body.type, c.type);
  const retryAfter = response.headers.some(([n]) => n.toLowerCase() === 'retry-after');
  assert.equal(retryAfter, c.retry_after);
}

async function serve(app) {
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  return { base: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) };
}

describe('a client\'s own limits', { skip }, () => {
  let options;
  let pool;
  before(async () => {
    options = await createDatabase(DB);
    pool = new pg.Pool({ ...options, max: 4 });
  });
  after(async () => {
    await pool.end();
    await dropDatabase(DB);
  });

  for (const c of SPEC.principal_vectors) {
    test(`principal ${JSON.stringify(c.principal)}, ${c.keys.length} keys${c.key_required ? ', required' : ''}: ${c.problem || c.result}`, async () => {
      const runner = new idem.Runner(pool);
      const tag = crypto.randomUUID();
      let runs = 0;
      const r = await runner.run({ principal: c.principal, method: 'POST', target: '/principal',
        keys: c.keys.map((k) => k + tag), body: '{}', keyRequired: c.key_required }, async () => {
        runs++;
        return { status: 201, body: 'ran' };
      });
      assert.equal(r.handlerRan, c.handler_ran);
      assert.equal(runs, c.handler_ran ? 1 : 0);
      assert.equal(r.outcome, c.result);
      if (c.problem) assertProblem(r.response, c);
    });
  }

  test('Express and Fastify answer the protocol\'s problem for a missing principal', async () => {
    let runs = 0;
    const app = express();
    app.use(idem.express({ pool, principal: (req) => req.get('x-user') }));
    app.post('/charges', (req, res) => { runs++; res.status(201).send('charged'); });
    const web = await serve(app);
    const fast = require('fastify')(); // eslint-disable-line global-require
    fast.register(idem.fastify, { pool, principal: (request) => request.headers['x-user'] });
    fast.post('/charges', async (request, reply) => { runs++; reply.code(201); return 'charged'; });
    await fast.listen({ port: 0, host: '127.0.0.1' });
    try {
      const key = crypto.randomUUID();
      for (const base of [web.base, `http://127.0.0.1:${fast.server.address().port}`]) {
        const r = await fetch(`${base}/charges`, { method: 'POST', body: '{}', headers: { 'idempotency-key': key } });
        assert.equal(r.status, 401);
        assert.equal((await r.json()).type, 'urn:pg-idem:problem:principal-missing');
      }
      assert.equal(runs, 0);
    } finally {
      await web.close();
      await fast.close();
    }
  });

  test('an exhausted pool is its own answer and log line', async () => {
    const c = SPEC.pool_exhausted;
    const small = new pg.Pool({ ...options, max: 1 });
    const lines = [];
    const { seen, metrics } = counting();
    const runner = new idem.Runner(small, { logger: (line) => lines.push(line), metrics });
    const held = await small.connect(); // the application's own query holds the only client
    // The pool's wait for a client, from here on (pg-pool reads it per
    // connect): set after the one connection opened, so a slow connect on a
    // loaded machine is not taken for an exhausted pool.
    small.options.connectionTimeoutMillis = 200;
    let runs = 0;
    const results = [];
    try {
      for (let i = 0; i < 2; i++) {
        results.push(await runner.run({ principal: 'alice', method: 'POST', target: '/pool', keys: [crypto.randomUUID()], body: '{}' },
          async () => { runs++; return { status: 201, body: 'ran' }; }));
      }
    } finally {
      held.release();
    }
    assert.equal(runs, 0);
    for (const r of results) {
      assertProblem(r.response, c);
      assert.equal(r.outcome, c.result);
    }
    assert.equal(seen.events.filter((e) => e === c.event).length, 2);
    assert.equal(lines.length, 1, lines.join('\n')); // once per cause
    assert.match(lines[0], /connection pool exhausted/);
    assert.ok(lines[0].includes(idem.protocol.POOL.fix), lines[0]);
    assert.doesNotMatch(lines[0], /cannot be reached|nothing listens/);
    const again = await runner.run({ principal: 'alice', method: 'POST', target: '/pool', keys: [crypto.randomUUID()], body: '{}' },
      async () => ({ status: 201, body: 'ran' }));
    assert.equal(again.response.status, 201);
    await small.end();
  });

  test('a pool that waits forever is bounded by the protocol\'s pool wait', async () => {
    const small = new pg.Pool({ ...options, max: 1 }); // node-postgres' default: no connectionTimeoutMillis
    const runner = new idem.Runner(small, { logger: false });
    const held = await small.connect();
    try {
      const r = await runner.run({ principal: 'alice', method: 'POST', target: '/pool', keys: [crypto.randomUUID()], body: '{}' },
        async () => ({ status: 201, body: 'ran' }));
      assertProblem(r.response, SPEC.pool_exhausted);
      assert.match(r.error.message, new RegExp(`within ${idem.protocol.POOL.waitMs} ms`));
    } finally {
      held.release();
      await small.end();
    }
  });

  test('duplicates of a slow request leave the pool to first requests', async () => {
    const appName = `idem_storm_${crypto.randomUUID().slice(0, 8)}`;
    const storm = new pg.Pool({ ...options, max: 10, application_name: appName });
    const watch = new pg.Client(options);
    await watch.connect();
    const { seen, metrics } = counting();
    let release;
    const released = new Promise((r) => { release = r; });
    let started;
    const running = new Promise((r) => { started = r; });
    const runs = [];
    const app = express();
    app.use(idem.express({ pool: storm, principal: (req) => req.get('x-user'), config: { followerWaitBudget: 120000, metrics } }));
    app.use(express.json());
    app.post('/pay', async (req, res) => {
      runs.push(req.body.n);
      if (req.body.n === 0) {
        started();
        await released;
      }
      res.status(201).json({ paid: req.body.n });
    });
    const web = await serve(app);
    const post = (key, n) => fetch(`${web.base}/pay`, { method: 'POST', body: JSON.stringify({ n }),
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-user': 'u' } });
    try {
      const key = crypto.randomUUID();
      const first = post(key, 0);
      await running;
      const dups = Array.from({ length: 30 }, () => post(key, 0));
      await waitFor(async () => (await watch.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 "
        + "AND state = 'active' AND query LIKE '%idem_claim%'", [appName])).rows[0].n >= 5, 'duplicates waiting in the server');
      const others = await Promise.all([1, 2, 3, 4, 5].map((n) => post(crypto.randomUUID(), n)));
      assert.deepEqual(others.map((r) => r.status), [201, 201, 201, 201, 201]);
      assert.equal(runs.filter((n) => n === 0).length, 1); // the first still runs
      release();
      const all = await Promise.all([first, ...dups]);
      assert.deepEqual([...new Set(all.map((r) => r.status))], [201]);
      assert.equal(all.filter((r) => r.headers.get('idempotent-replayed') === 'true').length, 30);
      assert.deepEqual(runs.sort(), [0, 1, 2, 3, 4, 5]);
      assert.ok(!seen.events.includes(idem.protocol.POOL.event), seen.events.join());
    } finally {
      release();
      await web.close();
      await watch.end();
      await storm.end();
    }
  });

  describe('start-up', () => {
    let bare;
    let norights;
    before(async () => {
      const tag = crypto.randomUUID().slice(0, 8);
      bare = `idem_node_bare_${tag}`;
      norights = `idem_node_norights_${tag}`;
      const admin = new pg.Client(options);
      await admin.connect();
      await admin.query(`CREATE DATABASE ${bare}`);
      await admin.query(`CREATE ROLE ${norights} LOGIN`);
      await admin.end();
    });
    after(async () => {
      await dropDatabase(bare);
      const admin = new pg.Client(options);
      await admin.connect();
      await admin.query(`DROP ROLE IF EXISTS ${norights}`);
      await admin.end();
    });

    const missingDir = path.join(os.tmpdir(), `pg_idem-no-such-dir-${crypto.randomUUID()}`);
    const refusals = () => [
      [{ ...options, user: 'idem_no_such_role' }, /role "idem_no_such_role" does not exist.*fix: .*user/],
      [{ ...options, database: 'idem_no_such_db' }, /database "idem_no_such_db" does not exist.*fix: the database does not exist/],
      [{ ...options, database: bare }, /not installed in this database.*CREATE EXTENSION/],
      [{ ...options, user: norights }, /may not EXECUTE .*GRANT idem_client/],
      [{ ...options, host: missingDir, port: 5432 },
        new RegExp(`no server answered at socket "${missingDir}/.s.PGSQL.5432" within 300 ms.*fix: check the connection string`)],
    ];

    test('runner.ready() refuses what cannot serve, saying what to fix', async () => {
      for (const [o, message] of refusals()) {
        const p = new pg.Pool(o);
        try {
          await assert.rejects(new idem.Runner(p, { logger: false }).ready({ wait: 300 }), (e) => {
            assert.ok(e instanceof idem.SetupError, e.stack);
            assert.match(e.message, message);
            return true;
          });
        } finally {
          await p.end();
        }
      }
    });

    test('the middlewares refuse to start too', async () => {
      for (const [o, message] of refusals()) {
        const p = new pg.Pool(o);
        try {
          const mw = idem.express({ pool: p, principal: () => 'svc', logger: false, startupWait: 300 });
          await assert.rejects(mw.ready(), message);
          const fast = require('fastify')(); // eslint-disable-line global-require
          fast.register(idem.fastify, { pool: p, principal: () => 'svc', logger: false, startupWait: 300 });
          await assert.rejects(fast.ready(), message);
          await fast.close().catch(() => {});
        } finally {
          await p.end();
        }
      }
    });

    test('ready() waits for a server that comes up', async () => {
      const relay = spawn('python3', [RELAY, options.host, String(options.port), '--closed'], { stdio: ['pipe', 'pipe', 'inherit'] });
      const lines = readline.createInterface({ input: relay.stdout });
      const next = () => new Promise((resolve) => lines.once('line', resolve));
      const port = Number((await next()).split(' ')[1]);
      let waiting;
      const waited = new Promise((r) => { waiting = r; });
      const p = new pg.Pool({ ...options, host: '127.0.0.1', port });
      const runner = new idem.Runner(p, { logger: (line) => { if (/waiting up to/.test(line)) waiting(line); } });
      try {
        const ready = runner.ready({ wait: 120000 });
        assert.match(await waited, new RegExp(`waiting up to 120000 ms for the server at 127.0.0.1:${port}`));
        relay.stdin.write('open\n');
        assert.equal(await next(), 'open');
        await ready;
        const r = await runner.run({ principal: 'alice', method: 'POST', target: '/late', keys: [crypto.randomUUID()], body: '{}' },
          async () => ({ status: 201, body: 'ran' }));
        assert.equal(r.response.status, 201);
      } finally {
        await p.end();
        relay.stdin.end();
        await new Promise((r) => relay.once('exit', r));
      }
    });
  });
});

module.exports = { DSN };
