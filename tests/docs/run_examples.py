#!/usr/bin/env python3
"""Run every fenced example of every Markdown file (make test's examples suite).

    python3 tests/docs/run_examples.py [FILE.md ...]   every block of the files
                                                        (default: every tracked *.md)
    python3 tests/docs/run_examples.py --self-test      prove that each kind of
                                                        block can fail
    python3 tests/docs/run_examples.py --markers        only that every block of every
                                                        file says how it runs (no server;
                                                        the static suite runs it)

Every fenced block says how it runs, in an HTML comment on the lines just
before it (docs/design.md, "Examples in the docs", is the convention):

    <!-- example: sql admin -->      psql as the superuser, in the database app
    <!-- example: sql app -->        psql as my_service_role (only idem_client)
    <!-- example: python -->         the harness's python3, client/python on
                                     PYTHONPATH, as my_service_role
    <!-- example: node -->           node, with client/node's node_modules and
                                     pg-idem resolvable, as my_service_role
    <!-- example: bash -->           bash -euo pipefail from the repository's root,
                                     as the superuser, PGDATABASE=app
    <!-- example: cpp -->            compiled (g++ -std=c++17 -fsyntax-only)
                                     against client/cpp/include; the block's
                                     #include lines go first, then the prelude,
                                     so that a prelude may open a function (and
                                     the check close it) around a fragment
    <!-- example: cmake -->          the end of a consumer project's CMakeLists.txt
                                     (after its project() and an executable "app"
                                     of a main.cpp that calls the client), configured,
                                     built and run against the C++ client installed
                                     in IDEM_DOCS_CPP_PREFIX (the examples suite
                                     installs the client suite's build there; without
                                     one the block is reported as not run)
    <!-- example: python compile -->  a fragment (names it does not define):
    <!-- example: node compile -->    only compiled (Python's compile(), node
                                     --check as an ES module: top-level await is valid)
    <!-- example: python broker F --> a program needing a message broker (docs/
    <!-- example: node broker F -->   guides/brokers.md): only compiled here; the
                                     broker suite (tests/broker/run.py) runs it
                                     as the file F against a real RabbitMQ
    <!-- not-run: the reason -->     for what cannot run here (a Citus cluster)
    <!-- install: what -->           install lines (```sh): not run here; the
                                     fresh_debian suite (tests/fresh_debian/)
                                     runs them as written on a fresh Debian 12

Blocks that only compile (cpp, cmake, compile, broker) run in two threads
beside the others, which run in order against the database.  Every file of the repository is read (README.md, docs/, the clients'
READMEs, tests/bench/results/ ...: what git tracks, or what the harness
listed beside its copy of the tree).

(`<!-- getting-started:admin ... -->` and `<!-- getting-started:app ... -->`,
the README's, are `sql admin` and `sql app`.)  A ```text block is output or
a diagram and needs no marker.  Anything else without a marker is an error:
nothing goes untested silently.

Lines of the comment after its first are a hidden prelude, run before the
block; a comment `<!-- check: ... -->` right after the block is hidden code
run after it (a test of the app the block defines).  Lines of the block
that start with "--  " (SQL), "#  " (Python, bash) or "//  " (Node) are
expected output: the block's output lines (psql's \\echo; the program's
stdout) must match them in order ("…" matches anything).

Each file runs in a fresh database "app", set up as the README's Getting
started does (schema idem, the extension, my_service_role with
idem_client), unless the file says <!-- examples: empty database -->.
Its blocks run in order in that database; it is dropped afterwards, and
so are the roles its examples created.  The cluster is the one of the
libpq environment (PGHOST, PGPORT, PGUSER: a superuser), as make test
provides it.

Every relative link of those files, and of client/**/README.md, must lead
to a file that exists and, for a heading (#anchor) of a Markdown file, to a
heading that exists; each file's links count as one check.

The last line is "docs examples: N passed, N failed, N not run".
"""

