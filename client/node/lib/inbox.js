'use strict';
// The message inbox: process each delivered message once, its effects
// committing with the record that it was processed (the C++ client's
// idem::inbox, client/cpp/include/idem/inbox.hpp, with the same protocol).
//
//   const inbox = new Inbox(pool);
//   const r = await inbox.handle('billing', { id: msg.properties.messageId, payload: msg.content },
//     async (tx) => { await tx.query('INSERT INTO invoices (order_id) VALUES ($1)', [orderId]); });
//   if (r.brokerAction === BrokerAction.REQUEUE_AFTER) requeueLater(msg, r.retryAfter);   // retry
//   else if (r.brokerAction === BrokerAction.REQUEUE) channel.nack(msg);                    // unknown
//   else channel.ack(msg);                              // processed, duplicate, dead, mismatch
//
// All on one pooled client:
//
//   BEGIN; SELECT idem_inbox_begin(consumer, id, sha256(payload), maxAttempts);
//     not process -> COMMIT, the answer's outcome;
//   SAVEPOINT idem_handler; handler(tx); RELEASE SAVEPOINT idem_handler;
//   SELECT idem_inbox_done(consumer, id); COMMIT                  -> processed
//
// The handler throws: ROLLBACK TO SAVEPOINT idem_handler; SELECT ... FROM
// idem_inbox_fail(consumer, id, message); COMMIT -> retry (retryAfter ms),
// dead (dead letter staged) or duplicate: recorded in the transaction that
// held the message. The transaction itself fails (COMMIT, idem_inbox_done,
// a broken savepoint): ROLLBACK, then idem_inbox_fail in autocommit on the
// same client; if even that fails the client is destroyed, and the server
// records the attempt as the session ends. A connection lost during COMMIT
// is unknown: never run again here; the redelivery answers duplicate or
// process. Serialization failures and deadlocks raised by the handler under
// READ COMMITTED are rerun in place up to handlerAttempts times, without
// counting a failed attempt.
//
// Consumers hold a session-level lock on a message while they process it:
// do not put them behind transaction-mode pooling.

const crypto = require('node:crypto');
const { beginText } = require('./statements');
const { ConfigError } = require('./config');
const protocol = require('./protocol');
const m = require('./messages');

const { InboxAnswer, InboxOutcome, INBOX_RESULT_OF, BROKER_ACTION_OF } = protocol;
const ANSWERS = new Set(Object.values(InboxAnswer));

class UnknownOutcome extends Error {}

// The consumer's result for one delivery.
class InboxResult {
  constructor() {
    this.outcome = InboxOutcome.UNKNOWN;
    this.handlerRan = false;
    this.handlerRuns = 0; //  in-place reruns after 40001/40P01 included
    this.errorCount = 0; //   after a recorded failure: the failed attempts so far
    this.retryAfter = 0; //   milliseconds before the next delivery (retry only)
    this.error = undefined; // the handler's or the transaction's, behind retry and unknown
  }

  // What to do with the delivery at the broker: ack, requeue, requeue_after.
  get brokerAction() {
    return BROKER_ACTION_OF[this.outcome];
  }
}

function answerOf(text) {
  if (!ANSWERS.has(text)) throw new Error(`pg_idem answered an unknown inbox outcome "${text}"`);
  return text;
}

class Inbox {
  // pool: a pg.Pool or a connection string. Options: maxAttempts
  // (idem_inbox_begin's cap), handlerAttempts (runs of the handler on
  // 40001/40P01 under READ COMMITTED, and tries of idem_inbox_begin),
  // isolation ('read committed', 'repeatable read', 'serializable'),
  // maxErrorBytes (longest error text recorded), schema (of the pg_idem
  // functions; undefined: the search_path), metrics ({onInbox(outcome)},
  // e.g. require('pg-idem').prometheus()).
  constructor(pool, options = {}) {
    const o = { maxAttempts: protocol.INBOX_DEFAULT_MAX_ATTEMPTS, handlerAttempts: 3, maxErrorBytes: 2000, ...options };
    this.pool = m.poolOf(pool);
    this.maxAttempts = m.integer('inbox', 'maxAttempts', o.maxAttempts, 1, protocol.INBOX_MAX_ATTEMPTS);
    this.handlerAttempts = m.integer('inbox', 'handlerAttempts', o.handlerAttempts, 1, 100);
    this.maxErrorBytes = m.integer('inbox', 'maxErrorBytes', o.maxErrorBytes, 16, 1024 * 1024);
    try {
      this.begin = beginText(o.isolation);
    } catch (e) {
      throw new ConfigError(`inbox: ${e.message}`);
    }
    this.rerunsInPlace = !o.isolation || String(o.isolation).toLowerCase() === 'read committed';
    this.metrics = o.metrics;
    this.sql = {
      begin: `SELECT ${m.qualified(o.schema, 'idem_inbox_begin')}($1, $2, $3, $4) AS answer`,
      done: `SELECT ${m.qualified(o.schema, 'idem_inbox_done')}($1, $2)`,
      fail: 'SELECT f.outcome, f.error_count, ceil(extract(epoch FROM f.retry_after) * 1000)::int4 AS retry_ms'
        + ` FROM ${m.qualified(o.schema, 'idem_inbox_fail')}($1, $2, $3) f`,
    };
  }

