'use strict';
// A run's input and output: the request as the runner reads it (and what
// it answers before claiming), the result it answers (RunResult), what a
// handler knows about its claim, and a claim function's row.

const protocol = require('./protocol');
const { ClientOutcome } = require('./protocol');
const { problems, protocolProblem } = require('./http');
const { KeyStatus, cacheKey, checkKeyHeader, requestHash } = require('./key');

// The claim outcomes whose caller runs the handler.
const WON = new Set(Object.values(protocol.OUTCOMES).filter((o) => o.role === 'win').map((o) => o.name));

// What a handler knows about the claim it runs under.
class ClaimContext {
  constructor(generation = 0n, claimId = null, cacheKey = null, keeper = null) {
    this.generation = generation; // BigInt fencing number, strictly increasing per key
    this.claimId = claimId; //       null when the request runs unguarded
    this.cacheKey = cacheKey;
    this._keeper = keeper;
  }

  get guarded() {
    return this.claimId !== null;
  }

  // True once renewal found the claim taken over (its result will not be stored).
  get lost() {
    return Boolean(this._keeper && this._keeper.lost);
  }
}

function normalizeRequest(req) {
  let keys = req.keys;
  if (keys === undefined || keys === null) keys = [];
  else if (!Array.isArray(keys)) keys = [keys];
  let body = req.body;
  if (body === undefined || body === null) body = Buffer.alloc(0);
  else if (typeof body === 'string') body = Buffer.from(body, 'utf8');
  else if (!Buffer.isBuffer(body)) body = Buffer.from(body);
  // fingerprint: what the request hash is taken of (the body unless given).
  const fingerprint = req.fingerprint === undefined || req.fingerprint === null ? body : req.fingerprint;
  return { principal: req.principal ?? '', method: req.method ?? 'POST', target: req.target ?? '/', keys, body, fingerprint,
    keyRequired: Boolean(req.keyRequired) };
}

function result() {
  return { response: null, outcome: ClientOutcome.FAILED, handlerRan: false, replayed: false, leaseStolen: false,
    outcomeUnknown: false, generation: 0n, error: null };
}

// {early: the answer} when the request goes no further; {c: null} to run
// unguarded; {c: the call's state} to claim. noPrincipal() is told of a
// guarded request without a principal, refused (protocol.toml
// [client.missing_principal]): never keyed on "" (one caller's replay to
// another) nor run unguarded (twice).
function prepareRun(raw, config, now, noPrincipal) {
  const req = normalizeRequest(raw);
  const p = config.profile;
  const early = (response, outcome = ClientOutcome.REJECTED) => ({ early: { ...result(), response, outcome } });
  const ks = checkKeyHeader(req.keys);
  if ((ks !== KeyStatus.ABSENT || req.keyRequired) && !req.principal) {
    noPrincipal();
    return early(protocolProblem(protocol.MISSING_PRINCIPAL.problem, p), protocol.MISSING_PRINCIPAL.result);
  }
  if (ks === KeyStatus.ABSENT && req.keyRequired) return early(problems.missingKey(p));
  if (ks !== KeyStatus.ABSENT && ks !== KeyStatus.OK) return early(problems.invalidKey(p, ks));
  if (req.body.length > config.maxRequestBodyBytes) return early(problems.requestTooLarge(p, config.maxRequestBodyBytes));
  if (ks === KeyStatus.ABSENT) return { c: null };
  return {
    c: {
      // The namespace goes where the protocol says (the same key in every client).
      ck: cacheKey(req.principal, req.method, protocol.namespacedTarget(config.namespace, req.target), req.keys[0]),
      rh: requestHash(req.fingerprint),
      deadline: now + config.followerWaitBudget,
      iterations: 0,
      backoff: config.pollMin,
      res: result(),
    },
  };
}

// A row of idem_claim, idem_begin or idem_lookup.
function parseRow(row) {
  if (!row) throw new Error('pg-idem: expected one row from the claim function');
  return {
    outcome: row.outcome || '',
    claimId: row.claim_id,
    generation: row.generation ?? 0n,
    retryAfter: row.retry_ms === null || row.retry_ms === undefined ? null : Number(row.retry_ms),
    status: row.response_status,
    headersJson: row.response_headers,
    body: row.response_body,
    get won() {
      return WON.has(this.outcome);
    },
  };
}

module.exports = { ClaimContext, WON, normalizeRequest, parseRow, prepareRun, result };
