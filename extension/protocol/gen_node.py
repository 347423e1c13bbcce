"""The Node client's lib/protocol.js (with limits.py's and messaging.py's parts)."""

import json

import limits
import messaging
from model import NOTE, storage_rules, upper


def gen_node(p):
    profiles = p["problems"]["profiles"]
    js = lambda v: json.dumps(v, ensure_ascii=False)
    L = ["'use strict';", "// pg_idem's protocol: outcomes, problems, status classes and key statuses.",
         "// " + NOTE, "",
         "const KEY_DOMAIN = %s;" % js(p["key"]["domain"]),
         "const MAX_KEY_BYTES = %d;" % p["key"]["max_bytes"],
         "const PROBLEM_BASE = %s;" % js(p["problems"]["base"]),
         "const PROFILES = Object.freeze(%s);" % js(profiles),
         "// Old names of a profile, accepted with a warning: {old: {profile, until}}.",
         "const DEPRECATED_PROFILES = Object.freeze(%s);" % js(p["problems"].get("deprecated_profiles", {})), "",
         "// The oldest extension the runner works with (its first-use check refuses older).",
         "const OLDEST_EXTENSION = %s;" % js(p["client"]["oldest_extension"]),
         "// A handler's validation failures: released, not stored, unless storeClientErrors.",
         "const VALIDATION_STATUSES = Object.freeze(%s);" % js(p["client"]["validation_statuses"]), "",
         *limits.node(p),
         "const FINALIZE = 'finalize';", "const RELEASE = 'release';", "const FAIL = 'fail';", "",
         "// What is wrong with a request's Idempotency-Key header(s), if anything.",
         "const KeyStatus = Object.freeze({"]
    for k in p["key_status"]:
        L.append("  %s: %s," % (upper(k["name"]), js(k["name"])))
    L += ["});", "", "const KEY_STATUS_DESCRIPTIONS = Object.freeze({"]
    for k in p["key_status"]:
        L.append("  %s: %s," % (k["name"], js(k["description"])))
    L += ["});", "", "// The client outcomes of a run (result.outcome), also the metrics label.",
          "const CLIENT_OUTCOMES = Object.freeze(%s);" % js([o["name"] for o in p["client_outcome"]]), "",
          "// status: per profile.  detail: {key_status} and {limit} are filled in by the caller.",
          "const PROBLEMS = Object.freeze({"]
    for x in p["problem"]:
        L.append("  %s: Object.freeze({ name: %s, slug: %s, title: %s, detail: %s, status: Object.freeze(%s), retryAfter: %s })," % (
            x["name"], js(x["name"]), js(x["slug"]), js(x["title"]), js(x["detail"]),
            js({pr: x["status"][pr] for pr in profiles}), "true" if x["retry_after"] else "false"))
    L += ["});", "",
          "// The server's claim outcomes and what a client does with each: run, replay,",
          "// answer (the problem), wait (then the problem), claim.",
          "const OUTCOMES = Object.freeze({"]
    for o in p["outcome"]:
        L.append("  %s: Object.freeze({ name: %s, role: %s, action: %s, problem: %s, result: %s, counted: %s, response: %s })," % (
            o["name"], js(o["name"]), js(o["role"]), js(o["client"]), js(o.get("problem")),
            js(o.get("result")), "true" if o["counted"] else "false", "true" if o["response"] else "false"))
    L += ["});", "",
          "// [lowest status, highest status, action]: the first that matches decides.",
          "const STORAGE_RULES = Object.freeze(["]
    for lo, hi, a in storage_rules(p):
        L.append("  [%d, %d, %s]," % (lo, hi, a.upper()))
    L += ["]);", "const STORAGE_DEFAULT = %s;" % p["storage"]["default"].upper(), "",
          "const SQLSTATES = Object.freeze({"]
    for s in p["sqlstate"]:
        L.append("  %s: %s," % (s["code"], js(s["name"])))
    L += ["});", "",
          "// What the winner does with its handler's response: FINALIZE, RELEASE or FAIL.",
          "function classify(status) {",
          "  for (const [lo, hi, action] of STORAGE_RULES) if (status >= lo && status <= hi) return action;",
          "  return STORAGE_DEFAULT;",
          "}", "",
          ]
    L += node_client_rules(p, js) + messaging.node(p)
    L += ["module.exports = {",
          "  KEY_DOMAIN, MAX_KEY_BYTES, PROBLEM_BASE, PROFILES, DEPRECATED_PROFILES, OLDEST_EXTENSION,",
          "  VALIDATION_STATUSES, FINALIZE, RELEASE, FAIL, KeyStatus,",
          "  KEY_STATUS_DESCRIPTIONS, CLIENT_OUTCOMES, PROBLEMS, OUTCOMES, STORAGE_RULES, STORAGE_DEFAULT,",
          "  SQLSTATES, classify,",
          "  ServerOutcome, ClientOutcome, Action, ProblemName, Event, Profile, EVENTS, DEFAULTS, LIMITS,",
          "  REPLAYED_HEADER, DEFAULT_REPLAY_HEADERS, NEVER_STORED_HEADERS, NEVER_STORED_HEADER_PARTS,",
          "  METRICS, namespacedTarget,",
          "  %s," % limits.NODE_EXPORTS,
          "  %s," % messaging.NODE_EXPORTS,
          "};", ""]
    return "\n".join(L)


