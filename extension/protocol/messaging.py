"""The messaging part of the protocol, for generate.py: the inbox's answers
and a consumer's results, idem_outbox_nack's outcomes, a relay's counts and
the two clients' metric names (protocol.toml's [inbox], [[inbox_answer]],
[[inbox_result]], [[nack_outcome]], [[relay_count]], [metrics.inbox] and
[metrics.relay]).

A module of its own so that generate.py stays one file per concern: each
gen_* there appends what this module returns for the same output.
"""

import json
import os
import re

BROKER_ACTIONS = ("ack", "requeue", "requeue_after")
INBOX_FUNCTIONS = ("begin", "fail")


def _fail(msg):
    raise SystemExit("protocol.toml: " + msg)


def _names(entries):
    return [e["name"] for e in entries]


def messaging_metrics(p):
    """The consumers' and relays' series of protocol.toml's [metrics] (the
    clients' one list of series), by their exported names (with _total)."""
    m = {}
    for k in ("inbox", "relay"):
        s = p["metrics"][k]
        m.update({k: s["name"] + "_total", k + "_label": s["label"], k + "_help": s["help"]})
    return m


def validate(p):
    """Every answer names a known result and function; every result a known
    broker action; every nack outcome a known count; no name twice."""
    results = _names(p["inbox_result"])
    counts = _names(p["relay_count"])
    for kind in ("inbox_answer", "inbox_result", "nack_outcome", "relay_count"):
        names = _names(p[kind])
        if len(set(names)) != len(names):
            _fail("a %s named twice" % kind)
    for a in p["inbox_answer"]:
        if a["result"] not in results:
            _fail("inbox_answer %s: result %s is no inbox_result" % (a["name"], a["result"]))
        if not a["from"] or set(a["from"]) - set(INBOX_FUNCTIONS):
            _fail("inbox_answer %s: from must list some of %s" % (a["name"], ", ".join(INBOX_FUNCTIONS)))
    for r in p["inbox_result"]:
        if r["broker"] not in BROKER_ACTIONS:
            _fail("inbox_result %s: broker %s" % (r["name"], r["broker"]))
    for n in p["nack_outcome"]:
        if n["count"] not in counts:
            _fail("nack_outcome %s: count %s is no relay_count" % (n["name"], n["count"]))
    ib = p["inbox"]
    if not 1 <= ib["default_max_attempts"] <= ib["max_attempts"]:
        _fail("inbox: default_max_attempts must be between 1 and max_attempts")


def check_install(p, root):
    """idem_inbox_begin's DEFAULT in the install script is the protocol's."""
    path = "extension/install/50_inbox.sql"
    with open(os.path.join(root, path), encoding="utf-8") as f:
        m = re.search(r"max_attempts integer DEFAULT (\d+)\)", f.read())
    want = p["inbox"]["default_max_attempts"]
    if not m or int(m.group(1)) != want:
        return ["%s: idem_inbox_begin's max_attempts DEFAULT is %s, the protocol's %d" % (
            path, m.group(1) if m else "missing", want)]
    return []


# ---- C ----------------------------------------------------------------------

def c_header(p):
    """Enums of the inbox's answers and the nack outcomes, and their texts."""
    L = ["/* What idem_inbox_begin and idem_inbox_fail answer (their names: idem_inbox_answers). */",
         "typedef enum IdemInboxAnswer", "{"]
    L += ["\tIDEM_INBOX_ANSWER_%s,\t/* from %s */" % (a["name"].upper(), ", ".join(a["from"]))
          for a in p["inbox_answer"]]
    L += ["\tIDEM_INBOX_NANSWERS", "} IdemInboxAnswer;", "",
          "extern PGDLLIMPORT const char *const idem_inbox_answers[IDEM_INBOX_NANSWERS];", "",
          "/* idem_inbox_begin's max_attempts: the default and the largest accepted. */",
          "#define IDEM_INBOX_DEFAULT_MAX_ATTEMPTS %d" % p["inbox"]["default_max_attempts"],
          "#define IDEM_INBOX_MAX_ATTEMPTS %d" % p["inbox"]["max_attempts"], "",
          "/* What idem_outbox_nack answers (their names: idem_nack_outcomes). */",
          "typedef enum IdemNackOutcome", "{"]
    L += ["\tIDEM_NACK_%s," % n["name"].upper() for n in p["nack_outcome"]]
    L += ["\tIDEM_NACK_NOUTCOMES", "} IdemNackOutcome;", "",
          "extern PGDLLIMPORT const char *const idem_nack_outcomes[IDEM_NACK_NOUTCOMES];", ""]
    return L


