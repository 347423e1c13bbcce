'use strict';
// The Node client through the PL/Proxy router (tests/scaleout/t/030_router_clients.pl).
//
//   node router_node.js CLIENT_DIR ROUTER_DSN KEY
//
// Runs the first-use check, then one lease-mode request twice with the key
// KEY, then a fenced and an in-transaction request (keys KEY-fenced and
// KEY-in-transaction), and prints what happened, one fact a line, for the
// TAP test to compare; a check that refuses is printed too (the test
// expects it for a role without EXECUTE).
const path = require('path');

async function main(clientDir, dsn, key) {
  const { Runner, SetupError } = require(path.resolve(clientDir));
  const runner = new Runner(dsn, { lease: 5000, followerWaitBudget: 2000, logger: false });
  try {
    try {
      await runner.ready();
    } catch (e) {
      if (!(e instanceof SetupError)) throw e;
      console.log(`check refused: ${e.message}`);
      return;
    }
    console.log('check passed');
    let runs = 0;
    const handler = async () => {
      runs += 1;
      return { status: 201, headers: { 'content-type': 'text/plain' }, body: 'paid' };
    };
    const req = { principal: 'alice', method: 'POST', target: '/payments', keys: [key], body: '{"amount": 1}' };
    for (const name of ['first', 'again']) {
      const r = await runner.run(req, handler);
      console.log(`${name} ${r.response.status} ${r.outcome} ${Buffer.from(r.response.body).toString()}`);
    }
    console.log(`runs ${runs}`);
    // The modes whose point is one transaction are refused, before any claim.
    for (const [label, mode] of [['fenced', 'runFenced'], ['in-transaction', 'runInTransaction']]) {
      let ran = 0;
      const r = await runner[mode]({ ...req, keys: [`${key}-${label}`], body: '{}' }, async () => {
        ran += 1;
        return { status: 201, headers: {}, body: '' };
      });
      console.log(`${label} ${r.response.status} ${r.outcome} ran ${ran}: ${r.error && r.error.message}`);
    }
  } finally {
    await runner.pool.end();
  }
}

main(...process.argv.slice(2)).catch((e) => {
  console.error(e);
  process.exit(1);
});