def node_names(const, doc, names, js):
    return ["// " + doc, "const %s = Object.freeze({" % const] + [
        "  %s: %s," % (upper(n), js(n)) for n in names] + ["});", ""]


def node_client_rules(p, js):
    """The names to use instead of string literals, and what the clients
    decide alike: defaults, limits, replay headers, metrics, namespace."""
    d, lim, rh = p["client"]["defaults"], p["client"]["limits"], p["replay_headers"]
    L = node_names("ServerOutcome", "The server's claim outcomes (the outcome column of idem_claim), by name.",
                   [o["name"] for o in p["outcome"]], js)
    L += node_names("ClientOutcome", "What a run reports (result.outcome), by name.",
                    [o["name"] for o in p["client_outcome"]], js)
    L += node_names("Action", "What a client does with a server outcome (OUTCOMES[...].action).",
                    ["run", "replay", "answer", "wait", "claim"], js)
    L += node_names("ProblemName", "The problems a client answers with (PROBLEMS' keys).",
                    [x["name"] for x in p["problem"]], js)
    L += node_names("Event", "The claim's lifecycle events (metrics' onEvent).", [e["name"] for e in p["event"]], js)
    L += node_names("Profile", "The HTTP status profiles (config.profile).", p["problems"]["profiles"], js)
    L += ["const EVENTS = Object.freeze(Object.values(Event));", "",
          "// What a Config is when it is told nothing (durations in milliseconds).",
          "const DEFAULTS = Object.freeze({"] + ["  %s: %s," % (k, js(v)) for k, v in d.items()] + [
          "});", "// What a Config may not be.",
          "const LIMITS = Object.freeze({"] + ["  %s: %s," % (k, js(v)) for k, v in lim.items()] + [
          "});", "",
          "// The header a replayed answer carries (value 'true').",
          "const REPLAYED_HEADER = %s;" % js(rh["replayed_header"]),
          "// Response headers kept for replay unless configured otherwise.",
          "const DEFAULT_REPLAY_HEADERS = Object.freeze(%s);" % js(rh["default"]),
          "// Never stored, whatever the configuration says; nor a header whose",
          "// lower-case name contains one of the parts.",
          "const NEVER_STORED_HEADERS = Object.freeze(%s);" % js(rh["never_stored"]),
          "const NEVER_STORED_HEADER_PARTS = Object.freeze(%s);" % js(rh["never_stored_parts"]), "",
          "// The metrics' series: prom-client takes the exported name, with _total.",
          "const METRICS = Object.freeze({"]
    for k in ("requests", "events"):
        m = p["metrics"][k]
        L.append("  %s: Object.freeze({ name: %s, help: %s, label: %s })," % (
            k, js(m["name"] + "_total"), js(m["help"]), js(m["label"])))
    sep = js(p["key"]["namespace"]["separator"])
    L += ["});", "",
          "// The target a namespace makes: the namespace, %s, the target (undefined: no namespace)." % sep,
          "function namespacedTarget(namespace, target) {",
          "  return namespace === undefined || namespace === null ? target : `${namespace}%s${target}`;"
          % p["key"]["namespace"]["separator"],
          "}", ""]
    return L
