'use strict';
// The start-up check (runner.ready(), the middleware's ready(), Fastify's
// onReady): protocol.toml [client.startup]. It refuses to start, saying
// what to fix, when the database cannot serve the runner: a role or
// database that does not exist, a refused login, the extension missing or
// too old, a role without EXECUTE or without the schema on its path. A
// server that does not answer yet (nothing listens at the address or
// socket, it is starting up: 57P03, it is full: 53300) may be starting
// beside the service: it is tried again for up to `wait` ms, then the
// start is refused, naming the address. Before, such a role or socket was
// only found by the first requests, each answered 503.

const { STARTUP } = require('./protocol');
const { SetupError } = require('./setup');
const { fixFor } = require('./report');

// Node's codes for a server that did not answer.
const NO_ANSWER = new Set(['ECONNREFUSED', 'ENOENT', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'ECONNRESET',
  'EHOSTUNREACH', 'ENETUNREACH', 'EPIPE']);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

// Whether the error is a server that does not answer (yet), to wait for.
function unanswered(err) {
  const code = err && err.code;
  if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code.startsWith('08') || STARTUP.retrySqlstates.includes(code);
  if (code) return NO_ANSWER.has(code);
  return /Connection terminated|connection timeout/i.test((err && err.message) || '');
}

// Where the pool connects, in words: socket "/run/postgresql/.s.PGSQL.5432", db:5432.
function address(pool) {
  const o = (pool && pool.options) || {};
  let { host, port } = o;
  if (o.connectionString) {
    try {
      const u = new URL(o.connectionString);
      host = decodeURIComponent(u.hostname) || u.searchParams.get('host') || host;
      port = u.port || port;
    } catch {
      // not a URL: node-postgres' defaults below
    }
  }
  host = host || process.env.PGHOST || 'localhost';
  port = port || process.env.PGPORT || 5432;
  return host.startsWith('/') ? `socket "${host}/.s.PGSQL.${port}"` : `${host}:${port}`;
}

async function startUp(runner, wait = STARTUP.waitMs) {
  const end = now() + wait;
  for (let tries = 1; ; tries++) {
    try {
      return await runner.checked();
    } catch (e) {
      if (e instanceof SetupError) throw e;
      if (!unanswered(e)) {
        const err = new SetupError(`the database refused this runner at start-up: ${e.message}`, fixFor(e) || 'see the message');
        err.cause = e;
        throw err;
      }
      const left = end - now();
      if (left <= 0) {
        const err = new SetupError(`no server answered at ${address(runner.pool)} within ${wait} ms at start-up: ${e.message || e.code}`,
          "check the connection string's host and port (or socket directory), and that PostgreSQL (or PgBouncer) runs there");
        err.cause = e;
        throw err;
      }
      if (tries === 1) runner.reporter.log(`pg-idem: waiting up to ${wait} ms for the server at ${address(runner.pool)} at start-up: ${e.message || e.code}`);
      await sleep(Math.min(left, 1000, 50 * 2 ** tries));
    }
  }
}

module.exports = { startUp, unanswered, address };
