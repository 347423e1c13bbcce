'use strict';
// The Express middleware keeps what Express answers (issue 22): a malformed
// JSON body gets express.json()'s own 400 and claims nothing; a guarded
// request without a principal is refused, never keyed on ""; a namespace
// keeps two services on one role and route apart; fingerprint 'json'
// compares bodies as canonical JSON; the pool it opens is bounded; ready().

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const express = require('express');
const pg = require('pg');
const idem = require('..');
const { createDatabase, dropDatabase, skip, DSN } = require('./support');

process.env.NODE_ENV = 'test'; // Express's error handler answers without printing each stack
const DB = 'idem_node_express_fidelity';
let pool;
let options;
const servers = [];

async function serve(app) {
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  servers.push(server);
  return `http://127.0.0.1:${server.address().port}`;
}

// An app with the one-line setup (or without it), counting its route's runs.
function paymentsApp(middleware) {
  const app = express();
  const state = { runs: 0 };
  if (middleware) app.use(middleware);
  app.use(express.json());
  app.post('/payments', (req, res) => {
    state.runs++;
    res.status(201).json({ id: state.runs, amount: req.body.amount });
  });
  return { app, state };
}

const post = (base, body, headers = {}) => fetch(`${base}/payments`, { method: 'POST', body,
  headers: { 'content-type': 'application/json', ...headers } });

test.describe('express fidelity', { skip }, () => {
  test.before(async () => {
    options = await createDatabase(DB);
    pool = new pg.Pool({ ...options, max: 10 });
  });

  test.after(async () => {
    for (const s of servers) s.close();
    await pool.end();
    await dropDatabase(DB);
  });

  test('malformed JSON: the 400 of express.json() without the middleware, nothing claimed', async () => {
    const plain = paymentsApp(null);
    const guarded = paymentsApp(idem.express({ pool, principal: (req) => req.get('x-user') }));
    const [a, b] = [await serve(plain.app), await serve(guarded.app)];
    const key = crypto.randomUUID();
    for (const bad of ['{"amount": 5', '"just a string"']) {
      const without = await post(a, bad, { 'idempotency-key': key, 'x-user': 'al' });
      const withIt = await post(b, bad, { 'idempotency-key': key, 'x-user': 'al' });
      assert.equal(without.status, 400);
      assert.equal(withIt.status, without.status, bad);
      assert.equal(withIt.headers.get('content-type'), without.headers.get('content-type'));
    }
    assert.equal(guarded.state.runs, 0);
    // The key is free: the corrected request runs at once (no cooldown, no 500).
    const fixed = await post(b, '{"amount": 5}', { 'idempotency-key': key, 'x-user': 'al' });
    assert.equal(fixed.status, 201);
    assert.equal(guarded.state.runs, 1);
  });

  test('a guarded request without a principal is refused, not keyed on ""', async () => {
    const { app, state } = paymentsApp(idem.express({ pool, principal: (req) => req.get('x-user') }));
    const base = await serve(app);
    const key = crypto.randomUUID();
    const anonymous = await post(base, '{"amount": 5}', { 'idempotency-key': key });
    assert.equal(anonymous.status, 401);
    assert.equal(state.runs, 0);
    const empty = await post(base, '{"amount": 5}', { 'idempotency-key': key, 'x-user': '' });
    assert.equal(empty.status, 401);
    // Without a key the request is not guarded and the route decides.
    assert.equal((await post(base, '{"amount": 5}')).status, 201);
    const alice = await post(base, '{"amount": 5}', { 'idempotency-key': key, 'x-user': 'al' });
    assert.equal(alice.status, 201);
  });

  test('fastify: a guarded request without a principal is refused too', async () => {
    const app = require('fastify')(); // eslint-disable-line global-require
    let runs = 0;
    app.register(idem.fastify, { pool, principal: (request) => request.headers['x-user'] });
    app.post('/payments', async (request, reply) => {
      runs++;
      reply.code(201);
      return { id: runs };
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    try {
      const base = `http://127.0.0.1:${app.server.address().port}`;
      const key = crypto.randomUUID();
      assert.equal((await post(base, '{"amount": 5}', { 'idempotency-key': key })).status, 401);
      assert.equal(runs, 0);
      assert.equal((await post(base, '{"amount": 5}', { 'idempotency-key': key, 'x-user': 'al' })).status, 201);
    } finally {
      await app.close();
    }
  });

  test('namespace: two services on one role and route keep their keys apart', async () => {
    const billing = paymentsApp(idem.express({ pool, principal: () => 'svc', namespace: 'billing' }));
    const shop = paymentsApp(idem.express({ pool, principal: () => 'svc', namespace: 'shop' }));
    const [a, b] = [await serve(billing.app), await serve(shop.app)];
    const key = crypto.randomUUID();
    assert.equal((await post(a, '{"amount": 5}', { 'idempotency-key': key })).status, 201);
    const other = await post(b, '{"amount": 7}', { 'idempotency-key': key });
    assert.equal(other.status, 201, 'not the other service\'s key');
    assert.equal(other.headers.get('idempotent-replayed'), null);
    assert.equal((await other.json()).amount, 7);
    assert.equal((await post(a, '{"amount": 5}', { 'idempotency-key': key })).headers.get('idempotent-replayed'), 'true');
    assert.deepEqual([billing.state.runs, shop.state.runs], [1, 1]);
    assert.throws(() => idem.express({ pool, principal: () => 'svc', namespace: 'two words' }), /namespace/);
  });

  test("fingerprint: 'json' compares the body as canonical JSON", async () => {
    const { app, state } = paymentsApp(idem.express({ pool, principal: () => 'svc', fingerprint: 'json' }));
    const base = await serve(app);
    const key = crypto.randomUUID();
    assert.equal((await post(base, '{"amount": 5, "currency": "EUR"}', { 'idempotency-key': key })).status, 201);
    const same = await post(base, '{"currency":"EUR","amount":5}', { 'idempotency-key': key });
    assert.equal(same.headers.get('idempotent-replayed'), 'true');
    assert.equal((await post(base, '{"amount":6}', { 'idempotency-key': key })).status, 422);
    assert.equal(state.runs, 1);
  });

  test('connectionString: a bounded pool, hooks beside config; ready() passes on a good store', async () => {
    const logger = () => {};
    const mw = idem.express({ connectionString: `${DSN} dbname=${DB}`, principal: () => 'svc', logger, config: { lease: 20000 } });
    try {
      assert.equal(mw.runner.pool.options.max, 10);
      assert.equal(mw.runner.config.logger, logger, 'logger beside config');
      assert.equal(mw.runner.config.lease, 20000);
      const info = await mw.ready();
      assert.equal(info.version, idem.version);
    } finally {
      await mw.runner.pool.end();
    }
  });
});
