"""The Python client's pg_idem/protocol.py (with limits.py's and messaging.py's parts)."""

import json

import limits
import messaging
from model import NOTE, storage_rules, upper


def gen_python(p):
    profiles = p["problems"]["profiles"]
    L = ['"""pg_idem\'s protocol: outcomes, problems, status classes and key statuses.', "",
         NOTE, '"""', "",
         "import collections", "import enum", "",
         "KEY_DOMAIN = %s" % json.dumps(p["key"]["domain"]),
         "MAX_KEY_BYTES = %d" % p["key"]["max_bytes"],
         "PROBLEM_BASE = %s" % json.dumps(p["problems"]["base"]),
         "PROFILES = %r" % (tuple(profiles),),
         "# Old names of a profile, accepted with a warning: {old: (profile, the release that drops it)}.",
         "DEPRECATED_PROFILES = %r" % {k: (v["profile"], v["until"]) for k, v in
                                       p["problems"].get("deprecated_profiles", {}).items()}, "",
         "# The oldest extension the runner works with (its first-use check refuses older).",
         "OLDEST_EXTENSION = %s" % json.dumps(p["client"]["oldest_extension"]),
         "# A handler's validation failures: released, not stored, unless Config.client_errors = \"store\".",
         "VALIDATION_STATUSES = %r" % (tuple(p["client"]["validation_statuses"]),), "",
         *limits.python(p),
         "FINALIZE = \"finalize\"", "RELEASE = \"release\"", "FAIL = \"fail\"", "",
         "",
         "class KeyStatus(enum.Enum):",
         '    """What is wrong with a request\'s Idempotency-Key header(s), if anything."""', ""]
    for k in p["key_status"]:
        L.append("    %s = %s" % (upper(k["name"]), json.dumps(k["name"])))
    L += ["", "",
          "KEY_STATUS_DESCRIPTIONS = {"]
    for k in p["key_status"]:
        L.append("    KeyStatus.%s: %s," % (upper(k["name"]), json.dumps(k["description"], ensure_ascii=False)))
    L += ["}", "", "# The client outcomes of a run (RunResult.outcome), also the metrics label.",
          "CLIENT_OUTCOMES = %r" % (tuple(o["name"] for o in p["client_outcome"]),), "",
          "Problem = collections.namedtuple(\"Problem\", \"name slug title detail status retry_after\")", "",
          "# status: per profile.  detail: {key_status} and {limit} are filled in by the caller.",
          "PROBLEMS = {"]
    for x in p["problem"]:
        L.append("    %s: Problem(%s, %s, %s, %s,\n                   %s, %s)," % (
            json.dumps(x["name"]), json.dumps(x["name"]), json.dumps(x["slug"]),
            json.dumps(x["title"], ensure_ascii=False), json.dumps(x["detail"], ensure_ascii=False),
            "{" + ", ".join("%s: %d" % (json.dumps(pr), x["status"][pr]) for pr in profiles) + "}",
            "True" if x["retry_after"] else "False"))
    L += ["}", "",
          "Outcome = collections.namedtuple(\"Outcome\", \"name role action problem result counted response\")", "",
          "# The server's claim outcomes and what a client does with each: run, replay,",
          "# answer (the problem), wait (then the problem), claim.",
          "OUTCOMES = {"]
    for o in p["outcome"]:
        L.append("    %s: Outcome(%s, %s, %s, %s, %s, %s, %s)," % (
            json.dumps(o["name"]), json.dumps(o["name"]), json.dumps(o["role"]), json.dumps(o["client"]),
            json.dumps(o.get("problem")) if o.get("problem") else "None",
            json.dumps(o.get("result")) if o.get("result") else "None",
            "True" if o["counted"] else "False", "True" if o["response"] else "False"))
    L += ["}", "",
          "# (lowest status, highest status, action): the first that matches decides.",
          "STORAGE_RULES = ("]
    for lo, hi, a in storage_rules(p):
        L.append("    (%d, %d, %s)," % (lo, hi, a.upper()))
    L += [")", "STORAGE_DEFAULT = %s" % p["storage"]["default"].upper(), "",
          "SQLSTATES = {"]
    for s in p["sqlstate"]:
        L.append("    %s: %s," % (json.dumps(s["code"]), json.dumps(s["name"])))
    L += ["}", "", "",
          "def classify(status):",
          '    """What the winner does with its handler\'s response: FINALIZE, RELEASE or FAIL."""',
          "    for lo, hi, action in STORAGE_RULES:",
          "        if lo <= status <= hi:",
          "            return action",
          "    return STORAGE_DEFAULT", ""]
    L += py_client_rules(p) + messaging.python(p) + [""]
    return "\n".join(L)


