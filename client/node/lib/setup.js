'use strict';
// The first-use check: before its first claim a runner makes sure that the
// extension is there, is not older than this client supports, that the
// role may EXECUTE the functions the runner calls and finds them (the
// extension's schema on its search_path, or `schema` set), and that the
// configured lease and cooldown are within the server's idem.max_lease.
// Each misconfiguration is one SetupError saying what to do, instead of
// every request answering 503 with nothing in the log.

// The oldest extension this client runs against: the protocol's, the same
// for the three clients (protocol.toml says why it is that one).
const { OLDEST_EXTENSION } = require('./protocol');

// Every function the runner calls.
const FUNCTIONS = ['idem_begin', 'idem_claim', 'idem_fail', 'idem_finalize', 'idem_lookup', 'idem_release', 'idem_renew'];

class SetupError extends Error {
  constructor(message, fix) {
    super(fix ? `${message}; fix: ${fix}` : message);
    this.name = 'SetupError';
    this.code = 'PG_IDEM_SETUP';
    this.fix = fix;
  }
}

const QUERY = 'SELECT x.extversion AS version, x.nspname AS schema, '
  + "pg_catalog.has_schema_privilege(x.oid, 'USAGE') AS usage, "
  + 'x.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false)) AS on_path, '
  + "pg_catalog.current_setting('search_path') AS search_path, current_user AS role, "
  + "pg_catalog.array_remove(pg_catalog.array_agg(DISTINCT CASE WHEN p.proname OPERATOR(pg_catalog.=) ANY ($1::name[]) AND NOT "
  + "pg_catalog.has_function_privilege(p.oid, 'EXECUTE') THEN p.proname::text END), NULL) AS denied, "
  // max_wait (0.3.0: a fourth argument) and lock_wait (0.6.0: a fifth).
  + "coalesce(bool_or(p.proname OPERATOR(pg_catalog.=) 'idem_claim' AND p.pronargs OPERATOR(pg_catalog.>=) 4), false) AS claim_wait, "
  + "coalesce(bool_or(p.proname OPERATOR(pg_catalog.=) 'idem_begin' AND p.pronargs OPERATOR(pg_catalog.>=) 4), false) AS begin_wait, "
  + "coalesce(bool_or(p.proname OPERATOR(pg_catalog.=) 'idem_claim' AND p.pronargs OPERATOR(pg_catalog.=) 5), false) AS lock_wait, "
  + '(SELECT s.setting || coalesce(s.unit, \'\') FROM pg_catalog.pg_settings s '
  + "WHERE s.name OPERATOR(pg_catalog.=) 'idem.max_lease') AS max_lease, "
  // idem_edition() (0.6.0): 'c' or 'sql'; the SQL edition's plain script
  // has no extension row, and is no router.
  + "coalesce(bool_or(p.proname OPERATOR(pg_catalog.=) 'idem_edition' AND p.pronargs OPERATOR(pg_catalog.=) 0), false) AS has_edition "
  + 'FROM (SELECT e.extversion, e.oid AS ext, n.oid, n.nspname FROM pg_catalog.pg_extension e '
  + 'JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace '
  + "WHERE e.extname OPERATOR(pg_catalog.=) 'pg_idem' "
  // A PL/Proxy router (docs/guides/sharding.md) has no extension: its
  // idem_* functions on the search_path forward to partitions that have it.
  + 'UNION ALL SELECT NULL, NULL, n.oid, n.nspname FROM pg_catalog.pg_proc p '
  + 'JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace '
  + "WHERE p.proname OPERATOR(pg_catalog.=) 'idem_claim' AND pg_catalog.pg_function_is_visible(p.oid) "
  + "AND NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'pg_idem') LIMIT 1) x "
  // The extension's own functions; a router's are those of idem_claim's schema.
  + 'LEFT JOIN pg_catalog.pg_proc p ON p.pronamespace OPERATOR(pg_catalog.=) x.oid AND (x.ext IS NULL OR EXISTS ('
  + "SELECT FROM pg_catalog.pg_depend d WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass "
  + "AND d.refobjid OPERATOR(pg_catalog.=) x.ext AND d.deptype OPERATOR(pg_catalog.=) 'e' "
  + "AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid OPERATOR(pg_catalog.=) p.oid)) "
  + 'GROUP BY x.extversion, x.nspname, x.oid';

const versionParts = (v) => String(v).split('.').map((x) => Number.parseInt(x, 10) || 0);
function olderThan(a, b) {
  const [x, y] = [versionParts(a), versionParts(b)];
  for (let i = 0; i < Math.max(x.length, y.length); i++) if ((x[i] || 0) !== (y[i] || 0)) return (x[i] || 0) < (y[i] || 0);
  return false;
}

