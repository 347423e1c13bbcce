'use strict';
// Against a SQL_ASCII database (what initdb makes when the environment sets
// no locale; issue 24 item 12). node-postgres asks for client_encoding
// UTF8 at startup, so text comes back as strings; every mode must claim,
// replay (headers outside ASCII byte for byte) and refuse another body.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const pg = require('pg');
const { Runner } = require('..');
const { DSN, dropDatabase, skip } = require('./support');
const { poolOptions } = require('../lib/conninfo');

const DB = 'idem_node_ascii';
let pool;

async function admin(sql) {
  const c = new pg.Client(poolOptions(DSN));
  await c.connect();
  try {
    await c.query('SET client_min_messages = warning');
    await c.query(sql);
  } finally {
    await c.end();
  }
}

const req = (k, body = '{"amount": 5}', target = '/ascii') => ({ principal: 'alice', method: 'POST', target, keys: [k], body });
const header = (res, name) => (res.headers.find(([n]) => n.toLowerCase() === name.toLowerCase()) || [])[1];
const LOCATION = '/payments/é';

test.describe('a SQL_ASCII database', { skip }, () => {
  test.before(async () => {
    await admin(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
    await admin(`CREATE DATABASE ${DB} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`);
    pool = new pg.Pool({ ...poolOptions(DSN), database: DB, max: 8 });
    pool.on('error', () => {});
    assert.equal((await pool.query('SHOW server_encoding')).rows[0].server_encoding, 'SQL_ASCII');
    await pool.query('CREATE EXTENSION pg_idem');
    await pool.query('CREATE TABLE effects (k text, note text)');
  });
  test.after(async () => {
    await pool.end();
    await dropDatabase(DB);
  });

  test('lease mode: claim, replay, another body', async () => {
    const r = new Runner(pool, { followerWaitBudget: 1000 });
    const k = crypto.randomUUID();
    let runs = 0;
    const h = async () => {
      runs += 1;
      return { status: 201, headers: [['Content-Type', 'application/json'], ['Location', LOCATION]], body: '{"id": "é"}' };
    };
    const first = await r.run(req(k), h);
    assert.equal(first.outcome, 'won_completed');
    const again = await r.run(req(k), h);
    assert.ok(again.replayed);
    assert.equal(again.response.body.toString(), '{"id": "é"}');
    assert.equal(header(again.response, 'location'), LOCATION);
    const other = await r.run(req(k, 'other'), h);
    assert.equal(other.outcome, 'conflict');
    assert.equal(other.response.status, 422);
    assert.equal(runs, 1);
  });

  for (const mode of ['runFenced', 'runInTransaction']) {
    test(`${mode}: claim, replay, another body`, async () => {
      const r = new Runner(pool, { followerWaitBudget: 1000 });
      const k = crypto.randomUUID();
      let runs = 0;
      const h = async (tx) => {
        runs += 1;
        await tx.query('INSERT INTO effects VALUES ($1, $2)', [k, 'é']);
        return { status: 201, headers: [['Location', LOCATION]], body: 'paid' };
      };
      assert.equal((await r[mode](req(k, '{}', `/ascii/${mode}`), h)).outcome, 'won_completed');
      const again = await r[mode](req(k, '{}', `/ascii/${mode}`), h);
      assert.ok(again.replayed);
      assert.equal(header(again.response, 'location'), LOCATION);
      assert.equal((await r[mode](req(k, 'other', `/ascii/${mode}`), h)).response.status, 422);
      assert.equal(runs, 1);
    });
  }
});