def py_names(cls, doc, names):
    return ["", "", "class %s:" % cls, '    """%s"""' % doc, ""] + [
        "    %s = %s" % (upper(n), json.dumps(n)) for n in names]


def py_client_rules(p):
    """The names to use instead of string literals, and what the clients
    decide alike: defaults, limits, replay headers, metrics, namespace."""
    d, lim, rh = p["client"]["defaults"], p["client"]["limits"], p["replay_headers"]
    L = py_names("ServerOutcome", "The server's claim outcomes (the outcome column of idem_claim), by name.",
                 [o["name"] for o in p["outcome"]])
    L += py_names("ClientOutcome", "What a run reports (RunResult.outcome), by name.",
                  [o["name"] for o in p["client_outcome"]])
    L += py_names("Action", "What a client does with a server outcome (Outcome.action).",
                  ["run", "replay", "answer", "wait", "claim"])
    L += py_names("ProblemName", "The problems a client answers with (PROBLEMS' keys).",
                  [x["name"] for x in p["problem"]])
    L += py_names("Event", "The claim's lifecycle events (RunResult.events, metrics' on_event).",
                  [e["name"] for e in p["event"]])
    L += py_names("Profile", "The HTTP status profiles (Config.profile).", p["problems"]["profiles"])
    L += py_names("ClientErrors", "What a runner does with a handler's validation failure (Config.client_errors).",
                  lim["client_errors"])
    L += ["", "",
          "EVENTS = ("] + ["    %s," % json.dumps(e["name"]) for e in p["event"]] + [")", "",
          "# What a Config is when it is told nothing (durations in milliseconds).",
          "DEFAULTS = {"] + ["    %s: %s," % (json.dumps(k), json.dumps(v)) for k, v in d.items()] + ["}",
          "# What a Config may not be.",
          "LIMITS = {"] + ["    %s: %s," % (json.dumps(k), "(%s)" % ", ".join(json.dumps(x) for x in v) if isinstance(v, list)
                                  else json.dumps(v)) for k, v in lim.items()] + ["}", "",
          "# The header a replayed answer carries (value \"true\").",
          "REPLAYED_HEADER = %s" % json.dumps(rh["replayed_header"]),
          "# Response headers kept for replay unless configured otherwise.",
          "DEFAULT_REPLAY_HEADERS = (%s)" % ", ".join(json.dumps(h) for h in rh["default"]),
          "# Never stored, whatever the configuration says; nor a header whose",
          "# lower-case name contains one of the parts.",
          "NEVER_STORED_HEADERS = frozenset((",
          "    %s," % ", ".join(json.dumps(h) for h in rh["never_stored"][:5]),
          "    %s," % ", ".join(json.dumps(h) for h in rh["never_stored"][5:]),
          "))",
          "NEVER_STORED_HEADER_PARTS = %r" % (tuple(rh["never_stored_parts"]),), "",
          "Series = collections.namedtuple(\"Series\", \"name help label\")",
          "# The metrics' series (prometheus_client adds _total to a counter's name).",
          "METRICS = {"]
    for k in ("requests", "events"):
        m = p["metrics"][k]
        L.append("    %s: Series(%s, %s, %s)," % (json.dumps(k), json.dumps(m["name"]), json.dumps(m["help"]),
                                                  json.dumps(m["label"])))
    L += ["}", "", "",
          "def namespaced_target(namespace, target):",
          '    """The target a namespace makes: the namespace, %s, the target (None: no namespace)."""'
          % json.dumps(p["key"]["namespace"]["separator"]),
          "    return target if namespace is None else namespace + %s + target"
          % json.dumps(p["key"]["namespace"]["separator"]), ""]
    return L
