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


def main():
    check_protocol()
    check_sizes()
    check_guards()
    check_includes()
    check_calls()
    if "--so" in sys.argv:
        check_exports(sys.argv[sys.argv.index("--so") + 1])
    return results.count(False)


if __name__ == "__main__":
    sys.exit(main())
