'use strict';
// Unit tests without a database: keys, status matrix, allowlist, problems, configuration.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const idem = require('..');
const { Runner } = idem;
const { parseSizeSetting } = require('../lib/runner');
const { retryAfterSeconds } = require('../lib/http');

function referenceKey(...fields) {
  const h = crypto.createHash('sha256').update('pg_idem key v1');
  for (const f of fields) {
    const b = Buffer.from(f, 'utf8');
    const len = Buffer.alloc(4);
    len.writeUInt32BE(b.length);
    h.update(len).update(b);
  }
  return h.digest();
}

test('the cache key is the documented tuple digest', () => {
  assert.deepEqual(idem.cacheKey('alice', 'POST', '/payments', 'order-42'), referenceKey('alice', 'POST', '/payments', 'order-42'));
  assert.notDeepEqual(idem.cacheKey('ab', 'c', '/', 'k'), idem.cacheKey('a', 'bc', '/', 'k'));
  assert.deepEqual(idem.cacheKey('p', 'POST', '/', Buffer.from('k')), idem.cacheKey('p', 'POST', '/', 'k'));
});

test('the request hash is SHA-256 of the body', () => {
  assert.deepEqual(idem.requestHash(Buffer.from('{}')), crypto.createHash('sha256').update('{}').digest());
  assert.deepEqual(idem.requestHash('é'), crypto.createHash('sha256').update(Buffer.from('é')).digest());
  assert.deepEqual(idem.requestHash(undefined), crypto.createHash('sha256').digest());
});

const S = idem.KeyStatus;
const cases = [
  ['k', S.OK], ['x'.repeat(255), S.OK], ['é'.repeat(127), S.OK], ['', S.EMPTY], ['x'.repeat(256), S.TOO_LONG],
  ['é'.repeat(128), S.TOO_LONG], ['a\u0000b', S.CONTAINS_NUL], [Buffer.from([0xc0, 0xaf]), S.INVALID_UTF8],
  [Buffer.from([0xed, 0xa0, 0x80]), S.INVALID_UTF8], [Buffer.from([0xf4, 0x90, 0x80, 0x80]), S.INVALID_UTF8],
  [Buffer.from([0x80]), S.INVALID_UTF8], [Buffer.from([0xe2, 0x82]), S.INVALID_UTF8], ['\ud800', S.INVALID_UTF8],
  ['a\udc00', S.INVALID_UTF8], [Buffer.from([0xf0, 0x9f, 0x92, 0xa9]), S.OK], ['🎉', S.OK],
];
for (const [key, status] of cases) {
  test(`key ${JSON.stringify(Buffer.isBuffer(key) ? [...key] : key.slice(0, 12))} is ${status}`, () => {
    assert.equal(idem.checkKey(key), status);
  });
}

test('absent and repeated Idempotency-Key fields', () => {
  assert.equal(idem.checkKeyHeader([]), S.ABSENT);
  assert.equal(idem.checkKeyHeader(undefined), S.ABSENT);
  assert.equal(idem.checkKeyHeader(['a', 'a']), S.DUPLICATED);
  assert.throws(() => idem.cacheKey('p', 'POST', '/', ''), idem.InvalidKeyError);
  assert.throws(() => idem.cacheKey('p', 'POST', '/', 'x'.repeat(256)), idem.InvalidKeyError);
});

test('status matrix', () => {
  for (let s = 100; s < 600; s++) {
    let want = 'release';
    if ((s >= 200 && s < 300) || [400, 404, 409, 422].includes(s)) want = 'finalize';
    else if (s >= 500 || s === 408 || s === 429) want = 'fail';
    assert.equal(idem.classify(s), want, String(s));
  }
  for (const s of [0, 99, 600]) assert.equal(idem.classify(s), 'fail');
});

test('never-stored headers and the allowlist', () => {
  for (const n of ['Set-Cookie', 'set-cookie2', 'Cookie', 'Authorization', 'Proxy-Authorization', 'WWW-Authenticate',
    'X-Session-Id', 'X-Auth-Token', 'X-CSRF-Token', 'X-Api-Key']) assert.ok(idem.isNeverStored(n), n);
  const allow = new idem.HeaderAllowlist(['x-request-id']);
  const json = JSON.parse(allow.toJson([['Content-Type', 'application/json'], ['Set-Cookie', 'a=1'], ['X-Request-Id', '7'],
    ['Cache-Control', 'no-store'], ['cache-control', 'private'], ['X-Other', '1'], ['Location', 'a\u0000b']]));
  assert.deepEqual(json, { 'content-type': 'application/json', 'x-request-id': '7', 'cache-control': 'no-store, private' });
  assert.equal(new idem.HeaderAllowlist(['set-cookie']).allows('set-cookie'), false);
});

