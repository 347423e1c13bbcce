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

import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the generators

from gen_c import gen_c_errors, gen_c_header, gen_c_source
from gen_cpp import gen_cpp
from gen_data import gen_conformance, gen_sql_states, gen_sql_vectors
from gen_docs import gen_docs
from gen_node import gen_node
from gen_python import gen_python
import messaging
from model import ROOT, check_install_sql, load


OUTPUTS = [
    ("extension/core/protocol.h", gen_c_header),
    ("extension/core/protocol.c", gen_c_source),
    ("extension/core/errors.h", gen_c_errors),
    ("client/cpp/include/idem/protocol.hpp", gen_cpp),
    ("client/python/pg_idem/protocol.py", gen_python),
    ("client/node/lib/protocol.js", gen_node),
    ("client/conformance/protocol.json", gen_conformance),
    ("sql/key_vectors.sql", gen_sql_vectors),
    ("sql/protocol_states.sql", gen_sql_states),
    ("docs/reference/protocol.md", gen_docs),
]


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

