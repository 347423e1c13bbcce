'use strict';
// The Node duplicate storm behind PgBouncer (issue 22): the README's
// one-line Express setup with every default (new pg.Pool() from the libpq
// environment, idem.express({ pool, principal })), 20 duplicates of a
// 300 ms handler at once, direct and through PgBouncer in transaction
// mode with a pool of 5. Exactly one handler run per storm, every answer
// the route's 201 (no 503, no 409), and the pooled storm answered within
// about twice the direct one. Exit status 0 when all holds.
//
//   PG_IDEM_STORM_HOST, PG_IDEM_STORM_PORT, PG_IDEM_STORM_USER: the server;
//   NODE_PATH: client/node/node_modules (express, pg).

const crypto = require('node:crypto');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');

const root = path.resolve(__dirname, '..', '..');
const express = require('express');
const pg = require('pg');
const idem = require(path.join(root, 'client', 'node'));

const DUPLICATES = 20;
const HANDLER_MS = 300;
const POOL_SIZE = 5;
const DB = 'idem_node_storm';
const server = { host: process.env.PG_IDEM_STORM_HOST, port: Number(process.env.PG_IDEM_STORM_PORT),
  user: process.env.PG_IDEM_STORM_USER || 'postgres' };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => {
    const { port } = s.address();
    s.close(() => resolve(port));
  });
});

async function adminQuery(database, sql) {
  const c = new pg.Client({ ...server, database });
  await c.connect();
  try {
    return await c.query(sql);
  } finally {
    await c.end();
  }
}

async function startBouncer() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg_idem.node_storm.'));
  const port = await freePort();
  fs.writeFileSync(path.join(dir, 'pgbouncer.ini'), `[databases]
${DB} = host=${server.host} port=${server.port} dbname=${DB} user=${server.user}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = ${POOL_SIZE}
reserve_pool_size = 0
max_client_conn = 200
server_reset_query =
ignore_startup_parameters = extra_float_digits, options
logfile = ${dir}/pgbouncer.log
pidfile = ${dir}/pgbouncer.pid
`);
  const binary = fs.existsSync('/usr/sbin/pgbouncer') ? '/usr/sbin/pgbouncer' : 'pgbouncer';
  const proc = spawn(binary, [path.join(dir, 'pgbouncer.ini')], { stdio: 'ignore' });
  for (let i = 0; ; i++) {
    try {
      await adminQuery(DB, 'SELECT 1').catch((e) => { throw e; });
      const c = new pg.Client({ host: '127.0.0.1', port, user: server.user, database: DB });
      await c.connect();
      await c.end();
      break;
    } catch (e) {
      if (i === 100) throw e;
      await sleep(100);
    }
  }
  return { port, stop: () => {
    proc.kill('SIGTERM');
    fs.rmSync(dir, { recursive: true, force: true }); // a passing run leaves nothing behind
  } };
}

// The README's app, its pool from the libpq environment (PGHOST, PGPORT ...).
async function storm(env, label) {
  Object.assign(process.env, env);
  const pool = new pg.Pool();
  const app = express();
  let runs = 0;
  app.use(idem.express({ pool, principal: (req) => req.get('x-user') }));
  app.use(express.json());
  app.post('/payments', async (req, res) => {
    runs++;
    await sleep(HANDLER_MS);
    res.status(201).json({ id: runs, amount: req.body.amount });
  });
  const listener = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  const url = `http://127.0.0.1:${listener.address().port}/payments`;
  const key = crypto.randomUUID();
  const t0 = performance.now();
  const answers = await Promise.all(Array.from({ length: DUPLICATES }, () => fetch(url, { method: 'POST',
    body: '{"amount": 5}', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-user': 'storm' } })
    .then(async (r) => ({ status: r.status, body: await r.text() }))));
  const ms = performance.now() - t0;
  listener.close();
  await pool.end();
  const statuses = {};
  for (const a of answers) statuses[a.status] = (statuses[a.status] || 0) + 1;
  console.log(`node storm ${label}: ${DUPLICATES} duplicates, ${runs} handler run(s), statuses ${JSON.stringify(statuses)}, `
    + `${Math.round(ms)} ms`);
  return { runs, statuses, ms, bodies: new Set(answers.map((a) => a.body)) };
}

(async () => {
  await adminQuery('postgres', `DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
  await adminQuery('postgres', `CREATE DATABASE ${DB}`);
  await adminQuery(DB, 'CREATE EXTENSION pg_idem');
  const bouncer = await startBouncer();
  const failures = [];
  try {
    const base = { PGUSER: server.user, PGDATABASE: DB };
    await storm({ ...base, PGHOST: server.host, PGPORT: String(server.port) }, 'warm-up'); // first connections, first check
    const direct = await storm({ ...base, PGHOST: server.host, PGPORT: String(server.port) }, 'direct');
    // About twice the direct time; 250 ms of slack for a loaded machine. A
    // storm over the bound gets one more try (its first ran on cold pooler
    // connections): the regression this guards against, followers holding
    // the pooler's connections for their budget, costs seconds every time.
    const bound = 2 * direct.ms + 250;
    const pooledEnv = { ...base, PGHOST: '127.0.0.1', PGPORT: String(bouncer.port) };
    const label = `through PgBouncer (transaction mode, pool ${POOL_SIZE})`;
    const first = await storm(pooledEnv, label);
    const pooled = first.ms > bound ? await storm(pooledEnv, `${label}, again`) : first;
    const storms = [['direct', direct], ['pgbouncer', first]];
    if (pooled !== first) storms.push(['pgbouncer again', pooled]);
    for (const [name, r] of storms) {
      if (r.runs !== 1) failures.push(`${name}: the handler ran ${r.runs} times`);
      if (r.statuses[201] !== DUPLICATES) failures.push(`${name}: not every answer is the route's 201: ${JSON.stringify(r.statuses)}`);
      if (r.bodies.size !== 1) failures.push(`${name}: the duplicates got different bodies`);
    }
    if (pooled.ms > bound) failures.push(`pgbouncer: answered in ${Math.round(pooled.ms)} ms, over ${Math.round(bound)} ms (2 x direct + 250)`);
  } finally {
    bouncer.stop();
    await sleep(200);
    await adminQuery('postgres', `DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`).catch(() => {});
  }
  for (const f of failures) console.log(`FAIL ${f}`);
  process.exit(failures.length ? 1 : 0);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
