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

async function dropDatabase(name) {
  const admin = new pg.Client(poolOptions(DSN));
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin.end();
}

module.exports = { DSN, createDatabase, dropDatabase, skip: DSN ? false : 'PG_IDEM_TEST_DSN is not set' };
