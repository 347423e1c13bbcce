'use strict';
// An Express app and a Fastify app, each made idempotent by one line, over
// real HTTP against the real server.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const http = require('node:http');
const net = require('node:net');
const pg = require('pg');
const idem = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_mw_test';
let pool;

// A raw request (repeated header fields kept apart, unlike fetch).
function send(port, method, path, headers, body) {
  return new Promise((resolve, reject) => {
    const r = http.request({ port, host: '127.0.0.1', method, path, headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString() }));
    });
    r.on('error', reject);
    r.end(body);
  });
}

// The same with a header block written by hand: two Idempotency-Key fields.
function sendRaw(port, head, body) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1', () => {
      sock.end(`${head}Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    });
    const chunks = [];
    sock.on('data', (c) => chunks.push(c));
    sock.on('error', reject);
    sock.on('end', () => {
      const text = Buffer.concat(chunks).toString();
      const [headText, ...rest] = text.split('\r\n\r\n');
      resolve({ status: Number(headText.split(' ')[1]), text: rest.join('\r\n\r\n') });
    });
  });
}

const listen = (server) => new Promise((resolve) => { server.listen(0, '127.0.0.1', () => resolve(server.address().port)); });

// The same checks for both frameworks.
async function exercise(port, runs) {
  const k = crypto.randomUUID();
  const json = { 'content-type': 'application/json' };
  const post = (body, headers) => send(port, 'POST', '/orders', { ...json, ...headers }, JSON.stringify(body));
  const first = await post({ sku: 'a' }, { 'idempotency-key': k, 'x-user': 'u1' });
  const again = await post({ sku: 'a' }, { 'idempotency-key': k, 'x-user': 'u1' });
  const otherUser = await post({ sku: 'a' }, { 'idempotency-key': k, 'x-user': 'u2' });
  const mismatch = await post({ sku: 'b' }, { 'idempotency-key': k, 'x-user': 'u1' });
  const twice = await sendRaw(port, 'POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
    + 'Idempotency-Key: a\r\nIdempotency-Key: b\r\nX-User: u1\r\n', '{}');
  const tooLong = await post({ sku: 'a' }, { 'idempotency-key': 'x'.repeat(256), 'x-user': 'u1' });
  const unguarded = await post({ sku: 'c' }, { 'x-user': 'u1' });
  const fail1 = await post({ sku: 'f' }, { 'idempotency-key': `${k}f`, 'x-user': 'u1', 'x-fail': '1' });
  const fail2 = await post({ sku: 'f' }, { 'idempotency-key': `${k}f`, 'x-user': 'u1', 'x-fail': '1' });

  assert.equal(first.status, 201);
  assert.deepEqual(JSON.parse(first.text), { order: 1, sku: 'a' });
  assert.match(first.headers['set-cookie'][0], /^sid=1/);
  assert.equal(again.status, 201);
  assert.equal(again.text, first.text);
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.equal(again.headers['set-cookie'], undefined);
  assert.equal(again.headers.location, '/orders/1');
  assert.equal(JSON.parse(otherUser.text).order, 2);
  assert.equal(mismatch.status, 422);
  assert.equal(mismatch.headers['content-type'], 'application/problem+json');
  assert.equal(twice.status, 400);
  assert.equal(JSON.parse(twice.text).type, 'urn:pg-idem:problem:idempotency-key-invalid');
  assert.equal(tooLong.status, 400);
  assert.equal(unguarded.status, 201);
  assert.equal(fail1.status, 503);
  assert.equal(fail2.status, 503);
  assert.ok(fail2.headers['retry-after']);
  assert.deepEqual(runs, ['a', 'a', 'c', 'f']);
}

test.describe('middleware', { skip }, () => {
  test.before(async () => {
    pool = new pg.Pool({ ...(await createDatabase(DB)), max: 20 });
    pool.on('error', () => {}); // idle clients whose backend was terminated (DROP DATABASE ... WITH (FORCE))
  });
  test.after(async () => {
    await pool.end();
    await dropDatabase(DB);
  });

  test('an Express app becomes idempotent with one line', async () => {
    const express = require('express');
    const app = express();
    app.use(idem.express({ pool, principal: (req) => req.get('x-user'), config: { failureCooldown: 5000 } })); // the one line
    app.use(express.json());
    const runs = [];
    app.post('/orders', (req, res) => {
      runs.push(req.body.sku);
      if (req.get('x-fail')) return res.status(503).send('down');
      res.cookie('sid', '1');
      res.location('/orders/1');
      return res.status(201).json({ order: runs.length, sku: req.body.sku });
    });
    const server = http.createServer(app);
    const port = await listen(server);
    try {
      await exercise(port, runs);
    } finally {
      server.close();
    }
  });

  test('a Fastify app becomes idempotent with one line', async () => {
    const fastify = require('fastify')();
    fastify.register(idem.fastify, { pool, principal: (req) => req.headers['x-user'], config: { failureCooldown: 5000 } }); // the one line
    const runs = [];
    fastify.post('/orders', async (request, reply) => {
      runs.push(request.body.sku);
      if (request.headers['x-fail']) return reply.code(503).send('down');
      reply.header('set-cookie', 'sid=1').header('location', '/orders/1').code(201);
      return { order: runs.length, sku: request.body.sku };
    });
    await fastify.ready();
    const port = await listen(fastify.server);
    try {
      await exercise(port, runs);
    } finally {
      await fastify.close();
    }
  });

  test('the middleware needs a principal', () => {
    assert.throws(() => idem.express({ pool }), /principal/);
    assert.throws(() => idem.fastify({ addHook() {} }, { pool }, () => {}), /principal/);
  });

  test('Express in fenced mode hands the transaction to the route', async () => {
    const express = require('express');
    const app = express();
    app.use(idem.express({ pool, principal: (req) => req.get('x-user'), mode: 'fenced' }));
    app.post('/pay', async (req, res) => {
      await req.idempotencyClient.query("INSERT INTO effects VALUES ($1, $2, 'express')",
        [req.idempotency.claimId, req.idempotency.generation.toString()]);
      res.status(201).send('paid');
    });
    const server = http.createServer(app);
    const port = await listen(server);
    try {
      const k = crypto.randomUUID();
      const a = await send(port, 'POST', '/pay', { 'idempotency-key': k, 'x-user': 'u' }, 'x');
      const b = await send(port, 'POST', '/pay', { 'idempotency-key': k, 'x-user': 'u' }, 'x');
      assert.equal(a.status, 201);
      assert.equal(b.text, 'paid');
      assert.equal(b.headers['idempotent-replayed'], 'true');
      const n = (await pool.query("SELECT count(*)::int AS n FROM effects WHERE note = 'express'")).rows[0].n;
      assert.equal(n, 1);
    } finally {
      server.close();
    }
  });
});
