'use strict';
// What the inbox consumer (./inbox) and the outbox relay (./outbox) share:
// their settings' checks, the schema-qualified names, the error texts they
// record, pooled clients that survive their backend dying, and how a lost
// connection is told from an error.

const pg = require('pg');
const { poolOptions } = require('./conninfo');
const { ConfigError } = require('./config');
const { quoteIdent } = require('./statements');

const sqlstate = (e) => (e && typeof e.code === 'string' ? e.code : undefined);
// Serialization failure and deadlock: the statement may succeed if run again.
const transient = (e) => ['40001', '40P01'].includes(sqlstate(e));
// The connection is gone: no SQLSTATE (the socket died), class 08, or the
// server ending the session (57P01 terminated, 57P02 crash, 57P03 starting up).
const connectionLost = (e) => !sqlstate(e) || /^(08|57P0)/.test(sqlstate(e));
const QUERY_CANCELED = '57014';

const qualified = (schema, name) => (schema ? `${quoteIdent(schema)}.${name}` : name);

function poolOf(source) {
  if (typeof source === 'string') return new pg.Pool(poolOptions(source));
  if (!source || typeof source.connect !== 'function') throw new TypeError('pass a pg.Pool (or a connection string)');
  return source;
}

// An integer setting within [low, high], or a ConfigError naming it.
function integer(owner, name, value, low, high) {
  if (!Number.isInteger(value) || value < low || value > high) {
    throw new ConfigError(`${owner}: ${name} must be an integer between ${low} and ${high}`);
  }
  return value;
}

// The text idem_inbox_fail / idem_outbox_nack records for an error: its
// message (or its name), without NUL, at most maxBytes of UTF-8 cut on a
// character boundary (lone surrogates become U+FFFD).
function errorText(error, maxBytes) {
  let text = typeof error === 'string' ? error : (error && (error.message || error.name)) || String(error);
  text = text.replace(/\0/g, ' ');
  const bytes = Buffer.from(text.toWellFormed ? text.toWellFormed() : text, 'utf8');
  if (bytes.length <= maxBytes) return bytes.toString('utf8');
  let end = maxBytes;
  while (end > 0 && (bytes[end] & 0xc0) === 0x80) end--; // not inside a character
  return bytes.subarray(0, end).toString('utf8');
}

// A pooled client with an 'error' listener while we hold it: a backend
// that dies while the client is checked out and idle emits 'error', which
// would otherwise be an uncaught exception.
async function checkout(pool) {
  const client = await pool.connect();
  const onError = () => { client.idemBroken = true; };
  client.on('error', onError);
  client.idemOnError = onError;
  return client;
}

// Gives the client back; one that is broken, or that an interrupted
// protocol left inside a transaction (a ROLLBACK there would leave an
// inbox attempt to the session, unrecorded), is destroyed, not reused.
function giveBack(client, destroy) {
  client.removeListener('error', client.idemOnError);
  const gone = destroy || client.idemBroken;
  delete client.idemOnError;
  delete client.idemBroken;
  client.release(gone ? true : undefined);
}

module.exports = {
  sqlstate, transient, connectionLost, QUERY_CANCELED, qualified, poolOf, integer, errorText, checkout, giveBack,
};
