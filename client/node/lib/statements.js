'use strict';
// The runner's SQL: unnamed statements only (no `name:`), so that they work
// behind a transaction-mode pooler. The claims and the renewal pass
// lock_wait, the longest each wait on another transaction's lock on the key
// may last: as an argument where the server takes it (pg_idem 0.6.0; the
// server sets it for the call only), and in `legacy`, for older servers, as
// lock_timeout set with set_config(..., true), local to the statement's
// transaction (idem_begin's sets the caller's value back). No session state
// is left behind either way.

const pg = require('pg');

const quoteIdent = (s) => `"${s.replace(/"/g, '""')}"`;
// node-postgres' own quoting (E'...' with backslashes doubled when there is
// one: right whatever standard_conforming_strings says); pg.escapeLiteral
// is exported from 8.11.3 on, the Client method in every 8.x.
const escapeLiteral = pg.escapeLiteral || ((s) => pg.Client.prototype.escapeLiteral(s));

// A value as an SQL literal of the simple protocol (the statement casts
// it): a Buffer as bytea's hex form (hex digits only), anything else as text.
function literal(v) {
  return escapeLiteral(Buffer.isBuffer(v) ? `\\x${v.toString('hex')}` : String(v));
}

// idem.max_response_bytes as current_setting shows it ("2MB", "1024", "-1").
function parseSizeSetting(text) {
  const m = /^(\d+)(B|kB|MB|GB|TB)?$/.exec(text || '');
  if (!m) return undefined;
  return Number(m[1]) * { undefined: 1, B: 1, kB: 1024, MB: 1024 ** 2, GB: 1024 ** 3, TB: 1024 ** 4 }[m[2]];
}

function statements(schema) {
  const p = schema ? `${quoteIdent(schema)}.` : '';
  const cols = 'SELECT r.outcome, r.claim_id::text, r.generation, ceil(extract(epoch FROM r.retry_after) * 1000)::int8 AS retry_ms, '
    + 'r.response_status, r.response_headers::text, r.response_body';
  // A claim's arguments: (cache key, request hash, lease, [max_wait,]
  // lock_wait) in $1..$5 (a bind parameter each) or as literals (idem_begin,
  // sent in one simple-protocol Query with BEGIN: ./runner.js, inTxLoop),
  // the same in both forms; without a wait, max_wait is NULL.
  const call = (fn, a) => `${cols} FROM ${p}${fn}(${a[0]}::bytea, ${a[1]}::bytea, ${a[2]}::interval, `
    + `${a.length > 4 ? `${a[3]}::interval` : 'NULL::interval'}, ${a[a.length - 1]}::interval) r`;
  const params = (n) => Array.from({ length: n }, (_, i) => `$${i + 1}`);
  const begin = (a) => call('idem_begin', a);
  return {
    legacy: legacyStatements(p, cols, params),
    claim: call('idem_claim', params(4)),
    claimWait: call('idem_claim', params(5)),
    lookup: `${cols} FROM ${p}idem_lookup($1::bytea, $2::bytea) r`,
    // In the caller's transaction: lock_wait holds for idem_begin only.
    begin: begin(params(4)),
    beginWait: begin(params(5)),
    // The same with the values in the text: only hashes and the runner's own
    // interval texts, never the request's or the response's content.
    beginInline: (values) => begin(values.map(literal)),
    // (cache key, claim id, lease, lock_wait)
    renew: `SELECT ${p}idem_renew($1::bytea, $2::uuid, $3::interval, $4::interval) IS NOT NULL AS ok`,
    // Over the client's cap the server records "completed, not replayable"
    // with idem.max_response_bytes at 0 for this transaction and one byte.
    finalize: `SELECT ${p}idem_finalize($1::bytea, $2::uuid, $3::int4, $4::jsonb, $5::bytea, $6::boolean) AS ok, `
      + "pg_catalog.current_setting('idem.max_response_bytes', true) AS cap FROM (SELECT CASE WHEN $7::boolean THEN "
      + "pg_catalog.set_config('idem.max_response_bytes', '0', true) END AS forced) s",
    release: `SELECT ${p}idem_release($1::bytea, $2::uuid) AS ok`,
    fail: `SELECT ${p}idem_fail($1::bytea, $2::uuid, $3::interval) AS ok`,
  };
}

// int8 as BigInt for our own queries only; the application's pg defaults are untouched.
const TYPES = {
  getTypeParser(oid, format) {
    if (oid === 20 && format !== 'binary') return (v) => BigInt(v);
    return pg.types.getTypeParser(oid, format);
  },
};

const ISOLATION = { 'read committed': 'READ COMMITTED', 'repeatable read': 'REPEATABLE READ', serializable: 'SERIALIZABLE' };

// BEGIN, with the isolation level named (only the ones in ISOLATION).
function beginText(isolation) {
  if (!isolation) return 'BEGIN';
  const level = ISOLATION[String(isolation).toLowerCase()];
  if (!level) throw new TypeError(`unknown isolation level ${isolation}`);
  return `BEGIN ISOLATION LEVEL ${level}`;
}

// The claims and the renewal for pg_idem 0.3.0 - 0.5.x, which have no
// lock_wait: the same arguments, lock_wait set as lock_timeout before the
// call runs (the LATERAL reference orders them). It goes when
// OLDEST_EXTENSION reaches 0.6.0.
function legacyStatements(p, cols, params) {
  const lt = (lock) => ` FROM (SELECT pg_catalog.set_config('lock_timeout', ${lock}, true) AS lt) s CROSS JOIN LATERAL `;
  const args = (a) => `(${a[0]}::bytea, ${a[1]}::bytea, CASE WHEN s.lt IS NOT NULL THEN ${a[2]}::interval END`
    + `${a.length > 4 ? `, ${a[3]}::interval` : ''}) r`;
  const claim = (a) => `${cols}${lt(a[a.length - 1])}${p}idem_claim${args(a)}`;
  const begin = (a) => `${cols}, pg_catalog.set_config('lock_timeout', s.old, true) AS restored FROM (SELECT `
    + `pg_catalog.current_setting('lock_timeout') AS old, pg_catalog.set_config('lock_timeout', ${a[a.length - 1]}, true) AS lt) s `
    + `CROSS JOIN LATERAL ${p}idem_begin${args(a)}`;
  return {
    claim: claim(params(4)),
    claimWait: claim(params(5)),
    begin: begin(params(4)),
    beginWait: begin(params(5)),
    beginInline: (values) => begin(values.map(literal)),
    renew: `SELECT CASE WHEN s.lt IS NOT NULL THEN ${p}idem_renew($1::bytea, $2::uuid, $3::interval) IS NOT NULL END AS ok`
      + " FROM (SELECT pg_catalog.set_config('lock_timeout', $4, true) AS lt) s",
  };
}

module.exports = { TYPES, beginText, statements, parseSizeSetting, quoteIdent, literal };