  // Processes one delivery, message = {id, payload} (payload: a Buffer or
  // a string, as received; its SHA-256 tells a redelivery from a reused
  // id). handler(tx) writes its effects with tx.query and must neither
  // commit nor roll back; throwing marks the attempt failed. Errors before
  // the message is begun (bad arguments: 22023, 22004; misuse: 55000; a
  // lost connection) reject; after that the result tells.
  async handle(consumer, message, handler) {
    if (typeof consumer !== 'string' || !message || typeof message.id !== 'string') {
      throw new TypeError('inbox.handle(consumer, {id, payload}, handler): consumer and id are strings');
    }
    if (typeof handler !== 'function') throw new TypeError('inbox.handle: the handler must be a function');
    const client = await m.checkout(this.pool);
    let destroy = true;
    try {
      const r = await this.steps(client, consumer, message, handler);
      destroy = r.destroy;
      delete r.destroy;
      if (this.metrics && this.metrics.onInbox) this.metrics.onInbox(r.outcome);
      return r;
    } finally {
      m.giveBack(client, destroy);
    }
  }

  async commit(client) {
    try {
      await client.query('COMMIT');
    } catch (e) {
      if (client.idemBroken || m.connectionLost(e)) throw Object.assign(new UnknownOutcome(e.message), { cause: e });
      throw e;
    }
  }

  async steps(client, consumer, message, handler) {
    const payload = Buffer.isBuffer(message.payload) ? message.payload : Buffer.from(String(message.payload ?? ''), 'utf8');
    const key = [consumer, message.id];
    const r = new InboxResult();

    // Begin. Nothing is begun when it fails: a 40001/40P01 is tried again.
    let answer;
    for (let attempt = 1; ; attempt++) {
      await client.query(this.begin);
      try {
        const digest = crypto.createHash('sha256').update(payload).digest();
        answer = answerOf((await client.query(this.sql.begin, [...key, digest, this.maxAttempts])).rows[0].answer);
        break;
      } catch (e) {
        if (!client.idemBroken && !m.connectionLost(e)) await client.query('ROLLBACK');
        if (!m.transient(e) || attempt >= this.handlerAttempts) throw e;
      }
    }
    if (answer !== InboxAnswer.PROCESS) {
      await this.commit(client); // a cap reached at begin commits its dead letter
      r.outcome = INBOX_RESULT_OF[answer];
      r.destroy = false;
      return r;
    }

    // From here on every path accounts for the attempt.
    let failure;
    let savepoint = false;
    try {
      await client.query('SAVEPOINT idem_handler');
      savepoint = true;
      for (;;) {
        r.handlerRan = true;
        r.handlerRuns++;
        try {
          await handler(client);
          break;
        } catch (e) {
          // Only READ COMMITTED reruns in place: the savepoint drops the
          // handler's writes and locks; its next statement takes a new snapshot.
          if (!m.transient(e) || !this.rerunsInPlace || r.handlerRuns >= this.handlerAttempts || client.idemBroken) throw e;
          await client.query('ROLLBACK TO SAVEPOINT idem_handler');
        }
      }
      await client.query('RELEASE SAVEPOINT idem_handler');
      savepoint = false;
      await client.query(this.sql.done, key);
      await this.commit(client);
      r.outcome = InboxOutcome.PROCESSED;
      r.destroy = false;
      return r;
    } catch (e) {
      if (e instanceof UnknownOutcome) {
        r.outcome = InboxOutcome.UNKNOWN;
        r.error = e.cause;
        r.destroy = true;
        return r;
      }
      failure = e;
    }
    r.error = failure;
    // The session is gone (the server records the attempt as it ends). A
    // socket that died shows no SQLSTATE: the statements below then fail
    // at once, which ends the same way.
    if (client.idemBroken || (m.sqlstate(failure) && m.connectionLost(failure))) {
      r.outcome = InboxOutcome.UNKNOWN;
      r.destroy = true;
      return r;
    }
    const text = m.errorText(failure, this.maxErrorBytes);

    // The handler failed inside its savepoint: record it in the same
    // transaction, which keeps the message locked until the record commits.
    if (savepoint) {
      try {
        await client.query('ROLLBACK TO SAVEPOINT idem_handler');
        const row = (await client.query(this.sql.fail, [...key, text])).rows[0];
        await this.commit(client);
        return readFailure(row, r);
      } catch (e) {
        if (e instanceof UnknownOutcome) {
          r.outcome = InboxOutcome.UNKNOWN;
          r.destroy = true;
          return r;
        }
        // the transaction itself failed: below
      }
    }

    // The transaction is lost: roll it back and record the failure in
    // autocommit on this client (the server keeps the attempt per session).
    try {
      await client.query('ROLLBACK'); // a warning only when none is open
      return readFailure((await client.query(this.sql.fail, [...key, text])).rows[0], r);
    } catch {
      // Not recorded: destroy the client; the server records the attempt as the session ends.
      r.outcome = InboxOutcome.UNKNOWN;
      r.destroy = true;
      return r;
    }
  }
}

function readFailure(row, r) {
  r.outcome = INBOX_RESULT_OF[answerOf(row.outcome)];
  r.errorCount = row.error_count || 0;
  r.retryAfter = row.retry_ms || 0;
  r.destroy = false;
  return r;
}

module.exports = { Inbox, InboxResult };
