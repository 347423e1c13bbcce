'use strict';
// Consumers and relays killed with SIGKILL (or stalled past their lease)
// in processes of their own (messaging-child.js), against the real server:
// every effect happens exactly once, nothing is lost, the attempt cap
// holds, leased events come back after the lease, and a late ack changes
// nothing.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const crypto = require('node:crypto');
const path = require('node:path');
const readline = require('node:readline');
const pg = require('pg');
const { Inbox, Drainer } = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_processes_test';
const CHILD = path.join(__dirname, 'messaging-child.js');
const SESSION_ENDED = 'consumer session ended during the attempt';
let options;
let db;

const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });
const rows = async (sql, params = []) => (await db.query(sql, params)).rows;

// A messaging-child.js process; waitFor reads its lines until one matches.
class Child {
  constructor(...args) {
    this.p = spawn(process.execPath, [CHILD, args[0], JSON.stringify(options), ...args.slice(1).map(String)],
      { stdio: ['pipe', 'pipe', 'inherit'] });
    this.out = [];
    this.waiters = [];
    this.exited = new Promise((r) => { this.p.on('exit', (code) => r(code)); });
    readline.createInterface({ input: this.p.stdout }).on('line', (line) => {
      this.out.push(line);
      this.waiters = this.waiters.filter((w) => !w(line));
    });
  }

  waitFor(predicate, timeout = 60000) {
    const seen = this.out.find(predicate);
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(undefined), timeout);
      this.exited.then(() => { clearTimeout(timer); resolve(this.out.find(predicate)); });
      this.waiters.push((line) => {
        if (!predicate(line)) return false;
        clearTimeout(timer);
        resolve(line);
        return true;
      });
    });
  }

  async kill() {
    this.p.kill('SIGKILL');
    await this.exited;
  }
}

// The state once the killed attempt is recorded (the n-th failure: its
// 'processing' was never committed, so only the count tells).
async function recorded(messageId, n) {
  for (let i = 0; i < 3000; i++) {
    const r = await rows("SELECT state, error_count FROM idem_inbox WHERE consumer = 'procs' AND message_id = $1", [messageId]);
    if (r.length && r[0].error_count >= n) return r[0].state;
    await sleep(20);
  }
  throw new Error(`the killed attempt at ${messageId} was never recorded`);
}

