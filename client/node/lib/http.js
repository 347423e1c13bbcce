'use strict';
// The HTTP side: status matrix, replay header allowlist and RFC 9457 problem
// details (the C++ client's idem/http.hpp).

const { KeyStatus, describe } = require('./key');

const REPLAY_HEADER = 'Idempotent-Replayed';
const PROBLEM_BASE = 'urn:pg-idem:problem:';
const FINALIZE = 'finalize'; // 2xx, 400, 404, 409, 422: stored and replayed
const RELEASE = 'release'; //   1xx, 3xx, 401, 403, other 4xx: not stored, key free at once
const FAIL = 'fail'; //         5xx, 408, 429: not stored, key in cooldown

const DEFAULT_REPLAY_HEADERS = ['content-type', 'content-disposition', 'content-language', 'cache-control', 'etag', 'location'];
const NEVER_STORED = new Set(['set-cookie', 'set-cookie2', 'cookie', 'authorization', 'proxy-authorization',
  'www-authenticate', 'proxy-authenticate', 'x-api-key', 'x-csrf-token', 'x-xsrf-token']);
const NEVER_STORED_PARTS = ['cookie', 'session', 'token', 'authoriz', 'authenticat'];

// What the winner does with its handler's response.
function classify(status) {
  if ((status >= 200 && status <= 299) || [400, 404, 409, 422].includes(status)) return FINALIZE;
  if (status === 408 || status === 429 || (status >= 500 && status <= 599)) return FAIL;
  if (status >= 100 && status <= 499) return RELEASE;
  return FAIL; // not an HTTP status: treat as a server error
}

// Headers never stored whatever the configuration (cookies, auth, session tokens).
function isNeverStored(name) {
  const low = String(name).toLowerCase();
  return NEVER_STORED.has(low) || NEVER_STORED_PARTS.some((p) => low.includes(p));
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

const make = (status, slug, title, detail, retry) => problem(status, title, detail, PROBLEM_BASE + slug, retry);

// The answers the runner gives instead of running the handler, per profile.
const problems = {
  missingKey: () => make(400, 'idempotency-key-missing', 'Idempotency-Key header is missing', describe(KeyStatus.ABSENT)),
  invalidKey: (profile, why) => make(400, 'idempotency-key-invalid', 'Idempotency-Key header is invalid', describe(why)),
  keyReused: (profile) => make(profile === 'ietf' ? 422 : 409, 'idempotency-key-reused',
    'Idempotency-Key is already used for a different request',
    'This key was used with another request body. Use a new key for a new request.'),
  inProgress: (profile, retryMs) => make(profile === 'ietf' ? 409 : 503, 'request-in-progress',
    'A request with this Idempotency-Key is being processed',
    'Retry after the delay in Retry-After to get its response.', retryMs),
  cooldown: (profile, retryMs) => make(503, 'request-failed-recently', 'The last attempt with this Idempotency-Key failed',
    'Retry after the delay in Retry-After.', retryMs),
  notReplayable: () => make(409, 'response-not-replayable', 'The request was completed but its response cannot be replayed',
    'The response was too large to store. Use a new key to repeat the request.'),
  expired: () => make(410, 'idempotency-key-expired', 'This Idempotency-Key has expired',
    'The request was completed too long ago for its response to be kept. Use a new key to repeat the request.'),
  requestTooLarge: (profile, limit) => make(413, 'request-too-large', 'Request body too large',
    `The request body is over ${limit} bytes.`),
  storeUnavailable: (profile, retryMs) => make(503, 'idempotency-store-unavailable', 'Idempotency store unavailable',
    'The request was not run. Retry after the delay in Retry-After.', retryMs),
  outcomeUnknown: (profile, retryMs) => make(503, 'outcome-unknown', 'The outcome of this request is not known yet',
    'Retry with the same Idempotency-Key: the request will not be run twice.', retryMs),
};

module.exports = {
  REPLAY_HEADER, FINALIZE, RELEASE, FAIL, DEFAULT_REPLAY_HEADERS, classify, isNeverStored, headerPairs, makeResponse,
  asResponse, headerValue, HeaderAllowlist, headersFromJson, retryAfterSeconds, problem, problems,
};
