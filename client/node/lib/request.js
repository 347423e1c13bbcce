'use strict';
// A run's input and output: the request as the runner reads it, the result
// it answers (RunResult), and what a handler knows about its claim.

const { ClientOutcome } = require('./protocol');

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

module.exports = { ClaimContext, normalizeRequest, result };