test.describe('killed consumers and relays', { skip }, () => {
  test.before(async () => {
    options = await createDatabase(DB);
    db = new pg.Client(options);
    await db.connect();
    await db.query('CREATE TABLE msg_effects (key text)');
  });
  test.after(async () => {
    await db.end();
    await dropDatabase(DB);
  });

  test('a consumer killed mid-handler loses nothing and repeats nothing', async () => {
    const run = crypto.randomUUID().slice(0, 8);
    const ids = Array.from({ length: 40 }, (_, i) => `k-${run}-${String(i).padStart(2, '0')}`);
    const victim = ids[20];
    const a = new Child('consume', 5, victim, ...ids);
    assert.ok(await a.waitFor((l) => l === `handling ${victim}`), a.out.join('\n'));
    await a.kill();
    assert.deepEqual(a.out.slice(0, 20), ids.slice(0, 20).map((id) => `${id} processed`));

    // The broker redelivers the whole stream to a new consumer.
    const b = new Child('consume', 5, '-', ...ids);
    assert.equal(await b.exited, 0);
    const outcomes = Object.fromEntries(b.out.map((l) => l.split(' ')));
    assert.deepEqual(ids.map((id) => outcomes[id]), [...Array(20).fill('duplicate'), ...Array(20).fill('processed')]);
    const effects = await rows('SELECT key, count(*)::int AS n FROM msg_effects WHERE key = ANY($1) GROUP BY key', [ids]);
    assert.deepEqual(Object.fromEntries(effects.map((r) => [r.key, r.n])), Object.fromEntries(ids.map((id) => [id, 1])));
    const states = await rows("SELECT message_id, state, error_count, last_error FROM idem_inbox WHERE consumer = 'procs'"
      + ' AND message_id = ANY($1)', [ids]);
    assert.equal(states.length, ids.length);
    assert.deepEqual([...new Set(states.map((s) => s.state))], ['done']);
    assert.deepEqual(states.filter((s) => s.error_count).map((s) => [s.message_id, s.error_count, s.last_error]),
      [[victim, 1, SESSION_ENDED]]);
  });

  test('the cap holds when consumers are killed at a poison message', async () => {
    const poison = `poison-${crypto.randomUUID()}`;
    for (const [n, state] of [[1, 'failed'], [2, 'dead']]) {
      const c = new Child('consume', 2, poison, poison);
      assert.ok(await c.waitFor((l) => l.startsWith('handling')), c.out.join('\n'));
      await c.kill();
      assert.equal(await recorded(poison, n), state);
    }
    const last = new Child('consume', 2, poison, poison);
    assert.equal(await last.exited, 0);
    assert.deepEqual(last.out, [`${poison} dead`]);
    assert.deepEqual(await rows('SELECT count(*)::int AS n FROM msg_effects WHERE key = $1', [poison]), [{ n: 0 }]);
    assert.deepEqual(await rows('SELECT state, error_count FROM idem_inbox WHERE message_id = $1', [poison]),
      [{ state: 'dead', error_count: 2 }]);
    assert.deepEqual(await rows("SELECT count(*)::int AS n FROM idem_outbox WHERE topic = 'idem.inbox.dead'"
      + " AND payload ->> 'message_id' = $1", [poison]), [{ n: 1 }]);
    const pool = new pg.Pool(options);
    assert.equal((await new Inbox(pool, { maxAttempts: 2 }).handle('procs', { id: poison, payload: 'p' }, async () => {})).outcome,
      'dead');
    await pool.end();
  });

  test('a relay killed mid-batch loses nothing', async () => {
    await db.query('DELETE FROM idem_outbox');
    const ids = (await rows("SELECT idem_outbox_stage('procs', jsonb_build_object('n', g),"
      + " CASE WHEN g % 3 = 0 THEN 'key-' || (g % 7) END)::text AS id FROM generate_series(1, 300) g ORDER BY 1"))
      .map((r) => r.id);
    // It hangs at its 150th publish, halfway through its second batch (the
    // first acked by then); the lease leaves the first batch's 100 publishes
    // time on a loaded machine.
    const r = new Child('relay', 100, 5000, 5, 150);
    assert.ok(await r.waitFor(() => r.out.length >= 150), r.out.slice(-3).join('\n'));
    await r.kill();
    const killed = new Set(r.out.filter((l) => l.startsWith('published')).map((l) => l.split(' ')[1]));
    const leased = await rows("SELECT id::text, available_at FROM idem_outbox_claimed WHERE state = 'pending' AND claim_token IS NOT NULL ORDER BY id");
    const batch = new Set(leased.map((l) => l.id));
    const leaseEnd = Math.max(...leased.map((l) => l.available_at.getTime()));
    const acked = new Set([...killed].filter((id) => !batch.has(id)));
    assert.equal(acked.size, 100);
    assert.ok([...killed].some((id) => batch.has(id)) && [...batch].some((id) => !killed.has(id)), 'killed mid-batch');

    const pool = new pg.Pool(options);
    const published = [];
    const d = new Drainer(pool, async (e) => { published.push(e); }, { batch: 100, lease: 30000 });
    const until = Date.now() + 60000;
    while (Date.now() < until && published.length < 300 - acked.size) {
      if ((await d.drainOnce()).claimed === 0) await sleep(50);
    }
    await pool.end();
    // Everything not acked, once: nothing lost, nothing acked published again.
    assert.deepEqual(published.map((e) => String(e.id)).sort(), ids.filter((id) => !acked.has(id)).sort());
    for (const e of published) {
      if (batch.has(String(e.id))) {
        // Came back only after the dead relay's lease, claimed a second time.
        assert.equal(e.attempts, 2);
        assert.ok(e.leaseExpiresAt.getTime() - 30000 >= leaseEnd, String(e.id));
      } else {
        assert.equal(e.attempts, 1);
      }
    }
    assert.deepEqual(await rows('SELECT count(*)::int AS n, count(DISTINCT id)::int AS d FROM idem_outbox_archive'),
      [{ n: 300, d: 300 }]);
    assert.deepEqual(await rows("SELECT count(*)::int AS n FROM idem_outbox WHERE state <> 'published'"), [{ n: 0 }]);
  });

  test("a stalled relay's late ack changes nothing", async () => {
    await db.query('DELETE FROM idem_outbox');
    const ids = (await rows("SELECT idem_outbox_stage('stall', jsonb_build_object('n', g))::text AS id"
      + ' FROM generate_series(1, 5) g ORDER BY 1')).map((r) => r.id);
    const s = new Child('stall', 1000);
    assert.equal(await s.waitFor((l) => l.startsWith('publishing')), `publishing ${ids[0]}`);
    await sleep(1200); // past its lease: another relay takes the batch over
    const pool = new pg.Pool(options);
    const taken = await new Drainer(pool, async () => {}).drainOnce();
    await pool.end();
    assert.deepEqual([taken.claimed, taken.acked], [5, 5]);
    const archived = await rows('SELECT id::text, claim_token, published_at FROM idem_outbox_archive ORDER BY id');
    s.p.stdin.write('go\n');
    assert.equal(await s.exited, 0);
    const report = JSON.parse(s.out[s.out.length - 1]);
    assert.deepEqual([report.published, report.acked, report.lease_lost, report.expired], [1, 0, 1, 4]);
    assert.deepEqual(await rows('SELECT id::text, claim_token, published_at FROM idem_outbox_archive ORDER BY id'), archived);
    assert.deepEqual(archived.map((a) => a.id), ids);
  });
});
