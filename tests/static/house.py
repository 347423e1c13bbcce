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
  layers     the extension's folders, by what their files include and
             call: core/ depends on no other folder, no circle between
             folders, and module.c (_PG_init, the only file above the
             folders) is included and called by none
  names      no outcome, state, status, event, problem, profile or series
             name of protocol.toml written as a string literal outside the
             generated files: the extension and the clients use the
             generated names (a short list of coincidences is allowed)
  functions  no function of the extension's C, the clients' C++, Python
             and JavaScript or the generators over 150 lines
  paths      no file of the repository names a repository path that does
             not exist, nor a file kept outside the repository (the style
             guide, scenario list and seeds shared beside it): a test
             states its scenario itself
  filemap    docs/design.md's maps of extension/ and tests/ name only what
             exists, and every C file of extension/
  docs       every fenced block of every Markdown file says how make
             test's examples suite runs it (run, compiled, or not run with
             a reason: tests/docs/run_examples.py --markers)
  self-test  layers, names and functions fail on the faults they are for
             (a _PG_init in core/, a protocol name as a literal, a
             function over the limit)
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
MAX_FUNCTION_LINES = 150

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
    # The SQL edition's pieces are its source as the C files are the C edition's.
    srcs += list(files(os.path.join(EXT, "sql_edition"), (".sql",)))
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


def include_graph():
    """{file: the extension's headers it includes}, paths from the root."""
    graph = {}
    for f in c_files():
        with open(f, encoding="utf-8") as fh:
            incs = re.findall(r'^#include "([a-z_]+/[a-z_]+\.h)"', fh.read(), re.M)
        graph[rel(f)] = {"extension/" + i for i in incs if os.path.exists(os.path.join(EXT, i))}
    return graph


def check_includes():
    cycle = find_cycle(include_graph())
    report("includes", ["circle: " + " -> ".join(cycle)] if cycle else [])


def call_graph():
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
    return graph


def check_calls():
    cycle = find_cycle(call_graph())
    report("calls", ["circle: " + " -> ".join(cycle)] if cycle else [])


