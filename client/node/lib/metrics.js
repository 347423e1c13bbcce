'use strict';
// Prometheus counters for the runner, with prom-client (the application's
// own, a peer dependency): the C++ client's series
// (client/cpp/examples/prometheus_metrics.hpp), so one dashboard serves
// every language:
//
//   idem_client_requests_total{outcome}   one per request (CLIENT_OUTCOMES)
//   idem_client_events_total{event}       claim lifecycle events (EVENTS)
//   and the inbox consumer's and outbox relay's (names in ./protocol):
//   idem_client_inbox_messages_total{outcome}  one per delivery (InboxOutcome)
//   idem_client_outbox_events_total{result}    a relay's batch counts (RELAY_COUNTS)
//
// Every label value starts at zero, so that rate() sees each series from
// the first scrape.

const { CLIENT_OUTCOMES, POOL, InboxOutcome, RELAY_COUNTS, MESSAGING_METRICS: M } = require('./protocol');

// The C++ client's idem::event names (client/cpp/include/idem/metrics.hpp).
const EVENTS = Object.freeze(['claimed', 'recovered_ttl', 'recovered_abandoned', 'pending_wait', 'retryable_cooldown',
  'lease_stolen', 'finalize_error', 'release_error', 'unknown_outcome', 'finalized', POOL.event]);

// A metrics observer ({onOutcome, onEvent}) backed by prom-client counters in
// `registry` (prom-client's global register by default).
function prometheus({ registry, promClient } = {}) {
  let client = promClient;
  if (!client) {
    try {
      client = require('prom-client'); // eslint-disable-line global-require
    } catch {
      throw new Error('pg-idem metrics need prom-client: npm install prom-client');
    }
  }
  const registers = registry ? [registry] : [client.register];
  const existing = (name) => registers[0].getSingleMetric(name);
  const requests = existing('idem_client_requests_total') || new client.Counter({
    name: 'idem_client_requests_total', help: 'Requests through the pg_idem runner, by outcome.', labelNames: ['outcome'], registers,
  });
  const events = existing('idem_client_events_total') || new client.Counter({
    name: 'idem_client_events_total', help: 'Claim lifecycle events seen by the pg_idem runner.', labelNames: ['event'], registers,
  });
  for (const outcome of CLIENT_OUTCOMES) requests.inc({ outcome }, 0);
  for (const event of EVENTS) events.inc({ event }, 0);
  const counter = (name, help, label, values) => {
    const c = existing(name) || new client.Counter({ name, help, labelNames: [label], registers });
    for (const v of values) c.inc({ [label]: v }, 0);
    return c;
  };
  const inbox = counter(M.inbox, M.inbox_help, M.inbox_label, Object.values(InboxOutcome));
  const relay = counter(M.relay, M.relay_help, M.relay_label, RELAY_COUNTS);
  return {
    onOutcome: (outcome) => requests.inc({ outcome }),
    onEvent: (event) => events.inc({ event }),
    onInbox: (outcome) => inbox.inc({ [M.inbox_label]: outcome }),
    onRelay: (report) => {
      for (const name of RELAY_COUNTS) if (report[name]) relay.inc({ [M.relay_label]: name }, report[name]);
    },
  };
}

module.exports = { prometheus, EVENTS };