import concurrent.futures
import glob
import itertools
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DB = "app"
APP_ROLE = "my_service_role"
KEEP_ROLES = {"idem_client", "idem_admin"}   # cluster-wide, made by CREATE EXTENSION, used by other databases
TIMEOUT = 180
# The SQL edition's suite (tests/suites/66_sql_edition.sh) runs the blocks
# marked "sql-edition" on its server (pg_tle, no library), and only those;
# the examples suite runs every other block.  Its databases are made from
# the template it names (its template1 knows pg_tle's registration of the
# SQL edition already).
SQL_EDITION = os.environ.get("IDEM_DOCS_SQL_EDITION") == "1"
TEMPLATE = os.environ.get("IDEM_DOCS_TEMPLATE", "template1")

SETUP = """
CREATE SCHEMA idem;
CREATE EXTENSION pg_idem SCHEMA idem;
CREATE ROLE my_service_role LOGIN;
GRANT idem_client TO my_service_role;
ALTER ROLE my_service_role SET search_path = idem, public;
ALTER DATABASE app SET search_path = idem, public;
"""

# The fence languages each kind of example accepts, and its expected-output prefix.
KINDS = {
    "sql": ({"sql"}, "--  "),
    "python": ({"python", "py"}, "#  "),
    "node": ({"js", "javascript"}, "//  "),
    "bash": ({"sh", "bash", "shell"}, "#  "),
    "cpp": ({"cpp", "c++"}, None),
    "cmake": ({"cmake"}, None),
}
# The C++ client installed where a cmake block's find_package looks.
CPP_PREFIX = os.environ.get("IDEM_DOCS_CPP_PREFIX", "")
# The consumer a cmake block ends: an executable that calls the client.
CMAKE_HEAD = """cmake_minimum_required(VERSION 3.16)
project(docs_consumer LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
add_executable(app main.cpp)
"""
CMAKE_MAIN = """#include <idem/runner.hpp>
#include <cstdio>
int main()
{
    std::printf("%s\\n", idem::to_hex(idem::cache_key("alice", "POST", "/orders", "k-1")).c_str());
    return 0;
}
"""
EXEMPT = {"text"}


class Block:
    def __init__(self, path, line, lang, body, marker, check):
        self.path, self.line, self.lang, self.body = path, line, lang, body
        self.marker, self.check = marker, check   # comment texts (without <!-- -->), or None

    def where(self):
        return "%s:%d" % (os.path.relpath(self.path, ROOT), self.line)