def c_source(p):
    L = ["const char *const idem_inbox_answers[IDEM_INBOX_NANSWERS] = {"]
    L += ["\t[IDEM_INBOX_ANSWER_%s] = %s," % (a["name"].upper(), json.dumps(a["name"])) for a in p["inbox_answer"]]
    L += ["};", "", "const char *const idem_nack_outcomes[IDEM_NACK_NOUTCOMES] = {"]
    L += ["\t[IDEM_NACK_%s] = %s," % (n["name"].upper(), json.dumps(n["name"])) for n in p["nack_outcome"]]
    L += ["};", ""]
    return L


# ---- C++ --------------------------------------------------------------------

def cpp_types(p):
    """Enums in namespace idem (before namespace protocol)."""
    L = ["// What idem::inbox::handle reports for a delivery, also its metrics label.",
         "enum class inbox_outcome", "{"]
    L += ["    %s,  // %s" % (r["name"], r["when"]) for r in p["inbox_result"]]
    L += ["};", "", "// What a consumer does with a delivery at its broker (protocol::broker_action_of).",
          "enum class broker_action", "{",
          "    ack,            // acknowledge it: nothing is left to do with it",
          "    requeue,        // hand it back now: the redelivery settles it",
          "    requeue_after,  // deliver it again after inbox_result::retry_after",
          "};", ""]
    return L


def cpp_protocol(p):
    """Declarations in namespace idem::protocol."""
    answers = p["inbox_answer"]
    L = ["// The answers of idem_inbox_begin and idem_inbox_fail.",
         "enum class inbox_answer", "{"]
    L += ["    %s,  // from %s" % (a["name"], ", ".join(a["from"])) for a in answers]
    L += ["    unknown,  // not one of the above: a newer server; treated as an error", "};", "",
          "inline constexpr std::array<std::string_view, %d> inbox_answers = {{%s}};" % (
              len(answers), ", ".join(json.dumps(a["name"]) for a in answers)), "",
          "inline inbox_answer parse_inbox_answer(std::string_view text) noexcept",
          "{",
          "    for (std::size_t i = 0; i < inbox_answers.size(); ++i)",
          "        if (inbox_answers[i] == text)",
          "            return static_cast<inbox_answer>(i);",
          "    return inbox_answer::unknown;",
          "}", "",
          "// The consumer's result for a server answer (process: once done commits).",
          "inline constexpr inbox_outcome result_of(inbox_answer a) noexcept",
          "{", "    switch (a)", "    {"]
    for a in answers:
        L += ["    case inbox_answer::%s:" % a["name"], "        return inbox_outcome::%s;" % a["result"]]
    L += ["    case inbox_answer::unknown:", "        break;", "    }",
          "    return inbox_outcome::unknown;", "}", "",
          "inline constexpr std::string_view name(inbox_outcome o) noexcept",
          "{", "    switch (o)", "    {"]
    for r in p["inbox_result"]:
        L += ["    case inbox_outcome::%s:" % r["name"], "        return %s;" % json.dumps(r["name"])]
    L += ["    }", "    return \"unknown\";", "}", "",
          "inline constexpr broker_action broker_action_of(inbox_outcome o) noexcept",
          "{", "    switch (o)", "    {"]
    for r in p["inbox_result"]:
        L += ["    case inbox_outcome::%s:" % r["name"], "        return broker_action::%s;" % r["broker"]]
    L += ["    }", "    return broker_action::requeue;", "}", "",
          "inline constexpr int inbox_default_max_attempts = %d;" % p["inbox"]["default_max_attempts"],
          "inline constexpr int inbox_max_attempts = %d;" % p["inbox"]["max_attempts"], "",
          "// The answers of idem_outbox_nack.",
          "enum class nack_outcome", "{"]
    L += ["    %s,  // %s" % (n["name"], n["when"]) for n in p["nack_outcome"]]
    L += ["    unknown,  // not one of the above: a newer server", "};", "",
          "inline nack_outcome parse_nack_outcome(std::string_view text) noexcept",
          "{"]
    for n in p["nack_outcome"]:
        L += ["    if (text == %s)" % json.dumps(n["name"]), "        return nack_outcome::%s;" % n["name"]]
    L += ["    return nack_outcome::unknown;", "}", "",
          "// The metric names of the consumers and relays (one series per inbox_outcome and",
          "// per batch_report count).",
          "inline constexpr std::string_view inbox_metric = %s;" % json.dumps(messaging_metrics(p)["inbox"]),
          "inline constexpr std::string_view relay_metric = %s;" % json.dumps(messaging_metrics(p)["relay"]),
          "inline constexpr std::array<std::string_view, %d> relay_counts = {{%s}};" % (
              len(p["relay_count"]), ", ".join(json.dumps(c["name"]) for c in p["relay_count"])), ""]
    return L


