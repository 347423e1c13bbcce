'use strict';
// Express and Fastify middleware: one line makes an app idempotent.
//
//   app.use(idempotency({ pool, principal: (req) => req.get('x-user') }));        // Express
//   fastify.register(fastifyIdempotency, { pool, principal: (req) => req.headers['x-user'] });
//
// Requests with an unsafe method (POST, PATCH by default) and an
// Idempotency-Key run the route once per key; duplicates get the stored
// response with Idempotent-Replayed: true, or an RFC 9457 problem. Requests
// without a key pass through unguarded (or get 400 with keyRequired). The
// response is buffered so that it can be stored.
//
// What the framework answers stays its own: a malformed JSON body is the
// 400 error express.json() raises (before any claim). A guarded request
// without a principal is answered 401 principal-missing, as by the Python
// and C++ clients (protocol.toml [client.missing_principal]): never keyed
// on the principal "" shared by every caller, never run unguarded.
//
// Start-up: `await middleware.ready()` (Express) before listening, or
// Fastify's own ready()/listen() (an onReady hook), refuses to start on a
// store the runner cannot use (./startup).

const { Readable } = require('node:stream');
const pg = require('pg');
const { Runner } = require('./runner');
const { Config } = require('./config');
const { poolOptions } = require('./conninfo');
const { fingerprintOf } = require('./fingerprint');

// The pool the middleware opens for a connectionString: bounded (node-postgres'
// own default, said here), so a storm of duplicates cannot take every
// server connection.
const DEFAULT_POOL_MAX = 10;

const CLAIM = Symbol.for('pg-idem.claim');

// logger, onError, metrics and namespace may be given beside config, as options of the middleware.
const HOOKS = ['logger', 'onError', 'metrics', 'namespace'];

function configOf(opts) {
  const hooks = Object.fromEntries(HOOKS.filter((h) => opts[h] !== undefined).map((h) => [h, opts[h]]));
  if (Object.keys(hooks).length === 0) return opts.config;
  if (opts.config instanceof Config || opts.runner) throw new TypeError(`pg-idem: give ${HOOKS.join(', ')} in config then`);
  return { ...(opts.config || {}), ...hooks };
}

function runnerOf(opts) {
  if (opts.runner) return opts.runner;
  if (opts.pool) return new Runner(opts.pool, configOf(opts));
  if (opts.connectionString) {
    return new Runner(new pg.Pool({ max: DEFAULT_POOL_MAX, ...poolOptions(opts.connectionString) }), configOf(opts));
  }
  throw new TypeError('pg-idem middleware needs runner, pool or connectionString');
}

function settings(opts) {
  const mode = opts.mode || 'lease';
  if (typeof opts.principal !== 'function') {
    // Without it one user's key would replay another user's response.
    throw new TypeError("pg-idem middleware needs principal: (req) => the authenticated actor, part of the key "
      + "(() => 'service' for a service without users)");
  }
  if (!['lease', 'fenced', 'in_transaction'].includes(mode)) throw new TypeError("mode must be 'lease', 'fenced' or 'in_transaction'");
  return {
    runner: runnerOf(opts),
    mode,
    principal: opts.principal,
    startupWait: opts.startupWait,
    methods: new Set((opts.methods || ['POST', 'PATCH']).map((m) => m.toUpperCase())),
    keyRequired: Boolean(opts.keyRequired),
    fingerprint: fingerprintOf(opts.fingerprint),
  };
}

// The principal of a request: undefined, null or '' is none, which the
// runner refuses for a guarded request (401 principal-missing).
function principalOf(s, req) {
  const p = s.principal(req);
  return p === undefined || p === null ? '' : String(p);
}

