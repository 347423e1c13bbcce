"""pg_idem for Python: run a handler once per Idempotency-Key, over psycopg 3.

    from pg_idem import Runner, Config, Request, Response
    runner = Runner("dbname=app", Config(lease=10, follower_wait_budget=2))
    result = runner.run(Request("user-17", "POST", "/payments", [key], body), handler)

pg_idem.aio has the asyncio runner, pg_idem.asgi and pg_idem.wsgi the middleware.
"""

from .config import IETF, SEED, Config, ConfigError
from .http import (FAIL, FINALIZE, RELEASE, REPLAY_HEADER, HeaderAllowlist, Response, classify,
                   is_never_stored, problem, problems)
from .key import InvalidKey, KeyStatus, cache_key, check_key, check_key_header, request_hash
from ._checks import ErrorReport, StoreMisconfigured
from ._pool import PoolExhausted
from ._engine import ClaimContext, Request, RunResult
from .runner import RetryRequest, Runner, SimplePool

__version__ = "0.6.0"

__all__ = [
    "Config", "ConfigError", "RetryRequest", "IETF", "SEED", "Runner", "SimplePool", "Request", "Response",
    "RunResult", "ClaimContext", "classify", "FINALIZE", "RELEASE", "FAIL", "REPLAY_HEADER",
    "HeaderAllowlist", "is_never_stored", "problem", "problems", "KeyStatus", "InvalidKey",
    "cache_key", "check_key", "check_key_header", "request_hash", "ErrorReport", "StoreMisconfigured",
    "PoolExhausted",
]
