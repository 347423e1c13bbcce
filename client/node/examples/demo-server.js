'use strict';
// The payments service of the conformance storm, in Node (pg-idem Runner,
// fenced mode): the same interface as client/cpp/examples/demo/server.cpp.
//
//   node client/node/examples/demo-server.js --port 8080 [--bind 127.0.0.1]
//       [--dsn CONNINFO] [--wait-budget-ms 1000] [--cooldown-ms 1000]
//       [--port-file F] [--pid-file F]
//
// POST /payments (Idempotency-Key and X-Demo-User required; body
// {"amount": <int>, "to": "<name>"}), GET /payments/{id}, GET /stats,
// GET /healthz. Test hooks X-Demo-Delay-Ms: N and X-Demo-Fail: STATUS.

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const pg = require('pg');
const { Runner, poolOptions, problem, version } = require(path.join(__dirname, '..', 'index.js'));
const { keyFields } = require(path.join(__dirname, '..', 'lib', 'middleware.js'));

// The command line, refused as a whole on the first bad flag.
function parseOptions(argv) {
  const o = { port: 8080, bind: '127.0.0.1', dsn: '', waitBudgetMs: 1000, cooldownMs: 1000, portFile: null, pidFile: null };
  const usage = (why) => {
    if (why) process.stderr.write(`demo-server: ${why}\n`);
    process.stderr.write('usage: demo-server.js --port P [--bind ADDR] [--dsn CONNINFO] [--wait-budget-ms N] '
      + '[--cooldown-ms N] [--threads N] [--port-file F] [--pid-file F]\n');
    process.exit(2);
  };
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (value === undefined) usage(`missing value after ${flag}`);
    const num = (lo, hi) => {
      if (!/^[0-9]{1,12}$/.test(value) || Number(value) < lo || Number(value) > hi) usage(`bad value for ${flag}: ${value}`);
      return Number(value);
    };
    if (flag === '--port') o.port = num(0, 65535);
    else if (flag === '--bind') o.bind = value;
    else if (flag === '--dsn') o.dsn = value;
    else if (flag === '--wait-budget-ms') o.waitBudgetMs = num(1, 600000);
    else if (flag === '--cooldown-ms') o.cooldownMs = num(1, 600000);
    else if (flag === '--threads') num(1, 1024); // the C++ service's flag; Node has one event loop
    else if (flag === '--port-file') o.portFile = value;
    else if (flag === '--pid-file') o.pidFile = value;
    else usage(`unknown option ${flag}`);
  }
  return o;
}

class Refusal extends Error {
  constructor(status, title, detail) {
    super(title);
    this.response = problem(status, title, detail);
  }
}

function hook(headers, name, lo, hi) {
  const v = headers[name.toLowerCase()];
  if (v === undefined) return 0;
  if (!/^[0-9]{1,12}$/.test(v) || Number(v) < lo || Number(v) > hi) {
    throw new Refusal(400, 'invalid test hook', `${name} must be a whole number from ${lo} to ${hi}.`);
  }
  return Number(v);
}

const SHAPE = 'The body must be a JSON object {"amount": <integer>, "to": "<name>"}.';

function parsePayment(headers, body) {
  const type = headers['content-type'] || '';
  if (type && !type.startsWith('application/json')) throw new Refusal(415, 'unsupported media type', 'The body must be application/json.');
  let j;
  try {
    j = JSON.parse(body.toString('utf8'));
  } catch {
    throw new Refusal(400, 'invalid body', SHAPE);
  }
  if (!j || typeof j !== 'object' || Array.isArray(j)) throw new Refusal(400, 'invalid body', SHAPE);
  for (const k of Object.keys(j)) if (k !== 'amount' && k !== 'to') throw new Refusal(400, 'invalid body', `Unknown member "${k}". ${SHAPE}`);
  if (!Number.isInteger(j.amount)) throw new Refusal(400, 'invalid amount', '"amount" must be an integer number of cents.');
  if (j.amount < 1 || j.amount > 1000000000) throw new Refusal(400, 'invalid amount', '"amount" must be from 1 to 1000000000.');
  if (typeof j.to !== 'string' || !j.to || Buffer.byteLength(j.to) > 100) throw new Refusal(400, 'invalid recipient', '"to" must be a name of 1 to 100 bytes.');
  return j;
}

function principalOf(headers) {
  const user = headers['x-demo-user'];
  if (!user) throw new Refusal(401, 'missing user', 'The X-Demo-User header names the payer; it is required.');
  if (Buffer.byteLength(user, 'latin1') > 100) throw new Refusal(400, 'invalid user', 'X-Demo-User is at most 100 bytes.');
  return user;
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size <= 1024 * 1024) chunks.push(c);
    });
    req.on('end', () => (size > 1024 * 1024
      ? reject(new Refusal(413, 'request too large', 'The body is over 1048576 bytes.'))
      : resolve(Buffer.concat(chunks))));
    req.on('error', reject);
  });
}

function writeFile(file, text) {
  fs.writeFileSync(`${file}.tmp`, `${text}\n`);
  fs.renameSync(`${file}.tmp`, file);
}

