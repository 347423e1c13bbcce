'use strict';
// The HTTP side: status matrix, replay header allowlist and RFC 9457 problem
// details (the C++ client's idem/http.hpp).

const protocol = require('./protocol');
const { describe } = require('./key');

const REPLAY_HEADER = protocol.REPLAYED_HEADER;
const { PROBLEM_BASE, FINALIZE, RELEASE, FAIL, classify } = protocol; // the storage rules: extension/protocol/protocol.toml

// The replay headers are the protocol's (protocol.toml's [replay_headers]).
const { DEFAULT_REPLAY_HEADERS, NEVER_STORED_HEADER_PARTS, ProblemName } = protocol;
const NEVER_STORED = new Set(protocol.NEVER_STORED_HEADERS);

// Headers never stored whatever the configuration (cookies, auth, session tokens).
function isNeverStored(name) {
  const low = String(name).toLowerCase();
  return NEVER_STORED.has(low) || NEVER_STORED_HEADER_PARTS.some((p) => low.includes(p));
}

// Headers as [name, value] pairs, from pairs, an object (arrays as repeats) or a Map.
function headerPairs(headers) {
  if (!headers) return [];
  const entries = Array.isArray(headers) ? headers : headers instanceof Map ? [...headers] : Object.entries(headers);
  const out = [];
  for (const [n, v] of entries) {
    if (v === undefined || v === null) continue;
    if (Array.isArray(v)) for (const x of v) out.push([String(n), String(x)]);
    else out.push([String(n), String(v)]);
  }
  return out;
}

// A handler's answer, normalized: {status, headers: [[n, v]], body: Buffer}.
function makeResponse(status, headers, body) {
  let b = body;
  if (b === undefined || b === null) b = Buffer.alloc(0);
  else if (typeof b === 'string') b = Buffer.from(b, 'utf8');
  else if (!Buffer.isBuffer(b)) b = Buffer.from(b);
  return { status, headers: headerPairs(headers), body: b };
}

function asResponse(value) {
  if (!value || typeof value !== 'object' || !Number.isInteger(value.status)) {
    throw new TypeError('a pg-idem handler returns {status, headers, body}');
  }
  return makeResponse(value.status, value.headers, value.body);
}

// First value of a header, names compared case-insensitively.
function headerValue(response, name) {
  const low = name.toLowerCase();
  const hit = response.headers.find(([n]) => n.toLowerCase() === low);
  return hit ? hit[1] : undefined;
}

class HeaderAllowlist {
  constructor(extra = []) {
    this.names = [...DEFAULT_REPLAY_HEADERS];
    for (const n of extra) {
      const low = n.toLowerCase();
      if (!isNeverStored(low) && !this.names.includes(low)) this.names.push(low);
    }
  }

  allows(name) {
    return !isNeverStored(name) && this.names.includes(String(name).toLowerCase());
  }

  // The allowed headers as a JSON object text with lower-case names; repeats joined with ", ".
  toJson(headers) {
    const out = {};
    for (const [n, v] of headerPairs(headers)) {
      if (!this.allows(n) || v.includes('\u0000')) continue;
      const low = n.toLowerCase();
      out[low] = low in out ? `${out[low]}, ${v}` : v;
    }
    return JSON.stringify(out);
  }
}

// What toJson stored (any JSON object) back to header pairs.
function headersFromJson(text) {
  if (!text) return [];
  let obj;
  try {
    obj = JSON.parse(text);
  } catch {
    return [];
  }
  if (!obj || typeof obj !== 'object' || Array.isArray(obj)) return [];
  return Object.entries(obj).filter(([, v]) => v !== null).map(([k, v]) => [k, typeof v === 'string' ? v : JSON.stringify(v)]);
}

// Retry-After in whole seconds, rounded up, at least 1 (from milliseconds).
function retryAfterSeconds(ms) {
  return Math.max(1, Math.ceil(Math.round(ms) / 1000));
}

// An RFC 9457 problem details response (application/problem+json).
function problem(status, title, detail, type, retryAfterMs) {
  const body = { type: type || 'about:blank', title, status };
  if (detail) body.detail = detail;
  const headers = [['Content-Type', 'application/problem+json']];
  if (retryAfterMs !== undefined && retryAfterMs !== null) headers.push(['Retry-After', String(retryAfterSeconds(retryAfterMs))]);
  return makeResponse(status, headers, JSON.stringify(body));
}

// A profile's name; a deprecated one (protocol.DEPRECATED_PROFILES) is
// taken with a warning, once per process.
const warned = new Set();
function profileOf(name) {
  const old = protocol.DEPRECATED_PROFILES[name];
  if (!old) return name;
  if (!warned.has(name)) {
    warned.add(name);
    process.emitWarning(`pg-idem: profile '${name}' is now '${old.profile}'; the old name goes in ${old.until}`,
      { type: 'DeprecationWarning', code: 'PG_IDEM_PROFILE' });
  }
  return old.profile;
}

// The problem `name` of the protocol (PROBLEMS in ./protocol) in a profile;
// fill: {keyStatus, limit} for its detail, retryMs for its Retry-After.
function protocolProblem(name, profile, { keyStatus, limit, retryMs } = {}) {
  const p = protocol.PROBLEMS[name];
  if (!p) throw new Error(`pg-idem: no problem named '${name}' in the protocol`);
  const status = p.status[profileOf(profile)];
  if (status === undefined) throw new Error(`pg-idem: no profile '${profile}' in the protocol`);
  const detail = p.detail.replace('{key_status}', () => describe(keyStatus)).replace('{limit}', () => String(limit));
  return problem(status, p.title, detail, PROBLEM_BASE + p.slug, p.retryAfter ? retryMs : undefined);
}

// The answers the runner gives instead of running the handler, per profile
// (problems.keyReused(profile), problems.inProgress(profile, retryMs) ...).
const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const problems = Object.freeze({
  ...Object.fromEntries(Object.keys(protocol.PROBLEMS).map((name) => [camel(name),
    (profile, retryMs) => protocolProblem(name, profile, { retryMs })])),
  missingKey: (profile = protocol.DEFAULTS.profile) => protocolProblem(ProblemName.MISSING_KEY, profile,
    { keyStatus: protocol.KeyStatus.ABSENT }),
  invalidKey: (profile, why) => protocolProblem(ProblemName.INVALID_KEY, profile, { keyStatus: why }),
  requestTooLarge: (profile, limit) => protocolProblem(ProblemName.REQUEST_TOO_LARGE, profile, { limit }),
});

module.exports = {
  REPLAY_HEADER, FINALIZE, RELEASE, FAIL, DEFAULT_REPLAY_HEADERS, classify, isNeverStored, headerPairs, makeResponse,
  asResponse, headerValue, HeaderAllowlist, headersFromJson, retryAfterSeconds, problem, problems, protocolProblem,
  profileOf,
};
