'use strict';
// The conformance file every client's suite runs (client/conformance/protocol.json,
// generated from extension/protocol/protocol.toml): each claim outcome in
// each profile gives the same action, status, problem type, Retry-After and
// client outcome as in the C++ and Python clients; the storage rules, the
// cache-key and request-hash vectors and the key-status sentences too. No
// database: the runner's decision is fed the server's row.

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
  for (const o of spec.outcomes) assert.ok(seen.has(`${o.outcome}/ietf`) && seen.has(`${o.outcome}/seed`), o.outcome);
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
