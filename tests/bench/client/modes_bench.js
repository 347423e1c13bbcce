'use strict';
// A new-key request in each of the Node runner's modes, at CLIENTS
// concurrent callers, interleaved in rounds so that a loaded machine weighs
// on each alike (client/cpp/bench/modes_bench.cpp's cells, for the Node
// client): lease mode (run), runFenced and runInTransaction (BEGIN + claim +
// SAVEPOINT in one simple-protocol Query). The handler writes one row in
// every mode: in its transaction in the exactly-once modes, autocommitted
// through the pool in lease mode.
//
//   node tests/bench/client/modes_bench.js CONNINFO [CLIENTS=4] [SECONDS_PER_CELL=2] [ROUNDS=3]
//
// Needs client/node's node_modules (npm ci there). Prints requests/s per
// mode and the ratio to lease mode, within one run.

const path = require('node:path');
const crypto = require('node:crypto');

const NODE_CLIENT = path.join(__dirname, '..', '..', '..', 'client', 'node');
const pg = require(path.join(NODE_CLIENT, 'node_modules', 'pg'));
const { Runner } = require(NODE_CLIENT);
const { poolOptions } = require(path.join(NODE_CLIENT, 'lib', 'conninfo'));

const MODES = ['lease', 'fenced', 'in_transaction'];
const INSERT = 'INSERT INTO bench_effects VALUES ($1, $2)';

async function cell(runner, pool, mode, clients, seconds) {
  const stop = performance.now() + seconds * 1000;
  let done = 0;
  const lease = async (claim) => {
    await pool.query(INSERT, [claim.claimId, claim.generation]);
    return { status: 201, headers: [], body: 'made' };
  };
  const inTx = async (tx, claim) => {
    await tx.query(INSERT, [claim.claimId, claim.generation]);
    return { status: 201, headers: [], body: 'made' };
  };
  const one = async () => {
    while (performance.now() < stop) {
      const r = { principal: 'bench', method: 'POST', target: '/modes', keys: [crypto.randomUUID()], body: '{}' };
      const res = mode === 'lease' ? await runner.run(r, lease)
        : mode === 'fenced' ? await runner.runFenced(r, inTx) : await runner.runInTransaction(r, inTx);
      if (res.outcome !== 'won_completed') throw new Error(`${mode}: ${res.outcome} (${res.error})`);
      done++;
    }
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: clients }, one));
  return done / ((performance.now() - started) / 1000);
}

async function main(argv) {
  if (argv.length < 1) {
    process.stderr.write('usage: modes_bench.js CONNINFO [CLIENTS=4] [SECONDS_PER_CELL=2] [ROUNDS=3]\n');
    return 2;
  }
  const [dsn, clients = 4, seconds = 2, rounds = 3] = [argv[0], ...argv.slice(1).map(Number)];
  const pool = new pg.Pool({ ...poolOptions(dsn), max: 2 * clients });
  await pool.query('CREATE TABLE IF NOT EXISTS bench_effects (claim_id uuid, generation bigint)');
  const sc = (await pool.query("SELECT current_setting('synchronous_commit') AS s, current_setting('fsync') AS f")).rows[0];
  const runner = new Runner(pool, {});
  const total = Object.fromEntries(MODES.map((m) => [m, 0]));
  for (let rnd = 1; rnd <= rounds; rnd++) {
    for (const m of MODES) {
      const rate = await cell(runner, pool, m, clients, seconds);
      total[m] += rate;
      console.log(`round ${rnd}  ${m.padEnd(16)} ${rate.toFixed(0).padStart(8)} requests/s`);
    }
  }
  await pool.end();
  console.log(`synchronous_commit = ${sc.s}, fsync = ${sc.f}, ${clients} clients, ${rounds} rounds of ${seconds} s cells`);
  for (const m of MODES) {
    console.log(`${m.padEnd(16)} ${(total[m] / rounds).toFixed(0).padStart(8)} requests/s  ${(total[m] / total.lease).toFixed(2)} x lease`);
  }
  return 0;
}

main(process.argv.slice(2)).then((rc) => process.exit(rc), (e) => {
  console.error(e);
  process.exit(1);
});
