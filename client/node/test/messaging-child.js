'use strict';
// A consumer or a relay in a process of its own, for the killed-process
// tests (messaging-processes.test.js). Every line goes straight to stdout:
// the parent reads them to know where to kill it.
//
//   node messaging-child.js consume OPTIONS_JSON MAX_ATTEMPTS HANG_ID ID...
//     handles each ID in order for the consumer "procs" (payload "p"), the
//     handler inserting msg_effects(key = ID); at HANG_ID it prints
//     "handling ID" and hangs inside the handler (to be killed). Prints
//     "ID OUTCOME" per message.
//   node messaging-child.js relay OPTIONS_JSON BATCH LEASE_MS DELAY_MS HOLD_AT
//     runs a Drainer whose publisher prints "published ID" and waits
//     DELAY_MS; the HOLD_AT-th publish hangs after its line (to be killed
//     there, mid-batch, however late the parent reads it).
//   node messaging-child.js stall OPTIONS_JSON LEASE_MS
//     one drainOnce whose publisher prints "publishing ID" for the first
//     event and waits for a line on stdin (a stall past the lease); then
//     prints the batch report as JSON.
// Without arguments (node --test runs every file under test/) it does nothing.

const pg = require('pg');
const { Inbox, Drainer } = require('..');

const sleep = (ms) => new Promise((r) => { setTimeout(r, ms); });
const say = (line) => new Promise((r) => { process.stdout.write(`${line}\n`, r); });

async function consume(pool, maxAttempts, hangId, ...ids) {
  const inbox = new Inbox(pool, { maxAttempts: Number(maxAttempts) });
  for (const id of ids) {
    const r = await inbox.handle('procs', { id, payload: 'p' }, async (tx) => {
      await tx.query('INSERT INTO msg_effects (key) VALUES ($1)', [id]);
      if (id === hangId) {
        await say(`handling ${id}`);
        await sleep(3600 * 1000);
      }
    });
    await say(`${id} ${r.outcome}`);
  }
}

async function relay(pool, batch, lease, delay, holdAt) {
  let publishes = 0;
  await new Drainer(pool, async (event) => {
    await say(`published ${event.id}`);
    if (++publishes === Number(holdAt)) await sleep(3600 * 1000);
    await sleep(Number(delay));
  }, { batch: Number(batch), lease: Number(lease), idleWait: 200 }).run();
}

async function stall(pool, lease) {
  let stalled = false;
  const line = () => new Promise((r) => { process.stdin.once('data', r); });
  const report = await new Drainer(pool, async (event) => {
    if (stalled) return;
    stalled = true;
    await say(`publishing ${event.id}`);
    await line();
  }, { lease: Number(lease), leaseMargin: 0 }).drainOnce();
  await say(JSON.stringify(report));
  process.stdin.pause();
}

const [mode, options, ...args] = process.argv.slice(2);
if (mode) {
  const pool = new pg.Pool(JSON.parse(options));
  pool.on('error', () => {});
  ({ consume, relay, stall })[mode](pool, ...args)
    .then(() => pool.end())
    .catch((e) => { console.error(e); process.exit(1); });
}
