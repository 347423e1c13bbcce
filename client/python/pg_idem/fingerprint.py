"""Fingerprints: what the request hash is taken of (Config.fingerprint).

By default it is the body's bytes, so {"amount": 5} and {"amount":5} are two
requests and the second is answered "key reused". With canonical_json they
are one; with json_fields("amount", "to") only those fields count (as
Powertools' payload validation picks fields with JMESPath). A body that is
not JSON is fingerprinted by its bytes."""

import json


def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _parse(body):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return _NOT_JSON


_NOT_JSON = object()


def canonical_json(body):
    """The JSON body with sorted keys and no insignificant white space."""
    value = _parse(body)
    return body if value is _NOT_JSON else _canonical(value)


def json_fields(*paths):
    """A fingerprint of the chosen fields only ("amount", "to.account"):
    other fields may differ between retries with the same key."""
    if not paths:
        raise ValueError("json_fields needs at least one field")
    split = [p.split(".") for p in paths]

    def pick(value, parts):
        for part in parts:
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value

    def fingerprint(body):
        value = _parse(body)
        if value is _NOT_JSON:
            return body
        return _canonical({p: pick(value, s) for p, s in zip(paths, split)})
    return fingerprint
