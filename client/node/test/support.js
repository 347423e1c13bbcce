'use strict';
// The integration tests need PG_IDEM_TEST_DSN (as the C++ client's); each
// file creates its own database with the extension (node --test runs files
// in parallel) and drops it after.

const pg = require('pg');
const { poolOptions } = require('../lib/conninfo');

const DSN = process.env.PG_IDEM_TEST_DSN;

// version: the extension's (its newest unless given).
async function createDatabase(name, version) {
  const admin = new pg.Client(poolOptions(DSN));
  await admin.connect();
  await admin.query('SET client_min_messages = warning');
  await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const options = { ...poolOptions(DSN), database: name };
  const setup = new pg.Client(options);
  await setup.connect();
  await setup.query(version ? `CREATE EXTENSION pg_idem VERSION '${version}'` : 'CREATE EXTENSION pg_idem');
  await setup.query('CREATE TABLE effects (k text, generation bigint, note text)');
  await setup.end();
  return options;
}

// pg-pool's end() resolves once it has asked its clients to close, not once
// their sessions are gone. A FORCE that terminates a session still reading its
// Terminate message makes that client emit "terminating connection due to
// administrator command" on a pool with no listener left: an uncaught
// exception, charged to whichever test created the client. So the drop first
// waits (a bounded time) for the database's sessions to end by themselves;
// FORCE is left for what a test really leaked.
async function dropDatabase(name) {
  const admin = new pg.Client(poolOptions(DSN));
  await admin.connect();
  try {
    const until = Date.now() + 30000;
    while (Date.now() < until
      && (await admin.query('SELECT 1 FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()', [name])).rows.length) {
      await new Promise((r) => setTimeout(r, 20));
    }
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  } finally {
    await admin.end();
  }
}

// Resolves once predicate() does; throws after a generous deadline (tests
// wait for states, never a fixed time).
async function waitFor(predicate, what, deadlineMs = 60000) {
  const end = Date.now() + deadlineMs;
  while (!(await predicate())) {
    if (Date.now() > end) throw new Error(`still waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

module.exports = { DSN, createDatabase, dropDatabase, waitFor, skip: DSN ? false : 'PG_IDEM_TEST_DSN is not set' };
