'use strict';
// Prometheus counters for the runner, with prom-client (the application's
// own, a peer dependency): the protocol's series (protocol.toml's
// [metrics], the same in every client), so one dashboard serves every
// language:
//
//   idem_client_requests_total{outcome}   one per request (CLIENT_OUTCOMES)
//   idem_client_events_total{event}       claim lifecycle events (EVENTS)
//   and the inbox consumer's and outbox relay's (names in ./protocol):
//   idem_client_inbox_messages_total{outcome}  one per delivery (InboxOutcome)
//   idem_client_outbox_events_total{result}    a relay's batch counts (RELAY_COUNTS)
//
// Every label value starts at zero, so that rate() sees each series from
// the first scrape.

const { CLIENT_OUTCOMES, EVENTS, METRICS, InboxOutcome, RELAY_COUNTS, MESSAGING_METRICS: M } = require('./protocol');

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
  const counter = (s) => existing(s.name) || new client.Counter({ name: s.name, help: s.help, labelNames: [s.label], registers });
  const requests = counter(METRICS.requests);
  const events = counter(METRICS.events);
  for (const outcome of CLIENT_OUTCOMES) requests.inc({ [METRICS.requests.label]: outcome }, 0);
  for (const event of EVENTS) events.inc({ [METRICS.events.label]: event }, 0);
  const inbox = counter({ name: M.inbox, help: M.inbox_help, label: M.inbox_label });
  const relay = counter({ name: M.relay, help: M.relay_help, label: M.relay_label });
  for (const outcome of Object.values(InboxOutcome)) inbox.inc({ [M.inbox_label]: outcome }, 0);
  for (const name of RELAY_COUNTS) relay.inc({ [M.relay_label]: name }, 0);
  return {
    onOutcome: (outcome) => requests.inc({ [METRICS.requests.label]: outcome }),
    onEvent: (event) => events.inc({ [METRICS.events.label]: event }),
    onInbox: (outcome) => inbox.inc({ [M.inbox_label]: outcome }),
    onRelay: (report) => {
      for (const name of RELAY_COUNTS) if (report[name]) relay.inc({ [M.relay_label]: name }, report[name]);
    },
  };
}

module.exports = { prometheus, EVENTS };
