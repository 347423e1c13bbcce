'use strict';
// The runner's configuration, validated when made; every duration is in
// milliseconds (a number). The defaults and limits are the protocol's
// (protocol.toml's [client.defaults] and [client.limits], the same in every
// client). The lease and the cooldown are checked against the server's
// idem.max_lease at first use (./setup).

const { isNeverStored, profileOf } = require('./http');
const protocol = require('./protocol');

const D = protocol.DEFAULTS;
const L = protocol.LIMITS;

class ConfigError extends Error {}

const TOKEN = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/;
const DEFAULTS = Object.freeze({
  lease: D.lease_ms,
  renewInterval: undefined, // lease / D.renew_divisor
  followerWaitBudget: D.follower_wait_budget_ms,
  pollMin: D.poll_min_ms,
  pollMax: D.poll_max_ms,
  pollJitter: D.poll_jitter,
  retryAfter: D.retry_after_ms,
  failureCooldown: D.failure_cooldown_ms,
  maxRequestBodyBytes: D.max_request_body_bytes,
  maxCacheableResponseBytes: D.max_cacheable_response_bytes,
  maxIterations: D.max_iterations,
  transactionAttempts: D.transaction_attempts,
  profile: D.profile, //   'ietf' or 'conflict409' ('seed', 0.5.0's name of conflict409, with a warning)
  replayHeaders: [],
  schema: undefined,
  namespace: undefined, //  a service's name, part of every cache key (before the target, as the protocol says)
  serverWait: undefined, // undefined: followers wait in the server (idem_claim's max_wait); false: poll
  waitSlice: D.wait_slice_ms, // longest server-side wait per statement: a waiting follower hands its connection back between
  // 400 and 422 (validation failures) free the key instead of being stored, as Stripe
  storeClientErrors: D.client_errors === 'store',
  logger: undefined, //     store errors, once per cause: a function of one line, {error(line)}, or false; console.error
  onError: undefined, //    (error, {sqlstate, fix, where}) for every store error
  metrics: undefined, //    {onOutcome(outcome), onEvent(event)}, e.g. require('pg-idem').prometheus()
});

const refuse = (what) => {
  throw new ConfigError(`pg-idem config: ${what}`);
};

class Config {
  constructor(options = {}) {
    if (options instanceof Config) return options;
    for (const k of Object.keys(options)) if (!(k in DEFAULTS)) refuse(`unknown setting "${k}"`);
    const c = { ...DEFAULTS, ...options };
    for (const n of ['lease', 'followerWaitBudget', 'pollMin', 'pollMax', 'retryAfter', 'failureCooldown', 'pollJitter', 'waitSlice']) {
      if (typeof c[n] !== 'number' || !Number.isFinite(c[n])) refuse(`${n} must be a number of milliseconds`);
    }
    if (c.renewInterval === undefined) c.renewInterval = Math.max(1, Math.floor(c.lease / D.renew_divisor));
    for (const n of ['lease', 'renewInterval', 'followerWaitBudget', 'pollMin', 'pollMax', 'retryAfter', 'failureCooldown', 'waitSlice']) {
      if (typeof c[n] !== 'number' || !(c[n] > 0)) refuse(`${n} must be positive (got ${c[n]} ms)`);
    }
    if (c.lease < L.min_lease_ms) refuse(`lease must be at least ${L.min_lease_ms} ms (got ${c.lease} ms)`);
    if (c.lease > L.max_lease_ms) refuse(`lease must be at most ${L.max_lease_ms / 3600000} hours (got ${c.lease} ms)`);
    if (c.renewInterval >= c.lease) refuse(`renewInterval (${c.renewInterval} ms) must be shorter than lease (${c.lease} ms)`);
    if (c.pollMin > c.pollMax) refuse(`pollMin (${c.pollMin} ms) must not exceed pollMax (${c.pollMax} ms)`);
    if (!(c.pollJitter >= 0 && c.pollJitter < 1)) refuse(`pollJitter must be in [0, 1) (got ${c.pollJitter})`);
    for (const n of ['maxRequestBodyBytes', 'maxCacheableResponseBytes', 'maxIterations', 'transactionAttempts']) {
      if (!Number.isInteger(c[n]) || c[n] <= 0) refuse(`${n} must be a positive integer (got ${c[n]})`);
    }
    c.profile = profileOf(c.profile);
    if (!protocol.PROFILES.includes(c.profile)) refuse(`profile must be ${protocol.PROFILES.map((p) => `'${p}'`).join(' or ')} (got ${c.profile})`);
    if (!Array.isArray(c.replayHeaders)) refuse('replayHeaders must be an array of header names');
    c.replayHeaders = c.replayHeaders.map((h) => String(h).toLowerCase());
    for (const h of c.replayHeaders) {
      if (!TOKEN.test(h)) refuse(`replay header "${h}" is not a valid header name`);
      if (isNeverStored(h)) refuse(`replay header "${h}" carries credentials or session state and is never stored`);
    }
    if (c.schema !== undefined && (typeof c.schema !== 'string' || !c.schema || c.schema.includes('\u0000'))) {
      refuse('schema must be a non-empty name without NUL');
    }
    if (c.namespace !== undefined && (typeof c.namespace !== 'string' || !/^[^\s\u0000]+$/.test(c.namespace))) {
      refuse('namespace is a service name without spaces (part of every cache key)');
    }
    if (![undefined, true, false].includes(c.serverWait)) refuse('serverWait must be undefined, true or false');
    if (typeof c.storeClientErrors !== 'boolean') refuse('storeClientErrors must be true or false');
    if (c.onError !== undefined && typeof c.onError !== 'function') refuse('onError must be a function');
    if (![undefined, false, null].includes(c.logger) && typeof c.logger !== 'function' && !(c.logger && typeof c.logger.error === 'function')) {
      refuse('logger must be a function of one line, an object with error(line), or false');
    }
    if (c.metrics !== undefined && (!c.metrics || typeof c.metrics !== 'object')) refuse('metrics must be an object with onOutcome and onEvent');
    Object.assign(this, c);
    Object.freeze(this.replayHeaders);
    Object.freeze(this);
  }
}

module.exports = { Config, ConfigError, DEFAULTS };
