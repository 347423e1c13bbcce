'use strict';
// pg-idem: run a handler once per Idempotency-Key with PostgreSQL and pg_idem.
//
//   const { Runner } = require('pg-idem');
//   const runner = new Runner(pool, { lease: 10000, followerWaitBudget: 2000 });
//   const r = await runner.run({ principal, method: 'POST', target, keys: [key], body },
//                              async (claim) => ({ status: 201, headers: { 'content-type': 'application/json' }, body }));

const { Config, ConfigError, DEFAULTS } = require('./lib/config');
const http = require('./lib/http');
const key = require('./lib/key');
const { Runner, ClaimContext } = require('./lib/runner');
const middleware = require('./lib/middleware');
const { poolOptions } = require('./lib/conninfo');
const protocol = require('./lib/protocol');
const { prometheus, EVENTS } = require('./lib/metrics');
const { SetupError, OLDEST_EXTENSION } = require('./lib/setup');
const fingerprint = require('./lib/fingerprint');
const { Inbox, InboxResult } = require('./lib/inbox');
const { Drainer, FINISH_BATCH, ABANDON_REST } = require('./lib/outbox');
const { version } = require('./package.json');

module.exports = {
  Runner,
  ClaimContext,
  Config,
  ConfigError,
  DEFAULTS,
  express: middleware.express,
  fastify: middleware.fastify,
  classify: http.classify,
  FINALIZE: http.FINALIZE,
  RELEASE: http.RELEASE,
  FAIL: http.FAIL,
  REPLAY_HEADER: http.REPLAY_HEADER,
  HeaderAllowlist: http.HeaderAllowlist,
  isNeverStored: http.isNeverStored,
  problem: http.problem,
  problems: http.problems,
  KeyStatus: key.KeyStatus,
  InvalidKeyError: key.InvalidKeyError,
  cacheKey: key.cacheKey,
  requestHash: key.requestHash,
  checkKey: key.checkKey,
  checkKeyHeader: key.checkKeyHeader,
  poolOptions,
  prometheus,
  fingerprint: { json: fingerprint.json, fields: fingerprint.fields, canonicalJson: fingerprint.canonicalJson },
  EVENTS,
  SetupError,
  OLDEST_EXTENSION,
  protocol,
  CLIENT_OUTCOMES: protocol.CLIENT_OUTCOMES,
  Inbox, //          the inbox consumer (./lib/inbox)
  InboxResult,
  InboxOutcome: protocol.InboxOutcome,
  BrokerAction: protocol.BrokerAction,
  Drainer, //        the outbox relay (./lib/outbox)
  FINISH_BATCH,
  ABANDON_REST,
  RELAY_COUNTS: protocol.RELAY_COUNTS,
  version, // the extension's version: the two are released together
};
