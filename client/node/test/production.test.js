'use strict';
// What a deployment meets first (issue 22), against the real server: a
// misconfigured store is one clear log line (once per cause, with the fix)
// and a SetupError from ready(), not a silent 503; waiting followers hand
// their pooled connection back; the prom-client series are the C++
// client's; validation failures are not stored; fingerprint hooks.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const pg = require('pg');
const promClient = require('prom-client');
const idem = require('..');
const { Runner } = idem;
const { DSN, createDatabase, dropDatabase, skip } = require('./support');
const { poolOptions } = require('../lib/conninfo');

const DB = 'idem_node_production';
const ROLE = 'idem_node_production_app';
let options;
let admin;
let pool;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const req = (k, body = '{"amount": 5}', target = '/production') => ({ principal: 'alice', method: 'POST', target, keys: [k], body });
const created = async () => ({ status: 201, headers: { 'content-type': 'application/json' }, body: '{"id":1}' });
const problemType = (res) => JSON.parse(res.response.body.toString()).type;
const capture = () => {
  const lines = [];
  return { lines, logger: (line) => lines.push(line) };
};

test.describe('production defaults', { skip }, () => {
  test.before(async () => {
    options = await createDatabase(DB);
    admin = new pg.Client(options);
    await admin.connect();
    await admin.query('SET client_min_messages = warning');
    await admin.query(`DROP OWNED BY ${ROLE}`).catch(() => {}); // left by an earlier run
    await admin.query(`DROP ROLE IF EXISTS ${ROLE}`).catch(() => {});
    await admin.query(`CREATE ROLE ${ROLE} LOGIN`);
    await admin.query(`GRANT CONNECT ON DATABASE ${DB} TO ${ROLE}`);
    await admin.query('CREATE SCHEMA elsewhere');
    pool = new pg.Pool({ ...options, max: 20 });
  });

  test.after(async () => {
    if (pool) await pool.end();
    if (admin) await admin.end();
    await dropDatabase(DB);
    const server = new pg.Client(poolOptions(DSN));
    await server.connect();
    await server.query(`DROP ROLE IF EXISTS ${ROLE}`);
    await server.end();
  });

  test('a role without idem_client: one log line with the fix, onError every time, ready() refuses', async () => {
    const app = new pg.Pool({ ...options, user: ROLE, max: 2 });
    const log = capture();
    const seen = [];
    const runner = new Runner(app, { logger: log.logger, onError: (e, info) => seen.push(info) });
    try {
      for (let i = 0; i < 3; i++) {
        const res = await runner.run(req(crypto.randomUUID()), created);
        assert.equal(res.response.status, 503);
        assert.equal(problemType(res), 'urn:pg-idem:problem:idempotency-store-unavailable');
        assert.equal(res.handlerRan, false);
      }
      assert.equal(log.lines.length, 1, log.lines.join('\n'));
      assert.match(log.lines[0], /may not EXECUTE .*idem_claim.*GRANT idem_client TO "idem_node_production_app"/);
      assert.equal(seen.length, 3);
      assert.match(seen[0].fix, /GRANT idem_client/);
      await assert.rejects(runner.ready(), (e) => e instanceof idem.SetupError && /GRANT idem_client/.test(e.message));
      // Fixed on the server: the next request works, without a restart.
      await admin.query(`GRANT idem_client TO ${ROLE}`);
      const ok = await runner.run(req(crypto.randomUUID()), created);
      assert.equal(ok.response.status, 201);
      assert.equal(ok.outcome, 'won_completed');
    } finally {
      await admin.query(`REVOKE idem_client FROM ${ROLE}`);
      await app.end();
    }
  });

  test('the extension in a schema off the search_path: said so, and schema fixes it', async () => {
    const db = 'idem_node_production_schema';
    const setup = new pg.Client(options);
    await setup.connect();
    await setup.query(`DROP DATABASE IF EXISTS ${db}`);
    await setup.query(`CREATE DATABASE ${db}`);
    await setup.end();
    const inDb = new pg.Client({ ...options, database: db });
    await inDb.connect();
    await inDb.query('CREATE SCHEMA idem; CREATE EXTENSION pg_idem SCHEMA idem');
    await inDb.end();
    const app = new pg.Pool({ ...options, database: db, max: 2 });
    try {
      const log = capture();
      const res = await new Runner(app, { logger: log.logger }).run(req(crypto.randomUUID()), created);
      assert.equal(res.response.status, 503);
      assert.equal(log.lines.length, 1);
      assert.match(log.lines[0], /schema "idem", which is not on the search_path.*set schema: 'idem'/);
      const wrong = new Runner(app, { schema: 'elsewhere', logger: false });
      await assert.rejects(wrong.ready(), /configured schema is "elsewhere", but pg_idem is installed in schema "idem"/);
      const fixed = await new Runner(app, { schema: 'idem' }).run(req(crypto.randomUUID()), created);
      assert.equal(fixed.response.status, 201);
    } finally {
      await app.end();
      await dropDatabase(db);
    }
  });

  test('no extension in the database, and a lease over idem.max_lease, are refused at ready()', async () => {
    const db = 'idem_node_production_bare';
    const setup = new pg.Client(options);
    await setup.connect();
    await setup.query(`DROP DATABASE IF EXISTS ${db}`);
    await setup.query(`CREATE DATABASE ${db}`);
    await setup.end();
    const bare = new pg.Pool({ ...options, database: db, max: 1 });
    try {
      await assert.rejects(new Runner(bare, { logger: false }).ready(), /not installed in this database .*; fix: CREATE EXTENSION pg_idem/);
      // The protocol's oldest extension passes the check, and the previous
      // release (whose tables this server's library serves until ALTER
      // EXTENSION UPDATE) serves a run; a version before the oldest is
      // refused (the package installs none: one is stamped by hand).
      await bare.query(`CREATE EXTENSION pg_idem VERSION '${idem.OLDEST_EXTENSION}'`);
      assert.equal((await new Runner(bare, { logger: false }).ready()).version, idem.OLDEST_EXTENSION);
      await bare.query("DROP EXTENSION pg_idem; CREATE EXTENSION pg_idem VERSION '0.5.0'");
      const previous = new Runner(bare, { logger: false });
      const k = crypto.randomUUID();
      assert.equal((await previous.run(req(k), created)).outcome, 'won_completed');
      assert.ok((await previous.run(req(k), created)).replayed);
      await bare.query("UPDATE pg_catalog.pg_extension SET extversion = '0.2.0' WHERE extname = 'pg_idem'");
      await assert.rejects(new Runner(bare, { logger: false }).ready(),
        new RegExp(`pg_idem is version 0\\.2\\.0, older than ${idem.OLDEST_EXTENSION.replace(/\./g, '\\.')}`));
    } finally {
      await bare.end();
      await dropDatabase(db);
    }
    const maxLease = Number((await admin.query("SELECT setting FROM pg_settings WHERE name = 'idem.max_lease'")).rows[0].setting);
    await assert.rejects(new Runner(pool, { lease: maxLease + 1000, logger: false }).ready(),
      new RegExp(`lease is ${maxLease + 1000} ms, over the server's idem.max_lease \\(${maxLease} ms\\)`));
    const info = await new Runner(pool).ready();
    assert.equal(info.version, idem.version);
  });

  test('an extension older than the oldest supported is refused', async () => {
    const fake = { connect: async () => ({ query: async () => ({ rows: [{ version: '0.2.0', schema: 'public', usage: true,
      on_path: true, denied: [], role: 'app', search_path: 'public', claim_wait: true, begin_wait: true, max_lease: '3600000ms' }] }),
    on() {}, removeListener() {}, release() {} }) };
    assert.equal(idem.OLDEST_EXTENSION, '0.3.0');
    await assert.rejects(new Runner(fake, { logger: false }).ready(),
      /pg_idem is version 0.2.0, older than 0.3.0, the oldest this client supports; fix: ALTER EXTENSION pg_idem UPDATE/);
  });

  test('a waiting follower hands its connection back: the winner\'s own query is not starved', async () => {
    // Two connections: the winner holds one; before, a follower waiting in
    // the server held the other for its whole budget, and the handler's own
    // query waited behind it.
    const small = new pg.Pool({ ...options, max: 2 });
    try {
      const runner = new Runner(small, { followerWaitBudget: 8000 });
      const r = req(crypto.randomUUID());
      let runs = 0;
      let handlerMs = 0;
      const handler = async () => {
        runs++;
        const t0 = Date.now();
        await sleep(200); // the followers are waiting by now
        await small.query('SELECT 1');
        handlerMs = Date.now() - t0;
        return created();
      };
      const all = await Promise.all([runner.run(r, handler), ...[1, 2, 3].map(async (i) => {
        await sleep(20 * i);
        return runner.run(r, handler);
      })]);
      assert.equal(runs, 1);
      assert.deepEqual(all.map((x) => x.response.status), [201, 201, 201, 201]);
      assert.ok(handlerMs < 2500, `the handler's query waited ${handlerMs} ms for a connection`);
    } finally {
      await small.end();
    }
  });

  test('a winner holds no client while its handler runs: handlers using the same pool never starve it', async () => {
    // Before, a lease winner held its claim's client through the handler
    // (a fenced one, that and its transaction's): as many winners as the
    // pool has clients, each waiting for one more, waited forever.
    for (const mode of ['run', 'runFenced']) {
      const small = new pg.Pool({ ...options, max: 2 });
      try {
        const runner = new Runner(small, { lease: 3000 });
        // lease: the handler uses the pool; fenced: its transaction's client.
        const h = async (txOrClaim) => {
          await sleep(100);
          await (mode === 'run' ? small : txOrClaim).query('SELECT 1');
          return created();
        };
        const all = Promise.all([1, 2].map(() => runner[mode](req(crypto.randomUUID()), h)));
        const stuck = sleep(15000).then(() => 'stuck');
        const done = await Promise.race([all, stuck]);
        assert.notEqual(done, 'stuck', `${mode}: two requests on a pool of two never finished`);
        assert.deepEqual(done.map((x) => x.response.status), [201, 201]);
        assert.deepEqual(done.map((x) => x.outcome), ['won_completed', 'won_completed']);
      } finally {
        small.end().catch(() => {});
      }
    }
  });

  test('prom-client counters with the C++ client\'s series names', async () => {
    const registry = new promClient.Registry();
    const runner = new Runner(pool, { metrics: idem.prometheus({ registry, promClient }) });
    const before = await registry.metrics();
    assert.match(before, /idem_client_requests_total\{outcome="replay"\} 0/);
    assert.match(before, /idem_client_events_total\{event="finalized"\} 0/);
    const r = req(crypto.randomUUID());
    await runner.run(r, created);
    await runner.run(r, created);
    await runner.run({ ...r, keys: ['x'.repeat(256)] }, created);
    const text = await registry.metrics();
    assert.match(text, /# TYPE idem_client_requests_total counter/);
    assert.match(text, /idem_client_requests_total\{outcome="won_completed"\} 1/);
    assert.match(text, /idem_client_requests_total\{outcome="replay"\} 1/);
    assert.match(text, /idem_client_requests_total\{outcome="rejected"\} 1/);
    assert.match(text, /idem_client_events_total\{event="claimed"\} 1/);
    assert.match(text, /idem_client_events_total\{event="finalized"\} 1/);
    for (const outcome of idem.CLIENT_OUTCOMES) assert.match(text, new RegExp(`outcome="${outcome}"`));
    for (const event of idem.EVENTS) assert.match(text, new RegExp(`event="${event}"`));
  });

  test('a validation failure is not stored: the corrected retry runs (storeClientErrors: true stores it)', async () => {
    for (const storeClientErrors of [false, true]) {
      const runner = new Runner(pool, { storeClientErrors });
      const k = crypto.randomUUID();
      const invalid = await runner.run(req(k, '{"amount": -5}'), async () => ({ status: 422, body: '{"error":"amount"}' }));
      assert.equal(invalid.response.status, 422);
      const corrected = await runner.run(req(k, '{"amount": 5}'), created);
      if (storeClientErrors) {
        assert.equal(corrected.response.status, 422);
        assert.equal(problemType(corrected), 'urn:pg-idem:problem:idempotency-key-reused');
      } else {
        assert.equal(corrected.response.status, 201);
        assert.equal(corrected.outcome, 'won_completed');
      }
    }
  });

  test('fingerprints: canonical JSON and chosen fields', async () => {
    const runner = new Runner(pool);
    const k = crypto.randomUUID();
    const viaJson = (body) => ({ ...req(k, body), fingerprint: idem.fingerprint.json(null, Buffer.from(body)) });
    assert.equal((await runner.run(viaJson('{"amount": 5, "currency": "EUR"}'), created)).outcome, 'won_completed');
    assert.equal((await runner.run(viaJson('{"currency":"EUR","amount":5}'), created)).outcome, 'replay');
    assert.equal((await runner.run(viaJson('{"amount":6,"currency":"EUR"}'), created)).outcome, 'conflict');
    const pick = idem.fingerprint.fields(['amount', 'payer.id']);
    const k2 = crypto.randomUUID();
    const viaFields = (body) => ({ ...req(k2, body), fingerprint: pick(null, Buffer.from(body)) });
    assert.equal((await runner.run(viaFields('{"amount":5,"payer":{"id":7},"note":"a"}'), created)).outcome, 'won_completed');
    assert.equal((await runner.run(viaFields('{"note":"b","payer":{"id":7},"amount":5}'), created)).outcome, 'replay');
    assert.equal((await runner.run(viaFields('{"amount":5,"payer":{"id":8}}'), created)).outcome, 'conflict');
  });
});
