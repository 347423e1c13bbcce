#!/usr/bin/env python3
"""Generate every copy of pg_idem's protocol from protocol.toml.

    python3 extension/protocol/generate.py          write the generated files
    python3 extension/protocol/generate.py --check  exit 1, naming them, when
                                                     any is out of date

The extension's C (outcomes, SQLSTATEs, attempt transitions), the C++,
Python and Node protocol modules, the clients' conformance data, the
server's key-vector regression test and the reference page in docs/ all
come from the one file, so they cannot disagree.  Each generated file says
so in its first lines; edit protocol.toml and run `make protocol` instead.
"""

import hashlib
import json
import os
import struct
import sys
import tomllib

import limits
import messaging

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SOURCE = "extension/protocol/protocol.toml"
NOTE = "Generated from %s by extension/protocol/generate.py: do not edit." % SOURCE


def load():
    with open(os.path.join(ROOT, SOURCE), "rb") as f:
        p = tomllib.load(f)
    validate(p)
    return p


def fail(msg):
    sys.exit("protocol.toml: " + msg)


def cache_key(p, v):
    h = hashlib.sha256(p["key"]["domain"].encode())
    for field in p["key"]["fields"]:
        b = v[field].encode()
        h.update(struct.pack(">I", len(b)) + b)
    return h.hexdigest()


def validate(p):
    """The cross-references hold, and the vectors are what SHA-256 says."""
    problems = {x["name"] for x in p["problem"]}
    results = {x["name"] for x in p["client_outcome"]}
    profiles = p["problems"]["profiles"]
    seen = set()
    for o in p["outcome"]:
        if o["name"] in seen:
            fail("outcome %s twice" % o["name"])
        seen.add(o["name"])
        if o["role"] not in ("win", "follow", "lookup"):
            fail("outcome %s: role %s" % (o["name"], o["role"]))
        if o["client"] not in ("run", "replay", "answer", "wait", "claim"):
            fail("outcome %s: client %s" % (o["name"], o["client"]))
        if o["client"] in ("answer", "wait") and o.get("problem") not in problems:
            fail("outcome %s needs a known problem" % o["name"])
        if o["role"] != "lookup" and o.get("result") not in results:
            fail("outcome %s needs a known result" % o["name"])
        if o["role"] == "lookup" and o["counted"]:
            fail("outcome %s: lookup outcomes are not counted" % o["name"])
    for x in p["problem"]:
        if sorted(x["status"]) != sorted(profiles):
            fail("problem %s: a status per profile" % x["name"])
    for v in p["key_vector"]:
        if len(v["key"].encode()) > p["key"]["max_bytes"]:
            fail("key vector %r is too long" % v["key"])
        if cache_key(p, v) != v["cache_key"]:
            fail("key vector %r: cache_key is %s" % (v["key"], cache_key(p, v)))
    for v in p["request_hash_vector"]:
        if hashlib.sha256(v["body"].encode()).hexdigest() != v["request_hash"]:
            fail("request hash vector %r" % v["body"])
    states = {t["from"] for t in p["attempt_transition"]} | {t["to"] for t in p["attempt_transition"]}
    for s in states:
        split_state(s)
    validate_client(p)
    messaging.validate(p)


def validate_client(p):
    """The oldest extension is a released one, and the validation statuses
    are ones the storage rules would store (releasing them is the point)."""
    oldest = p["client"]["oldest_extension"]
    if not os.path.exists(os.path.join(ROOT, "extension", "releases", "pg_idem--%s.sql" % oldest)):
        fail("client.oldest_extension %s has no extension/releases/pg_idem--%s.sql" % (oldest, oldest))
    for s in p["client"]["validation_statuses"]:
        if classify_status(p, s) != "finalize":
            fail("client.validation_statuses: %d is not finalized by the storage rules" % s)
    limits.validate(p, fail)


def split_state(s):
    """"failed(reason)" -> ("failed", "reason"); "pending" -> ("pending", None)."""
    if "(" in s:
        status, reason = s[:-1].split("(")
        if not s.endswith(")") or status != "failed":
            fail("attempt state %s" % s)
        return status, reason
    return s, None


def storage_rules(p):
    out = []
    for r in p["storage_rule"]:
        if "statuses" in r:
            for s in r["statuses"]:
                out.append((s, s, r["action"]))
        else:
            out.append((r["from"], r["to"], r["action"]))
    return out


