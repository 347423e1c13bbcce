"""The C++ client's idem/protocol.hpp (with limits.py's and messaging.py's parts)."""

import limits
import messaging
from model import NOTE, attempt_states, c_string, storage_rules


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
        "#include <string>",
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
    for old, new in p["problems"].get("deprecated_profiles", {}).items():
        L.append("    %s [[deprecated(\"%s is %s; the old name goes in %s\")]] = %s," % (
            old, old, new["profile"], new["until"], new["profile"]))
    L += ["};", "", "// The claim's lifecycle events, any number per run (metrics::on_event).",
          "enum class event", "{"]
    for e in p["event"]:
        L.append("    %s,  // %s" % (e["name"], e["when"]))
    L += ["};", "", "// What is wrong with a request's Idempotency-Key, if anything.", "enum class key_status", "{"]
    for k in p["key_status"]:
        L.append("    %s," % k["name"])
    L += ["};", "", "// What the winner does with its handler's response.", "enum class storage_action", "{"]
    for a in ("finalize", "release", "fail"):
        L.append("    %s," % a)
    L += ["};", ""] + messaging.cpp_types(p) + cpp_protocol_tables(p)
    return "\n".join(L)


def cpp_protocol_tables(p):
    """namespace idem::protocol: the problems, the server's outcomes, the
    storage rules and what the clients decide alike."""
    profiles = p["problems"]["profiles"]
    L = ["namespace protocol {", "",
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
    L += ["}};", "", *limits.cpp(p), "",
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
    L += ["    return storage_action::%s;" % p["storage"]["default"], "}", ""]
    L += cpp_client_rules(p) + messaging.cpp_protocol(p)
    L += ["}  // namespace protocol", "}  // namespace idem", ""]
    return L


def cpp_strings(name, values, comment):
    return ["// " + comment,
            "inline constexpr std::array<std::string_view, %d> %s = {{%s}};" % (
                len(values), name, ", ".join(c_string(v) for v in values)), ""]


def cpp_client_rules(p):
    """What the runner decides as the other clients do: the events' names,
    the namespace, its defaults, the replay headers, the metrics, and the
    attempts' statuses the reconciler reads back from the server."""
    d, lim = p["client"]["defaults"], p["client"]["limits"]
    rh, m = p["replay_headers"], p["metrics"]
    ms = lambda v: "std::chrono::milliseconds{%d}" % v
    L = ["inline constexpr std::size_t event_count = %d;" % len(p["event"]), "",
         "inline constexpr std::string_view name(event e) noexcept", "{", "    switch (e)", "    {"]
    for e in p["event"]:
        L += ["    case event::%s:" % e["name"], "        return %s;" % c_string(e["name"])]
    L += ["    }", "    return \"unknown\";", "}", "",
          "// A namespace goes before the target: " + c_string(p["key"]["namespace"]["separator"]) +
          " between (an empty namespace is none).",
          "inline std::string namespaced_target(std::string_view ns, std::string_view target)", "{",
          "    if (ns.empty())", "        return std::string(target);",
          "    std::string out(ns);", "    out += %s;" % c_string(p["key"]["namespace"]["separator"]),
          "    out += target;", "    return out;", "}", "",
          "// What config() is when the builder is told nothing.", "namespace defaults {",
          "inline constexpr std::chrono::milliseconds lease = %s;" % ms(d["lease_ms"]),
          "inline constexpr int renew_divisor = %d;  // renew_interval = lease / renew_divisor" % d["renew_divisor"],
          "inline constexpr std::chrono::milliseconds follower_wait_budget = %s;" % ms(d["follower_wait_budget_ms"]),
          "inline constexpr std::chrono::milliseconds poll_min = %s;" % ms(d["poll_min_ms"]),
          "inline constexpr std::chrono::milliseconds poll_max = %s;" % ms(d["poll_max_ms"]),
          "inline constexpr double poll_jitter = %r;" % d["poll_jitter"],
          "inline constexpr std::chrono::milliseconds retry_after = %s;" % ms(d["retry_after_ms"]),
          "inline constexpr std::chrono::milliseconds failure_cooldown = %s;" % ms(d["failure_cooldown_ms"]),
          "inline constexpr std::size_t max_request_body_bytes = %d;" % d["max_request_body_bytes"],
          "inline constexpr std::size_t max_cacheable_response_bytes = %d;" % d["max_cacheable_response_bytes"],
          "inline constexpr unsigned max_iterations = %d;" % d["max_iterations"],
          "inline constexpr unsigned transaction_attempts = %d;" % d["transaction_attempts"],
          "inline constexpr status_profile profile = status_profile::%s;" % d["profile"],
          "inline constexpr std::string_view client_errors = %s;" % c_string(d["client_errors"]),
          "inline constexpr std::chrono::milliseconds pooled_wait_slice = %s;" % ms(d["pooled_wait_slice_ms"]),
          "}  // namespace defaults", "",
          "// What a configuration may not be.", "namespace limits {",
          "inline constexpr std::chrono::milliseconds min_lease = %s;" % ms(lim["min_lease_ms"]),
          "inline constexpr std::chrono::milliseconds max_lease = %s;" % ms(lim["max_lease_ms"]),
          "}  // namespace limits", "",
          "// The header a replayed answer carries (value \"true\").",
          "inline constexpr std::string_view replayed_header = %s;" % c_string(rh["replayed_header"]), ""]
    L += cpp_strings("default_replay_headers", rh["default"], "Response headers kept for replay unless configured otherwise.")
    L += cpp_strings("never_stored_headers", rh["never_stored"], "Never stored, whatever the configuration says.")
    L += cpp_strings("never_stored_header_parts", rh["never_stored_parts"],
                     "Nor a header whose lower-case name contains one of these.")
    L += ["// The metrics' series (a Prometheus counter's exported name adds _total).", "namespace series {"]
    for k in ("requests", "events"):
        L += ["inline constexpr std::string_view %s_name = %s;" % (k, c_string(m[k]["name"])),
              "inline constexpr std::string_view %s_help = %s;" % (k, c_string(m[k]["help"])),
              "inline constexpr std::string_view %s_label = %s;" % (k, c_string(m[k]["label"]))]
    statuses, reasons = attempt_states(p)
    L += ["}  // namespace series", "", "// idem_attempts' statuses and failure reasons.", "namespace attempt {"]
    for x in statuses:
        L.append("inline constexpr std::string_view %s = %s;" % (x, c_string(x)))
    for x in reasons:
        L.append("inline constexpr std::string_view %s = %s;" % (x, c_string(x)))
    L += ["}  // namespace attempt", ""]
    return L