def comment_before(lines, i):
    """The HTML comment that ends on the last non-blank line before line i, or None."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0 or not lines[j].rstrip().endswith("-->"):
        return None
    k = j
    while k >= 0 and "<!--" not in lines[k]:
        k -= 1
    if k < 0 or not lines[k].lstrip().startswith("<!--"):
        return None
    text = "\n".join(lines[k:j + 1]).strip()
    return text[len("<!--"):-len("-->")].strip("\n ")


def comment_after(lines, i):
    """The <!-- check: ... --> comment starting on the first non-blank line after line i."""
    j = i + 1
    while j < len(lines) and not lines[j].strip():
        j += 1
    if j >= len(lines) or not lines[j].lstrip().startswith("<!-- check:"):
        return None
    k = j
    while k < len(lines) and not lines[k].rstrip().endswith("-->"):
        k += 1
    text = "\n".join(lines[j:k + 1]).strip()
    return text[len("<!-- check:"):-len("-->")]


def blocks(path):
    """The fenced blocks of a Markdown file (CommonMark fences of ``` or ~~~)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        start = i
        i += 1
        body = []
        while i < len(lines) and not re.match(r"^ {0,3}%s%s*\s*$" % (re.escape(fence), re.escape(fence[0])), lines[i]):
            body.append(lines[i])
            i += 1
        out.append(Block(path, start + 1, lang, "\n".join(body) + "\n",
                         comment_before(lines, start), comment_after(lines, i)))
        i += 1
    return out


def parse_marker(b):
    """(kind, options, prelude) of a block, ('not-run', reason, '') or ('exempt', ...); raises ValueError."""
    if b.lang in EXEMPT:
        return "exempt", [], ""
    if not b.lang:
        raise ValueError("a fenced block without a language: tag it (```text for output)")
    text = b.marker
    if text is not None and text.startswith("install:"):
        return "not-run", "an install block: the fresh_debian suite runs it on a fresh Debian 12", ""
    if text is None or not re.match(r"(example|not-run|getting-started):", text):
        raise ValueError("```%s block without <!-- example: ... --> or <!-- not-run: reason -->" % b.lang)
    first, _, prelude = text.partition("\n")
    if first.startswith("not-run:"):
        reason = first[len("not-run:"):].strip()
        if not reason:
            raise ValueError("<!-- not-run: --> needs a reason")
        return "not-run", reason, ""
    if first.startswith("getting-started:"):
        kind, opts = "sql", [first[len("getting-started:"):].split()[0]]
    else:
        words = first[len("example:"):].split()
        if not words:
            raise ValueError("<!-- example: --> names no kind")
        kind, opts = words[0], words[1:]
    if kind not in KINDS:
        raise ValueError("unknown example kind %r (one of %s)" % (kind, ", ".join(KINDS)))
    # "sql-edition": run on the SQL edition's server only (see SQL_EDITION).
    opts = [o for o in opts if o != "sql-edition"] + (["sql-edition"] if "sql-edition" in opts else [])
    if b.lang not in KINDS[kind][0]:
        raise ValueError("a ```%s block marked as a %s example" % (b.lang, kind))
    if kind == "sql" and (len([o for o in opts if o != "sql-edition"]) != 1 or opts[0] not in ("admin", "app")):
        raise ValueError("a sql example is run as 'admin' or 'app': <!-- example: sql admin -->")
    if "broker" in opts and (kind not in ("python", "node") or len(opts) != 2 or opts[0] != "broker"):
        raise ValueError("a broker program is <!-- example: python broker FILE --> or node broker FILE")
    if "compile" in opts and (kind not in ("python", "node") or opts != ["compile"]):
        raise ValueError("only python and node fragments are <!-- example: KIND compile -->")
    if kind in ("cpp", "cmake") and opts:
        raise ValueError("a %s example takes no options" % kind)
    return kind, opts, prelude + "\n" if prelude.strip() else ""


