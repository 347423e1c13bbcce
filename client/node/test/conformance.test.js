'use strict';
// The conformance file every client's suite runs (client/conformance/protocol.json,
// generated from extension/protocol/protocol.toml): each claim outcome in
// each profile gives the same action, status, problem type, Retry-After and
// client outcome as in the C++ and Python clients; the storage rules, the
// cache-key and request-hash vectors and the key-status sentences too; the
// defaults and limits, the namespace's place in the key, the replay headers,
// the metrics' series and events and the profiles' names. No database: the
// runner's decision is fed the server's row.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const idem = require('..');
const { Runner } = idem;

const CONFORMANCE = path.join(__dirname, '..', '..', 'conformance', 'protocol.json');
const spec = JSON.parse(fs.readFileSync(CONFORMANCE, 'utf8'));
const header = (response, name) => (response.headers.find(([n]) => n.toLowerCase() === name.toLowerCase()) || [])[1];

// A runner that never connects: only its decision on a row is used.
const runnerFor = (profile) => new Runner({ connect() { throw new Error('no database in this test'); } }, { profile });
const row = (outcome) => ({ outcome, claimId: null, generation: 1n, retryAfter: 1500, status: 201,
  headersJson: '{"content-type":"application/json"}', body: Buffer.from('{"id":1}'),
  get won() { return Runner.WON.has(outcome); } });
const freshCall = () => ({ res: { response: null, outcome: 'failed', replayed: false } });

test('the conformance file covers every outcome in every profile', () => {
  const seen = new Set(spec.outcomes.map((o) => `${o.outcome}/${o.profile}`));
  assert.ok(spec.outcomes.length >= 20, 'the conformance file has the outcomes');
  for (const o of spec.outcomes) for (const p of spec.profiles) assert.ok(seen.has(`${o.outcome}/${p}`), `${o.outcome}/${p}`);
});

for (const o of spec.outcomes) {
  test(`outcome ${o.outcome} in profile ${o.profile}: ${o.action}${o.status ? ` ${o.status}` : ''}`, () => {
    const runner = runnerFor(o.profile);
    if (o.action === 'run') {
      assert.ok(Runner.WON.has(o.outcome), 'a winning outcome runs the handler');
      assert.equal(o.result, 'won_completed');
      return;
    }
    assert.ok(!Runner.WON.has(o.outcome));
    const c = freshCall();
    const decided = runner.onRow(c, row(o.outcome));
    if (o.action === 'claim' || o.action === 'wait') {
      assert.equal(decided, o.action);
      if (o.action === 'claim') return;
      // A follower that waited past its budget gets the outcome's problem.
      runner.timedOut(c);
    } else assert.equal(typeof decided, 'object', 'answered at once');
    assert.equal(c.res.outcome, o.result, 'client outcome');
    assert.ok(idem.CLIENT_OUTCOMES.includes(c.res.outcome));
    const r = c.res.response;
    if (o.action === 'replay') {
      assert.equal(r.status, 201);
      assert.equal(header(r, 'Idempotent-Replayed'), 'true');
      assert.equal(r.body.toString(), '{"id":1}');
      return;
    }
    assert.equal(r.status, o.status, 'status');
    assert.equal(header(r, 'Content-Type'), 'application/problem+json');
    const body = JSON.parse(r.body.toString());
    assert.equal(body.type, o.type, 'problem type');
    assert.equal(body.status, o.status);
    assert.equal(header(r, 'Retry-After') !== undefined, o.retry_after, 'Retry-After');
  });
}

test('storage rules: what the winner does with each status', () => {
  for (const { status, action } of spec.storage) assert.equal(idem.classify(status), action, `status ${status}`);
});

test('cache-key vectors shared by the three clients and the server', () => {
  assert.ok(spec.key_vectors.length > 0);
  for (const v of spec.key_vectors) {
    assert.equal(idem.cacheKey(v.principal, v.method, v.target, v.key).toString('hex'), v.cache_key, JSON.stringify(v).slice(0, 80));
  }
});

test('request-hash vectors', () => {
  for (const v of spec.request_hash_vectors) assert.equal(idem.requestHash(v.body).toString('hex'), v.request_hash);
});

test('the oldest extension and the validation statuses are the protocol\'s, as in the other clients', () => {
  assert.equal(idem.OLDEST_EXTENSION, spec.client.oldest_extension);
  assert.ok(spec.client.validation_statuses.length > 0);
  const released = runnerFor('ietf');
  const stored = new Runner({ connect() { throw new Error('no database in this test'); } }, { storeClientErrors: true });
  for (const s of spec.client.validation_statuses) {
    assert.equal(idem.classify(s), 'finalize', `the rules store ${s}`);
    assert.equal(released.storage(s), 'release', `released by default: ${s}`);
    assert.equal(stored.storage(s), 'finalize', `stored with storeClientErrors: ${s}`);
  }
  assert.equal(released.storage(404), 'finalize', 'only those');
});

test('key-status sentences are the protocol\'s', () => {
  for (const [status, sentence] of Object.entries(spec.key_statuses)) {
    assert.ok(Object.values(idem.KeyStatus).includes(status), status);
    if (status === 'ok') continue;
    const p = status === 'absent' ? idem.problems.missingKey('ietf') : idem.problems.invalidKey('ietf', status);
    assert.equal(JSON.parse(p.body.toString()).detail, sentence);
  }
});

