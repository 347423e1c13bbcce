#!/usr/bin/env python3
"""The house rules a newcomer relies on, checked (make test's static suite).

    python3 tests/static/house.py [--so path/to/pg_idem.so]

Each check prints one line "ok <name>" or "not ok <name>: why"; the exit
status is the number of failed checks.

  protocol   every generated copy of the protocol is up to date
  sizes      no source file of the extension or the clients over 800 lines
  guards     every extension header's guard is IDEM_<FOLDER>_<FILE>_H
  includes   no circle of #includes between the extension's files
  calls      no circle of calls between the extension's .c files (file A
             calls a function of file B and B one of A's)
  names      no outcome, state, status, event, problem, profile or series
             name of protocol.toml written as a string literal outside the
             generated files: the extension and the clients use the
             generated names (a short list of coincidences is allowed)
  functions  no function of the extension or the clients over 150 lines
  exports    (with --so) the library exports only idem_* symbols and the
             two PostgreSQL looks up
"""

import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EXT = os.path.join(ROOT, "extension")
MAX_LINES = 800

results = []


def report(name, problems):
    if problems:
        results.append(False)
        print("not ok %s: %s" % (name, "; ".join(problems[:20])))
    else:
        results.append(True)
        print("ok %s" % name)


def rel(path):
    return os.path.relpath(path, ROOT)


def files(top, exts, skip=("node_modules", "build", "__pycache__")):
    for d, dirs, names in os.walk(top):
        dirs[:] = [x for x in dirs if x not in skip]
        for n in names:
            if n.endswith(exts):
                yield os.path.join(d, n)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def check_protocol():
    r = subprocess.run([sys.executable, os.path.join(EXT, "protocol", "generate.py"), "--check"],
                       capture_output=True, text=True)
    report("protocol", [] if r.returncode == 0 else [(r.stderr or r.stdout).strip()])


def check_sizes():
    bad = []
    srcs = list(files(EXT, (".c", ".h", ".py"))) + list(files(os.path.join(ROOT, "client"),
                                                              (".c", ".h", ".cpp", ".hpp", ".py", ".js")))
    for f in srcs:
        with open(f, encoding="utf-8", errors="replace") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            bad.append("%s has %d lines" % (rel(f), n))
    report("sizes", bad)


def c_files():
    return sorted(f for f in files(EXT, (".c", ".h")))


def check_guards():
    bad = []
    for f in c_files():
        if not f.endswith(".h"):
            continue
        folder = os.path.basename(os.path.dirname(f))
        want = "IDEM_%s_%s_H" % (folder.upper(), os.path.basename(f)[:-2].upper())
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        m = re.search(r"#ifndef (\w+)\n#define (\w+)", text)
        if not m or m.group(1) != want or m.group(2) != want:
            bad.append("%s: guard %s, want %s" % (rel(f), m.group(1) if m else "none", want))
    report("guards", bad)


