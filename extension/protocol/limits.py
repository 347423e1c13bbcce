"""What generate.py writes for protocol.toml's client limits: [client.missing_principal],
[client.pool], [client.startup], [[connect_message]] and [[principal_vector]]
(issue 31), kept apart from the protocol's outcomes and problems.

Each function returns the lines (or the conformance entries) generate.py
puts in its output for one client, the conformance data or the reference
page; validate() checks the entries' cross-references."""

import json
import re


def _c(s):
    return json.dumps(s, ensure_ascii=False)


def validate(p, fail):
    """The limits name known problems and results, and their numbers are sane."""
    c = p["client"]
    problems = {x["name"]: x for x in p["problem"]}
    results = {x["name"] for x in p["client_outcome"]}
    for part in ("missing_principal", "pool"):
        if c[part]["problem"] not in problems or c[part]["result"] not in results:
            fail("client.%s needs a known problem and result" % part)
    if not problems[c["pool"]["problem"]]["retry_after"]:
        fail("client.pool: an exhausted pool is retryable (Retry-After)")
    if not 0 < c["pool"]["duplicates_share"] <= 1:
        fail("client.pool.duplicates_share is a share of the pool, in (0, 1]")
    for name in ("pool", "startup"):
        if not (isinstance(c[name]["wait_ms"], int) and c[name]["wait_ms"] > 0):
            fail("client.%s.wait_ms must be a positive number of milliseconds" % name)
    for m in p["connect_message"]:
        re.compile(m["pattern"])
        if not re.fullmatch(r"[0-9A-Z]{5}", m["sqlstate"]):
            fail("connect_message %r: a SQLSTATE" % m)
    answers = results | {c["missing_principal"]["problem"]}
    for v in p["principal_vector"]:
        if v["answer"] not in answers:
            fail("principal vector %r: answer %s" % (v, v["answer"]))


def cpp(p):
    """Constants of idem/protocol.hpp (namespace idem::protocol)."""
    c = p["client"]
    L = ["// A guarded request without a principal: refused with this problem, counted",
         "// as this result (protocol.toml [client.missing_principal]).",
         "inline constexpr problem missing_principal = problem::%s;" % c["missing_principal"]["problem"],
         "inline constexpr outcome missing_principal_result = outcome::%s;" % c["missing_principal"]["result"],
         "// An exhausted connection pool (protocol.toml [client.pool]): the answer,",
         "// its result and metrics event (an [[event]]), the wait of a bounded",
         "// simple_pool, the fix every log line names, the share of a bounded pool",
         "// waiting duplicates may hold at once.",
         "inline constexpr problem pool_exhausted_answer = problem::%s;" % c["pool"]["problem"],
         "inline constexpr outcome pool_exhausted_result = outcome::%s;" % c["pool"]["result"],
         "inline constexpr event pool_exhausted_event = event::%s;" % c["pool"]["event"],
         "inline constexpr std::chrono::milliseconds pool_wait{%d};" % c["pool"]["wait_ms"],
         "inline constexpr std::string_view pool_exhausted_fix = %s;" % _c(c["pool"]["fix"]),
         "inline constexpr double pool_duplicates_share = %r;" % c["pool"]["duplicates_share"],
         "// How long runner::check() waits for a server that does not answer",
         "// yet, and the SQLSTATEs it waits through (protocol.toml [client.startup]).",
         "inline constexpr std::chrono::milliseconds startup_wait{%d};" % c["startup"]["wait_ms"],
         "inline constexpr std::array<std::string_view, %d> startup_retry_sqlstates = {{%s}};" % (
             len(c["startup"]["retry_sqlstates"]), ", ".join(_c(x) for x in c["startup"]["retry_sqlstates"])),
         "// {SQLSTATE, the server's words (an ECMAScript regex)} of a refused",
         "// connection, which libpq gives without its code.",
         "struct connect_message",
         "{",
         "    std::string_view sqlstate;",
         "    std::string_view pattern;",
         "};",
         "inline constexpr std::array<connect_message, %d> connect_messages = {{" % len(p["connect_message"])]
    L += ["    {%s, %s}," % (_c(m["sqlstate"]), _c(m["pattern"])) for m in p["connect_message"]]
    L += ["}};"]
    return L


def python(p):
    """Constants of pg_idem/protocol.py."""
    c = p["client"]
    return [
        "# A guarded request without a principal: refused ([client.missing_principal]).",
        "MISSING_PRINCIPAL = %s" % json.dumps(c["missing_principal"]["problem"]),
        "MISSING_PRINCIPAL_RESULT = %s" % json.dumps(c["missing_principal"]["result"]),
        "# An exhausted connection pool ([client.pool]): the answer's problem, its",
        "# run result and metrics event, the wait of a pool the client bounds",
        "# (seconds), the waiting duplicates' share of a pool, the fix every log line names.",
        "POOL_EXHAUSTED = %s" % json.dumps(c["pool"]["problem"]),
        "POOL_EXHAUSTED_RESULT = %s" % json.dumps(c["pool"]["result"]),
        "POOL_EXHAUSTED_EVENT = %s" % json.dumps(c["pool"]["event"]),
        "POOL_WAIT = %r" % (c["pool"]["wait_ms"] / 1000.0),
        "POOL_DUPLICATES_SHARE = %r" % c["pool"]["duplicates_share"],
        "POOL_EXHAUSTED_FIX = %s" % json.dumps(c["pool"]["fix"]),
        "# How long Runner.check() waits for a server that does not answer yet",
        "# (seconds), and the SQLSTATEs it waits through ([client.startup]).",
        "STARTUP_WAIT = %r" % (c["startup"]["wait_ms"] / 1000.0),
        "STARTUP_RETRY_SQLSTATES = %r" % (tuple(c["startup"]["retry_sqlstates"]),),
        "# (SQLSTATE, the server's words) of a refused connection, which libpq gives without its code.",
        "CONNECT_MESSAGES = (",
    ] + ["    (%s, %s)," % (json.dumps(m["sqlstate"]), json.dumps(m["pattern"])) for m in p["connect_message"]] + [
        ")", ""]