def slug(heading):
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def prose(path, code_spans=False):
    """A Markdown file without its fenced blocks, HTML comments and (unless asked) code spans."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and re.match(r"^ {0,3}%s%s*\s*$" % (re.escape(fence), re.escape(fence[0])), line):
            fence = None
        elif fence is None:
            out.append(line if code_spans else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(path):
    found, seen = set(), {}
    for line in prose(path, code_spans=True).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            a = slug(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            found.add(a if n == 0 else "%s-%d" % (a, n))
    return found


def broken_links(path):
    """Relative links of a Markdown file whose file or heading does not exist."""
    bad = []
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    headings = {}
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(path)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(full):
            bad.append("%s: no such file" % target)
        elif anchor and full.endswith(".md"):
            if full not in headings:
                headings[full] = anchors(full)
            if anchor not in headings[full]:
                bad.append("%s: no such heading" % target)
    return bad


def matches(expected, got):
    return re.fullmatch(".*".join(map(re.escape, expected.split("…"))), got) is not None


def offline(kind, opts):
    """Whether a block only compiles (no database): it may run beside the others."""
    return kind in ("cpp", "cmake") or opts[:1] in (["compile"], ["broker"])


class Runner:
    def __init__(self, tmp, workers=0):
        self.tmp = tmp
        self.passed = self.failed = self.not_run = 0
        self.results = []   # (line, ok, what was printed), for the self-test
        self.node_path = None
        self.serial = itertools.count()   # the examples' file names, unique across threads
        # Blocks that only compile run in these threads while the database's
        # examples run (the suite's time is mostly theirs, waiting on psql).
        self.pool = concurrent.futures.ThreadPoolExecutor(workers) if workers else None
        self.pending = []   # (block, label, future)

    def env(self, **extra):
        e = dict(os.environ)
        e.update(extra)
        return e

    def psql(self, *args, db="postgres", user=None, input=None):
        cmd = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db] + (["-U", user] if user else []) + list(args)
        return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=TIMEOUT,
                              env=self.env(PGOPTIONS="--client-min-messages=warning"))

    def roles(self):
        r = self.psql("-At", "-c", "SELECT rolname FROM pg_catalog.pg_roles")
        if r.returncode:
            raise RuntimeError("cannot list roles: " + r.stderr)
        return set(r.stdout.split())

    def drop_database(self):
        # A logical slot left by a failed example would keep the database.
        self.psql("-c", "SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots"
                  " WHERE database = '%s' AND NOT active" % DB)
        r = self.psql("-c", "DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB)
        if r.returncode:
            raise RuntimeError(r.stderr)

    def drop_roles(self, roles):
        for role in sorted(roles - KEEP_ROLES):
            self.psql("-c", 'DROP ROLE IF EXISTS "%s"' % role)

    def prepare(self, empty):
        self.drop_database()
        r = self.psql("-c", "CREATE DATABASE %s TEMPLATE %s" % (DB, TEMPLATE))
        if r.returncode:
            raise RuntimeError(r.stderr)
        if not empty:
            r = self.psql(db=DB, input=SETUP)
            if r.returncode:
                raise RuntimeError("setting up the database app: " + r.stderr)

    def node_modules(self):
        """client/node's dependencies (npm ci once, as the node suite does) and a pg-idem to require."""
        if self.node_path is None:
            node = os.path.join(ROOT, "client", "node")
            if not os.path.isdir(os.path.join(node, "node_modules", "pg")):
                r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=node,
                                   capture_output=True, text=True, timeout=600)
                if r.returncode:
                    raise RuntimeError("npm ci in client/node: " + r.stdout + r.stderr)
            links = os.path.join(self.tmp, "node_path")
            os.makedirs(links, exist_ok=True)
            if not os.path.lexists(os.path.join(links, "pg-idem")):
                os.symlink(node, os.path.join(links, "pg-idem"))
            self.node_path = links + os.pathsep + os.path.join(node, "node_modules")
        return self.node_path

    def execute(self, kind, opts, source, n):
        """Run one example's source; (returncode, stdout, stderr)."""
        ext = {"sql": "sql", "python": "py", "node": "mjs" if opts == ["compile"] else "js", "bash": "sh",
               "cpp": "cpp", "cmake": "cmake"}[kind]
        n = next(self.serial)
        path = os.path.join(self.tmp, "example%d.%s" % (n, ext))
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        app = dict(PGDATABASE=DB, PGUSER=APP_ROLE)
        if kind == "python" and offline(kind, opts):
            try:
                compile(source, path, "exec")
                return 0, "", ""
            except SyntaxError as e:
                return 1, "", "SyntaxError: %s" % e
        if opts[:1] == ["broker"] or opts == ["compile"]:
            # A fragment, or run by the broker suite against RabbitMQ; here it must compile.
            cmd = [sys.executable, "-m", "py_compile", path] if kind == "python" else ["node", "--check", path]
            env = self.env()
        elif kind == "sql":
            user = APP_ROLE if opts[0] == "app" else None
            cmd = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-P", "pager=off", "-d", DB, "-o", os.devnull,
                   "-f", path] + (["-U", user] if user else [])
            env = self.env()
        elif kind == "python":
            cmd = [sys.executable, path]
            env = self.env(PYTHONPATH=os.path.join(ROOT, "client", "python"), **app)
        elif kind == "node":
            cmd = ["node", path]
            env = self.env(NODE_PATH=self.node_modules(), PORT=str(free_port()), **app)
        elif kind == "bash":
            cmd = ["bash", "-euo", "pipefail", path]
            env = self.env(PGDATABASE=DB)
        elif kind == "cmake":
            cmd, env = self.cmake_project(path, source, n), self.env()
        else:
            inc = subprocess.run(["pg_config", "--includedir"], capture_output=True, text=True).stdout.strip()
            cmd = ["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-I", os.path.join(ROOT, "client", "cpp", "include"),
                   "-I", os.path.join(ROOT, "client", "cpp", "examples"), "-I", inc or "/usr/include/postgresql", path]
            env = self.env()
        try:
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return 1, "", "timed out after %d s" % TIMEOUT
        return r.returncode, r.stdout, r.stderr

    def cmake_project(self, path, source, n):
        """The command that configures, builds and runs a consumer project ending with source."""
        project = os.path.join(self.tmp, "cmake%d" % n)
        os.makedirs(project, exist_ok=True)
        with open(os.path.join(project, "CMakeLists.txt"), "w", encoding="utf-8") as f:
            f.write(CMAKE_HEAD + source)
        with open(os.path.join(project, "main.cpp"), "w", encoding="utf-8") as f:
            f.write(CMAKE_MAIN)
        build = os.path.join(project, "build")
        return ["bash", "-ec", 'cmake -S "$1" -B "$2" -DCMAKE_PREFIX_PATH="$3" -DCMAKE_BUILD_TYPE=Release >/dev/null\n'
                'cmake --build "$2" -j2 >/dev/null\n"$2/app" >/dev/null', "cmake", project, build, CPP_PREFIX]

    def run_block(self, b, kind, opts, prelude, n):
        body = b.body
        if kind == "cpp":
            # The block's includes before the prelude, which may open a function.
            lines = body.split("\n")
            prelude = "\n".join([l for l in lines if l.startswith("#include")] + [prelude])
            body = "\n".join(l for l in lines if not l.startswith("#include"))
        source = prelude + body + (b.check + "\n" if b.check else "")
        code, out, err = self.execute(kind, opts, source, n)
        prefix = KINDS[kind][1]
        expected = [l[len(prefix):] for l in b.body.split("\n") if prefix and l.startswith(prefix)]
        problems = []
        if code != 0:
            problems.append("exit status %d" % code)
        if expected:
            got = [l for l in out.split("\n") if l.strip()]
            if len(got) != len(expected) or not all(matches(e, g) for e, g in zip(expected, got)):
                problems.append("output differs from the block's expected lines")
                for k in range(max(len(expected), len(got))):
                    problems.append("  expected %-50r got %r" % (expected[k] if k < len(expected) else "",
                                                                 got[k] if k < len(got) else ""))
        if problems:
            detail = "\n".join(problems + ["  " + l for l in (out + err).strip().split("\n")[-25:]])
            return False, detail
        return True, ""

    def report(self, b, ok, text):
        print("%s %s %s" % ("ok" if ok else "not ok", b.where(), text))
        self.results.append((b.line, ok, text))
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def check_links(self, path):
        bad = broken_links(path)
        where = os.path.relpath(path, ROOT)
        print("%s %s: links%s" % ("not ok" if bad else "ok", where, (": " + "; ".join(bad)) if bad else ""))
        self.results.append((0, not bad, "links: " + "; ".join(bad)))
        if bad:
            self.failed += 1
        else:
            self.passed += 1

    def run_file(self, path):
        try:
            bs = blocks(path)
        except OSError as e:
            print("not ok %s: %s" % (path, e))
            self.failed += 1
            return
        parsed = []
        for b in bs:
            try:
                parsed.append((b, parse_marker(b)))
            except ValueError as e:
                self.report(b, False, str(e))
        no_cpp = [(b, m) for b, m in parsed if m[0] == "cmake" and not SQL_EDITION and not CPP_PREFIX]
        todo = [(b, m) for b, m in parsed if m[0] not in ("exempt", "not-run")
                and ("sql-edition" in m[1]) == SQL_EDITION and (b, m) not in no_cpp]
        for b, m in parsed:
            if (b, m) in no_cpp:
                print("not run %s ```cmake: no installed C++ client (IDEM_DOCS_CPP_PREFIX): the client suite "
                      "builds it; make test SUITES=\"client examples\"" % b.where())
                self.not_run += 1
            elif m[0] == "not-run":
                print("not run %s ```%s: %s" % (b.where(), b.lang, m[1]))
                self.not_run += 1
            elif m[0] != "exempt" and ("sql-edition" in m[1]) != SQL_EDITION:
                print("not run %s ```%s: %s" % (b.where(), b.lang, "on the SQL edition's server: tests/suites/66_sql_edition.sh runs it"
                                                if not SQL_EDITION else "on the C edition's server: the examples suite runs it"))
                self.not_run += 1
        if not todo:
            return
        with open(path, encoding="utf-8") as f:
            empty = "<!-- examples: empty database -->" in f.read()
        for n, (b, (kind, opts, prelude)) in enumerate(todo):
            if offline(kind, opts):
                label = " ".join([kind] + opts)
                if self.pool:
                    self.pending.append((b, label, self.pool.submit(self.run_block, b, kind, opts, prelude, n)))
                else:
                    ok, detail = self.run_block(b, kind, opts, prelude, n)
                    self.report(b, ok, label + ("\n" + detail if detail else ""))
        todo = [(b, m) for b, m in todo if not offline(m[0], m[1])]
        if not todo:
            return
        before = self.roles()
        try:
            self.prepare(empty)
            for n, (b, (kind, opts, prelude)) in enumerate(todo):
                ok, detail = self.run_block(b, kind, opts, prelude, n)
                label = " ".join([kind] + opts)
                self.report(b, ok, label + ("\n" + detail if detail else ""))
        except RuntimeError as e:
            print("not ok %s: %s" % (os.path.relpath(path, ROOT), e))
            self.failed += 1
        finally:
            try:
                self.drop_database()
            except RuntimeError as e:
                print("warning: %s" % e)
            self.drop_roles(self.roles() - before)

    def finish(self):
        """Report the blocks that compiled in the threads."""
        for b, label, future in self.pending:
            ok, detail = future.result()
            self.report(b, ok, label + ("\n" + detail if detail else ""))
        self.pending = []
        if self.pool:
            self.pool.shutdown()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def default_files():
    """Every Markdown file of the repository: the tracked ones (git ls-files, or
    the list the harness wrote beside its copy of the tree), or, in a copy
    with neither, every one outside dependencies and build output."""
    listed = os.path.join(ROOT, ".tracked-files")
    if os.path.exists(os.path.join(ROOT, ".git")):
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "*.md"], capture_output=True, text=True, check=True)
        names = out.stdout.split("\0")
    elif os.path.exists(listed):
        with open(listed, encoding="utf-8") as f:
            names = f.read().split("\0")
    else:
        names = [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "**", "*.md"), recursive=True)
                 if not re.search(r"(^|/)(node_modules|build|tmp_check)/", os.path.relpath(p, ROOT))]
    names = [n for n in names if n.endswith(".md") and os.path.exists(os.path.join(ROOT, n))]
    # README.md first: the Getting started the others build on.
    return sorted((os.path.join(ROOT, n) for n in names), key=lambda p: (p != os.path.join(ROOT, "README.md"), p))


