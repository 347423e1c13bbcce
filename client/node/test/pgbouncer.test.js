'use strict';
// Behind PgBouncer in transaction mode (two server connections for many
// clients): unnamed queries, no session state, every mode works.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const pg = require('pg');
const { Runner } = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_bouncer_test';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => {
    const { port } = s.address();
    s.close(() => resolve(port));
  });
});

test.describe('behind pgbouncer (transaction pooling)', { skip }, () => {
  let direct;
  let bouncer;
  let proc;
  let dir;

  test.before(async () => {
    const options = await createDatabase(DB);
    direct = new pg.Pool(options);
    direct.on('error', () => {}); // idle clients whose backend was terminated (DROP DATABASE ... WITH (FORCE))
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg_idem.bouncer.'));
    const port = await freePort();
    fs.writeFileSync(path.join(dir, 'pgbouncer.ini'), `[databases]
${DB} = host=${options.host} port=${options.port} dbname=${DB} user=${options.user || 'postgres'}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
logfile = ${dir}/pgbouncer.log
pidfile = ${dir}/pgbouncer.pid
`);
    const binary = fs.existsSync('/usr/sbin/pgbouncer') ? '/usr/sbin/pgbouncer' : 'pgbouncer';
    proc = spawn(binary, [path.join(dir, 'pgbouncer.ini')], { stdio: 'ignore' });
    bouncer = new pg.Pool({ host: '127.0.0.1', port, database: DB, user: options.user || 'postgres', max: 20 });
    bouncer.on('error', () => {}); // idle clients whose backend was terminated (DROP DATABASE ... WITH (FORCE))
    for (let i = 0; ; i++) {
      try {
        await (await bouncer.connect()).release();
        break;
      } catch (e) {
        if (i === 100) throw e;
        await sleep(100);
      }
    }
  });
  test.after(async () => {
    await bouncer.end();
    proc.kill();
    await direct.end();
    await dropDatabase(DB);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('every mode', async () => {
    // Fewer server connections (2) than waiting followers (9): a server-side
    // wait would hold every connection the winner needs to renew its lease.
    // Renewed every 100 ms, a 1 s lease has 900 ms of slack per renewal for a
    // renewal waiting its turn at a busy pooler.
    const runner = new Runner(bouncer, { lease: 1000, renewInterval: 100, followerWaitBudget: 10000, serverWait: false });
    const k = crypto.randomUUID();
    const req = (key) => ({ principal: 'alice', method: 'POST', target: '/bouncer', keys: [key], body: '{}' });
    let runs = 0;
    const results = await Promise.all(Array.from({ length: 10 }, () => runner.run(req(k), async () => {
      runs += 1;
      await sleep(2000); // two leases, renewed on whichever server connection is free
      return { status: 201, body: 'bounced' };
    })));
    assert.equal(runs, 1);
    assert.equal(results.filter((r) => r.replayed).length, 9);
    assert.ok(!results.some((r) => r.leaseStolen));
    for (const mode of ['runFenced', 'runInTransaction']) {
      const k2 = crypto.randomUUID();
      for (let i = 0; i < 8; i++) {
        const r = await runner[mode](req(k2), async (tx, claim) => {
          await tx.query("INSERT INTO effects VALUES ($1, $2, 'bouncer')", [k2, claim.generation.toString()]);
          return { status: 201, body: 'paid' };
        });
        assert.equal(r.response.status, 201);
      }
      assert.equal(Number((await direct.query('SELECT count(*) AS n FROM effects WHERE k = $1', [k2])).rows[0].n), 1);
    }
  });
});