def find_cycle(graph):
    """A circle in a graph {node: set(nodes)}, as a list, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {n: WHITE for n in graph}
    stack = []

    def visit(n):
        color[n] = GREY
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m, WHITE) == GREY:
                return stack[stack.index(m):] + [m]
            if color.get(m, WHITE) == WHITE:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = BLACK
        return None

    for n in sorted(graph):
        if color[n] == WHITE:
            found = visit(n)
            if found:
                return found
    return None


def check_includes():
    graph = {}
    for f in c_files():
        with open(f, encoding="utf-8") as fh:
            incs = re.findall(r'^#include "([a-z_]+/[a-z_]+\.h)"', fh.read(), re.M)
        graph[rel(f)] = {"extension/" + i for i in incs if os.path.exists(os.path.join(EXT, i))}
    cycle = find_cycle(graph)
    report("includes", ["circle: " + " -> ".join(cycle)] if cycle else [])


def check_calls():
    """File-level call graph from function definitions and calls."""
    defined = {}
    bodies = {}
    for f in c_files():
        if not f.endswith(".c"):
            continue
        with open(f, encoding="utf-8") as fh:
            text = strip_comments(fh.read())
        bodies[rel(f)] = text
        # A definition: a name at the start of a line, its arguments, then
        # the body's brace on a line of its own (PostgreSQL style).
        for m in re.finditer(r"^([A-Za-z_]\w*)\([^;{]*\)\s*\n\{", text, re.M):
            name = m.group(1)
            static = re.search(r"(^|\n)static[^\n]*\n" + name + r"\(", text)
            if not static:
                defined.setdefault(name, rel(f))
    graph = {f: set() for f in bodies}
    for f, text in bodies.items():
        for name in set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text)):
            g = defined.get(name)
            if g and g != f:
                graph[f].add(g)
    cycle = find_cycle(graph)
    report("calls", ["circle: " + " -> ".join(cycle)] if cycle else [])


def check_exports(so):
    out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    bad = []
    for line in out.splitlines():
        sym = line.split()[-1]
        if not re.match(r"^(idem_\w+|pg_finfo_idem_\w+|Pg_magic_func|_PG_init)$", sym):
            bad.append(sym)
    report("exports", ["%d symbols without the idem_ prefix: %s" % (len(bad), " ".join(bad[:15]))] if bad else [])


# ---- one description of each rule: no protocol name written by hand ----------

# The sources that may name the protocol only through its generated symbols.
NAME_SOURCES = [("extension", (".c", ".h")), ("client/cpp/src", (".cpp", ".hpp")),
                ("client/cpp/include", (".hpp",)), ("client/python/pg_idem", (".py",)),
                ("client/node/lib", (".js",)), ("client/node/index.js", (".js",))]
# The files generate.py writes (the uses of those symbols are elsewhere).
GENERATED = {"extension/core/protocol.h", "extension/core/protocol.c", "extension/core/errors.h",
             "client/cpp/include/idem/protocol.hpp", "client/python/pg_idem/protocol.py",
             "client/node/lib/protocol.js"}
# A literal that is a protocol name by coincidence, each with why it is not
# a copy of the rule: (file, name): reason.
NAME_ALLOWED = {
    ("extension/keys/finish.c", "cooldown"): "idem_fail's argument, named in its errors",
    ("extension/outbox/outbox_wait.c", "timeout"): "idem_outbox_wait's argument, named in its errors",
    # idem_outbox_nack's outcomes, not the row state: their names come to
    # protocol.toml with the outbox relays of the Python and Node clients
    # (issue 34's messaging branch), and these entries go then.
    ("extension/outbox/outbox_ack.c", "dead"): "idem_outbox_nack's outcome (see above)",
    ("client/cpp/src/messaging/outbox.cpp", "dead"): "idem_outbox_nack's outcome (see above)",
}
# Folders of code whose names are not in protocol.toml yet: the inbox's
# outcomes move there with the inbox consumers of the Python and Node
# clients (issue 34); their literals are checked once they are generated.
NAME_PENDING = ("extension/inbox/", "client/cpp/src/messaging/inbox.cpp",
                # The attempts' statuses in C move to the generated
                # IDEM_ATTEMPT_* names once idem_attempt_open is split (the
                # other branch of issue 34 rewrites these files).
                "extension/attempts/")


def protocol_names():
    """Every name protocol.toml defines: each [[table]]'s names, the row
    states, the attempts' states, the profiles and the metrics' series."""
    import tomllib
    with open(os.path.join(EXT, "protocol", "protocol.toml"), "rb") as fh:
        p = tomllib.load(fh)
    names = set()
    for key, value in p.items():
        if key != "row_states" and isinstance(value, list) and value and isinstance(value[0], dict):
            names |= {x["name"] for x in value if "name" in x}
            names |= {x["slug"] for x in value if "slug" in x}
    for r in p["row_states"]:
        names |= {x["name"] for x in r["state"]}
    for t in p["attempt_transition"]:
        for s in (t["from"], t["to"]):
            names |= set(re.findall(r"[a-z_]+", s))
    names |= set(p["problems"]["profiles"]) | set(p["problems"].get("deprecated_profiles", {}))
    names |= {m["name"] for m in p["metrics"].values()}
    return names - {x["name"] for x in p["sqlstate"]}


def literals(text, ext):
    """The string literals of a source text, with their lines; comments,
    Python's docstrings and JavaScript's regular expressions skipped."""
    quotes = r'"(?:\\.|[^"\\\n])*"'
    skip = r"//[^\n]*|/\*.*?\*/"
    if ext == ".py":
        skip = r'#[^\n]*|"""(?:\\.|[^\\])*?"""' + r"|'''(?:\\.|[^\\])*?'''"
    if ext in (".py", ".js"):
        quotes += r"|'(?:\\.|[^'\\\n])*'"
    if ext == ".js":
        quotes += r"|`(?:\\.|[^`\\])*`"
        skip += r"|(?<=[=(,:!&|?;])\s*/(?:\\.|\[(?:\\.|[^\]\\])*\]|[^/\\\n*])(?:\\.|\[(?:\\.|[^\]\\])*\]|[^/\\\n])*/"
    for m in re.finditer("(" + skip + ")|" + quotes, text, re.S):
        if m.group(1) is None:
            yield text.count("\n", 0, m.start()) + 1, m.group(0)[1:-1]


def check_names():
    names = protocol_names()
    bad, used = [], set()
    for top, exts in NAME_SOURCES:
        path = os.path.join(ROOT, top)
        for f in ([path] if os.path.isfile(path) else files(path, exts)):
            r = rel(f)
            if r in GENERATED or r.startswith(NAME_PENDING):
                continue
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            ext = os.path.splitext(f)[1]
            for line, value in literals(text, ext):
                # The whole literal, or a quoted SQL literal inside it.
                found = {value} if value in names else set()
                found |= set(re.findall(r"'([a-z_0-9-]+)'", value)) & names
                for n in sorted(found):
                    if (r, n) in NAME_ALLOWED:
                        used.add((r, n))
                    else:
                        bad.append("%s:%d: \"%s\" (use the generated name)" % (r, line, n))
    bad += ["NAME_ALLOWED has %s:%s, which is no longer there" % k for k in sorted(set(NAME_ALLOWED) - used)]
    report("names", bad)


# ---- functions that say what they decide -------------------------------------

MAX_FUNCTION_LINES = 150
# Split by another branch of issue 34 (the house-ext engineer's part).
FUNCTION_PENDING = {("extension/attempts/attempts_open.c", "idem_attempt_open")}


def function_lengths(text, ext):
    """(name, first line, lines) of each function: C and C++ bodies whose
    braces stand at the start of a line, Python defs by indentation, and
    JavaScript functions and methods by their braces."""
    lines = text.split("\n")
    if ext in (".c", ".cpp"):
        start = None
        for i, l in enumerate(lines):
            if l == "{" and i and re.search(r"\)\s*(const|noexcept|override|\s)*$", lines[i - 1]):
                start = i - 1
            elif l == "}" and start is not None:
                # The name: on the first line of the signature, at the start of a line.
                heads = (re.findall(r"([A-Za-z_][\w:~]*)\s*\(", lines[k])
                         for k in range(start, max(-1, start - 6), -1) if re.match(r"[A-Za-z_]", lines[k]))
                m = next((h for h in heads if h), None)
                yield (m[0] if m else "?"), start + 1, i - start + 1
                start = None
    elif ext == ".py":
        for i, l in enumerate(lines):
            m = re.match(r"(\s*)(?:async\s+)?def\s+(\w+)", l)
            if m:
                j = i + 1
                while j < len(lines) and (not lines[j].strip() or
                                          len(lines[j]) - len(lines[j].lstrip()) > len(m.group(1))):
                    j += 1
                while lines[j - 1].strip() == "":
                    j -= 1
                yield m.group(2), i + 1, j - i
    elif ext == ".js":
        code = [re.sub(r"//.*", "", re.sub(r"'(\\.|[^'\\])*'|\"(\\.|[^\"\\])*\"|`[^`]*`", "''", l))
                for l in lines]
        for i, l in enumerate(code):
            m = re.match(r"\s*(?:async\s+)?(?:function\s*\*?\s*(\w+)|(\w+)\s*\([^)]*\)\s*\{\s*$)", l)
            if not m or re.match(r"\s*(if|for|while|switch|catch)\b", l):
                continue
            depth, j = 0, i
            while j < len(code):
                depth += code[j].count("{") - code[j].count("}")
                if depth <= 0 and "{" in "".join(code[i:j + 1]):
                    break
                j += 1
            yield (m.group(1) or m.group(2)), i + 1, j - i + 1


def check_functions():
    bad = []
    for top, exts in (("extension", (".c", ".py")), ("client", (".cpp", ".py", ".js")), ("tests/static", (".py",))):
        for f in files(os.path.join(ROOT, top), exts):
            with open(f, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for name, line, n in function_lengths(text, os.path.splitext(f)[1]):
                if n > MAX_FUNCTION_LINES and (rel(f), name) not in FUNCTION_PENDING:
                    bad.append("%s:%d: %s has %d lines" % (rel(f), line, name, n))
    report("functions", bad)


def main():
    check_protocol()
    check_sizes()
    check_guards()
    check_includes()
    check_calls()
    check_names()
    check_functions()
    if "--so" in sys.argv:
        check_exports(sys.argv[sys.argv.index("--so") + 1])
    return results.count(False)


if __name__ == "__main__":
    sys.exit(main())
