'use strict';
// What of a request the stored key is compared with (the request hash is
// SHA-256 of it): by default the body's bytes; json, the body as canonical
// JSON (keys sorted, no white space), so that {"amount": 5} and
// {"amount":5} are the same request; fields([...]), only the named members
// (dotted paths), as Powertools' JMESPath selection.

// JSON text with object keys sorted at every level and no white space.
function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map((v) => (v === undefined ? 'null' : canonicalJson(v))).join(',')}]`;
  if (value && typeof value === 'object') {
    const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value === undefined ? null : value);
}

function parsed(body) {
  try {
    return { ok: true, value: JSON.parse(Buffer.from(body).toString('utf8')) };
  } catch {
    return { ok: false };
  }
}

// The body as canonical JSON; a body that is not JSON as its bytes.
function json(req, body) {
  const p = parsed(body);
  return p.ok ? canonicalJson(p.value) : body;
}

// Only the named members of a JSON body ('amount', 'payer.id'): a request
// that differs elsewhere is the same request. A body that is not JSON: its bytes.
function fields(names) {
  if (!Array.isArray(names) || names.length === 0 || !names.every((n) => typeof n === 'string' && n)) {
    throw new TypeError('fingerprint.fields takes a non-empty array of member names');
  }
  const paths = names.map((n) => n.split('.'));
  return (req, body) => {
    const p = parsed(body);
    if (!p.ok) return body;
    const picked = {};
    paths.forEach((path, i) => {
      let v = p.value;
      for (const part of path) v = v !== null && typeof v === 'object' ? v[part] : undefined;
      picked[names[i]] = v === undefined ? null : v;
    });
    return canonicalJson(picked);
  };
}

// The middleware's fingerprint option as a function (req, body) -> bytes.
function fingerprintOf(option) {
  if (option === undefined || option === 'body') return null;
  if (option === 'json') return json;
  if (typeof option === 'function') return option;
  throw new TypeError("fingerprint is 'body', 'json', fingerprint.fields([...]) or (req, body) => string | Buffer");
}

module.exports = { canonicalJson, json, fields, fingerprintOf };