async function main() {
  const o = parseOptions(process.argv.slice(2));
  const pool = new pg.Pool({ ...poolOptions(o.dsn), max: 100 });
  pool.on('error', (e) => process.stderr.write(`demo-server: idle connection: ${e.message}\n`));
  const runner = new Runner(pool, { lease: 10000, followerWaitBudget: o.waitBudgetMs, failureCooldown: o.cooldownMs, retryAfter: 1000 });
  let executions = 0;
  const outcomes = {};

  const ext = await pool.query("SELECT 1 FROM pg_extension WHERE extname = 'pg_idem'");
  if (ext.rowCount === 0) {
    process.stderr.write('demo-server: the extension is missing in this database; run CREATE EXTENSION pg_idem first\n');
    process.exit(1);
  }
  await pool.query('CREATE TABLE IF NOT EXISTS payments (id bigserial PRIMARY KEY, principal text NOT NULL, '
    + 'amount bigint NOT NULL CHECK (amount > 0), recipient text NOT NULL, generation bigint NOT NULL, '
    + 'created_at timestamptz NOT NULL DEFAULT now())');

  async function createPayment(req) {
    const user = principalOf(req.headers);
    const delay = hook(req.headers, 'X-Demo-Delay-Ms', 0, 60000);
    const fail = hook(req.headers, 'X-Demo-Fail', 400, 599);
    const body = await readBody(req);
    const p = parsePayment(req.headers, body);
    const keys = keyFields(req.rawHeaders);
    const r = await runner.runFenced({ principal: user, method: 'POST', target: req.url, keys, body, keyRequired: true },
      async (tx, claim) => {
        executions += 1;
        if (delay) await new Promise((res) => setTimeout(res, delay));
        if (fail) return problem(fail, 'demo failure', 'X-Demo-Fail asked for this status; nothing was written.');
        const row = (await tx.query('INSERT INTO payments (principal, amount, recipient, generation) VALUES ($1, $2, $3, $4) RETURNING id',
          [user, p.amount, p.to, claim.generation.toString()])).rows[0];
        const id = Number(row.id);
        return { status: 201, headers: [['Content-Type', 'application/json'], ['Location', `/payments/${id}`]],
          body: JSON.stringify({ id, amount: p.amount, to: p.to, user }) };
      });
    outcomes[r.outcome] = (outcomes[r.outcome] || 0) + 1;
    process.stderr.write(`POST ${req.url} user=${user} key=${keys.length ? keys[0].toString('latin1') : '-'} -> `
      + `${r.response.status} ${r.outcome}${r.handlerRan ? ' (ran)' : ''}\n`);
    return r.response;
  }

  async function showPayment(req, id) {
    const user = principalOf(req.headers);
    const r = await pool.query('SELECT amount, recipient FROM payments WHERE id = $1 AND principal = $2', [id, user]);
    if (r.rowCount === 0) throw new Refusal(404, 'not found', `No payment ${id} of this user.`);
    return { status: 200, headers: [['Content-Type', 'application/json']],
      body: Buffer.from(JSON.stringify({ id: Number(id), amount: Number(r.rows[0].amount), to: r.rows[0].recipient, user })) };
  }

  async function stats() {
    const rows = Number((await pool.query('SELECT count(*) AS n FROM payments')).rows[0].n);
    return { status: 200, headers: [['Content-Type', 'application/json']],
      body: Buffer.from(JSON.stringify({ handler_executions: executions, executions, payments: rows, outcomes })) };
  }

  const server = http.createServer((req, res) => {
    const send = (r) => {
      res.statusCode = r.status;
      for (const [n, v] of r.headers) res.setHeader(n, v);
      res.setHeader('Content-Length', r.body.length);
      res.end(r.body);
    };
    const route = () => {
      const url = req.url.split('?')[0];
      if (req.method === 'POST' && url === '/payments') return createPayment(req);
      if (req.method === 'GET' && url === '/stats') return stats();
      if (req.method === 'GET' && url === '/healthz') return { status: 200, headers: [['Content-Type', 'text/plain']], body: Buffer.from('ok\n') };
      const m = /^\/payments\/(\d{1,18})$/.exec(url);
      if (req.method === 'GET' && m) return showPayment(req, m[1]);
      req.resume();
      return problem(404, 'not found', 'No such route.');
    };
    Promise.resolve().then(route).then(send, (e) => {
      if (e instanceof Refusal) return send(e.response);
      process.stderr.write(`demo-server: request failed: ${e.stack || e}\n`);
      return send(problem(500, 'internal error', 'The request failed; the server log has the reason.'));
    });
  });
  server.listen(o.port, o.bind, () => {
    const { port } = server.address();
    if (o.pidFile) writeFile(o.pidFile, String(process.pid));
    if (o.portFile) writeFile(o.portFile, String(port));
    process.stdout.write(`pg-idem ${version} demo server (node) listening on http://${o.bind}:${port} `
      + `(wait budget ${o.waitBudgetMs} ms, cooldown ${o.cooldownMs} ms)\n`);
  });
  const stop = () => server.close(() => pool.end().then(() => process.exit(0)));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((e) => {
  process.stderr.write(`demo-server: ${e.stack || e}\n`);
  process.exit(1);
});
