"""The runner's configuration, validated when it is made. Its defaults and
limits are the protocol's (protocol.toml's [client.defaults] and
[client.limits], the same in every client); durations here are seconds."""

import dataclasses
import datetime
import re

from .http import is_never_stored, profile_of

from . import protocol
from .protocol import Profile

_D, _L = protocol.DEFAULTS, protocol.LIMITS
IETF, CONFLICT409 = Profile.IETF, Profile.CONFLICT409
DURATIONS = ("lease", "renew_interval", "follower_wait_budget", "poll_min", "poll_max", "retry_after",
             "failure_cooldown")
_TOKEN = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")


class ConfigError(ValueError):
    """A setting is out of range; the message names it."""


def _ms(v):
    return "%g ms" % (v * 1000.0)


@dataclasses.dataclass(frozen=True)
class Config:
    """Durations are seconds (int or float) or datetime.timedelta, as
    Python's own time.sleep and asyncio take them (Node's client takes
    milliseconds, as JavaScript's timers do). ``Config()`` is valid as it
    is; the first request (or Runner.check()) also checks the lease against
    the server's idem.max_lease.

    The defaults below are protocol.DEFAULTS (docs/reference/protocol.md).

    lease                         claim lifetime without renewal (30 s)
    renew_interval                renewal period, < lease (default lease / 3)
    follower_wait_budget          how long a duplicate waits for the winner (5 s)
    poll_min, poll_max, poll_jitter  fallback polling backoff (50 ms, 1 s, 0.25)
    retry_after                   Retry-After of in-progress answers (1 s)
    failure_cooldown              cooldown after 5xx/408/429 (2 s)
    max_request_body_bytes        larger requests get 413 (1 MiB)
    max_cacheable_response_bytes  larger responses are stored not replayable (2 MiB)
    max_iterations                cap on claim/wait rounds per request (100)
    transaction_attempts          tries of a fenced/in-transaction handler on 40001/40P01 (3)
    profile                       "ietf" or "conflict409" status codes ("seed", 0.5.0's
                                  name of conflict409, is accepted with a warning)
    replay_headers                added to the replay allowlist
    schema                        schema of the pg_idem functions (None: search_path)
    server_wait                   None: use idem_claim(..., max_wait) when the server
                                  has it; False: always poll
    namespace                     a service's name, part of every cache key, so that
                                  services on one role and route never share keys
    fingerprint                   body -> bytes: what the request hash is taken of
                                  (pg_idem.fingerprint.canonical_json, json_fields(...));
                                  None: the body's bytes
    client_errors                 "release" (default): 400 and 422 (validation failures)
                                  are not stored, a corrected retry with the key runs;
                                  "store": stored and replayed, as the protocol's table says
    """

    lease: float = _D["lease_ms"] / 1000.0
    renew_interval: float = None
    follower_wait_budget: float = _D["follower_wait_budget_ms"] / 1000.0
    poll_min: float = _D["poll_min_ms"] / 1000.0
    poll_max: float = _D["poll_max_ms"] / 1000.0
    poll_jitter: float = _D["poll_jitter"]
    retry_after: float = _D["retry_after_ms"] / 1000.0
    failure_cooldown: float = _D["failure_cooldown_ms"] / 1000.0
    max_request_body_bytes: int = _D["max_request_body_bytes"]
    max_cacheable_response_bytes: int = _D["max_cacheable_response_bytes"]
    max_iterations: int = _D["max_iterations"]
    transaction_attempts: int = _D["transaction_attempts"]
    profile: str = _D["profile"]
    replay_headers: tuple = ()
    schema: str = None
    server_wait: bool = None
    namespace: str = None
    fingerprint: object = None
    client_errors: str = _D["client_errors"]

    def __post_init__(self):
        set_ = lambda name, v: object.__setattr__(self, name, v)  # noqa: E731
        for name in DURATIONS:
            v = getattr(self, name)
            if isinstance(v, datetime.timedelta):
                set_(name, v.total_seconds())
        if self.renew_interval is None and _is_number(self.lease):
            set_("renew_interval", max(0.001, self.lease / _D["renew_divisor"]))
        set_("profile", profile_of(self.profile))
        set_("replay_headers", tuple(str(h).lower() for h in (self.replay_headers or ())))
        self._check()

    def _check(self):
        for name in DURATIONS:
            if not _is_number(getattr(self, name)):
                raise ConfigError("pg_idem.Config: %s must be a number of seconds or a datetime.timedelta"
                                  % name)
        if not _is_number(self.poll_jitter):
            raise ConfigError("pg_idem.Config: poll_jitter must be a number")
        for name in ("lease", "renew_interval", "follower_wait_budget", "poll_min",
                     "poll_max", "retry_after", "failure_cooldown"):
            v = getattr(self, name)
            if v <= 0:
                raise ConfigError("pg_idem.Config: %s must be positive (got %s)" % (name, _ms(v)))
        if self.lease < _L["min_lease_ms"] / 1000.0:
            raise ConfigError("pg_idem.Config: lease must be at least %d ms (got %s)"
                              % (_L["min_lease_ms"], _ms(self.lease)))
        if self.lease > _L["max_lease_ms"] / 1000.0:
            raise ConfigError("pg_idem.Config: lease must be at most %g hours (got %g s; durations are seconds "
                              "or datetime.timedelta)" % (_L["max_lease_ms"] / 3600000.0, self.lease))
        if self.renew_interval >= self.lease:
            raise ConfigError("pg_idem.Config: renew_interval (%s) must be shorter than lease (%s)"
                              % (_ms(self.renew_interval), _ms(self.lease)))
        if self.poll_min > self.poll_max:
            raise ConfigError("pg_idem.Config: poll_min (%s) must not exceed poll_max (%s)"
                              % (_ms(self.poll_min), _ms(self.poll_max)))
        if not 0.0 <= self.poll_jitter < 1.0:
            raise ConfigError("pg_idem.Config: poll_jitter must be in [0, 1) (got %r)" % self.poll_jitter)
        for name in ("max_request_body_bytes", "max_cacheable_response_bytes", "max_iterations",
                     "transaction_attempts"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError("pg_idem.Config: %s must be a positive integer (got %r)" % (name, v))
        if self.profile not in protocol.PROFILES:
            raise ConfigError("pg_idem.Config: profile must be one of %s (got %r)"
                              % (", ".join(repr(x) for x in protocol.PROFILES), self.profile))
        for h in self.replay_headers:
            if not _TOKEN.match(h):
                raise ConfigError('pg_idem.Config: replay header "%s" is not a valid header name' % h)
            if is_never_stored(h):
                raise ConfigError('pg_idem.Config: replay header "%s" carries credentials or '
                                  "session state and is never stored" % h)
        if self.schema is not None and (not isinstance(self.schema, str) or "\x00" in self.schema
                                        or not self.schema):
            raise ConfigError("pg_idem.Config: schema must be a non-empty name without NUL")
        if self.namespace is not None and (not isinstance(self.namespace, str) or not self.namespace
                                           or re.search(r"[\s\x00]", self.namespace)):
            raise ConfigError("pg_idem.Config: namespace must be a non-empty name without spaces (got %r)"
                              % (self.namespace,))
        if self.fingerprint is not None and not callable(self.fingerprint):
            raise ConfigError("pg_idem.Config: fingerprint must be a function of the body (bytes -> bytes)")
        if self.client_errors not in _L["client_errors"]:
            raise ConfigError("pg_idem.Config: client_errors must be %s (got %r)"
                              % (" or ".join(repr(x) for x in _L["client_errors"]), self.client_errors))
        if self.server_wait not in (None, False, True):
            raise ConfigError("pg_idem.Config: server_wait must be None, True or False")


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def with_options(config, namespace=None, fingerprint=None, client_errors=None):
    """config (or Config()) with the middleware's own options set where given."""
    config = config or Config()
    changes = {k: v for k, v in (("namespace", namespace), ("fingerprint", fingerprint),
                                 ("client_errors", client_errors)) if v is not None}
    return dataclasses.replace(config, **changes) if changes else config