NODE_EXPORTS = "MISSING_PRINCIPAL, POOL, STARTUP"


def node(p):
    """Constants of lib/protocol.js (exported as NODE_EXPORTS)."""
    c = p["client"]
    js = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    return [
        "// A guarded request without a principal: refused ([client.missing_principal]).",
        "const MISSING_PRINCIPAL = Object.freeze(%s);" % js({"problem": c["missing_principal"]["problem"],
                                                             "result": c["missing_principal"]["result"]}),
        "// An exhausted connection pool ([client.pool]): the answer's problem, its run",
        "// result and metrics event, how long a request waits for a connection (ms),",
        "// the waiting duplicates' share of a pool, the fix every log line names.",
        "const POOL = Object.freeze(%s);" % js({
            "problem": c["pool"]["problem"], "result": c["pool"]["result"], "event": c["pool"]["event"],
            "waitMs": c["pool"]["wait_ms"], "duplicatesShare": c["pool"]["duplicates_share"],
            "fix": c["pool"]["fix"]}),
        "// How long ready() waits for a server that does not answer yet (ms), and",
        "// the SQLSTATEs it waits through ([client.startup]).",
        "const STARTUP = Object.freeze(%s);" % js({"waitMs": c["startup"]["wait_ms"],
                                                   "retrySqlstates": c["startup"]["retry_sqlstates"]}),
        ""]


def _problem_case(p, name):
    """A problem's answer in every profile: statuses, type, Retry-After."""
    x = next(x for x in p["problem"] if x["name"] == name)
    return {"problem": name, "status": x["status"], "type": p["problems"]["base"] + x["slug"],
            "retry_after": x["retry_after"]}


def _principal_case(p, v):
    """A principal vector with what the client answers: a problem (and the
    run result it is counted as), or the run result of a handler that ran."""
    case = {"principal": v["principal"], "keys": v["keys"], "key_required": v.get("key_required", False)}
    refusal = p["client"]["missing_principal"]
    if v["answer"] == refusal["problem"]:
        case.update(_problem_case(p, refusal["problem"]), result=refusal["result"], handler_ran=False)
    else:
        case.update(result=v["answer"], handler_ran=True)
    return case


def conformance(p):
    """The entries of client/conformance/protocol.json the clients' limits tests run."""
    pool = p["client"]["pool"]
    return {
        "principal_vectors": [_principal_case(p, v) for v in p["principal_vector"]],
        "pool_exhausted": dict(_problem_case(p, pool["problem"]), result=pool["result"], event=pool["event"]),
    }


def docs(p):
    """The section "A client's own limits" of docs/reference/protocol.md."""
    c = p["client"]
    problems = {x["name"]: x for x in p["problem"]}
    L = ["## A client's own limits", "",
         "What every client answers when it cannot guard a request for a reason of its own",
         "(the [clients guide](../guides/clients.md#a-clients-own-limits) says more):", "",
         "- **A guarded request without a principal** (an `Idempotency-Key`, or a route that",
         "  requires one, and an empty or absent principal) is refused with `%s`, counted as" %
         problems[c["missing_principal"]["problem"]]["slug"],
         "  `%s`: never keyed on an empty principal, never run unguarded. A route without users" %
         c["missing_principal"]["result"],
         "  names its callers as one principal (a fixed string); a request without a key runs",
         "  as without pg_idem, whatever its principal.", "",
         "  | principal | Idempotency-Key fields | key required | answer |", "  |---|---|---|---|"]
    for v in p["principal_vector"]:
        L.append("  | %s | %s | %s | %s |" % (
            "`%s`" % v["principal"] if v["principal"] else "empty",
            ", ".join("`%s`" % k for k in v["keys"]) or "none", "yes" if v.get("key_required") else "no",
            "`%s`" % problems[v["answer"]]["slug"] if v["answer"] in problems else "runs (`%s`)" % v["answer"]))
    pool = c["pool"]
    L += ["",
          "- **An exhausted connection pool**: a request that gets no connection of the",
          "  service's pool in time (%d ms for a pool the client makes or can bound) is" % pool["wait_ms"],
          "  answered `%s` with `Retry-After`, counted as `%s` and as the event `%s`, and" % (
              problems[pool["problem"]]["slug"], pool["result"], pool["event"]),
          "  logged once per cause with the fix: %s. Never \"the server cannot be reached\"." % pool["fix"],
          "  Duplicates waiting for a first request hold at most %d%% of a pool whose size the" %
          round(pool["duplicates_share"] * 100),
          "  client knows, a connection at a time between wait slices.", "",
          "- **Start-up** (each client's documented start hook) refuses to start, saying what to",
          "  fix, for a role or database that does not exist, a refused login, the extension",
          "  missing or too old, a role without `EXECUTE` or without the schema on its path. A",
          "  server that does not answer yet (nothing listens, or SQLSTATE %s) is tried again" %
          " or ".join("`%s`" % x for x in c["startup"]["retry_sqlstates"]),
          "  for up to %d ms, then start-up is refused, naming the address." % c["startup"]["wait_ms"], ""]
    return L