// The SyntaxError express.json() (body-parser) raises for a body it cannot
// parse, so that the application's error handler answers what it answers
// without this middleware: 400, err.type 'entity.parse.failed'. Strict, as
// express.json(): only an object or an array at the top.
function jsonBody(text) {
  const first = text.replace(/^[\x20\x09\x0a\x0d]+/, '')[0];
  try {
    if (first !== undefined && first !== '{' && first !== '[') throw new SyntaxError(`Unexpected token ${first} in JSON at position 0`);
    return text.length ? JSON.parse(text) : {};
  } catch (e) {
    const err = new SyntaxError(e.message);
    err.status = err.statusCode = 400; // eslint-disable-line no-multi-assign
    err.expose = true;
    err.type = 'entity.parse.failed';
    err.body = text;
    throw err;
  }
}

// Every Idempotency-Key field as received (repeats kept apart), as the
// bytes on the wire (Node decodes header bytes as latin-1).
function keyFields(rawHeaders) {
  const out = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i].toLowerCase() === 'idempotency-key') out.push(Buffer.from(rawHeaders[i + 1], 'latin1'));
  }
  return out;
}

function readBody(stream, limit) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    stream.on('data', (chunk) => {
      size += chunk.length;
      if (size <= limit + 1) chunks.push(chunk);
    });
    stream.on('end', () => resolve(Buffer.concat(chunks)));
    stream.on('error', reject);
  });
}

// Runs the request under the runner in the configured mode.
function runUnder(s, view, route) {
  if (s.mode === 'lease') return s.runner.run(view, (claim) => route(claim, null));
  const h = (client, claim) => route(claim, client);
  return s.mode === 'fenced' ? s.runner.runFenced(view, h) : s.runner.runInTransaction(view, h);
}

// ---- Express -------------------------------------------------------------------

function express(opts = {}) {
  const s = settings(opts);
  function pgIdempotency(req, res, next) {
    if (!s.methods.has(req.method.toUpperCase())) return next();
    const keys = keyFields(req.rawHeaders);
    if (keys.length === 0 && !s.keyRequired) return next();
    (async () => {
      const principal = principalOf(s, req);
      let body;
      if (Buffer.isBuffer(req.rawBody)) body = req.rawBody;
      else if (req.readableEnded) body = Buffer.from(req.body === undefined ? '' : JSON.stringify(req.body));
      else {
        body = await readBody(req, s.runner.config.maxRequestBodyBytes);
        req.rawBody = body;
        // The stream is consumed: parse JSON here and tell body-parser it is done.
        req.body = /json/i.test(req.headers['content-type'] || '') ? jsonBody(body.toString('utf8')) : body;
        req._body = true; // eslint-disable-line no-underscore-dangle
      }
      const view = { principal, method: req.method.toUpperCase(), target: req.originalUrl, keys, body,
        fingerprint: s.fingerprint ? s.fingerprint(req, body) : undefined, keyRequired: s.keyRequired };
      const orig = { writeHead: res.writeHead, write: res.write, end: res.end };
      let own = null;
      const result = await runUnder(s, view, (claim, client) => new Promise((resolve) => {
        req.idempotency = claim;
        req[CLAIM] = claim;
        if (client) req.idempotencyClient = client;
        const chunks = [];
        const toBuf = (chunk, enc) => (Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof enc === 'string' ? enc : 'utf8'));
        res.writeHead = function writeHead(status, reason, headers) {
          res.statusCode = status;
          const h = typeof reason === 'object' ? reason : headers;
          if (h) for (const [n, v] of Array.isArray(h) ? h : Object.entries(h)) res.setHeader(n, v);
          return res;
        };
        res.write = function write(chunk, enc, cb) {
          if (chunk) chunks.push(toBuf(chunk, enc));
          if (typeof enc === 'function') enc();
          else if (typeof cb === 'function') cb();
          return true;
        };
        res.end = function end(chunk, enc, cb) {
          if (chunk && typeof chunk !== 'function') chunks.push(toBuf(chunk, enc));
          Object.assign(res, orig);
          const headers = [];
          for (const [n, v] of Object.entries(res.getHeaders())) {
            if (Array.isArray(v)) for (const x of v) headers.push([n, String(x)]);
            else headers.push([n, String(v)]);
          }
          own = { status: res.statusCode, headers, body: Buffer.concat(chunks) };
          resolve(own);
          return res;
        };
        next();
      }));
      Object.assign(res, orig);
      const r = result.response;
      if (!own || r.body !== own.body) {
        // Not the route's own response (a replay, a problem): only its headers.
        for (const n of res.getHeaderNames()) res.removeHeader(n);
        for (const [n, v] of r.headers) res.setHeader(n, v);
        res.statusCode = r.status;
      }
      res.setHeader('Content-Length', r.body.length);
      res.end(r.body);
    })().catch(next);
    return undefined;
  }
  // await middleware.ready() at start-up to refuse to start on a store the runner cannot use.
  pgIdempotency.ready = () => s.runner.ready({ wait: s.startupWait });
  pgIdempotency.runner = s.runner;
  return pgIdempotency;
}

