"""protocol.toml read and checked, and what every generator of generate.py
shares: the file's path and the note each generated file opens with, the
key's digest, the storage rules, the attempt states, quoting."""

import hashlib
import json
import os
import re
import struct
import sys
import tomllib

import limits
import messaging

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SOURCE = "extension/protocol/protocol.toml"
NOTE = "Generated from %s by extension/protocol/generate.py: do not edit." % SOURCE


def load():
    with open(os.path.join(ROOT, SOURCE), "rb") as f:
        p = tomllib.load(f)
    validate(p)
    return p


def fail(msg):
    sys.exit("protocol.toml: " + msg)


def cache_key(p, v):
    h = hashlib.sha256(p["key"]["domain"].encode())
    for field in p["key"]["fields"]:
        b = v[field].encode()
        h.update(struct.pack(">I", len(b)) + b)
    return h.hexdigest()


def validate(p):
    """The cross-references hold, and the vectors are what SHA-256 says."""
    problems = {x["name"] for x in p["problem"]}
    results = {x["name"] for x in p["client_outcome"]}
    profiles = p["problems"]["profiles"]
    seen = set()
    for o in p["outcome"]:
        if o["name"] in seen:
            fail("outcome %s twice" % o["name"])
        seen.add(o["name"])
        if o["role"] not in ("win", "follow", "lookup"):
            fail("outcome %s: role %s" % (o["name"], o["role"]))
        if o["client"] not in ("run", "replay", "answer", "wait", "claim"):
            fail("outcome %s: client %s" % (o["name"], o["client"]))
        if o["client"] in ("answer", "wait") and o.get("problem") not in problems:
            fail("outcome %s needs a known problem" % o["name"])
        if o["role"] != "lookup" and o.get("result") not in results:
            fail("outcome %s needs a known result" % o["name"])
        if o["role"] == "lookup" and o["counted"]:
            fail("outcome %s: lookup outcomes are not counted" % o["name"])
    for x in p["problem"]:
        if sorted(x["status"]) != sorted(profiles):
            fail("problem %s: a status per profile" % x["name"])
    for v in p["key_vector"]:
        if len(v["key"].encode()) > p["key"]["max_bytes"]:
            fail("key vector %r is too long" % v["key"])
        if cache_key(p, v) != v["cache_key"]:
            fail("key vector %r: cache_key is %s" % (v["key"], cache_key(p, v)))
    for v in p["request_hash_vector"]:
        if hashlib.sha256(v["body"].encode()).hexdigest() != v["request_hash"]:
            fail("request hash vector %r" % v["body"])
    states = {t["from"] for t in p["attempt_transition"]} | {t["to"] for t in p["attempt_transition"]}
    for s in states:
        split_state(s)
    validate_client(p)
    messaging.validate(p)


def current_version():
    """The extension's version (pg_idem.control's default_version)."""
    with open(os.path.join(ROOT, "extension", "pg_idem.control"), encoding="utf-8") as f:
        return re.search(r"^default_version\s*=\s*'([0-9.]+)'", f.read(), re.M).group(1)


def version_tuple(v):
    return tuple(int(x) for x in v.split("."))


def validate_client(p):
    """The oldest extension is a released one or the current one, the
    validation statuses are ones the storage rules would store (releasing
    them is the point), and the defaults are within the limits."""
    c = p["client"]
    oldest = c["oldest_extension"]
    released = os.path.exists(os.path.join(ROOT, "extension", "releases", "pg_idem--%s.sql" % oldest))
    if not released and oldest != current_version():
        fail("client.oldest_extension %s is neither released (extension/releases/) nor %s"
             % (oldest, current_version()))
    for s in c["validation_statuses"]:
        if classify_status(p, s) != "finalize":
            fail("client.validation_statuses: %d is not finalized by the storage rules" % s)
    d, lim = c["defaults"], c["limits"]
    if not lim["min_lease_ms"] <= d["lease_ms"] <= lim["max_lease_ms"]:
        fail("client.defaults.lease_ms is outside client.limits")
    if d["profile"] not in p["problems"]["profiles"]:
        fail("client.defaults.profile %s is no profile" % d["profile"])
    if d["client_errors"] not in lim["client_errors"]:
        fail("client.defaults.client_errors %s is not one of client.limits.client_errors" % d["client_errors"])
    if not d["poll_min_ms"] <= d["poll_max_ms"] or not 0 <= d["poll_jitter"] < 1:
        fail("client.defaults: poll_min_ms <= poll_max_ms and 0 <= poll_jitter < 1")
    for old, new in p["problems"].get("deprecated_profiles", {}).items():
        if new["profile"] not in p["problems"]["profiles"] or old in p["problems"]["profiles"]:
            fail("problems.deprecated_profiles.%s: an old name for a profile" % old)
    names = [e["name"] for e in p["event"]]
    if len(set(names)) != len(names):
        fail("an event twice")
    if c["pool"]["event"] not in names:
        fail("client.pool.event %s is no [[event]]" % c["pool"]["event"])
    limits.validate(p, fail)
    for r in p["row_states"]:
        names = [x["name"] for x in r["state"]]
        if len(set(names)) != len(names):
            fail("row_states %s: a state twice" % r["name"])