def classify_status(p, status):
    """The storage rules' action for an HTTP status."""
    for lo, hi, a in storage_rules(p):
        if lo <= status <= hi:
            return a
    return p["storage"]["default"]


def c_string(s):
    return json.dumps(s, ensure_ascii=False)


def upper(name):
    return name.upper()


# ---------------------------------------------------------------------------
# C
# ---------------------------------------------------------------------------

def gen_c_header(p):
    outcomes = p["outcome"]
    lines = [
        "/*-------------------------------------------------------------------------",
        " *",
        " * protocol.h",
        " *\t  Claim outcomes, the attempts' state machine, the inbox's answers and",
        " *\t  the outbox's nack outcomes (protocol.c).",
        " *",
        " * " + NOTE,
        " *",
        " *-------------------------------------------------------------------------",
        " */",
        "#ifndef IDEM_CORE_PROTOCOL_H",
        "#define IDEM_CORE_PROTOCOL_H",
        "",
        "/* Who answers a claim outcome: a winner, a follower, idem_lookup only. */",
        "typedef enum IdemRole",
        "{",
        "\tIDEM_ROLE_WIN,",
        "\tIDEM_ROLE_FOLLOW,",
        "\tIDEM_ROLE_LOOKUP",
        "} IdemRole;",
        "",
        "/*",
        " * X(ID, name, role, counted, carries the stored response), in the order",
        " * of protocol.toml; counted outcomes have an idem_stats counter.",
        " */",
        "#define IDEM_OUTCOMES(X) \\",
    ]
    for o in outcomes:
        lines.append("\tX(%s, %s, IDEM_ROLE_%s, %s, %s) \\" % (
            upper(o["name"]), o["name"], upper(o["role"]),
            "true" if o["counted"] else "false", "true" if o["response"] else "false"))
    lines[-1] = lines[-1][:-2]
    lines += [
        "",
        "/* The counted outcomes only: X(ID, name). */",
        "#define IDEM_COUNTED_OUTCOMES(X) \\",
    ]
    for o in outcomes:
        if o["counted"]:
            lines.append("\tX(%s, %s) \\" % (upper(o["name"]), o["name"]))
    lines[-1] = lines[-1][:-2]
    lines += [
        "",
        "/* The others: X(ID, name). */",
        "#define IDEM_UNCOUNTED_OUTCOMES(X) \\",
    ]
    for o in outcomes:
        if not o["counted"]:
            lines.append("\tX(%s, %s) \\" % (upper(o["name"]), o["name"]))
    lines[-1] = lines[-1][:-2]
    lines += [
        "",
        "typedef enum IdemOutcome",
        "{",
        "#define IDEM_OUTCOME_ENUM(id, name, role, counted, response) IDEM_OUTCOME_##id,",
        "\tIDEM_OUTCOMES(IDEM_OUTCOME_ENUM)",
        "#undef IDEM_OUTCOME_ENUM",
        "\tIDEM_NOUTCOMES",
        "} IdemOutcome;",
        "",
        "typedef struct IdemOutcomeInfo",
        "{",
        "\tconst char *name;",
        "\tIdemRole\trole;",
        "\tbool\t\tcounted;",
        "\tbool\t\tresponse;\t\t/* carries the stored response */",
        "} IdemOutcomeInfo;",
        "",
        "extern PGDLLIMPORT const IdemOutcomeInfo idem_outcomes[IDEM_NOUTCOMES];",
        "",
        "/* A legal move of an attempt; a NULL reason: the bare status. */",
        "typedef struct IdemAttemptTransition",
        "{",
        "\tconst char *from_status;",
        "\tconst char *from_reason;",
        "\tconst char *to_status;",
        "\tconst char *to_reason;",
        "\tbool\t\tnext_generation;\t/* a reopen: the move starts a new generation */",
        "} IdemAttemptTransition;",
        "",
        "#define IDEM_ATTEMPT_NTRANSITIONS %d" % len(p["attempt_transition"]),
        "extern PGDLLIMPORT const IdemAttemptTransition idem_attempt_transitions[IDEM_ATTEMPT_NTRANSITIONS];",
        "",
        "/* The legal moves in words, for IL005's hint. */",
        "#define IDEM_ATTEMPT_TRANSITIONS_TEXT %s" % c_string(", ".join(
            "%s -> %s" % (t["from"], t["to"]) for t in p["attempt_transition"])),
        "",
    ] + messaging.c_header(p) + [
        "#endif\t\t\t\t\t\t\t/* IDEM_CORE_PROTOCOL_H */",
        "",
    ]
    return "\n".join(lines)