// ---- Fastify ---------------------------------------------------------------------

function fastify(instance, opts, done) {
  const s = settings(opts);
  const guarded = (request) => s.methods.has(request.method.toUpperCase())
    && (s.keyRequired || keyFields(request.raw.rawHeaders).length > 0);

  // fastify.ready() and listen() fail on a store the runner cannot use.
  instance.addHook('onReady', async () => {
    await s.runner.ready({ wait: s.startupWait });
  });

  // Keep the raw body for the request hash, and give Fastify the same bytes.
  instance.addHook('preParsing', async (request, reply, payload) => {
    if (!guarded(request)) return payload;
    const body = await readBody(payload, s.runner.config.maxRequestBodyBytes);
    request.rawBody = body;
    const again = Readable.from([body]);
    again.receivedEncodedLength = body.length;
    return again;
  });

  instance.addHook('preHandler', async (request, reply) => {
    if (!guarded(request)) return undefined;
    const body = request.rawBody || Buffer.alloc(0);
    const view = { principal: principalOf(s, request), method: request.method.toUpperCase(), target: request.raw.url,
      keys: keyFields(request.raw.rawHeaders), body, fingerprint: s.fingerprint ? s.fingerprint(request, body) : undefined,
      keyRequired: s.keyRequired };
    let proceed;
    const started = new Promise((r) => { proceed = r; });
    const state = { done: false };
    state.responded = new Promise((resolve) => { state.finish = resolve; });
    request[CLAIM] = state;
    state.run = runUnder(s, view, (claim, client) => {
      request.idempotency = claim;
      if (client) request.idempotencyClient = client;
      proceed('run');
      return state.responded;
    });
    const first = await Promise.race([started, state.run]);
    if (first === 'run') return undefined; // the route runs; onSend stores its answer
    state.done = true;
    const r = first.response;
    reply.code(r.status);
    for (const [n, v] of r.headers) reply.header(n, v);
    return reply.send(r.body);
  });

  instance.addHook('onSend', async (request, reply, payload) => {
    const state = request[CLAIM];
    if (!state || state.done) return payload;
    state.done = true;
    let body = payload;
    if (body === null || body === undefined) body = Buffer.alloc(0);
    else if (typeof body === 'string') body = Buffer.from(body, 'utf8');
    else if (!Buffer.isBuffer(body)) body = await readBody(body, Infinity); // a stream
    const headers = [];
    for (const [n, v] of Object.entries(reply.getHeaders())) {
      if (Array.isArray(v)) for (const x of v) headers.push([n, String(x)]);
      else headers.push([n, String(v)]);
    }
    const own = { status: reply.statusCode, headers, body };
    state.finish(own);
    const result = await state.run;
    const r = result.response;
    if (r.body === own.body) return body;
    for (const n of Object.keys(reply.getHeaders())) reply.removeHeader(n);
    reply.code(r.status);
    for (const [n, v] of r.headers) reply.header(n, v);
    return r.body;
  });
  done();
}
fastify[Symbol.for('skip-override')] = true; // what fastify-plugin does: apply to the whole app
fastify[Symbol.for('fastify.display-name')] = 'pg-idem';

module.exports = { express, fastify, keyFields, CLAIM, DEFAULT_POOL_MAX };
