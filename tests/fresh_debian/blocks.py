#!/usr/bin/env python3
"""Print the install blocks of the docs as one shell script per block.

    python3 tests/fresh_debian/blocks.py ROOT            the blocks, each
        preceded by a line "# == FILE:LINE LABEL"
    python3 tests/fresh_debian/blocks.py ROOT --apt      only their apt-get lines

An install block is a ```sh block right after the comment
<!-- install: LABEL -->; the fresh_debian suite (tests/suites/
84_fresh_debian.sh) runs them, as written, on a fresh Debian 12.  Files,
in this order: README.md, then client/*/README.md.  An apt-get line must
be one line (no trailing backslash): --apt runs those lines alone to make
the cached snapshot of the packages.
"""

import glob
import os
import re
import sys

MARKER = re.compile(r"^<!--\s*install:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(```|~~~)\s*(\S*)\s*$")


def install_blocks(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    for i, line in enumerate(lines):
        m = MARKER.match(line.strip())
        if not m:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        f = FENCE.match(lines[j]) if j < len(lines) else None
        if not f or f.group(2) not in ("sh", "bash"):
            sys.exit("%s:%d: <!-- install: --> is not followed by a ```sh block" % (path, i + 1))
        k = j + 1
        while k < len(lines) and not lines[k].startswith(f.group(1)):
            k += 1
        out.append((i + 1, m.group(1).split(" (")[0], lines[j + 1:k]))
    return out


def main():
    root = sys.argv[1]
    apt = "--apt" in sys.argv[2:]
    files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "client", "*", "README.md")))
    n = 0
    for path in files:
        for line, label, body in install_blocks(path):
            n += 1
            rel = os.path.relpath(path, root)
            for b in body:
                if "apt-get" in b and b.rstrip().endswith("\\"):
                    sys.exit("%s:%d: keep an apt-get line on one line" % (rel, line))
            if apt:
                body = [b for b in body if re.match(r"^\s*(sudo\s+)?apt-get\s", b)]
            print("# == %s:%d %s" % (rel, line, label))
            print("\n".join(body))
    if n == 0:
        sys.exit("no <!-- install: --> block in README.md or client/*/README.md")


if __name__ == "__main__":
    main()