// pg_settings' setting and unit ("3600000ms", "60s") in milliseconds.
function settingMs(text) {
  const m = /^(\d+)(ms|s|min|h|d)?$/.exec(text || '');
  if (!m) return undefined;
  return Number(m[1]) * { undefined: 1, ms: 1, s: 1000, min: 60000, h: 3600000, d: 86400000 }[m[2]];
}

// Checks the server for this configuration on a connection; returns
// {version, schema, serverWait: {claim, begin}, lockWait, maxLease, router,
// edition} (edition: 'c' for the library, 'sql' for the SQL edition, null
// through a router) or throws SetupError.
async function checkSetup(client, config) {
  const r = await client.query({ text: QUERY, values: [FUNCTIONS] });
  const row = r.rows[0];
  if (!row) {
    throw new SetupError('the extension pg_idem is not installed in this database (nor is it a PL/Proxy router: no idem_claim on the search_path)',
      'CREATE EXTENSION pg_idem (as its owner; see docs/guides/privileges.md)');
  }
  // No version: a router, whose partitions' versions it does not show
  // (docs/guides/sharding.md), or the SQL edition's plain script (it has
  // idem_edition, and is at least 0.6.0); the rest is checked on its own
  // functions.
  if (row.version !== null && olderThan(row.version, OLDEST_EXTENSION)) {
    throw new SetupError(`the extension pg_idem is version ${row.version}, older than ${OLDEST_EXTENSION}, the oldest this client supports`,
      'ALTER EXTENSION pg_idem UPDATE (docs/guides/upgrading.md)');
  }
  if (config.schema !== undefined && config.schema !== row.schema) {
    throw new SetupError(`the configured schema is "${config.schema}", but pg_idem is installed in schema "${row.schema}"`,
      `set schema: '${row.schema}'`);
  }
  if (!row.usage) {
    throw new SetupError(`role "${row.role}" may not use schema "${row.schema}", where pg_idem is installed`,
      `GRANT idem_client TO "${row.role}" (or GRANT USAGE ON SCHEMA "${row.schema}")`);
  }
  if (row.denied.length) {
    throw new SetupError(`role "${row.role}" may not EXECUTE ${row.denied.join(', ')}`, `GRANT idem_client TO "${row.role}"`);
  }
  if (config.schema === undefined && !row.on_path) {
    throw new SetupError(`pg_idem is installed in schema "${row.schema}", which is not on the search_path of role "${row.role}" `
      + `(search_path: ${row.search_path})`,
    `set schema: '${row.schema}' in the pg-idem config, or ALTER ROLE "${row.role}" SET search_path = "$user", public, "${row.schema}"`);
  }
  const maxLease = settingMs(row.max_lease);
  if (maxLease !== undefined) {
    for (const name of ['lease', 'failureCooldown']) {
      if (config[name] > maxLease) {
        throw new SetupError(`${name} is ${config[name]} ms, over the server's idem.max_lease (${maxLease} ms)`,
          `lower ${name} (milliseconds), or raise idem.max_lease (superuser)`);
      }
    }
  }
  const serverWait = config.serverWait === false ? { claim: false, begin: false }
    : { claim: Boolean(row.claim_wait), begin: Boolean(row.begin_wait) };
  const router = row.version === null && !row.has_edition;
  let edition = router ? null : 'c';
  if (row.has_edition) {
    const e = await client.query(`SELECT "${row.schema.replace(/"/g, '""')}".idem_edition() AS edition`);
    edition = e.rows[0].edition;
  }
  return { version: row.version, schema: row.schema, serverWait, lockWait: Boolean(row.lock_wait), maxLease, router,
    edition };
}

// Fenced and in-transaction modes need the handler's transaction on the
// partition that owns the key: a PL/Proxy router runs each call in a
// transaction of its own there (and has no idem_begin), so through it the
// finalize would commit apart from the handler's writes.
function routerRefusal(mode) {
  return new SetupError(`${mode} mode cannot run through a PL/Proxy router, which runs each call in a transaction `
    + 'of its own on the partition, apart from the handler\'s',
  'use lease mode through the router, or a pool connected to the partition that owns the key '
    + '(the router\'s idem_key_partition() and idem_partition_map() name it; docs/guides/sharding.md)');
}

module.exports = { OLDEST_EXTENSION, FUNCTIONS, SetupError, checkSetup, olderThan, routerRefusal, settingMs };