def unmarked(files):
    """Every block of the files that does not say how it runs: (where, why)."""
    bad = []
    for path in files:
        for b in blocks(path):
            try:
                parse_marker(b)
            except ValueError as e:
                bad.append((b.where(), str(e)))
    return bad


# --self-test: one page whose every block must be reported as a failure,
# except the first, which must pass.  Each kind of example is shown to fail
# on a wrong expectation or an error, and so are an unmarked block, a marker
# for another language and a not-run without a reason.
SELF_TEST = '''# Self-test

Links that go nowhere: [a file](no-such-file.md), [a heading](#no-such-heading).

<!-- example: sql app -->
```sql
SELECT idem_key('p', 'POST', '/', 'k') IS NOT NULL AS ok \\gset
\\echo ok: :ok
--  ok: t
```

<!-- example: sql app -->
```sql
\\echo claim: claimed
--  claim: replay
```

<!-- example: sql app -->
```sql
SELECT idem_no_such_function();
```

<!-- example: sql app -->
```sql
SELECT * FROM idem_keys;   -- my_service_role may not read the table
```

<!-- example: python -->
```python
import pg_idem
assert pg_idem.cache_key("p", "POST", "/", "k") == b"", "a wrong cache key"
```

<!-- example: python -->
```python
print("replay")
#  claimed
```

<!-- example: node -->
```js
const idem = require('pg-idem');
if (idem.cacheKey('p', 'POST', '/', 'k').length !== 0) throw new Error('a wrong cache key');
```

<!-- example: bash -->
```sh
psql -At -c "SELECT 1" | grep -qx 2
```

<!-- example: cpp -->
```cpp
#include <idem/runner.hpp>
idem::no_such_type t;
```

<!-- example: python broker bad.py -->
```python
def consume(:   # a broker program is compiled here, run by the broker suite
```

<!-- example: python compile -->
```python
pool.claim(   # a fragment is compiled, not run: a syntax error fails it
```

```sql
SELECT 1;   -- no marker
```

<!-- example: python -->
```sql
SELECT 1;   -- a marker for another language
```

<!-- not-run: -->
```sql
SELECT 1;   -- not-run without a reason
```

<!-- example: sql app -->
```sql
SELECT 1;
```
<!-- check:
\\echo the hidden check runs after the block, and fails it
SELECT 1/0;
-->
'''