def gen_c_source(p):
    lines = [
        "/*-------------------------------------------------------------------------",
        " *",
        " * protocol.c",
        " *\t  The tables of protocol.h.",
        " *",
        " * " + NOTE,
        " *",
        " *-------------------------------------------------------------------------",
        " */",
        '#include "postgres.h"',
        "",
        '#include "core/protocol.h"',
        "",
        "const IdemOutcomeInfo idem_outcomes[IDEM_NOUTCOMES] = {",
        "#define IDEM_OUTCOME_INFO(id, name, role, counted, response) \\",
        "\t[IDEM_OUTCOME_##id] = {#name, role, counted, response},",
        "\tIDEM_OUTCOMES(IDEM_OUTCOME_INFO)",
        "#undef IDEM_OUTCOME_INFO",
        "};",
        "",
        "const IdemAttemptTransition idem_attempt_transitions[IDEM_ATTEMPT_NTRANSITIONS] = {",
    ]
    for t in p["attempt_transition"]:
        fs, fr = split_state(t["from"])
        ts, tr = split_state(t["to"])
        lines.append("\t{%s, %s, %s, %s, %s},\t/* %s */" % (
            c_string(fs), c_string(fr) if fr else "NULL", c_string(ts),
            c_string(tr) if tr else "NULL", "true" if t.get("next_generation") else "false",
            t["by"].replace("*/", "* /")))
    lines += ["};", ""] + messaging.c_source(p)
    return "\n".join(lines)


