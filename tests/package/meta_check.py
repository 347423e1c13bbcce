#!/usr/bin/env python3
"""META.json is a valid PGXN distribution description (meta-spec 1.0.0).

    python3 tests/package/meta_check.py META.json extension/pg_idem.control

Checks what PGXN::Meta::Validator checks for the keys we use: the required
keys, semantic versions, the license, each provided extension's file, and
that the versions agree with the control file's default_version.
"""

import json
import os
import re
import sys

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+)?$")
LICENSES = {"agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd", "freebsd",
            "gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1", "lgpl_3_0", "mit",
            "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5", "postgresql", "qpl_1_0", "ssleay",
            "sun", "zlib", "open_source", "restricted", "unrestricted", "unknown"}
PREREQ_PHASES = {"configure", "build", "test", "runtime", "develop"}
PREREQ_RELATIONS = {"requires", "recommends", "suggests", "conflicts"}


def main(meta_path, control_path):
    root = os.path.dirname(os.path.abspath(meta_path))
    meta = json.load(open(meta_path, encoding="utf-8"))
    control = open(control_path, encoding="utf-8").read()
    m = re.search(r"^default_version\s*=\s*'([^']+)'", control, re.M)
    version = m.group(1) if m else None
    errors = []
    for key in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
        if key not in meta:
            errors.append("required key %s is missing" % key)
    if meta.get("meta-spec", {}).get("version") != "1.0.0":
        errors.append("meta-spec.version must be 1.0.0")
    if not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$", meta.get("name", "")):
        errors.append("name %r is not a PGXN name" % meta.get("name"))
    if not SEMVER.match(str(meta.get("version", ""))):
        errors.append("version %r is not a semantic version" % meta.get("version"))
    if meta.get("version") != version:
        errors.append("version %r is not the control file's %r" % (meta.get("version"), version))
    lic = meta.get("license")
    if isinstance(lic, str) and lic not in LICENSES:
        errors.append("license %r is not one of PGXN's" % lic)
    for name, ext in meta.get("provides", {}).items():
        for key in ("file", "version"):
            if key not in ext:
                errors.append("provides.%s.%s is missing" % (name, key))
        if not SEMVER.match(str(ext.get("version", ""))):
            errors.append("provides.%s.version is not a semantic version" % name)
        if ext.get("version") != version:
            errors.append("provides.%s.version %r is not %r" % (name, ext.get("version"), version))
        for key in ("file", "docfile"):
            if key in ext and not os.path.isfile(os.path.join(root, ext[key])):
                errors.append("provides.%s.%s %s does not exist" % (name, key, ext[key]))
    for phase, relations in meta.get("prereqs", {}).items():
        if phase not in PREREQ_PHASES:
            errors.append("prereqs phase %s is unknown" % phase)
        for rel, reqs in relations.items():
            if rel not in PREREQ_RELATIONS:
                errors.append("prereqs.%s relation %s is unknown" % (phase, rel))
            for req, ver in reqs.items():
                if not SEMVER.match(str(ver)) and ver != 0:
                    errors.append("prereqs.%s.%s.%s version %r" % (phase, rel, req, ver))
    for key, value in meta.get("resources", {}).items():
        url = value.get("web") or value.get("url") if isinstance(value, dict) else None
        if url and ".invalid" in url:
            errors.append("resources.%s points nowhere (%s)" % (key, url))
    for e in errors:
        print("META.json: " + e)
    print("META.json: %s" % ("valid" if not errors else "%d problems" % len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
