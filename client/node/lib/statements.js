'use strict';
// The runner's SQL: unnamed statements only (no `name:`), so that they work
// behind a transaction-mode pooler; set_config(..., true) is local to its
// statement's transaction, so no session state is left behind.

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
  const lt = " FROM (SELECT pg_catalog.set_config('lock_timeout', $1, true) AS lt) s CROSS JOIN LATERAL ";
  const lease = 'CASE WHEN s.lt IS NOT NULL THEN $4::interval END';
  // idem_begin's statements with their arguments in $1..$5 (a bind
  // parameter each) or as literals (sent in one simple-protocol Query with
  // BEGIN: ./runner.js, inTxLoop).
  const begin = (a) => `${cols}, pg_catalog.set_config('lock_timeout', s.old, true) AS restored FROM (SELECT `
    + `pg_catalog.current_setting('lock_timeout') AS old, pg_catalog.set_config('lock_timeout', ${a[0]}, true) AS lt) s `
    + `CROSS JOIN LATERAL ${p}idem_begin(${a[1]}::bytea, ${a[2]}::bytea, CASE WHEN s.lt IS NOT NULL THEN ${a[3]}::interval END`
    + `${a.length > 4 ? `, ${a[4]}::interval` : ''}) r`;
  const params = (n) => Array.from({ length: n }, (_, i) => `$${i + 1}`);
  return {
    // lock_timeout is set before idem_claim runs (the LATERAL reference orders them).
    claim: `${cols}${lt}${p}idem_claim($2::bytea, $3::bytea, ${lease}) r`,
    claimWait: `${cols}${lt}${p}idem_claim($2::bytea, $3::bytea, ${lease}, $5::interval) r`,
    lookup: `${cols} FROM ${p}idem_lookup($1::bytea, $2::bytea) r`,
    // In the caller's transaction: the budget as lock_timeout for idem_begin only.
    begin: begin(params(4)),
    beginWait: begin(params(5)),
    // The same with the values in the text: only hashes and the runner's own
    // interval texts, never the request's or the response's content.
    beginInline: (values) => begin(values.map(literal)),
    renew: `SELECT CASE WHEN s.lt IS NOT NULL THEN ${p}idem_renew($2::bytea, $3::uuid, $4::interval) IS NOT NULL END AS ok`
      + " FROM (SELECT pg_catalog.set_config('lock_timeout', $1, true) AS lt) s",
    // Over the client's cap the server records "completed, not replayable"
    // with idem.max_response_bytes at 0 for this transaction and one byte.
    finalize: `SELECT ${p}idem_finalize($1::bytea, $2::uuid, $3::int4, $4::jsonb, $5::bytea, $6::boolean) AS ok, `
      + "pg_catalog.current_setting('idem.max_response_bytes', true) AS cap FROM (SELECT CASE WHEN $7::boolean THEN "
      + "pg_catalog.set_config('idem.max_response_bytes', '0', true) END AS forced) s",
    release: `SELECT ${p}idem_release($1::bytea, $2::uuid) AS ok`,
    fail: `SELECT ${p}idem_fail($1::bytea, $2::uuid, $3::interval) AS ok`,
    capabilities: "SELECT coalesce(bool_or(p.proname = 'idem_claim' AND p.pronargs = 4), false) AS claim, "
      + "coalesce(bool_or(p.proname = 'idem_begin' AND p.pronargs = 4), false) AS begin "
      + 'FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_depend d ON d.refclassid = \'pg_catalog.pg_extension\'::pg_catalog.regclass '
      + "AND d.refobjid = e.oid AND d.deptype = 'e' AND d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass "
      + "JOIN pg_catalog.pg_proc p ON p.oid = d.objid WHERE e.extname = 'pg_idem'",
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

module.exports = { TYPES, beginText, statements, parseSizeSetting, quoteIdent, literal };