def gen_c_errors(p):
    lines = [
        "/*-------------------------------------------------------------------------",
        " *",
        " * errors.h",
        " *\t  pg_idem's own SQLSTATEs.  Class \"IL\" is implementation-defined (the",
        " *\t  SQL standard reserves classes starting with 0-4 and A-H).",
        " *",
        " * " + NOTE,
        " *",
        " *-------------------------------------------------------------------------",
        " */",
        "#ifndef IDEM_CORE_ERRORS_H",
        "#define IDEM_CORE_ERRORS_H",
        "",
        '#include "utils/elog.h"',
        "",
    ]
    for s in p["sqlstate"]:
        c = s["code"]
        lines.append("/* %s */" % s["raised"].replace("*/", "* /"))
        lines.append("#define ERRCODE_IDEM_%s MAKE_SQLSTATE(%s)" % (
            upper(s["name"]), ",".join("'%s'" % ch for ch in c)))
    lines += ["", "#endif\t\t\t\t\t\t\t/* IDEM_CORE_ERRORS_H */", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The clients
# ---------------------------------------------------------------------------

def gen_cpp(p):
    profiles = p["problems"]["profiles"]
    L = [
        "// pg_idem C++ client: the protocol, generated.",
        "// " + NOTE,
        "#pragma once",
        "",
        "#include <array>",
        "#include <chrono>",
        "#include <cstddef>",
        "#include <string_view>",
        "",
        "namespace idem {",
        "",
        "// What a run reports (run_result::outcome), also its metrics label.",
        "enum class outcome",
        "{",
    ]
    for o in p["client_outcome"]:
        L.append("    %s,  // %s" % (o["name"], o["when"]))
    L += ["};", "", "// The HTTP status profiles.", "enum class status_profile", "{"]
    for pr in profiles:
        L.append("    %s," % pr)
    L += ["};", "", "// What is wrong with a request's Idempotency-Key, if anything.", "enum class key_status", "{"]
    for k in p["key_status"]:
        L.append("    %s," % k["name"])
    L += ["};", "", "// What the winner does with its handler's response.", "enum class storage_action", "{"]
    for a in ("finalize", "release", "fail"):
        L.append("    %s," % a)
    L += ["};", ""] + messaging.cpp_types(p)
    L += ["namespace protocol {", "",
          "inline constexpr std::string_view key_domain = %s;" % c_string(p["key"]["domain"]),
          "inline constexpr std::size_t max_key_bytes = %d;" % p["key"]["max_bytes"],
          "inline constexpr std::string_view problem_base = %s;" % c_string(p["problems"]["base"]),
          "// How many idem::outcome values there are (an array of counters per outcome).",
          "inline constexpr std::size_t outcome_count = %d;" % len(p["client_outcome"]),
          "// The oldest extension the runner works with (idem::oldest_extension).",
          "inline constexpr std::string_view oldest_extension = %s;" % c_string(p["client"]["oldest_extension"]),
          "// A handler's validation failures: released, not stored, unless",
          "// config::client_errors() is client_errors::store.",
          "inline constexpr std::array<int, %d> validation_statuses = {{%s}};" % (
              len(p["client"]["validation_statuses"]),
              ", ".join(str(s) for s in p["client"]["validation_statuses"])),
          "",
          "inline constexpr bool is_validation_status(int http_status) noexcept",
          "{",
          "    for (int s : validation_statuses)",
          "        if (s == http_status)",
          "            return true;",
          "    return false;",
          "}",
          "",
          "// Problems a client answers instead of running the handler.",
          "enum class problem", "{"]
    for x in p["problem"]:
        L.append("    %s," % x["name"])
    L += ["};", "",
          "struct problem_info",
          "{",
          "    std::string_view slug;",
          "    std::string_view title;",
          "    std::string_view detail;  // {key_status}, {limit}: filled in by the caller",
          "    std::array<int, %d> status;  // per status_profile" % len(profiles),
          "    bool retry_after;",
          "};",
          "",
          "inline constexpr std::array<problem_info, %d> problems = {{" % len(p["problem"])]
    for x in p["problem"]:
        L.append("    {%s, %s, %s, {%s}, %s}," % (
            c_string(x["slug"]), c_string(x["title"]), c_string(x["detail"]),
            ", ".join(str(x["status"][pr]) for pr in profiles), "true" if x["retry_after"] else "false"))
    L += ["}};", "",
          "inline constexpr const problem_info &info(problem p) noexcept",
          "{",
          "    return problems[static_cast<std::size_t>(p)];",
          "}",
          "",
          "inline constexpr int status(problem p, status_profile profile) noexcept",
          "{",
          "    return info(p).status[static_cast<std::size_t>(profile)];",
          "}",
          "",
          "// The server's claim outcomes (the outcome column of idem_claim and idem_lookup).",
          "enum class server_outcome", "{"]
    for o in p["outcome"]:
        L.append("    %s," % o["name"])
    L += ["    unknown,  // not one of the above: a newer server; treated as an error", "};", "",
          "// What a client does with a server outcome.",
          "enum class action", "{", "    run,", "    replay,", "    answer,", "    wait,", "    claim,", "};", "",
          "struct outcome_info",
          "{",
          "    std::string_view name;",
          "    action what;",
          "    problem answer;   // answer, and wait once the budget ends",
          "    bool has_problem;",
          "    outcome result;",
          "};",
          "",
          "inline constexpr std::array<outcome_info, %d> outcomes = {{" % len(p["outcome"])]
    for o in p["outcome"]:
        pb = o.get("problem")
        L.append("    {%s, action::%s, problem::%s, %s, outcome::%s}," % (
            c_string(o["name"]), o["client"], pb or p["problem"][0]["name"],
            "true" if pb else "false", o.get("result", "failed")))
    L += ["}};", "",
          *limits.cpp(p),
          "",
          "inline server_outcome parse_server_outcome(std::string_view name) noexcept",
          "{",
          "    for (std::size_t i = 0; i < outcomes.size(); ++i)",
          "        if (outcomes[i].name == name)",
          "            return static_cast<server_outcome>(i);",
          "    return server_outcome::unknown;",
          "}",
          "",
          "inline constexpr const outcome_info &info(server_outcome o) noexcept",
          "{",
          "    return outcomes[static_cast<std::size_t>(o)];",
          "}",
          "",
          "inline constexpr std::string_view name(outcome o) noexcept",
          "{",
          "    switch (o)",
          "    {"]
    for o in p["client_outcome"]:
        L.append("    case outcome::%s:" % o["name"])
        L.append("        return %s;" % c_string(o["name"]))
    L += ["    }", "    return \"unknown\";", "}", "",
          "inline constexpr std::string_view describe(key_status s) noexcept",
          "{",
          "    switch (s)",
          "    {"]
    for k in p["key_status"]:
        L.append("    case key_status::%s:" % k["name"])
        L.append("        return %s;" % c_string(k["description"]))
    L += ["    }", "    return \"\";", "}", "",
          "inline constexpr storage_action classify(int http_status) noexcept",
          "{"]
    for lo, hi, a in storage_rules(p):
        if lo == hi:
            L.append("    if (http_status == %d)" % lo)
        else:
            L.append("    if (http_status >= %d && http_status <= %d)" % (lo, hi))
        L.append("        return storage_action::%s;" % a)
    L += ["    return storage_action::%s;" % p["storage"]["default"], "}", ""] + messaging.cpp_protocol(p)
    L += ["}  // namespace protocol", "}  // namespace idem", ""]
    return "\n".join(L)


def gen_python(p):
    profiles = p["problems"]["profiles"]
    L = ['"""pg_idem\'s protocol: outcomes, problems, status classes and key statuses.', "",
         NOTE, '"""', "",
         "import collections", "import enum", "",
         "KEY_DOMAIN = %s" % json.dumps(p["key"]["domain"]),
         "MAX_KEY_BYTES = %d" % p["key"]["max_bytes"],
         "PROBLEM_BASE = %s" % json.dumps(p["problems"]["base"]),
         "PROFILES = %r" % (tuple(profiles),), "",
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
          "    return STORAGE_DEFAULT", ""] + messaging.python(p) + [""]
    return "\n".join(L)


def gen_node(p):
    profiles = p["problems"]["profiles"]
    js = lambda v: json.dumps(v, ensure_ascii=False)
    L = ["'use strict';", "// pg_idem's protocol: outcomes, problems, status classes and key statuses.",
         "// " + NOTE, "",
         "const KEY_DOMAIN = %s;" % js(p["key"]["domain"]),
         "const MAX_KEY_BYTES = %d;" % p["key"]["max_bytes"],
         "const PROBLEM_BASE = %s;" % js(p["problems"]["base"]),
         "const PROFILES = Object.freeze(%s);" % js(profiles), "",
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
          "}", ""] + messaging.node(p) + [
          "module.exports = {",
          "  KEY_DOMAIN, MAX_KEY_BYTES, PROBLEM_BASE, PROFILES, OLDEST_EXTENSION, VALIDATION_STATUSES,",
          "  %s," % limits.NODE_EXPORTS,
          "  FINALIZE, RELEASE, FAIL, KeyStatus,",
          "  KEY_STATUS_DESCRIPTIONS, CLIENT_OUTCOMES, PROBLEMS, OUTCOMES, STORAGE_RULES, STORAGE_DEFAULT,",
          "  SQLSTATES, classify,",
          "  " + messaging.NODE_EXPORTS + ",",
          "};", ""]
    return "\n".join(L)


# ---------------------------------------------------------------------------
# Conformance data, the server's vector test, the reference page
# ---------------------------------------------------------------------------

def gen_conformance(p):
    """What every client must answer for every server outcome, per profile."""
    profiles = p["problems"]["profiles"]
    problems = {x["name"]: x for x in p["problem"]}
    cases = []
    for o in p["outcome"]:
        for pr in profiles:
            case = {"outcome": o["name"], "profile": pr, "action": o["client"]}
            if o.get("problem"):
                x = problems[o["problem"]]
                case["status"] = x["status"][pr]
                case["type"] = p["problems"]["base"] + x["slug"]
                case["retry_after"] = x["retry_after"]
            if o.get("result"):
                case["result"] = o["result"]
            cases.append(case)
    storage = []
    for s in (100, 101, 200, 201, 204, 299, 301, 304, 400, 401, 403, 404, 405, 408, 409, 410,
              422, 429, 499, 500, 502, 503, 599, 600, 0, -1):
        storage.append({"status": s, "action": classify_status(p, s)})
    doc = {
        "note": NOTE,
        "outcomes": cases,
        "storage": storage,
        "key_vectors": [{k: v[k] for k in ("principal", "method", "target", "key", "cache_key")}
                        for v in p["key_vector"]],
        "request_hash_vectors": p["request_hash_vector"],
        "key_statuses": {k["name"]: k["description"] for k in p["key_status"]},
        "client": {"oldest_extension": p["client"]["oldest_extension"],
                   "validation_statuses": p["client"]["validation_statuses"]},
        **limits.conformance(p),
        "messaging": messaging.conformance(p),
    }
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def sql_literal(s):
    return "'" + s.replace("'", "''") + "'"


def gen_sql_vectors(p):
    L = ["-- The server's idem_key() and idem_request_hash() against the protocol's test",
         "-- vectors (the clients' suites check the same ones).",
         "-- " + NOTE,
         "SELECT left(v.key, 40) AS key, encode(idem_key(v.principal, v.method, v.target, v.key), 'hex') = v.cache_key AS same",
         "  FROM (VALUES"]
    rows = []
    for v in p["key_vector"]:
        rows.append("    (%s, %s, %s, %s, %s)" % tuple(sql_literal(v[k]) for k in (
            "principal", "method", "target", "key", "cache_key")))
    L.append(",\n".join(rows))
    L += ["  ) AS v(principal, method, target, key, cache_key)", " ORDER BY 1;",
          "SELECT v.body, encode(idem_request_hash(convert_to(v.body, 'UTF8')), 'hex') = v.request_hash AS same",
          "  FROM (VALUES"]
    rows = ["    (%s, %s)" % (sql_literal(v["body"]), sql_literal(v["request_hash"])) for v in p["request_hash_vector"]]
    L.append(",\n".join(rows))
    L += ["  ) AS v(body, request_hash)", " ORDER BY 1;", ""]
    return "\n".join(L)


def gen_docs(p):
    profiles = p["problems"]["profiles"]
    problems = {x["name"]: x for x in p["problem"]}
    L = ["# Protocol reference", "", "<!-- " + NOTE + " -->", "",
         "Everything on this page comes from [`%s`](../../%s), the one" % (SOURCE, SOURCE),
         "description of the protocol from which the extension and the three clients",
         "are generated.", "",
         "## Claim outcomes", "",
         "The `outcome` column of `idem_claim`, `idem_begin` and `idem_lookup`, and what every",
         "client does with it (the HTTP status in the `%s` profile, then `%s`)." % tuple(profiles[:2]), "",
         "| outcome | who | when | the client | answer | run result |",
         "|---|---|---|---|---|---|"]
    verbs = {"run": "runs the handler", "replay": "replays the stored response",
             "answer": "answers", "wait": "waits for the winner, then answers", "claim": "claims the key"}
    for o in p["outcome"]:
        ans = ""
        if o.get("problem"):
            x = problems[o["problem"]]
            ans = "%s `%s`%s" % ("/".join(str(x["status"][pr]) for pr in profiles), x["slug"],
                                 " + `Retry-After`" if x["retry_after"] else "")
        L.append("| `%s` | %s | %s | %s | %s | %s |" % (
            o["name"], o["role"], o["when"], verbs[o["client"]], ans,
            "`%s`" % o["result"] if o.get("result") else ""))
    L += ["", "Counted in `idem_stats` (one row per outcome of the same name): " +
          ", ".join("`%s`" % o["name"] for o in p["outcome"] if o["counted"]) + ".", "",
          "## Problems", "",
          "RFC 9457 `application/problem+json`; `type` is `%s` + the slug." % p["problems"]["base"], "",
          "| problem | " + " | ".join(profiles) + " | title | detail | Retry-After |",
          "|---|" + "---|" * len(profiles) + "---|---|---|"]
    for x in p["problem"]:
        L.append("| `%s` | %s | %s | %s | %s |" % (
            x["slug"], " | ".join(str(x["status"][pr]) for pr in profiles), x["title"],
            x["detail"].replace("{key_status}", "(what is wrong with the key)").replace("{limit}", "*limit*"),
            "yes" if x["retry_after"] else ""))
    L += ["", "## Storing a handler's response", "",
          "By HTTP status; the first rule that matches decides.", "",
          "| status | action |", "|---|---|"]
    for r in p["storage_rule"]:
        st = ", ".join(str(s) for s in r["statuses"]) if "statuses" in r else "%d–%d" % (r["from"], r["to"])
        L.append("| %s | %s |" % (st, r["action"]))
    L += ["| anything else | %s |" % p["storage"]["default"], "",
          "`finalize`: stored and replayed to every retry. `release`: not stored, the key is free at once.",
          "`fail`: not stored, the key cools down for `idem.failure_cooldown`.", "",
          "By default the three clients release a handler's validation failures, " +
          ", ".join(str(s) for s in p["client"]["validation_statuses"]) +
          " (as Stripe does: the corrected request with the same key runs; in the fenced and",
          "in-transaction modes the handler's writes commit, as for any released status). Each has",
          "an option to store them as the rules say: Python's `client_errors = \"store\"`, Node's",
          "`storeClientErrors: true`, C++'s `client_errors(idem::client_errors::store)`.", "",
          *limits.docs(p),
          "## Extension versions", "",
          "Each client's first-use check refuses an extension older than %s, the first with" %
          p["client"]["oldest_extension"],
          "a scope per role, the wait in the server (`max_wait`) and the `expired` outcome.",
          "Through a PL/Proxy router, which has no extension, the version is not checked",
          "(see [Sharding](../guides/sharding.md)).", "",
          "## Client run results", "", "| result | when |", "|---|---|"]
    for o in p["client_outcome"]:
        L.append("| `%s` | %s |" % (o["name"], o["when"]))
    L += ["", "## Idempotency-Key statuses", "",
          "Keys are at most %d bytes of UTF-8 without NUL." % p["key"]["max_bytes"], "",
          "| status | detail |", "|---|---|"]
    for k in p["key_status"]:
        L.append("| `%s` | %s |" % (k["name"], k["description"]))
    L += ["", "## SQLSTATEs", "", "| SQLSTATE | name | raised by |", "|---|---|---|"]
    for s in p["sqlstate"]:
        L.append("| `%s` | %s | %s |" % (s["code"], s["name"], s["raised"]))
    L += ["", "## Attempt transitions", "",
          "Every other move raises `IL005`. A transition that expected a state and found one",
          "that follows it in the same generation lost a race (the function returns false).", "",
          "| from | to | by |", "|---|---|---|"]
    for t in p["attempt_transition"]:
        L.append("| `%s` | `%s`%s | %s |" % (t["from"], t["to"],
                                            " (next generation)" if t.get("next_generation") else "", t["by"]))
    L.append("")
    return "\n".join(L + messaging.docs(p))


OUTPUTS = [
    ("extension/core/protocol.h", gen_c_header),
    ("extension/core/protocol.c", gen_c_source),
    ("extension/core/errors.h", gen_c_errors),
    ("client/cpp/include/idem/protocol.hpp", gen_cpp),
    ("client/python/pg_idem/protocol.py", gen_python),
    ("client/node/lib/protocol.js", gen_node),
    ("client/conformance/protocol.json", gen_conformance),
    ("sql/key_vectors.sql", gen_sql_vectors),
    ("docs/reference/protocol.md", gen_docs),
]


def check_install_sql(p):
    """The attempts table's CHECKs list the protocol's statuses and reasons."""
    import re
    path = "extension/install/60_attempts.sql"
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        sql = f.read()
    states = [split_state(t[k]) for t in p["attempt_transition"] for k in ("from", "to")]
    want = {"idem_attempts_status": {s for s, _ in states},
            "idem_attempts_failure_reason": {r for _, r in states if r}}
    bad = []
    for name, values in want.items():
        m = re.search(name + r" CHECK.*?ARRAY\s*\[([^\]]*)\]", sql, re.S)
        found = set(re.findall(r"'([a-z_]+)'", m.group(1))) if m else set()
        if found != values:
            bad.append("%s: constraint %s lists %s, the protocol %s" % (
                path, name, sorted(found), sorted(values)))
    return bad


def main():
    check = "--check" in sys.argv[1:]
    p = load()
    mismatches = check_install_sql(p) + messaging.check_install(p, ROOT)
    if mismatches:
        print("\n".join(mismatches), file=sys.stderr)
        return 1
    stale = []
    for path, gen in OUTPUTS:
        text = gen(p)
        full = os.path.join(ROOT, path)
        try:
            with open(full, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current == text:
            continue
        if check:
            stale.append(path)
        else:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
            print("wrote", path)
    if stale:
        print("out of date (run `make protocol`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
