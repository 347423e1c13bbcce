"""docs/reference/protocol.md."""

import limits
import messaging
from model import NOTE, SOURCE, cache_key, namespaced, row_tables


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
          "Each client's first-use check refuses an extension older than %s, with the fix" %
          p["client"]["oldest_extension"],
          "(`ALTER EXTENSION pg_idem UPDATE`): the first with a scope per role, the wait in the",
          "server (`max_wait`) and the `expired` outcome. From 0.6.0 on `idem_claim`, `idem_begin`",
          "and `idem_renew` take `lock_wait` ([Functions](functions.md#lock_wait)): the clients",
          "pass it where the server has it, and against older versions set `lock_timeout` around",
          "the call, as they did up to 0.5.0 (that form goes when the oldest accepted version",
          "reaches 0.6.0). Through a PL/Proxy router, which has no extension, the version is not",
          "checked, and the form is the router's: the clients pass `lock_wait` when the router",
          "has the five-argument `idem_claim` (see [Sharding](../guides/sharding.md)).", ""]
    L += docs_client_rules(p)
    L += ["## Client run results", "", "| result | when |", "|---|---|"]
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
    L += docs_row_states(p) + messaging.docs(p)
    return "\n".join(L)


def docs_client_rules(p):
    """The profiles' names, the namespace, the defaults, the replay headers, the metrics."""
    d, lim, rh, m = p["client"]["defaults"], p["client"]["limits"], p["replay_headers"], p["metrics"]
    sep = p["key"]["namespace"]["separator"]
    L = ["## Status profiles", "",
         "%s (the default: the IETF Idempotency-Key draft's statuses) and `%s` (409 for every" % (
             "`%s`" % p["problems"]["profiles"][0], p["problems"]["profiles"][1]),
         "refusal of a key, 503 for every answer to retry); the statuses per problem are in",
         "[Problems](#problems)."]
    for old, new in p["problems"].get("deprecated_profiles", {}).items():
        L.append("`%s` is an old name of `%s`, accepted with a warning until %s." % (old, new["profile"], new["until"]))
    L += ["", "## The namespace", "",
          "A client's namespace (a service's name, no spaces) is part of every cache key: it goes",
          "before the target, with %s between, so `payments` and `/orders` make the target" % (
              "one space" if sep == " " else "`%s`" % sep),
          "`%s`. In SQL, the key of Alice's `POST /payments` with key `k-1` to the service" %
          namespaced(p, "payments", "/orders"),
          "`payments`, as the clients compute it:", "",
          "<!-- example: sql app -->", "```sql",
          "SELECT encode(idem_key('alice', 'POST', '%s', 'k-1'), 'hex') AS cache_key \\gset" %
          namespaced(p, "payments", "/payments"),
          "\\echo :cache_key", "--  " + cache_key(p, {"principal": "alice", "method": "POST", "key": "k-1",
                                                      "target": namespaced(p, "payments", "/payments")}),
          "```", "",
          "## Client defaults", "",
          "What each client's configuration is when it says nothing (Python's `Config` takes",
          "seconds, Node's and C++'s milliseconds).", "",
          "| setting | default |", "|---|---|"]
    for k, v in d.items():
        L.append("| `%s` | %s |" % (k, "`%s`" % v if isinstance(v, str) else v))
    L += ["", "Refused in any client: a lease under %d ms or over %d ms; `client_errors` other than %s." % (
        lim["min_lease_ms"], lim["max_lease_ms"], " or ".join("`%s`" % x for x in lim["client_errors"])), "",
          "## Replay headers", "",
          "A replayed answer carries `%s: true`. Stored with the response by default: %s." % (
              rh["replayed_header"], ", ".join("`%s`" % h for h in rh["default"])),
          "A configuration may add others, but never %s, nor a header whose lower-case name" % (
              ", ".join("`%s`" % h for h in rh["never_stored"])),
          "contains %s: a replay to another caller must not hand out this caller's" % (
              ", ".join("`%s`" % h for h in rh["never_stored_parts"])),
          "credentials or session.", "",
          "## Client metrics", "",
          "The same Prometheus counters in every client, every label value from zero:", "",
          "| series | label | counts |", "|---|---|---|",
          "| `%s_total` | `%s` | %s: the [run results](#client-run-results) |" % (
              m["requests"]["name"], m["requests"]["label"], m["requests"]["help"].rstrip(".")),
          "| `%s_total` | `%s` | %s |" % (m["events"]["name"], m["events"]["label"], m["events"]["help"]),
          "| `%s_total` | `%s` | %s: the [consumer results](#inbox-consumer-results) |" % (
              m["inbox"]["name"], m["inbox"]["label"], m["inbox"]["help"].rstrip(".")),
          "| `%s_total` | `%s` | %s: the [relay counts](#relay-counts) |" % (
              m["relay"]["name"], m["relay"]["label"], m["relay"]["help"].rstrip(".")), "",
          "| event | when |", "|---|---|"]
    for e in p["event"]:
        L.append("| `%s` | %s |" % (e["name"], e["when"]))
    return L + [""]


def docs_row_states(p):
    """The states of the tables' rows and of the outbox's backlog."""
    L = ["", "## Row states", "",
         "The `state` column of pg_idem's tables (the install script's CHECK constraints and partial",
         "indexes name the same; `sql/protocol_states.sql` checks a fresh catalog against this list)."]
    for r in p["row_states"]:
        L += ["", "%s:" % ", ".join("`%s`" % t for t in row_tables(r)), "", "| state | when |", "|---|---|"]
        for x in r["state"]:
            L.append("| `%s` | %s |" % (x["name"], x["when"]))
    L += ["", "`idem_outbox_backlog`'s state:", "", "| state | when |", "|---|---|"]
    for x in p["outbox_backlog_state"]:
        L.append("| `%s` | %s |" % (x["name"], x["when"]))
    return L + [""]
