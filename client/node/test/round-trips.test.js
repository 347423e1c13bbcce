'use strict';
// Round trips per request in each mode, counted on the wire: the pool's
// connections go through client/conformance/flight_relay.py, which counts
// the flights (what a client sends before it waits for the server). A
// count, not a time: docs/benchmarks.md's round-trip table is these numbers.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const pg = require('pg');
const { Runner } = require('..');
const { createDatabase, dropDatabase, skip } = require('./support');

const DB = 'idem_node_round_trips';
const RELAY = path.join(__dirname, '..', '..', 'conformance', 'flight_relay.py');

// The relay as a child process: "port N", then a JSON line per "count".
async function startRelay(host, port) {
  const child = spawn(process.env.PYTHON || 'python3', [RELAY, host, String(port)], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const first = (await lines.next()).value;
  const m = /^port (\d+)$/.exec(first || '');
  if (!m) throw new Error(`flight_relay.py did not start: ${first}`);
  return {
    port: Number(m[1]),
    async log() {
      child.stdin.write('count\n');
      return JSON.parse((await lines.next()).value).log;
    },
    stop() {
      child.stdin.end();
      return new Promise((resolve) => child.on('exit', resolve));
    },
  };
}

// A flight log in short: each statement's first word or pg_idem call.
const CALLS = ['idem_claim', 'idem_begin', 'idem_finalize', 'idem_release', 'idem_fail', 'idem_lookup'];
const short = (log) => log.map((flight) => flight.flatMap((text) => text.split(/;\s*/).filter(Boolean)).map(
  (sql) => CALLS.find((fn) => sql.includes(fn)) || sql.trim().split(/\s+/)[0].toUpperCase()));

// The handler's INSERT is a flight of its own in the fenced and
// in-transaction modes (the application's, not the runner's). node-postgres
// has no pipeline: one statement per flight, but for a Query without
// parameters, which may hold several (in-transaction mode's first flight).
const EXPECTED = {
  lease: [['idem_claim'], ['idem_finalize']],
  'lease replay': [['idem_claim']],
  fenced: [['idem_claim'], ['BEGIN'], ['INSERT'], ['idem_finalize'], ['COMMIT']],
  'fenced replay': [['idem_claim']],
  in_transaction: [['BEGIN', 'idem_begin', 'SAVEPOINT'], ['INSERT'], ['idem_finalize'], ['COMMIT']],
  // The replay is read in the transaction it would have run in, then rolled back.
  'in_transaction replay': [['BEGIN', 'idem_begin', 'SAVEPOINT'], ['ROLLBACK']],
};

test.describe('round trips', { skip }, () => {
  let options;
  let relay;
  let pool;
  test.before(async () => {
    options = await createDatabase(DB);
    relay = await startRelay(options.host || '/var/run/postgresql', options.port || 5432);
    pool = new pg.Pool({ ...options, host: '127.0.0.1', port: relay.port, max: 4 });
  });
  test.after(async () => {
    await pool.end();
    await relay.stop();
    await dropDatabase(DB);
  });

  test('flights per request in each mode', async () => {
    // A lease far beyond the test: no renewal can add a flight.
    const r = new Runner(pool, { lease: 300000 });
    const ok = async () => ({ status: 201, headers: [], body: 'made' });
    const txOk = async (tx, claim) => {
      await tx.query("INSERT INTO effects VALUES ($1, $2, 'round trips')", [claim.claimId, claim.generation]);
      return { status: 201, headers: [], body: 'made' };
    };
    const modes = {
      lease: (q) => r.run(q, ok),
      fenced: (q) => r.runFenced(q, txOk),
      in_transaction: (q) => r.runInTransaction(q, txOk),
    };
    const req = (target) => ({ principal: 'alice', method: 'POST', target, keys: [crypto.randomUUID()], body: '{}' });
    // One request of each first: opening connections and the first-use check are not counted.
    for (const [name, run] of Object.entries(modes)) assert.equal((await run(req(`/warm-${name}`))).outcome, 'won_completed');
    let seen = (await relay.log()).length;
    const take = async () => {
      const log = (await relay.log()).slice(seen);
      seen += log.length;
      return log;
    };
    const got = {};
    for (const [name, run] of Object.entries(modes)) {
      const q = req(`/${name}`);
      assert.equal((await run(q)).outcome, 'won_completed');
      got[name] = await take();
      assert.ok((await run(q)).replayed);
      got[`${name} replay`] = await take();
    }
    for (const [what, flights] of Object.entries(EXPECTED)) {
      assert.deepEqual(short(got[what]), flights, `${what}: ${JSON.stringify(got[what])}`);
    }
  });
});