def folder_of(path):
    """extension/keys/claim.c -> keys; extension/module.c -> '' (the top)."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else ""


def layer_problems(includes, calls, sources):
    """What is wrong with the folders of the extension, given its include
    and call graphs ({file: files}) and its C files."""
    bad = []
    folders = {}
    for graph, how in ((includes, "includes"), (calls, "calls")):
        for f, targets in graph.items():
            for t in targets:
                a, b = folder_of(f), folder_of(t)
                if b == "":
                    bad.append("%s %s %s: nothing depends on the module's init" % (f, how, t))
                elif a == "core" and b != "core":
                    bad.append("%s %s %s: core/ depends on no other folder" % (f, how, t))
                if a and b and a != b:
                    folders.setdefault(a, set()).add(b)
                    folders.setdefault(b, set())
    tops = sorted(f for f in sources if folder_of(f) == "")
    if tops != ["extension/module.c"]:
        bad.append("files above the folders: %s (only extension/module.c)" % ", ".join(tops))
    cycle = find_cycle(folders)
    if cycle:
        bad.append("circle of folders: " + " -> ".join(cycle))
    return bad


def check_layers():
    report("layers", layer_problems(include_graph(), call_graph(), [rel(f) for f in c_files()]))


def check_exports(so):
    out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    bad = []
    for line in out.splitlines():
        sym = line.split()[-1]
        if not re.match(r"^(idem_\w+|pg_finfo_idem_\w+|Pg_magic_func|_PG_init)$", sym):
            bad.append(sym)
    report("exports", ["%d symbols without the idem_ prefix: %s" % (len(bad), " ".join(bad[:15]))] if bad else [])


# Where a path may be named that is not the repository's: the frozen
# release scripts (their headers name the build of their day), and build
# output.
PATHS_SKIP_DIRS = ("extension/releases/",)
WALK_SKIP = ("node_modules", "build", "__pycache__", ".git", "results", "output_iso", "tmp_check", "log",
             "pg_idem.egg-info", "dist")
PATH_EXTENSIONS = {"c", "h", "cpp", "hpp", "py", "js", "pl", "pm", "sh", "sql", "spec", "out", "md", "toml",
                   "json", "txt", "conf", "control", "map", "cmake", "yml", "yaml", "mjs", "ts", "in"}
# Files every developer has beside the repository, never in it: a tracked
# file that cites one cites something a reader of the repository lacks.
# (../shared/vendor/ is a build input, not a citation: the upstream
# sources every CI run has beside the project, which the harness builds,
# e.g. pg_tle for the SQL edition's server, tests/sql_edition/server.sh.)
SHARED_FILES = re.compile(r"\b(?:STYLE|SCENARIOS)(?:\.md\b|\s+#?\d)|\bseeds/\d+|\.\./shared/(?!vendor/)")


def repository_files():
    """The tracked files (git ls-files, or the list the test harness wrote
    beside its copy of the tree), or every file of a copy without either."""
    if os.path.exists(os.path.join(ROOT, ".git")):
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, text=True, check=True)
        return [f for f in out.stdout.split("\0") if f]
    listed = os.path.join(ROOT, ".tracked-files")
    if os.path.exists(listed):
        with open(listed, encoding="utf-8") as fh:
            return [f for f in fh.read().split("\0") if f and os.path.exists(os.path.join(ROOT, f))]
    found = []
    for d, dirs, names in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in WALK_SKIP]
        found += [rel(os.path.join(d, n)) for n in names]
    return found


def check_paths():
    """Paths that start with a top folder of the repository and name a file
    of a kind the repository holds (or end with '/'): each must exist,
    from the root or from the naming file's folder.  Globs, templates and
    placeholders (NN_name.sql, foo.sql) are not paths."""
    bad = []
    names = repository_files()
    tops = sorted({n.split("/")[0] for n in names if "/" in n and not n.startswith(".git/")})
    pattern = re.compile(r"(?<![\w./-])((?:\.\./)*(?:%s)/[\w.+-]*(?:/[\w.+-]+)*/?)" % "|".join(map(re.escape, tops)))
    for name in names:
        if name.startswith(PATHS_SKIP_DIRS):
            continue
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        for m in SHARED_FILES.finditer(text):
            bad.append("%s:%d names %r, which is not in the repository"
                       % (name, text.count("\n", 0, m.start()) + 1, m.group(0).strip()))
        for m in pattern.finditer(text):
            path = m.group(1).rstrip(".,:;")
            after = text[m.end():m.end() + 1]
            if after and after in "*<${[%…":
                continue
            parts = path.rstrip("/").split("/")
            if any(re.search(r"NN|NAME|XXXX|^foo\b", p) for p in parts):
                continue
            if not path.endswith("/") and parts[-1].rsplit(".", 1)[-1] not in PATH_EXTENSIONS:
                continue
            if "." not in parts[-1] and not path.endswith("/"):
                continue
            here = os.path.dirname(os.path.join(ROOT, name))
            if not (os.path.exists(os.path.join(ROOT, path)) or os.path.exists(os.path.join(here, path))):
                bad.append("%s:%d names %s, which does not exist"
                           % (name, text.count("\n", 0, m.start()) + 1, path))
    report("paths", bad)


def design_map(heading):
    """The names of the text block under a heading of docs/design.md, as
    paths from the folder the heading names: a line at the left is a
    folder (name/) or a file; a line indented by two spaces lists files of
    the folder above (a, b.c/.h: b.c and b.h); deeper lines continue a
    description."""
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(r"^### %s\n.*?^```text\n(.*?)^```" % re.escape(heading), text, re.M | re.S)
    if not m:
        return None
    paths, folder = [], ""
    for line in m.group(1).splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent > 2:
            continue
        for name in re.split(r"\s{2,}", line.strip())[0].split(", "):
            if indent == 0:
                folder = name if name.endswith("/") else ""
                paths.append(name)
            elif name.endswith(".c/.h"):
                paths += [folder + name[:-3], folder + name[:-4] + "h"]
            else:
                paths.append(folder + name)
    return paths


def check_filemap():
    bad = []
    for top in ("extension/", "tests/"):
        names = design_map(top)
        if names is None:
            bad.append("docs/design.md has no ### %s map" % top)
            continue
        for name in names:
            if not os.path.exists(os.path.join(ROOT, top, name)):
                bad.append("the %s map names %s, which does not exist" % (top, top + name))
        if top == "extension/":
            named = {top + n for n in names}
            for f in c_files() + [os.path.join(EXT, "module.c")]:
                if rel(f) not in named:
                    bad.append("%s is not in the extension/ map" % rel(f))
    report("filemap", sorted(set(bad)))


def check_self_test():
    """Each check above fails on the fault it is there for (the old seams
    among them), and passes without it."""
    bad = []
    top = ["extension/module.c", "extension/core/stats.c", "extension/inbox/inbox_cap.c"]
    in_core = "extension/core/" + "module.c"    # where 0.5.0 had it
    seam = layer_problems({in_core: {"extension/inbox/inbox.h"},
                           "extension/inbox/inbox_cap.c": {"extension/core/stats.h"}}, {},
                          [in_core, "extension/core/stats.c", "extension/inbox/inbox_cap.c"])
    if not any("core/ depends on no other folder" in p for p in seam) or \
            not any("circle of folders" in p for p in seam) or \
            not any("files above the folders" in p for p in seam):
        bad.append("layers misses _PG_init in core/: %s" % seam)
    if layer_problems({"extension/module.c": {"extension/inbox/inbox.h"},
                       "extension/inbox/inbox_cap.c": {"extension/core/stats.h"}}, {}, top):
        bad.append("layers refuses module.c above the folders")
    if not layer_problems({}, {"extension/core/statements.c": {"extension/keys/claim.c"}}, top):
        bad.append("layers misses a call from core/ into a part")
    bad += functions_self_test()
    bad += names_self_test()
    if find_cycle({"a": {"b"}, "b": {"a"}}) is None or find_cycle({"a": {"b"}, "b": set()}):
        bad.append("find_cycle")
    report("self-test", bad)


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
    ("extension/core/schema.c", "unknown"): "installed_version's answer when pg_idem has no catalog row",
    ("client/cpp/src/messaging/reconciler.cpp", "stale"): "completion::stale, the reconciler's own result",
    ("client/cpp/src/keys/retry_policy.cpp", "retry"): "verdict::retry, the sender's own verdict",
    ("client/cpp/src/keys/retry_policy.cpp", "unknown"): "to_string of a verdict that is none of them",
    ("client/python/pg_idem/_pool.py", "timeout"): "getconn()'s argument (psycopg_pool's, SimplePool's)",
    ("client/python/pg_idem/_engine.py", "unknown"): "settle()'s own state: a commit whose result could not be read",
    ("client/node/lib/runner.js", "unknown"): "settle()'s own state: a commit whose result could not be read",
}
# Folders of code whose names are not checked yet: the inbox's row states
# (idem_inbox.state: failed, dead, ...) are not in protocol.toml's
# [[row_states]] yet (its answers are, and the C uses them), and the
# attempts' statuses in C move to the generated IDEM_ATTEMPT_* names once
# idem_attempt_open is split (the other branch of issue 34 rewrites these
# files).
NAME_PENDING = ("extension/inbox/", "extension/attempts/")


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


def functions_self_test():
    """A function one line over the limit is refused, one at it is not, in each language."""
    bad = []
    bodies = {".c": "static int\nf(void)\n{\n%s}\n", ".cpp": "int engine::f(call &c) const\n{\n%s}\n",
              ".py": "def f():\n%s", ".js": "function f() {\n%s}\n"}
    lines = {".c": "\tx++;\n", ".cpp": "    x++;\n", ".py": "    x += 1\n", ".js": "  x += 1;\n"}
    # The body lines that make a function of MAX_FUNCTION_LINES: the
    # signature and the braces count.
    frame = {".c": 3, ".cpp": 3, ".py": 1, ".js": 2}
    for ext, body in bodies.items():
        at = body % (lines[ext] * (MAX_FUNCTION_LINES - frame[ext]))
        over = body % (lines[ext] * (MAX_FUNCTION_LINES - frame[ext] + 1))
        if not any(n > MAX_FUNCTION_LINES for _, _, n in function_lengths(over, ext)):
            bad.append("functions misses a %s function of %d lines" % (ext, MAX_FUNCTION_LINES + 1))
        if any(n > MAX_FUNCTION_LINES for _, _, n in function_lengths(at, ext)):
            bad.append("functions refuses a %s function of %d lines" % (ext, MAX_FUNCTION_LINES))
    return bad


def names_self_test():
    """A name as a literal is found in code and in an SQL text, not in a comment or a docstring."""
    found = lambda text, ext: [v for _, v in literals(text, ext)]  # noqa: E731
    bad = []
    if "pending" not in found('x = "pending"; // "dead"\n', ".c"):
        bad.append("names misses a C literal")
    if "dead" in found('x = 1; // "dead"\n', ".c"):
        bad.append("names reads a C comment")
    if not any("'expired'" in v for v in found('q = "SET state = \'expired\'"\n', ".py")):
        bad.append("names misses an SQL literal in a Python string")
    if found('"""A docstring "pending"."""\n', ".py"):
        bad.append("names reads a Python docstring")
    if "replay" not in found("const re = /^[a-z']+$/; f('replay');\n", ".js"):
        bad.append("names misses a JavaScript literal after a regular expression")
    return bad


def check_doc_markers():
    """Every fenced block of every Markdown file says how make test runs it
    (tests/docs/run_examples.py: run, compiled, or not run with a reason)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "docs"))
    import run_examples
    report("docs: every code block is run, compiled or marked",
           ["%s: %s" % bad for bad in run_examples.unmarked(run_examples.default_files())])


def main():
    check_protocol()
    check_sizes()
    check_guards()
    check_includes()
    check_calls()
    check_layers()
    check_names()
    check_functions()
    check_paths()
    check_filemap()
    check_doc_markers()
    check_self_test()
    if "--so" in sys.argv:
        check_exports(sys.argv[sys.argv.index("--so") + 1])
    return results.count(False)


if __name__ == "__main__":
    sys.exit(main())
