"""The extension's C: outcomes, SQLSTATEs, attempt transitions, row states,
the inbox's answers and the nack outcomes (messaging.py)."""

import messaging
from model import NOTE, attempt_states, c_string, row_tables, split_state, upper


def gen_c_header(p):
    outcomes = p["outcome"]
    lines = [
        "/*-------------------------------------------------------------------------",
        " *",
        " * protocol.h",
        " *\t  Claim outcomes, the attempts' state machine, the rows' states, the",
        " *\t  inbox's answers and the outbox's nack outcomes (protocol.c).",
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
    ] + c_state_names(p) + messaging.c_header(p) + [
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
    lines += ["};", ""]
    for r in p["row_states"]:
        lines += ["const char *const idem_%s_state_names[IDEM_%s_NSTATES] = {" % (r["name"], upper(r["name"]))]
        for x in r["state"]:
            lines.append("\t[IDEM_%s_%s] = IDEM_%s_%s_NAME," % (
                upper(r["name"]), upper(x["name"]), upper(r["name"]), upper(x["name"])))
        lines += ["};", ""]
    return "\n".join(lines + messaging.c_source(p))


def c_state_names(p):
    """The rows' states, the backlog's states and the attempts' statuses:
    an enum per table, and every name as a string constant for C and for
    the SQL texts built from it ("... state = '" IDEM_OUTBOX_PENDING_NAME "'")."""
    L = ["/*",
         " * The states of pg_idem's rows ([[row_states]]): the install script's",
         " * CHECK constraints and partial indexes name the same (checked by",
         " * generate.py and sql/protocol_states.sql).",
         " */",
         "",
         "/* A name below as an SQL literal, for the statements built from it. */",
         "#define IDEM_SQL(name) \"'\" name \"'\""]
    for r in p["row_states"]:
        T = upper(r["name"])
        L += ["", "/* %s.state */" % ", ".join(row_tables(r)),
              "typedef enum Idem%sState" % r["name"].capitalize(), "{"]
        for x in r["state"]:
            L.append("\tIDEM_%s_%s,\t\t/* %s */" % (T, upper(x["name"]), x["when"].replace("*/", "* /")))
        L += ["\tIDEM_%s_NSTATES" % T, "} Idem%sState;" % r["name"].capitalize(), ""]
        for x in r["state"]:
            L.append("#define IDEM_%s_%s_NAME %s" % (T, upper(x["name"]), c_string(x["name"])))
        L.append("extern PGDLLIMPORT const char *const idem_%s_state_names[IDEM_%s_NSTATES];" % (r["name"], T))
    L += ["", "/* idem_outbox_backlog's states. */"]
    for x in p["outbox_backlog_state"]:
        L.append("#define IDEM_OUTBOX_BACKLOG_%s %s" % (upper(x["name"]), c_string(x["name"])))
    statuses, reasons = attempt_states(p)
    L += ["", "/* idem_attempts.status and .failure_reason. */"]
    for x in statuses:
        L.append("#define IDEM_ATTEMPT_%s %s" % (upper(x), c_string(x)))
    for x in reasons:
        L.append("#define IDEM_ATTEMPT_REASON_%s %s" % (upper(x), c_string(x)))
    return L + [""]


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
