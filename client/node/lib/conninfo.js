'use strict';
// libpq keyword/value connection strings ("host=/tmp port=5432 dbname=app")
// as node-postgres options; URLs (postgres://...) go to pg as they are.

const NAMES = { host: 'host', hostaddr: 'host', port: 'port', user: 'user', dbname: 'database', password: 'password',
  application_name: 'application_name', connect_timeout: 'connectionTimeoutMillis', options: 'options' };

// pg.Pool / pg.Client options for a conninfo string; later keywords win, as in libpq.
function poolOptions(conninfo) {
  const s = (conninfo || '').trim();
  if (/^postgres(ql)?:\/\//.test(s)) return { connectionString: s };
  const out = {};
  const re = /(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)/g;
  let m;
  while ((m = re.exec(s)) !== null) {
    let v = m[2];
    if (v.startsWith("'")) v = v.slice(1, -1).replace(/\\(.)/g, '$1');
    const name = NAMES[m[1]];
    if (!name) throw new TypeError(`pg-idem: conninfo keyword "${m[1]}" is not supported here`);
    if (name === 'port') out.port = Number(v);
    else if (name === 'connectionTimeoutMillis') out.connectionTimeoutMillis = Number(v) * 1000;
    else out[name] = v;
  }
  return out;
}

module.exports = { poolOptions };
