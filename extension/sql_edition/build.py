#!/usr/bin/env python3
"""Assemble pg_idem's SQL edition from the C edition's install pieces.

    python3 extension/sql_edition/build.py plain OUT   a script for psql -f (-v schema=...)
    python3 extension/sql_edition/build.py tle OUT     a pg_tle installer (pgtle.install_extension)
    python3 extension/sql_edition/build.py script OUT  the extension script itself (what both wrap)
    python3 extension/sql_edition/build.py update OUT  an update script's part: every function made again
    python3 extension/sql_edition/build.py tle-update FROM TO OUT
                                               a pg_tle update path (pgtle.install_update_path)

The SQL edition is the C edition's install script with every C function
given a body in SQL or PL/pgSQL: the tables, types, views, constraints,
triggers, comments and grants are the C edition's own statements
(extension/install/NN_*.sql), so "same tables, same signatures" holds by
construction.  Each `AS 'MODULE_PATHNAME', 'symbol' LANGUAGE C ...` clause
is replaced by the definition of that symbol in this folder's pieces:

    -- @symbol idem_claim
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
    AS $function$ ... $function$
    -- @end

A `-- @before symbol` block (the internal functions, named idem__*) goes
right before the C statement that declares the symbol; a piece's other
statements go after the install piece with the lower number (this
folder's 21_sql_claims.sql after install/20_claims.sql).  A C symbol
without a definition, or a definition no C piece uses, fails the build.

Two more kinds of blocks are expanded where they are named:

    -- @snippet name(a, b)      code shared by several bodies, with %a% and
    ...                         %b% replaced by the arguments of the use,
    -- @end                     {{name(x, y)}}

and values stated once elsewhere: {{outcome:claimed}}, {{sqlstate:lease_lost}},
{{outcomes_with_response}}, {{attempt_transitions}} (protocol.toml), and
{{setting:idem.lease}} (the default and range in extension/core/settings.c).
The bodies never call one another by name (a role that may create in the
extension's schema could make such a call ambiguous): a request-path
function reaches its internal function through a cast between two of the
extension's own types (21_sql_claims.sql says why), and what PL/pgSQL
bodies share is expanded into each of them here.
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "extension", "protocol"))
import model  # noqa: E402  (protocol.toml's loader and checks)

INSTALL = os.path.join(ROOT, "extension", "install")
C_CLAUSE = re.compile(r"AS\s+'MODULE_PATHNAME',\s*'(\w+)'\s+LANGUAGE\s+C\b[^;$]*", re.S)
BLOCK = re.compile(r"^-- @(symbol|before|snippet) ([^\n]+)\n(.*?)^-- @end[^\n]*\n", re.S | re.M)
TLE_TAG = "$pg_idem_tle$"
PLAIN_TAG = "$pg_idem_plain$"
PLAIN_DO_TAG = "$pg_idem_plain_install$"


def fail(msg):
    sys.exit("sql_edition/build.py: " + msg)


def version():
    with open(os.path.join(ROOT, "extension", "pg_idem.control")) as f:
        return re.search(r"default_version\s*=\s*'([^']+)'", f.read()).group(1)


def pieces(folder):
    return sorted(n for n in os.listdir(folder) if re.match(r"\d\d_\w+\.sql$", n))


def c_int(expr):
    """A C integer constant of settings.c (products of literals and macros)."""
    macros = {"INT_MAX": 2147483647, "IDEM_MIN_LEASE_MS": 1}
    value = 1
    for factor in expr.split("*"):
        factor = factor.strip()
        value *= macros[factor] if factor in macros else int(factor)
    return value


def settings():
    """name -> (default, min, max, unit) of every integer idem.* setting."""
    with open(os.path.join(ROOT, "extension", "core", "settings.c")) as f:
        src = f.read()
    out = {}
    # Every string but a setting's name blanked, so that no description's
    # punctuation is taken for the call's.
    src = re.sub(r'"(\\.|[^"\\])*"', lambda m: m.group(0) if m.group(0).startswith('"idem.') else '""', src)
    for m in re.finditer(r'DefineCustomIntVariable\("([\w.]+)",(.*?)\);', src, re.S):
        args = [a.strip() for a in m.group(2).split(",")]
        # description, long description, &variable, default, min, max, context, unit
        default, lo, hi, unit = args[3], args[4], args[5], args[7]
        unit = {"GUC_UNIT_MS": "ms", "GUC_UNIT_S": "s", "GUC_UNIT_BYTE": "B", "0": ""}[unit]
        out[m.group(1)] = (c_int(default), c_int(lo), c_int(hi), unit)
    for m in re.finditer(r'DefineCustom(Bool|String|Enum)Variable\("([\w.]+)"', src):
        out.setdefault(m.group(2), None)
    return out


def sql_literal(s):
    return "'" + s.replace("'", "''") + "'"


def protocol_values(p):
    """The {{kind:name}} placeholders protocol.toml answers."""
    values = {}
    for o in p["outcome"]:
        values["outcome:" + o["name"]] = sql_literal(o["name"])
    for s in p["sqlstate"]:
        values["sqlstate:" + s["name"]] = sql_literal(s["code"])
    values["outcomes_with_response"] = "ARRAY[%s]::pg_catalog.text[]" % ", ".join(
        sql_literal(o["name"]) for o in p["outcome"] if o["response"])
    rows = []
    for t in p["attempt_transition"]:
        fs, fr = model.split_state(t["from"])
        ts, tr = model.split_state(t["to"])
        rows.append("(%s, %s, %s, %s, %s)" % (
            sql_literal(fs), sql_literal(fr) if fr else "NULL::pg_catalog.text", sql_literal(ts),
            sql_literal(tr) if tr else "NULL::pg_catalog.text", "true" if t.get("next_generation") else "false"))
    values["attempt_transitions"] = "(VALUES %s) AS transition(from_status, from_reason, to_status, to_reason, next_generation)" % ", ".join(rows)
    values["attempt_transitions_text"] = sql_literal(", ".join(
        "%s -> %s" % (t["from"], t["to"]) for t in p["attempt_transition"]))
    values["max_key_bytes"] = str(p["key"]["max_bytes"])
    values["key_domain"] = sql_literal(p["key"]["domain"])
    return values


def setting_values():
    values = {}
    for name, spec in settings().items():
        if spec is None:
            continue
        default, lo, hi, unit = spec
        values["setting:%s:default" % name] = str(default)
        values["setting:%s:min" % name] = str(lo)
        values["setting:%s:max" % name] = str(hi)
        values["setting:%s:unit" % name] = sql_literal(unit)
    return values


def read_blocks(paths):
    """(symbols, befores, snippets, extras per piece) of this folder's pieces."""
    symbols, befores, snippets, extras = {}, {}, {}, {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for kind, head, body in BLOCK.findall(text):
            if kind in ("symbol", "before"):
                table = symbols if kind == "symbol" else befores
                if head.strip() in table:
                    fail("%s %s is defined twice" % (kind, head))
                table[head.strip()] = body.rstrip("\n")
            else:
                m = re.match(r"(\w+)(?:\(([^)]*)\))?\s*$", head)
                if not m:
                    fail("bad snippet head %r in %s" % (head, path))
                params = [x.strip() for x in (m.group(2) or "").split(",") if x.strip()]
                snippets[m.group(1)] = (params, body)
        extras[path] = BLOCK.sub("", text)
    return symbols, befores, snippets, extras


def expand(text, values, snippets, where, depth=0):
    """Replace every {{...}} in text."""
    if depth > 8:
        fail("snippets nest too deep in %s" % where)

    def one(m):
        inner = m.group(1).strip()
        if inner in values:
            return values[inner]
        s = re.match(r"(\w+)\((.*)\)$", inner, re.S) or re.match(r"(\w+)()$", inner)
        if s and s.group(1) in snippets:
            params, body = snippets[s.group(1)]
            args = split_args(s.group(2)) if s.group(2).strip() else []
            if len(args) > len(params) and params:
                # The last parameter takes the rest (a statement with commas).
                args = args[:len(params) - 1] + [",".join(args[len(params) - 1:])]
            args = [a.strip() for a in args]
            if len(args) != len(params):
                fail("%s: {{%s}} takes %d arguments" % (where, s.group(1), len(params)))
            for p, a in zip(params, args):
                body = body.replace("%" + p + "%", a)
            return expand(body.rstrip("\n"), values, snippets, where, depth + 1)
        fail("%s: unknown placeholder {{%s}}" % (where, inner))

    # Innermost first: a placeholder's arguments may hold placeholders.
    inner = re.compile(r"\{\{((?:(?!\{\{).)*?)\}\}", re.S)
    while inner.search(text):
        text = inner.sub(one, text)
    return text


def split_args(s):
    """Arguments of a snippet use: commas outside parentheses and quotes."""
    out, depth, cur, quote = [], 0, "", False
    for ch in s:
        if ch == "'":
            quote = not quote
        if not quote and ch in "([":
            depth += 1
        elif not quote and ch in ")]":
            depth -= 1
        if ch == "," and depth == 0 and not quote:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def arity_symbol(sym, create, symbols):
    """sym/N where the definitions have one for a function of N arguments
    (idem_claim/5: the form with lock_wait reads an argument the shorter
    form lacks), else sym."""
    m = re.match(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+[\w.]+\s*\((.*?)\)\s*RETURNS", create, re.S)
    if not m:
        return sym
    n = len([a for a in split_args(m.group(1)) if a.strip()])
    return "%s/%d" % (sym, n) if "%s/%d" % (sym, n) in symbols else sym


def substitute(body, rel, symbols, befores, snippets, values, used):
    """A C piece with each C clause replaced by its symbol's definition, and
    the symbol's @before statements put before the statement that holds it
    (the CREATE at the start of the last line that begins with one)."""
    out, pos = [], 0
    for m in C_CLAUSE.finditer(body):
        sym = arity_symbol(m.group(1), body[body.rfind("\nCREATE ", 0, m.start()) + 1:m.start()], symbols)
        if sym not in symbols and os.environ.get("IDEM_SQL_PARTIAL"):   # while porting
            symbols[sym] = "LANGUAGE plpgsql AS $stub$BEGIN RAISE 'not yet'; END$stub$"
        if sym not in symbols:
            fail("%s: C function %s has no SQL edition definition (-- @symbol %s)" % (rel, sym, sym))
        start = body.rfind("\nCREATE ", 0, m.start()) + 1
        if sym in befores and sym not in used and start >= pos:
            out.append(body[pos:start])
            out.append(expand(befores[sym], values, snippets, "before " + sym).strip("\n") + "\n\n")
            pos = start
        elif sym in befores and sym not in used:
            fail("%s: no statement start found for the @before of %s" % (rel, sym))
        used.add(sym)
        out.append(body[pos:m.start()])
        out.append(expand(symbols[sym], values, snippets, "symbol " + sym))
        pos = m.end()
    out.append(body[pos:])
    return "".join(out)


def statements(text):
    """text split into its top-level statements (quotes, dollar quotes and
    comments respected), each with its trailing semicolon."""
    out, start, i, n = [], 0, 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i) + 2
        elif c == "'":
            i = text.find("'", i + 1) + 1
            while i < n and text[i] == "'":
                i = text.find("'", i + 1) + 1
            continue
        elif c == "$":
            m = re.match(r"\$[A-Za-z_]*\$", text[i:])
            if m:
                i = text.find(m.group(0), i + len(m.group(0))) + len(m.group(0))
                continue
        elif c == ";":
            out.append(text[start:i + 1].strip())
            start = i + 1
        i += 1
    return [x for x in out if re.sub(r"--[^\n]*", "", x).strip(" \n;")]


def definitions(text):
    """An update's part of the script: every function (idem__* and the
    extension's own) and the types and casts they use, made again with
    their current definitions; nothing of the tables."""
    out = []
    for st in statements(text):
        body = re.sub(r"^(--[^\n]*\n)+", "", st).lstrip()
        if re.match(r"CREATE FUNCTION ", body):
            out.append(body.replace("CREATE FUNCTION ", "CREATE OR REPLACE FUNCTION ", 1))
        elif re.match(r"(CREATE (TYPE|DOMAIN) @extschema@\.idem__|CREATE CAST|COMMENT ON FUNCTION)", body):
            out.append(body)
        elif "$stats_view$" in body:
            m = re.search(r"CREATE FUNCTION @extschema@\.%I\((.*?)\) RETURNS (.*?) %s', hidden,\s*"
                          r"\$definition\$(.*?)\$definition\$", body, re.S)
            out.append("CREATE OR REPLACE FUNCTION @extschema@.idem_stats(%s) RETURNS %s %s;" % (
                re.sub(r"'\s*'", "", m.group(1)), m.group(2), m.group(3).strip()))
    return "\n\n".join(out) + "\n"


def script(update=False):
    """The SQL edition's extension script (with @extschema@ to substitute);
    update: what an update script makes again (see definitions())."""
    p = model.load()
    values = protocol_values(p)
    values.update(setting_values())
    own = [os.path.join(HERE, n) for n in pieces(HERE)]
    symbols, befores, snippets, extras = read_blocks(own)
    used = set()
    parts = []
    c_pieces = [(n, os.path.join(INSTALL, n)) for n in pieces(INSTALL)]
    order = sorted(c_pieces + [(os.path.basename(x), x) for x in own], key=lambda t: (t[0][:2], t[1].startswith(HERE)))
    for name, path in order:
        rel = os.path.relpath(path, ROOT)
        if update and name[:2] in ("05", "90"):
            continue   # the preload notice; the privileges come last, below
        if path.startswith(HERE):
            body = expand(extras[path], values, snippets, rel)
        else:
            with open(path, encoding="utf-8") as f:
                body = f.read()

            body = substitute(body, rel, symbols, befores, snippets, values, used)
        parts.append("\n-- %s\n%s" % (rel, body.strip("\n")))
    unused = sorted((set(symbols) | set(befores)) - used - ({"idem_preload_notice"} if update else set()))
    if unused:
        fail("definitions no C function uses: %s" % ", ".join(unused))
    text = "\n".join(parts) + "\n"
    if update:
        with open(os.path.join(INSTALL, "90_privileges.sql"), encoding="utf-8") as f:
            text = UPDATE_PROLOGUE + definitions(text) + "\n-- extension/install/90_privileges.sql\n" + f.read()
    for tag in (TLE_TAG, PLAIN_TAG, PLAIN_DO_TAG):
        if tag in text:
            fail("the script must not contain %s" % tag)
    return text


# An update drops the internal functions (their casts go with them) and
# types, and makes them again from this version's pieces: they are no
# part of the contract, and a function whose arguments changed could not
# be replaced.  The extension's own functions keep their OIDs (CREATE OR
# REPLACE), and with them the grants and the views that use them.
UPDATE_PROLOGUE = """-- The SQL edition's internals, made again below.
DO $drop_internals$
DECLARE
    target CONSTANT pg_catalog.oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    obj record;
BEGIN
    FOR obj IN SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text AS signature FROM pg_catalog.pg_proc p
                WHERE p.pronamespace OPERATOR(pg_catalog.=) target
                  AND p.proname OPERATOR(pg_catalog.~~) 'idem\\_\\_%'::pg_catalog.text LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s CASCADE', obj.signature);
    END LOOP;
    FOR obj IN SELECT t.oid::pg_catalog.regtype::pg_catalog.text AS name FROM pg_catalog.pg_type t
                WHERE t.typnamespace OPERATOR(pg_catalog.=) target AND t.typtype OPERATOR(pg_catalog.=) 'c'::pg_catalog."char"
                  AND t.typname OPERATOR(pg_catalog.~~) 'idem\\_\\_%'::pg_catalog.text LOOP
        EXECUTE pg_catalog.format('DROP TYPE %s', obj.name);
    END LOOP;
    FOR obj IN SELECT t.oid::pg_catalog.regtype::pg_catalog.text AS name FROM pg_catalog.pg_type t
                WHERE t.typnamespace OPERATOR(pg_catalog.=) target AND t.typtype OPERATOR(pg_catalog.=) 'd'::pg_catalog."char"
                  AND t.typname OPERATOR(pg_catalog.~~) 'idem\\_\\_%'::pg_catalog.text LOOP
        EXECUTE pg_catalog.format('DROP DOMAIN %s', obj.name);
    END LOOP;
END
$drop_internals$;

"""

HEADER = "-- pg_idem %s, SQL edition: generated by extension/sql_edition/build.py from\n" \
         "-- extension/install/ and extension/sql_edition/ (edit those files).\n"


def plain(text):
    """psql -v schema=NAME -f this-file: into an existing or new schema."""
    # Only CREATE EXTENSION can mark tables for pg_dump; a plain install's
    # tables are ordinary ones, which pg_dump dumps anyway.
    text = re.sub(r"^SELECT pg_catalog\.pg_extension_config_dump\([^;]*\);\n", "", text, flags=re.M)
    # The schema check's advice, as this script follows it.
    advice = "CREATE SCHEMA idem; CREATE EXTENSION pg_idem SCHEMA idem;"
    if text.count(advice) != 1:
        fail("extension/install/00_schema_check.sql: its advice changed (%s)" % advice)
    text = text.replace(advice, "psql -v schema=idem -f pg_idem_sql-%s.sql" % version())
    return (HEADER % version()) + r"""--
-- Install:  psql -v ON_ERROR_STOP=1 -v schema=idem -f pg_idem_sql-%(v)s.sql
-- (schema defaults to idem; it is created when missing).  One transaction:
-- it installs completely or not at all.  With -v within_transaction=1 (or
-- \set within_transaction 1 before \i) it runs in the caller's open
-- transaction instead, as moving from the C edition does.
\set ON_ERROR_STOP 1
\if :{?schema}
\else
\set schema idem
\endif
\if :{?within_transaction}
\else
BEGIN;
\endif
CREATE SCHEMA IF NOT EXISTS :"schema";
SELECT pg_catalog.set_config('pg_idem.install_schema', :'schema', true) IS NOT NULL AS installing \gset
DO %(do)s
DECLARE
    target CONSTANT pg_catalog.text := pg_catalog.current_setting('pg_idem.install_schema');
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_proc p
                WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(target)::pg_catalog.regnamespace
                  AND p.proname OPERATOR(pg_catalog.=) 'idem_edition'::pg_catalog.name
                  AND p.pronargs OPERATOR(pg_catalog.=) 0::pg_catalog.int2) THEN
        RAISE EXCEPTION 'pg_idem is already installed in schema "%%"', target
            USING ERRCODE = 'duplicate_object',
                  HINT = 'Upgrade it with the upgrade script of the version you move to.';
    END IF;
    PERFORM pg_catalog.set_config('search_path', pg_catalog.quote_ident(target), true);
    EXECUTE pg_catalog.replace(%(tag)s
%(script)s%(tag)s, '@extschema@', pg_catalog.quote_ident(target));
END
%(do)s;
RESET search_path;
\if :{?within_transaction}
\else
COMMIT;
\endif
""" % {"v": version(), "tag": PLAIN_TAG, "do": PLAIN_DO_TAG, "script": text}


def tle(text):
    """The pg_tle installer: run by a member of pgtle_admin in each database."""
    return (HEADER % version()) + """--
-- Register:  psql -v ON_ERROR_STOP=1 -f pg_idem_tle-%(v)s.sql   (as a member of pgtle_admin)
-- then:      CREATE SCHEMA idem; CREATE EXTENSION pg_idem SCHEMA idem;
SELECT pgtle.install_extension(
    'pg_idem', %(vl)s,
    'single-flight idempotency keys with fenced leases, inbox and outbox (SQL edition)',
%(tag)s
%(script)s%(tag)s);
""" % {"v": version(), "vl": sql_literal(version()), "tag": TLE_TAG, "script": text}


def tle_update(text, from_version, to_version):
    """A pg_tle update path (pgtle.install_update_path) to this version."""
    return (HEADER % version()) + """--
-- Register (as a member of pgtle_admin), then ALTER EXTENSION pg_idem UPDATE TO %(to)s:
SELECT pgtle.install_update_path('pg_idem', %(from)s, %(to)s,
%(tag)s
%(script)s%(tag)s);
""" % {"from": sql_literal(from_version), "to": sql_literal(to_version), "tag": TLE_TAG, "script": text}


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "tle-update":
        out = tle_update(script(update=True), sys.argv[2], sys.argv[3])
        target = sys.argv[4]
    elif len(sys.argv) == 3 and sys.argv[1] in ("plain", "tle", "script", "update"):
        if sys.argv[1] == "update":
            out = (HEADER % version()) + script(update=True)
        else:
            out = {"plain": plain, "tle": tle, "script": lambda t: (HEADER % version()) + t}[sys.argv[1]](script())
        target = sys.argv[2]
    else:
        sys.exit(__doc__)
    with open(target, "w", encoding="utf-8") as f:
        f.write(out)


if __name__ == "__main__":
    main()