# Why each block of SELF_TEST after the first must fail, in order.
SELF_TEST_WANT = [
    "expected 'claim: replay'", "idem_no_such_function() does not exist", "permission denied for table idem_keys",
    "AssertionError: a wrong cache key", "expected 'claimed'", "Error: a wrong cache key", "bash\nexit status 1",
    "no_such_type", "SyntaxError", "SyntaxError", "block without <!-- example", "a ```sql block marked as a python example",
    "needs a reason", "division by zero",
]


def self_test(tmp):
    page = os.path.join(tmp, "self-test.md")
    with open(page, "w", encoding="utf-8") as f:
        f.write(SELF_TEST)
    runner = Runner(tmp)
    runner.check_links(page)
    links = runner.results.pop()
    runner.run_file(page)
    results = sorted(runner.results)
    bad = []
    if links[1] or "no-such-file.md: no such file" not in links[2] or "#no-such-heading: no such heading" not in links[2]:
        bad.append("broken links were not noticed: %s" % links[2])
    if len(results) != len(SELF_TEST_WANT) + 1 or not results[0][1]:
        bad.append("%d results, the first %s" % (len(results), "passed" if results and results[0][1] else "failed"))
    for (line, ok, text), want in zip(results[1:], SELF_TEST_WANT):
        if ok or want not in text:
            bad.append("line %d: %s, not a failure for %r" % (line, "passed" if ok else "failed otherwise", want))
    print("docs examples self-test: every kind of block can fail: %s" % ("; ".join(bad) or "ok"))
    return 1 if bad else 0


def main(argv):
    tmp = tempfile.mkdtemp(prefix="pg_idem.docs.")
    try:
        if argv[:1] == ["--self-test"]:
            return self_test(tmp)
        if argv[:1] == ["--markers"]:
            bad = unmarked(default_files())
            for where, why in bad:
                print("not ok %s: %s" % (where, why))
            print("docs markers: %d files, %d blocks without a marker" % (len(default_files()), len(bad)))
            return 1 if bad else 0
        files = [os.path.abspath(a) for a in argv] or default_files()
        runner = Runner(tmp, workers=2)
        for path in files:
            runner.check_links(path)
        for path in files:
            runner.run_file(path)
        runner.finish()
        print("docs examples: %d passed, %d failed, %d not run" % (runner.passed, runner.failed, runner.not_run))
        return 1 if runner.failed or not runner.passed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