# ---- Python -----------------------------------------------------------------

def python(p):
    m = messaging_metrics(p)
    L = ["", "# ---- messaging: the inbox's answers, a consumer's results, the relay ----", "",
         "class InboxAnswer(str, enum.Enum):",
         '    """What idem_inbox_begin and idem_inbox_fail answer."""', ""]
    L += ["    %s = %s  # from %s" % (a["name"].upper(), json.dumps(a["name"]), ", ".join(a["from"]))
          for a in p["inbox_answer"]]
    L += ["", "", "class InboxOutcome(str, enum.Enum):",
          '    """What a consumer reports for a delivery (InboxResult.outcome), also its metrics label."""', ""]
    L += ["    %s = %s" % (r["name"].upper(), json.dumps(r["name"])) for r in p["inbox_result"]]
    L += ["", "", "class BrokerAction(str, enum.Enum):",
          '    """What a consumer does with a delivery at its broker."""', ""]
    L += ["    %s = %s" % (b.upper(), json.dumps(b)) for b in BROKER_ACTIONS]
    L += ["", "", "# The consumer's result for each server answer (process: once done commits).",
          "INBOX_RESULT_OF = {"]
    L += ["    InboxAnswer.%s: InboxOutcome.%s," % (a["name"].upper(), a["result"].upper()) for a in p["inbox_answer"]]
    L += ["}", "BROKER_ACTION_OF = {"]
    L += ["    InboxOutcome.%s: BrokerAction.%s," % (r["name"].upper(), r["broker"].upper()) for r in p["inbox_result"]]
    L += ["}", "INBOX_DEFAULT_MAX_ATTEMPTS = %d" % p["inbox"]["default_max_attempts"],
          "INBOX_MAX_ATTEMPTS = %d" % p["inbox"]["max_attempts"], "", "",
          "class NackOutcome(str, enum.Enum):", '    """What idem_outbox_nack answers."""', ""]
    L += ["    %s = %s" % (n["name"].upper(), json.dumps(n["name"])) for n in p["nack_outcome"]]
    L += ["", "", "# The count of a relay's batch report that each nack outcome adds to.",
          "NACK_COUNT = {"]
    L += ["    NackOutcome.%s: %s," % (n["name"].upper(), json.dumps(n["count"])) for n in p["nack_outcome"]]
    L += ["}", "# What a relay's batch report counts (BatchReport's fields), also its metrics label.",
          "RELAY_COUNTS = %r" % (tuple(c["name"] for c in p["relay_count"]),),
          "INBOX_METRIC = %s" % json.dumps(m["inbox"]),
          "INBOX_METRIC_LABEL = %s" % json.dumps(m["inbox_label"]),
          "INBOX_METRIC_HELP = %s" % json.dumps(m["inbox_help"]),
          "RELAY_METRIC = %s" % json.dumps(m["relay"]),
          "RELAY_METRIC_LABEL = %s" % json.dumps(m["relay_label"]),
          "RELAY_METRIC_HELP = %s" % json.dumps(m["relay_help"])]
    return L


# ---- Node -------------------------------------------------------------------

NODE_EXPORTS = ("InboxAnswer, InboxOutcome, BrokerAction, INBOX_RESULT_OF, BROKER_ACTION_OF, "
                "INBOX_DEFAULT_MAX_ATTEMPTS, INBOX_MAX_ATTEMPTS, NackOutcome, NACK_COUNT, RELAY_COUNTS, "
                "MESSAGING_METRICS")


def _js_enum(name, doc, values):
    L = ["// " + doc, "const %s = Object.freeze({" % name]
    L += ["  %s: %s," % (v.upper(), json.dumps(v)) for v in values]
    return L + ["});", ""]


