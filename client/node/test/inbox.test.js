'use strict';
// The inbox consumer (lib/inbox.js) against the real server: the C++
// client's inbox tests (client/cpp/tests/integration_messages_test.cpp).

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const pg = require('pg');
const { Inbox, InboxOutcome, BrokerAction, ConfigError, protocol } = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_inbox_test';
let options;
let pool;
let db;

const mid = () => `m-${crypto.randomUUID()}`;
const one = async (sql, params = []) => (await db.query(sql, params)).rows[0];
const effects = async (k) => Number((await one('SELECT count(*) AS n FROM msg_effects WHERE key = $1', [k])).n);
const insertEffect = (k) => async (tx) => { await tx.query('INSERT INTO msg_effects (key) VALUES ($1)', [k]); };
const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });

test.describe('the inbox against the server', { skip }, () => {
  test.before(async () => {
    options = await createDatabase(DB);
    pool = new pg.Pool({ ...options, max: 10 });
    pool.on('error', () => {});
    db = new pg.Client(options);
    await db.connect();
    await db.query('CREATE TABLE msg_effects (key text, note text)');
    await db.query('CREATE TABLE msg_deferred (k int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)');
    await db.query('CREATE TABLE msg_gated (key text)');
    await db.query(`CREATE FUNCTION msg_gate() RETURNS trigger LANGUAGE plpgsql AS
                    $$BEGIN PERFORM pg_advisory_xact_lock(4243, 3); RETURN NULL; END$$`);
    await db.query(`CREATE CONSTRAINT TRIGGER msg_gate AFTER INSERT ON msg_gated
                    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION msg_gate()`);
  });
  test.after(async () => {
    await db.end();
    await pool.end();
    await dropDatabase(DB);
  });

  test('processes once, then answers duplicate', async () => {
    const inbox = new Inbox(pool);
    const m = mid();
    const first = await inbox.handle('billing', { id: m, payload: '{"n":1}' }, insertEffect(m));
    assert.equal(first.outcome, InboxOutcome.PROCESSED);
    assert.ok(first.handlerRan);
    assert.equal(first.handlerRuns, 1);
    assert.equal(first.brokerAction, BrokerAction.ACK);
    assert.equal(await effects(m), 1);
    assert.equal((await one('SELECT state FROM idem_inbox WHERE message_id = $1', [m])).state, 'done');
    const again = await inbox.handle('billing', { id: m, payload: Buffer.from('{"n":1}') }, insertEffect(m));
    assert.equal(again.outcome, InboxOutcome.DUPLICATE);
    assert.ok(!again.handlerRan);
    assert.equal((await inbox.handle('audit', { id: m, payload: '{"n":1}' }, insertEffect(m))).outcome, 'processed');
    assert.equal(await effects(m), 2);
  });

  test('a failing handler is recorded with retryAfter', async () => {
    const inbox = new Inbox(pool);
    const m = mid();
    const r = await inbox.handle('billing', { id: m, payload: 'p' }, async (tx) => {
      await tx.query('INSERT INTO msg_effects (key) VALUES ($1)', [m]);
      throw new Error('payment provider said no');
    });
    assert.equal(r.outcome, InboxOutcome.RETRY);
    assert.equal(r.errorCount, 1);
    assert.equal(r.retryAfter, 1000); // idem.inbox_backoff_base
    assert.equal(r.brokerAction, BrokerAction.REQUEUE_AFTER);
    assert.equal(r.error.message, 'payment provider said no');
    assert.equal(await effects(m), 0);
    assert.deepEqual({ ...(await one('SELECT state, error_count, last_error FROM idem_inbox WHERE message_id = $1', [m])) },
      { state: 'failed', error_count: 1, last_error: 'payment provider said no' });
    assert.equal((await inbox.handle('billing', { id: m, payload: 'p' }, insertEffect(m))).outcome, 'processed');
    assert.equal(await effects(m), 1);
  });

  test('the cap makes the message dead, with a dead letter', async () => {
    const inbox = new Inbox(pool, { maxAttempts: 2 });
    const m = mid();
    const poison = async () => { throw new Error('poison'); };
    const r1 = await inbox.handle('billing', { id: m, payload: 'p' }, poison);
    assert.deepEqual([r1.outcome, r1.errorCount], ['retry', 1]);
    const r2 = await inbox.handle('billing', { id: m, payload: 'p' }, poison);
    assert.deepEqual([r2.outcome, r2.errorCount, r2.retryAfter, r2.brokerAction], ['dead', 2, 0, 'ack']);
    assert.equal(Number((await one("SELECT count(*) AS n FROM idem_outbox WHERE topic = 'idem.inbox.dead'"
      + " AND payload ->> 'message_id' = $1 AND payload ->> 'last_error' = 'poison'", [m])).n), 1);
    const r3 = await inbox.handle('billing', { id: m, payload: 'p' }, insertEffect(m));
    assert.equal(r3.outcome, 'dead');
    assert.ok(!r3.handlerRan);
    assert.equal(await effects(m), 0);
  });

  test('the same id with another payload is a mismatch', async () => {
    const inbox = new Inbox(pool);
    const m = mid();
    assert.equal((await inbox.handle('billing', { id: m, payload: 'first' }, insertEffect(m))).outcome, 'processed');
    const r = await inbox.handle('billing', { id: m, payload: 'second' }, insertEffect(m));
    assert.equal(r.outcome, InboxOutcome.MISMATCH);
    assert.ok(!r.handlerRan);
    assert.equal(await effects(m), 1);
  });

  test('concurrent deliveries have one effect', async () => {
    const inbox = new Inbox(pool);
    const m = mid();
    const results = await Promise.all(Array.from({ length: 6 }, () => inbox.handle('billing', { id: m, payload: 'x' },
      async (tx) => { await tx.query('INSERT INTO msg_effects (key) VALUES ($1)', [m]); await sleep(50); })));
    assert.deepEqual(results.map((r) => r.outcome).sort(), ['duplicate', 'duplicate', 'duplicate', 'duplicate', 'duplicate',
      'processed']);
    assert.equal(await effects(m), 1);
  });

  test('a serialization failure in the handler is rerun in place', async () => {
    const inbox = new Inbox(pool);
    const m = mid();
    let runs = 0;
    const conflict = "DO $$BEGIN RAISE EXCEPTION 'simulated conflict' USING ERRCODE = 'serialization_failure'; END$$";
    const r = await inbox.handle('billing', { id: m, payload: 'p' }, async (tx) => {
      runs++;
      await tx.query('INSERT INTO msg_effects (key, note) VALUES ($1, $2)', [m, String(runs)]);
      if (runs === 1) await tx.query(conflict);
    });
    assert.equal(r.outcome, 'processed');
    assert.equal(r.handlerRuns, 2);
    assert.equal(Number((await one("SELECT count(*) AS n FROM msg_effects WHERE key = $1 AND note = '2'", [m])).n), 1);
    assert.equal(await effects(m), 1);
    assert.equal((await one('SELECT error_count FROM idem_inbox WHERE message_id = $1', [m])).error_count, 0);
    const m2 = mid();
    const r2 = await inbox.handle('billing', { id: m2, payload: 'p' }, async (tx) => { await tx.query(conflict); });
    assert.deepEqual([r2.outcome, r2.handlerRuns, r2.errorCount, r2.error.code], ['retry', 3, 1, '40001']);
  });

  test('a failed COMMIT is recorded in autocommit', async () => {
    const single = new pg.Pool({ ...options, max: 1 });
    const inbox = new Inbox(single);
    const m = mid();
    const k = crypto.randomInt(2 ** 30);
    const r = await inbox.handle('billing', { id: m, payload: 'p' }, async (tx) => {
      await tx.query('INSERT INTO msg_effects (key) VALUES ($1)', [m]);
      await tx.query('INSERT INTO msg_deferred VALUES ($1), ($1)', [k]);
    });
    assert.deepEqual([r.outcome, r.errorCount, r.error.code], ['retry', 1, '23505']);
    assert.equal(await effects(m), 0);
    assert.equal((await one('SELECT state FROM idem_inbox WHERE message_id = $1', [m])).state, 'failed');
    assert.equal((await inbox.handle('billing', { id: m, payload: 'p' }, insertEffect(m))).outcome, 'processed');
    assert.equal(await effects(m), 1);
    await single.end();
  });

  test('a lost COMMIT is unknown and the handler is not rerun', async () => {
    const inbox = new Inbox(pool);
    const m = mid();
    let runs = 0;
    await db.query('SELECT pg_advisory_lock(4243, 3)');
    const pending = inbox.handle('billing', { id: m, payload: 'p' }, async (tx) => {
      runs++;
      await tx.query('INSERT INTO msg_gated (key) VALUES ($1)', [m]);
    });
    let pid;
    for (let i = 0; i < 1000 && !pid; i++) {
      const w = await db.query("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 4243 AND objid = 3 AND NOT granted");
      if (w.rows.length) pid = w.rows[0].pid;
      else await sleep(10);
    }
    assert.ok(pid, 'the COMMIT never reached the gate');
    await db.query('SELECT pg_terminate_backend($1)', [pid]);
    const r = await pending;
    await db.query('SELECT pg_advisory_unlock(4243, 3)');
    assert.equal(r.outcome, InboxOutcome.UNKNOWN);
    assert.equal(r.brokerAction, BrokerAction.REQUEUE);
    assert.equal(runs, 1);
    assert.ok(r.error);
    const again = await inbox.handle('billing', { id: m, payload: 'p' }, insertEffect(m));
    assert.equal(again.outcome, 'processed');
    assert.equal(Number((await one('SELECT count(*) AS n FROM msg_gated WHERE key = $1', [m])).n), 0);
    assert.equal((await one('SELECT error_count FROM idem_inbox WHERE message_id = $1', [m])).error_count, 1);
  });

  test('bad arguments are refused before the handler', async () => {
    const inbox = new Inbox(pool);
    let ran = false;
    await assert.rejects(inbox.handle('', { id: 'm1', payload: 'p' }, async () => { ran = true; }), { code: '22023' });
    await assert.rejects(inbox.handle('billing', { id: '', payload: 'p' }, async () => { ran = true; }), { code: '22023' });
    assert.ok(!ran);
    for (const bad of [{ maxAttempts: 0 }, { maxAttempts: protocol.INBOX_MAX_ATTEMPTS + 1 }, { handlerAttempts: 0 },
      { isolation: 'chaos' }, { maxErrorBytes: 1 }]) {
      assert.throws(() => new Inbox(pool, bad), ConfigError, JSON.stringify(bad));
    }
  });

  test('outcomes are counted', async () => {
    const prom = require('prom-client'); // eslint-disable-line global-require
    const registry = new prom.Registry();
    const { prometheus } = require('..'); // eslint-disable-line global-require
    const inbox = new Inbox(pool, { metrics: prometheus({ registry }) });
    const m = mid();
    await inbox.handle('billing', { id: m, payload: 'p' }, insertEffect(m));
    await inbox.handle('billing', { id: m, payload: 'p' }, insertEffect(m));
    const text = await registry.metrics();
    assert.match(text, /idem_client_inbox_messages_total\{outcome="processed"\} 1/);
    assert.match(text, /idem_client_inbox_messages_total\{outcome="duplicate"\} 1/);
    assert.match(text, /idem_client_inbox_messages_total\{outcome="dead"\} 0/);
  });
});