def namespaced(p, namespace, target):
    """The target a namespace makes: protocol.toml's [key.namespace]."""
    ns = p["key"]["namespace"]
    if ns["field"] != "target":
        fail("key.namespace.field: the generators put it before the target only")
    return target if namespace is None else namespace + ns["separator"] + target


def table_states(p, name):
    """The state names of one [[row_states]] entry."""
    r = next(r for r in p["row_states"] if r["name"] == name)
    return [x["name"] for x in r["state"]]


def row_tables(r):
    """The tables whose state column a [[row_states]] entry describes."""
    return r["tables"] if "tables" in r else [r["table"]]


def attempt_states(p):
    """The attempts' statuses and failure reasons, in the order they appear."""
    statuses, reasons = [], []
    for t in p["attempt_transition"]:
        for k in ("from", "to"):
            status, reason = split_state(t[k])
            if status not in statuses:
                statuses.append(status)
            if reason and reason not in reasons:
                reasons.append(reason)
    return statuses, reasons


def check_install_sql(p):
    """The install script's CHECK constraints list the protocol's states:
    the keys' state, the attempts' status and failure reason (a fresh
    install's catalog is checked too, by sql/protocol_states.sql)."""
    statuses, reasons = attempt_states(p)
    want = [("extension/install/60_attempts.sql", "idem_attempts_status", set(statuses)),
            ("extension/install/60_attempts.sql", "idem_attempts_failure_reason", set(reasons))]
    for r in p["row_states"]:
        if r.get("check"):
            path = next(f for f in sorted(os.listdir(os.path.join(ROOT, "extension", "install")))
                        if "CREATE TABLE %s " % row_tables(r)[0] in open(
                            os.path.join(ROOT, "extension", "install", f), encoding="utf-8").read())
            want.append(("extension/install/" + path, r["check"], set(table_states(p, r["name"]))))
    bad = []
    for path, name, values in want:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            sql = f.read()
        m = re.search(name + r"\s+CHECK\s*\((.*?)\)\s*[,)]\s*\n", sql, re.S)
        listed = m and (re.search(r"ARRAY\s*\[([^\]]*)\]", m.group(1)) or re.search(r"IN\s*\(([^)]*)\)", m.group(1)))
        found = set(re.findall(r"'([a-z_]+)'", listed.group(1))) if listed else set()
        if found != values:
            bad.append("%s: constraint %s lists %s, the protocol %s" % (
                path, name, sorted(found), sorted(values)))
    return bad


def split_state(s):
    """"failed(reason)" -> ("failed", "reason"); "pending" -> ("pending", None)."""
    if "(" in s:
        status, reason = s[:-1].split("(")
        if not s.endswith(")") or status != "failed":
            fail("attempt state %s" % s)
        return status, reason
    return s, None


def storage_rules(p):
    out = []
    for r in p["storage_rule"]:
        if "statuses" in r:
            for s in r["statuses"]:
                out.append((s, s, r["action"]))
        else:
            out.append((r["from"], r["to"], r["action"]))
    return out


def classify_status(p, status):
    """The storage rules' action for an HTTP status."""
    for lo, hi, a in storage_rules(p):
        if lo <= status <= hi:
            return a
    return p["storage"]["default"]


def c_string(s):
    return json.dumps(s, ensure_ascii=False)


def upper(name):
    return name.upper()


