'use strict';
// The runner's configuration, validated when made; every duration is in
// milliseconds (a number), the C++ client's defaults. The lease and the
// cooldown are checked against the server's idem.max_lease at first use
// (./setup).

const { isNeverStored } = require('./http');

class ConfigError extends Error {}

const TOKEN = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/;
const DEFAULTS = Object.freeze({
  lease: 30000,
  renewInterval: undefined, // lease / 3
  followerWaitBudget: 5000,
  pollMin: 50,
  pollMax: 1000,
  pollJitter: 0.25,
  retryAfter: 1000,
  failureCooldown: 2000,
  maxRequestBodyBytes: 1024 * 1024,
  maxCacheableResponseBytes: 2 * 1024 * 1024,
  maxIterations: 100,
  transactionAttempts: 3,
  profile: 'ietf',
  replayHeaders: [],
  schema: undefined,
  serverWait: undefined, // undefined: use idem_claim(..., max_wait) when the server has it; false: poll
  waitSlice: 100, //        longest server-side wait per statement: a waiting follower hands its connection back between
  storeClientErrors: false, // 400 and 422 (validation failures) free the key instead of being stored, as Stripe
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
    if (c.renewInterval === undefined) c.renewInterval = Math.max(1, Math.floor(c.lease / 3));
    for (const n of ['lease', 'renewInterval', 'followerWaitBudget', 'pollMin', 'pollMax', 'retryAfter', 'failureCooldown', 'waitSlice']) {
      if (typeof c[n] !== 'number' || !(c[n] > 0)) refuse(`${n} must be positive (got ${c[n]} ms)`);
    }
    if (c.lease < 10) refuse(`lease must be at least 10 ms (got ${c.lease} ms)`);
    if (c.lease > 24 * 3600 * 1000) refuse(`lease must be at most 24 hours (got ${c.lease} ms)`);
    if (c.renewInterval >= c.lease) refuse(`renewInterval (${c.renewInterval} ms) must be shorter than lease (${c.lease} ms)`);
    if (c.pollMin > c.pollMax) refuse(`pollMin (${c.pollMin} ms) must not exceed pollMax (${c.pollMax} ms)`);
    if (!(c.pollJitter >= 0 && c.pollJitter < 1)) refuse(`pollJitter must be in [0, 1) (got ${c.pollJitter})`);
    for (const n of ['maxRequestBodyBytes', 'maxCacheableResponseBytes', 'maxIterations', 'transactionAttempts']) {
      if (!Number.isInteger(c[n]) || c[n] <= 0) refuse(`${n} must be a positive integer (got ${c[n]})`);
    }
    if (c.profile !== 'ietf' && c.profile !== 'seed') refuse(`profile must be 'ietf' or 'seed' (got ${c.profile})`);
    if (!Array.isArray(c.replayHeaders)) refuse('replayHeaders must be an array of header names');
    c.replayHeaders = c.replayHeaders.map((h) => String(h).toLowerCase());
    for (const h of c.replayHeaders) {
      if (!TOKEN.test(h)) refuse(`replay header "${h}" is not a valid header name`);
      if (isNeverStored(h)) refuse(`replay header "${h}" carries credentials or session state and is never stored`);
    }
    if (c.schema !== undefined && (typeof c.schema !== 'string' || !c.schema || c.schema.includes('\u0000'))) {
      refuse('schema must be a non-empty name without NUL');
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
