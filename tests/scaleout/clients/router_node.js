'use strict';
// The Node client through the PL/Proxy router (tests/scaleout/t/030_router_clients.pl).
//
//   node router_node.js CLIENT_DIR ROUTER_DSN KEY
//
// Runs the first-use check, then one lease-mode request twice with the key
// KEY, and prints what happened, one fact a line, for the TAP test to
// compare; a check that refuses is printed too (the test expects it for a
// role without EXECUTE).
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
  } finally {
    await runner.pool.end();
  }
}

main(...process.argv.slice(2)).catch((e) => {
  console.error(e);
  process.exit(1);
});