def node(p):
    m = messaging_metrics(p)
    L = ["// ---- messaging: the inbox's answers, a consumer's results, the relay ----", ""]
    L += _js_enum("InboxAnswer", "What idem_inbox_begin and idem_inbox_fail answer.", _names(p["inbox_answer"]))
    L += _js_enum("InboxOutcome", "What a consumer reports for a delivery (result.outcome), also its metrics label.",
                  _names(p["inbox_result"]))
    L += _js_enum("BrokerAction", "What a consumer does with a delivery at its broker.", BROKER_ACTIONS)
    L += ["// The consumer's result for each server answer (process: once done commits).",
          "const INBOX_RESULT_OF = Object.freeze(%s);" % json.dumps({a["name"]: a["result"] for a in p["inbox_answer"]}),
          "const BROKER_ACTION_OF = Object.freeze(%s);" % json.dumps({r["name"]: r["broker"] for r in p["inbox_result"]}),
          "const INBOX_DEFAULT_MAX_ATTEMPTS = %d;" % p["inbox"]["default_max_attempts"],
          "const INBOX_MAX_ATTEMPTS = %d;" % p["inbox"]["max_attempts"], ""]
    L += _js_enum("NackOutcome", "What idem_outbox_nack answers.", _names(p["nack_outcome"]))
    L += ["// The count of a relay's batch report that each nack outcome adds to.",
          "const NACK_COUNT = Object.freeze(%s);" % json.dumps({n["name"]: n["count"] for n in p["nack_outcome"]}),
          "// What a relay's batch report counts, also its metrics label.",
          "const RELAY_COUNTS = Object.freeze(%s);" % json.dumps(_names(p["relay_count"])),
          "const MESSAGING_METRICS = Object.freeze(%s);" % json.dumps(m), ""]
    return L


# ---- conformance data and the reference page --------------------------------

def conformance(p):
    return {
        "inbox_answers": [{"name": a["name"], "from": a["from"], "result": a["result"]} for a in p["inbox_answer"]],
        "inbox_results": [{"name": r["name"], "broker": r["broker"]} for r in p["inbox_result"]],
        "inbox": p["inbox"],
        "nack_outcomes": [{"name": n["name"], "count": n["count"]} for n in p["nack_outcome"]],
        "relay_counts": _names(p["relay_count"]),
        "messaging_metrics": messaging_metrics(p),
    }


def docs(p):
    m = messaging_metrics(p)
    L = ["## Inbox answers", "",
         "What `idem_inbox_begin` and `idem_inbox_fail` answer, and what a consumer (C++ `idem::inbox`,",
         "Python `pg_idem.inbox`, Node `Inbox`) reports for it. `max_attempts` is %d unless given, at most %d." % (
             p["inbox"]["default_max_attempts"], p["inbox"]["max_attempts"]), "",
         "| answer | from | when | consumer's result |", "|---|---|---|---|"]
    for a in p["inbox_answer"]:
        L.append("| `%s` | %s | %s | `%s` |" % (a["name"], ", ".join("`idem_inbox_%s`" % f for f in a["from"]),
                                               a["when"], a["result"]))
    L += ["", "## Inbox consumer results", "",
          "What a consumer reports for one delivery (counted in `%s{%s}`) and does with it at" % (
              m["inbox"], m["inbox_label"]),
          "its broker: `ack`, `requeue` (now), `requeue_after` (after `retry_after`: a delay queue).", "",
          "| result | broker | when |", "|---|---|---|"]
    for r in p["inbox_result"]:
        L.append("| `%s` | %s | %s |" % (r["name"], r["broker"], r["when"]))
    L += ["", "## Outbox nack outcomes", "", "What `idem_outbox_nack` answers, and the relay count it adds to.", "",
          "| outcome | count | when |", "|---|---|---|"]
    for n in p["nack_outcome"]:
        L.append("| `%s` | `%s` | %s |" % (n["name"], n["count"], n["when"]))
    L += ["", "## Relay counts", "",
          "What a relay's batch report counts (C++ `batch_report`, Python `BatchReport`, Node",
          "`report`), also counted in `%s{%s}`." % (m["relay"], m["relay_label"]), "",
          "| count | when |", "|---|---|"]
    for c in p["relay_count"]:
        L.append("| `%s` | %s |" % (c["name"], c["when"]))
    L.append("")
    return L
