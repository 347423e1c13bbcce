"""pg_idem for Python: run a handler once per Idempotency-Key, over psycopg 3.

    from pg_idem import Runner, Config, Request, Response
    runner = Runner("dbname=app", Config(lease=10, follower_wait_budget=2))
    result = runner.run(Request("user-17", "POST", "/payments", [key], body), handler)

pg_idem.aio has the asyncio runner, pg_idem.asgi and pg_idem.wsgi the middleware.
"""

import warnings as _warnings

from . import protocol as _protocol
from .config import CONFLICT409, IETF, Config, ConfigError
from .http import (FAIL, FINALIZE, RELEASE, REPLAY_HEADER, HeaderAllowlist, Response, classify,
                   is_never_stored, problem, problems)
from .key import InvalidKey, KeyStatus, cache_key, check_key, check_key_header, request_hash
from ._checks import ErrorReport, StoreMisconfigured
from ._pool import PoolExhausted
from ._engine import ClaimContext, Request, RunResult
from .runner import RetryRequest, Runner, SimplePool

__version__ = "0.6.0"

__all__ = [
    "Config", "ConfigError", "RetryRequest", "IETF", "CONFLICT409", "Runner", "SimplePool", "Request", "Response",
    "RunResult", "ClaimContext", "classify", "FINALIZE", "RELEASE", "FAIL", "REPLAY_HEADER",
    "HeaderAllowlist", "is_never_stored", "problem", "problems", "KeyStatus", "InvalidKey",
    "cache_key", "check_key", "check_key_header", "request_hash", "ErrorReport", "StoreMisconfigured",
    "PoolExhausted",
]


def __getattr__(name):
    """pg_idem.SEED, 0.5.0's name of CONFLICT409: still there, with a warning."""
    if name in (old.upper() for old in _protocol.DEPRECATED_PROFILES):
        new, until = _protocol.DEPRECATED_PROFILES[name.lower()]
        _warnings.warn("pg_idem.%s is now pg_idem.%s; the old name goes in %s" % (name, new.upper(), until),
                       DeprecationWarning, stacklevel=2)
        return new
    raise AttributeError("module 'pg_idem' has no attribute %r" % name)
