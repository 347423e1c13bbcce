'use strict';
// Store errors explained: each cause (SQLSTATE and message) is logged once
// with what to do about it, and every occurrence goes to the onError hook.
// A request answered 503 "idempotency-store-unavailable" has its reason in
// the log instead of nowhere.

const { isPoolExhausted, poolFix } = require('./pool');

const sqlstateOf = (e) => (e && typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code) ? e.code : undefined);

// What to do, by SQLSTATE (or node's error code), for the causes a
// deployment meets first.
const FIXES = {
  42883: 'the pg_idem functions are not found: CREATE EXTENSION pg_idem in this database, and put its schema on the '
    + "role's search_path or set schema in the pg-idem config",
  '3F000': 'the schema set in the pg-idem config does not exist: set it to the schema of CREATE EXTENSION pg_idem',
  42501: 'the role lacks a privilege: GRANT idem_client TO the role (docs/guides/privileges.md)',
  26000: 'a prepared statement vanished: a transaction-mode pooler with named statements; pg-idem uses unnamed ones, '
    + "so check the application's own pg settings (docs/guides/connection-pooling.md)",
  '42P05': 'a prepared statement exists twice: a transaction-mode pooler with named statements (docs/guides/connection-pooling.md)',
  22023: 'a value is out of the server\'s range: keep lease and failureCooldown (milliseconds) within idem.max_lease',
  53300: 'the server has no connection slot left: lower the pool\'s max, or put PgBouncer in front (docs/guides/connection-pooling.md)',
  '57P03': 'the server is starting up or shutting down: retry',
  57014: 'a statement was cancelled (statement_timeout): keep statement_timeout above followerWaitBudget',
  '28P01': 'authentication failed: check the user and password of the connection string',
  '28000': "the server refused the role: check the connection string's user (does the role exist, may it log in?) "
    + 'and pg_hba.conf (allow this user, database and host)',
  '3D000': 'the database does not exist: check the connection string',
  ECONNREFUSED: 'nothing listens at the connection string\'s host and port: is the server (or PgBouncer) running?',
  ENOTFOUND: 'the connection string\'s host name does not resolve',
  PG_IDEM_SETUP: undefined, // a SetupError carries its own fix
};

function fixFor(err) {
  if (err && err.fix) return err.fix;
  if (isPoolExhausted(err)) return poolFix(err); // the server was never asked
  const state = sqlstateOf(err);
  if (state && FIXES[state]) return FIXES[state];
  if (state && state.startsWith('08')) return 'the connection to the server was lost: check the server and the network';
  return err && FIXES[err.code];
}

// One line: what failed, its SQLSTATE, and the fix.
function describeError(err, where) {
  const state = sqlstateOf(err);
  const fix = fixFor(err);
  const message = err && err.message ? err.message : String(err);
  return `pg-idem: ${where}: ${err && err.fix ? message : `${message}${fix ? `; fix: ${fix}` : ''}`}`
    + `${state ? ` (SQLSTATE ${state})` : ''}`;
}

// How many distinct causes are remembered before the memory starts over
// (a cause seen again after that is logged again).
const REMEMBERED_CAUSES = 256;

class Reporter {
  // logger: a function of one line, or an object with error(line); default console.error.
  constructor(logger, onError) {
    if (logger === undefined) this.log = (line) => console.error(line);
    else if (typeof logger === 'function') this.log = logger;
    else if (logger && typeof logger.error === 'function') this.log = (line) => logger.error(line);
    else if (logger === false || logger === null) this.log = () => {};
    else throw new TypeError('logger is a function, an object with error(), or false');
    this.onError = onError;
    this.seen = new Set();
  }

  report(err, where = isPoolExhausted(err) ? 'connection pool exhausted' : 'idempotency store error') {
    const state = sqlstateOf(err);
    if (this.onError) {
      try {
        this.onError(err, { sqlstate: state, fix: fixFor(err), where });
      } catch {
        // a hook that throws must not turn a logged error into a failed request
      }
    }
    const cause = `${state || (err && err.code) || (err && err.name)}|${err && err.message}`;
    if (this.seen.has(cause)) return;
    if (this.seen.size >= REMEMBERED_CAUSES) this.seen.clear();
    this.seen.add(cause);
    try {
      this.log(describeError(err, where));
    } catch {
      // the logger's failure is not the request's
    }
  }
}

module.exports = { Reporter, describeError, fixFor, sqlstateOf };