test('the defaults and limits are the protocol\'s (milliseconds)', () => {
  const d = spec.client.defaults;
  const lim = spec.client.limits;
  const c = new idem.Config();
  const same = {
    lease: d.lease_ms, followerWaitBudget: d.follower_wait_budget_ms, pollMin: d.poll_min_ms, pollMax: d.poll_max_ms,
    pollJitter: d.poll_jitter, retryAfter: d.retry_after_ms, failureCooldown: d.failure_cooldown_ms,
    maxRequestBodyBytes: d.max_request_body_bytes, maxCacheableResponseBytes: d.max_cacheable_response_bytes,
    maxIterations: d.max_iterations, transactionAttempts: d.transaction_attempts, profile: d.profile,
    waitSlice: d.wait_slice_ms, storeClientErrors: d.client_errors === 'store',
  };
  for (const [name, value] of Object.entries(same)) assert.equal(c[name], value, name);
  assert.equal(c.renewInterval, Math.floor(c.lease / d.renew_divisor));
  assert.equal(new idem.Config({ lease: lim.min_lease_ms }).lease, lim.min_lease_ms);
  for (const lease of [lim.min_lease_ms - 1, lim.max_lease_ms + 1]) {
    assert.throws(() => new idem.Config({ lease }), /lease/, String(lease));
  }
  assert.deepEqual([...lim.client_errors].sort(), ['release', 'store'], 'storeClientErrors: false or true');
});

test('the profiles, and their old names with a warning', async () => {
  assert.deepEqual([...idem.protocol.PROFILES], spec.profiles);
  for (const p of spec.profiles) assert.equal(new idem.Config({ profile: p }).profile, p);
  for (const [old, now] of Object.entries(spec.deprecated_profiles)) {
    const warned = new Promise((resolve) => { process.once('warning', resolve); });
    assert.equal(new idem.Config({ profile: old }).profile, now.profile);
    const w = await warned;
    assert.equal(w.name, 'DeprecationWarning');
    assert.match(w.message, new RegExp(`'${old}' is now '${now.profile}'.*${now.until}`));
    assert.equal(idem.problems.keyReused(old).status, idem.problems.keyReused(now.profile).status);
  }
});

test('the namespace goes where the protocol says', () => {
  for (const v of spec.namespace_vectors) {
    const runner = new Runner({ connect() { throw new Error('no database in this test'); } },
      v.namespace === null ? {} : { namespace: v.namespace });
    const { c } = runner.prepare({ principal: v.principal, method: v.method, target: v.target, keys: [v.key], body: '{}' });
    assert.equal(c.ck.toString('hex'), v.cache_key, String(v.namespace));
    assert.equal(idem.protocol.namespacedTarget(v.namespace, v.target), v.namespaced_target);
  }
});

test('the replay headers', () => {
  const rh = spec.replay_headers;
  assert.equal(idem.REPLAY_HEADER, rh.replayed_header);
  const byDefault = new idem.HeaderAllowlist();
  for (const v of rh.vectors) {
    assert.equal(byDefault.allows(v.name), v.by_default, v.name);
    assert.equal(new idem.HeaderAllowlist([v.name]).allows(v.name), v.when_configured, v.name);
    assert.equal(idem.isNeverStored(v.name), !v.when_configured, v.name);
    if (!v.when_configured) assert.throws(() => new idem.Config({ replayHeaders: [v.name] }), /never stored/, v.name);
  }
});

test('the metrics\' series and events', async () => {
  assert.deepEqual([...idem.EVENTS], spec.events);
  let promClient;
  try {
    promClient = require('prom-client'); // eslint-disable-line global-require
  } catch {
    return; // the production suite counts with it; here the names are checked without it
  }
  const registry = new promClient.Registry();
  idem.prometheus({ registry, promClient });
  const metrics = await registry.getMetricsAsJSON();
  for (const [kind, values] of [['requests', idem.CLIENT_OUTCOMES], ['events', spec.events]]) {
    const series = spec.metrics[kind];
    const m = metrics.find((x) => x.name === `${series.name}_total`);
    assert.ok(m, series.name);
    assert.equal(m.help, series.help);
    assert.deepEqual(new Set(m.values.map((x) => x.labels[series.label])), new Set(values), kind);
  }
});

test('inbox answers, results and broker actions; nack outcomes and relay counts', () => {
  const { InboxResult } = require('../lib/inbox'); // eslint-disable-line global-require
  const { emptyReport } = require('../lib/outbox'); // eslint-disable-line global-require
  const { protocol } = idem;
  const m = spec.messaging;
  for (const a of m.inbox_answers) assert.equal(protocol.INBOX_RESULT_OF[a.name], a.result);
  for (const r of m.inbox_results) {
    const result = Object.assign(new InboxResult(), { outcome: r.name });
    assert.equal(result.brokerAction, r.broker);
  }
  assert.deepEqual(Object.values(protocol.InboxOutcome), m.inbox_results.map((r) => r.name));
  assert.equal(new idem.Inbox('host=/nowhere').maxAttempts, m.inbox.default_max_attempts);
  assert.equal(protocol.INBOX_MAX_ATTEMPTS, m.inbox.max_attempts);
  assert.deepEqual(Object.keys(emptyReport()), m.relay_counts);
  assert.deepEqual({ ...protocol.NACK_COUNT }, Object.fromEntries(m.nack_outcomes.map((n) => [n.name, n.count])));
});