test('problem details per profile', () => {
  const p = idem.problems;
  const r = p.inProgress('ietf', 200);
  const body = JSON.parse(r.body.toString());
  assert.equal(r.status, 409);
  assert.deepEqual(r.headers, [['Content-Type', 'application/problem+json'], ['Retry-After', '1']]);
  assert.equal(body.status, 409);
  assert.match(body.type, /^urn:pg-idem:problem:/);
  assert.equal(p.inProgress('conflict409', 1000).status, 503);
  assert.equal(p.keyReused('ietf').status, 422);
  assert.equal(p.keyReused('conflict409').status, 409);
  assert.equal(p.cooldown('ietf', 1500).headers[1][1], '2');
  assert.equal(p.notReplayable('ietf').status, 409);
  assert.equal(p.expired('ietf').status, 410);
  assert.equal(p.requestTooLarge('ietf', 10).status, 413);
  assert.deepEqual([0, 1, 1000, 1001, 2500].map(retryAfterSeconds), [1, 1, 1, 2, 3]);
});

test('config defaults are the C++ client\'s', () => {
  const c = new idem.Config();
  assert.deepEqual([c.lease, c.renewInterval, c.followerWaitBudget, c.pollMin, c.pollMax, c.pollJitter, c.retryAfter,
    c.failureCooldown, c.maxRequestBodyBytes, c.maxCacheableResponseBytes, c.maxIterations, c.transactionAttempts, c.profile],
  [30000, 10000, 5000, 50, 1000, 0.25, 1000, 2000, 1048576, 2097152, 100, 3, 'ietf']);
  assert.equal(new idem.Config({ lease: 9000 }).renewInterval, 3000);
  assert.ok(Object.isFrozen(c));
});

const refusals = [
  [{ lease: 0 }, 'lease'], [{ lease: 5 }, 'at least 10 ms'], [{ lease: 9e7 }, '24 hours'],
  [{ lease: 1000, renewInterval: 1000 }, 'shorter than lease'], [{ followerWaitBudget: -1 }, 'followerWaitBudget'],
  [{ pollMin: 2000, pollMax: 1000 }, 'pollMin'], [{ pollJitter: 1 }, 'pollJitter'], [{ retryAfter: 0 }, 'retryAfter'],
  [{ failureCooldown: 0 }, 'failureCooldown'], [{ maxRequestBodyBytes: 0 }, 'maxRequestBodyBytes'],
  [{ maxIterations: 1.5 }, 'maxIterations'], [{ transactionAttempts: 0 }, 'transactionAttempts'],
  [{ profile: 'x' }, 'profile'], [{ replayHeaders: ['Set-Cookie'] }, 'never stored'],
  [{ replayHeaders: ['Authorization'] }, 'never stored'], [{ replayHeaders: ['bad header'] }, 'not a valid header name'],
  [{ schema: '' }, 'schema'], [{ lease: '10' }, 'lease'], [{ leese: 1 }, 'unknown setting'],
];
for (const [opts, word] of refusals) {
  test(`config refuses ${JSON.stringify(opts)}`, () => {
    assert.throws(() => new idem.Config(opts), (e) => e instanceof idem.ConfigError && e.message.includes(word));
  });
}

test('size settings', () => {
  assert.equal(parseSizeSetting('2MB'), 2 * 1024 * 1024);
  assert.equal(parseSizeSetting('1024'), 1024);
  assert.equal(parseSizeSetting('8kB'), 8192);
  assert.equal(parseSizeSetting('-1'), undefined);
});

test('conninfo strings', () => {
  assert.deepEqual(idem.poolOptions("host=/tmp/s port=5432 user=u dbname=d password='a b'"),
    { host: '/tmp/s', port: 5432, user: 'u', database: 'd', password: 'a b' });
  assert.deepEqual(idem.poolOptions('postgres://x@y/z'), { connectionString: 'postgres://x@y/z' });
});

test('early answers need no database', async () => {
  const fakePool = { connect: () => { throw new Error('no database here'); } };
  const r = new Runner(fakePool, { maxRequestBodyBytes: 4 });
  const h = async () => ({ status: 200 });
  for (const [keys, status] of [[[''], 400], [['a', 'b'], 400], [['x'.repeat(256)], 400], [[Buffer.from([0xff])], 400]]) {
    const res = await r.run({ principal: 'p', method: 'POST', target: '/', keys, body: '' }, h);
    assert.equal(res.response.status, status);
    assert.equal(res.outcome, 'rejected');
  }
  assert.equal((await r.run({ principal: 'p', keys: [], keyRequired: true }, h)).response.status, 400);
  assert.equal((await r.run({ principal: 'p', keys: ['k'], body: '12345' }, h)).response.status, 413);
  assert.equal((await r.run({ keys: ['k'] }, h)).response.status, 401); // no principal
  const un = await r.run({ keys: [] }, h);
  assert.equal(un.outcome, 'unguarded');
  assert.ok(un.handlerRan);
  const db = await r.run({ principal: 'p', keys: ['k'] }, h);
  assert.equal(db.response.status, 503); // the store is unavailable: nothing runs
  assert.equal(db.handlerRan, false);
});
