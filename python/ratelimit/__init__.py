# SPDX-License-Identifier: MIT
"""Exact rate limiting over libratelimit (docs/python.md).

    import ratelimit
    limiter = ratelimit.Limiter(ratelimit.Policy("token-bucket 10/s burst=20"))
    d = limiter.check("user:42")
    if not d.allowed:
        retry_in = d.retry_after        # seconds (inf: never)

Policies take the library's text form (docs/policy.md) or the wording of
`limits` and Flask-Limiter ("10/minute", "10 per minute", "5/second;
100/hour"), which makes fixed windows unless `algorithm` says otherwise.
Stores: memory_store(), shm_store(path, max_keys=N), redis_store(url).
Errors of the library raise ratelimit.Error (the library's message, .code,
.name); wrong types raise TypeError, numbers out of range OverflowError,
a closed limiter ValueError.
"""

import asyncio as _asyncio
import collections as _collections
import re as _re

from . import _ratelimit
from ._ratelimit import (Decision, Error, Fair, Limiter, Lease, Store, memory_store,
                         monotonic_ns, noop, parse_duration, redis_store,
                         redis_async_store,
                         shm_store, strerror, NEVER, KEY_MAX)
from ._ratelimit import RulesHeld, SyncedLimiter
# The DynamoDB store, when the library was built with it (the default).
if hasattr(_ratelimit, "dynamodb_store"):
    from ._ratelimit import dynamodb_counters, dynamodb_last_error, dynamodb_store

__version__ = _ratelimit.__version__

# The error codes: EINVAL, EKEY, EPOLICY, ERANGE, ESTORE, ... (Error.code).
_CODES = [n for n in dir(_ratelimit) if n[:1] == "E" and n[1:].isupper()]
globals().update((n, getattr(_ratelimit, n)) for n in _CODES)

# The wording of `limits` (its limits.util.parse_many): "[count] [per|/]
# [n] [unit]", several joined by , ; or |; and the library's short units
# (s, m, h, d: "10/s", "100/5m"), as the README writes a rate.
_LIMITS_ONE = _re.compile(
    r"\s*([0-9]+)\s*(?:/|\s*per\s*)\s*([0-9]+)?\s*"
    r"(?:(second|minute|hour|day|month|year)s?|(s|m|h|d))\s*", _re.IGNORECASE)
_LIMITS_SEP = _re.compile(r"[,;|]")
# Its units in the library's: a month is 30 days, a year 12 months, as
# `limits` counts them.
_LIMITS_UNITS = {"second": (1, "s"), "minute": (1, "m"), "hour": (1, "h"),
                 "day": (1, "d"), "month": (30, "d"), "year": (360, "d")}
_SHORT_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}
_ALGORITHMS = ("token-bucket", "gcra", "leaky-bucket", "fixed-window",
               "sliding-log", "sliding-window")


def limits_text(text, algorithm="fixed-window"):
    """The library's policy text for `limits` wording ("10/minute",
    "10 per 2 hours; 100/day"), each limit under `algorithm` (a bucket's
    burst or capacity is the count); None when `text` is not that wording."""
    if algorithm not in _ALGORITHMS:
        raise ValueError("algorithm must be one of %s, not %r"
                         % (", ".join(_ALGORITHMS), algorithm))
    parts = []
    for one in _LIMITS_SEP.split(text):
        m = _LIMITS_ONE.fullmatch(one)
        if not m:
            return None
        count, n = m.group(1), int(m.group(2) or 1)
        unit = (m.group(3) or _SHORT_UNITS[m.group(4).lower()]).lower()
        scale, suffix = _LIMITS_UNITS[unit]
        part = "%s %s/%d%s" % (algorithm, count, n * scale, suffix)
        if algorithm in ("token-bucket", "gcra"):
            part += " burst=" + count
        elif algorithm == "leaky-bucket":
            part += " capacity=" + count
        parts.append(part)
    return "; ".join(parts)


def raise_store_error(decision):
    """Raises Error for a decision the store failed (reason 'store-error'),
    with the store's code and message, for callers that would rather stop
    than take the fail mode's verdict."""
    name, text = strerror(decision.error)
    e = Error(text)
    e.code, e.name = decision.error, name
    raise e


class Policy(_ratelimit.Policy):
    """Policy(text, name=None, algorithm="fixed-window"): the library's text
    form, or the wording of `limits` (each of its limits then under
    `algorithm`).  str(policy) is the canonical text; .limits the limits."""

    def __init__(self, text, name=None, algorithm="fixed-window"):
        if isinstance(text, (str, bytes)):
            s = text.decode() if isinstance(text, bytes) else text
            if "\0" not in s:
                translated = limits_text(s, algorithm)
                if translated is not None:
                    text = translated
        super().__init__(text, name)


class Limited(Exception):
    """Raised by InFlight.lease() when the in-flight limit (or a rate limit
    of its policy) denies: .decision says which and when to retry."""

    def __init__(self, decision):
        super().__init__("limited: retry after %.3f s" % decision.retry_after)
        self.decision = decision


class InFlight(_ratelimit.InFlight):
    """InFlight("concurrency 10 ttl=30s[; token-bucket 5/s]", store=None):
    at most N requests of a key at once (docs/leases.md).  acquire() ->
    (Decision, Lease or None); lease() -> a Lease to use in a with block:

        with inflight.lease("user:42"):
            ...                     # released on leaving, even by an error
    """

    def lease(self, key, *, critical=False):
        d, held = self.acquire(key, critical=critical)
        if held is None:
            raise Limited(d)
        return held


class Outcome(_collections.namedtuple(
        "Outcome", "allowed denied_by delay_ns applied status headers")):
    """A request's outcome under the rules: allowed, the index of the first
    policy that denied (-1: none), the longest reservation's wait (ns),
    `applied` as (policy name, Decision, refunded) for each policy, and
    the HTTP status (0: serve; 429; 503) and header fields."""


class Rules(_ratelimit._Rules):
    """Rules(path): a rules file (docs/api-server.md): which named policies
    a request gets from its attributes, and under which key."""

    def check(self, limiter, key, attrs=None, permits=1, *, max_wait=0,
              now=None):
        allowed, denied_by, delay_ns, applied, (status, fields) = \
            self._check(limiter, key, attrs or {}, permits, max_wait, now)
        return Outcome(allowed, denied_by, delay_ns, applied, status, fields)

    def acquire(self, limiter, key, attrs=None, permits=1, *, max_wait=0):
        """Decides as check() does and, allowed under in-flight policies
        (`concurrency N ttl=DUR`), holds a lease of each: a RulesHeld,
        whose .outcome is the Outcome, to release() or use in a with block
        (released on leaving it, even by an error).  Denied, or with no
        in-flight policy, it holds nothing.  The rules and the limiter
        refuse to close while it holds leases.

            with rules.acquire(limiter, key, attrs) as req:
                if not req.outcome.allowed: ...     # 429, req.outcome.headers
        """
        return self._acquire(limiter, key, {} if attrs is None else attrs,
                             permits, max_wait, Outcome)


class AsyncLimiter(Limiter):
    """A Limiter whose check() and acquire() are coroutines that never block
    the event loop: on redis_async_store(url, loop) the decision is the
    asynchronous store's (its socket and timer on the loop, no thread);
    on the other stores it is made at once.  Run them on the loop's thread.
    refund(), penalize() and reset() are the Limiter's (on an asynchronous
    Redis store they block, through the synchronous store it owns)."""

    async def check(self, key, permits=1, *, max_wait=0, now=None):
        fut = _asyncio.get_running_loop().create_future()
        d = self._check_start(key, permits, max_wait, fut, now)
        return d if d is not None else await fut

    async def acquire(self, key, permits=1, *, timeout=0):
        """Waits up to `timeout` s for the permits, as Limiter.acquire does:
        a reservation's delay is slept, and a denial whose retry_after
        falls within the timeout (a window that has to end first) is
        retried then.  The Decision, allowed or not."""
        loop = _asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = max(deadline - loop.time(), 0.0)
            d = await self.check(key, permits, max_wait=left)
            if d.allowed:
                if d.delay_ns:
                    await _asyncio.sleep(d.delay)
                return d
            if d.reason != "limited" or not 0 < d.retry_after <= left:
                return d
            await _asyncio.sleep(d.retry_after)


def _answered(fut):
    """Whether fut holds a result (not cancelled, no exception); reading
    its exception also marks one as seen."""
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _lease_arg(lease):
    if not isinstance(lease, Lease):
        raise TypeError("lease must be a ratelimit.Lease, not %s"
                        % type(lease).__name__)


class AsyncFair(Fair):
    """A Fair whose acquire() is a coroutine that waits in the flow's queue
    on the event loop (rate_fair_acquire_start: a timer and an eventfd of
    the loop, no thread), never blocking it.  One loop per fair limit: its
    first acquire's; run its calls and close() on that loop's thread.
    check() is the Fair's (it never waits on a table in this process)."""

    def __init__(self, limiter, key, *args, **kwargs):
        super().__init__(limiter, key, *args, **kwargs)
        self._shared = (limiter, key)  # to give back a lost admission

    async def acquire(self, flow, permits=1, *, weight=1, timeout=0):
        """Waits up to `timeout` s in the flow's queue, in weighted fair
        order: the Decision, allowed, or denied (reason 'limited') at the
        deadline or at once when the flow's queue is full.  A task
        cancelled meanwhile leaves its place; permits admitted to it later
        go back to the shared limit."""
        loop = _asyncio.get_running_loop()
        fut = loop.create_future()
        d = self._acquire_start(flow, permits, weight, timeout, fut, loop)
        if d is not None:
            return d
        try:
            return await fut
        except _asyncio.CancelledError:
            # admitted, then cancelled before the task ran again: the
            # permits go back, as for a task cancelled while it waited
            if _answered(fut) and fut.result().allowed:
                limiter, key = self._shared
                limiter.refund(key, permits)
            raise


class AsyncInFlight(InFlight):
    """An InFlight whose calls are coroutines that never block the event
    loop: on redis_async_store(url, loop) each is one command through the
    loop (rate_inflight_acquire_start, ...); on the memory and
    shared-memory stores they answer at once.  Any other store (the
    blocking Redis store, DynamoDB) would block the loop: TypeError, use
    InFlight on a thread for it.  Run them on the loop's thread.

        async with inflight.lease("user:42"):
            ...              # released on leaving, by an error or a
                             # cancellation too
    """

    _KINDS = ("memory", "shm", "redis-async")

    def __init__(self, policy, store=None, **kw):
        if isinstance(store, Store) and store.kind not in self._KINDS:
            raise TypeError(
                "AsyncInFlight needs a store that never blocks the loop: "
                "memory, shm or redis_async_store(url, loop), not a %r "
                "store (use InFlight on a thread for it)" % store.kind)
        super().__init__(policy, store, **kw)

    async def acquire(self, key, *, critical=False):
        """(Decision, Lease or None).  A task cancelled while it waits
        leaves no lease held: one granted meanwhile is released."""
        fut = _asyncio.get_running_loop().create_future()
        r = self._acquire_start(key, critical, fut)
        if r is not None:
            return r
        try:
            return await fut
        except _asyncio.CancelledError:
            # granted, then cancelled before the task ran again: released
            # through the loop, as for a task cancelled while it waited
            if _answered(fut) and fut.result()[1] is not None:
                done = _asyncio.get_running_loop().create_future()
                done.add_done_callback(_answered)  # its outcome is nobody's
                fut.result()[1]._release_start(done)
            raise

    async def release(self, lease):
        """Gives the lease's slot back (Error RATE_EEXPIRED when it lapsed
        first; ValueError when released already)."""
        _lease_arg(lease)
        fut = _asyncio.get_running_loop().create_future()
        if lease._release_start(fut) is None:
            await fut

    async def extend(self, lease, ttl=None):
        """The lease now expires `ttl` s from now (None: the policy's)."""
        _lease_arg(lease)
        fut = _asyncio.get_running_loop().create_future()
        if lease._extend_start(ttl, fut) is None:
            await fut

    def lease(self, key, *, critical=False):
        """An asynchronous context manager: `async with` acquires (raising
        Limited when denied) and releases on leaving the block."""
        return _AsyncLeaseBlock(self, key, critical)


class _AsyncLeaseBlock:
    __slots__ = ("_inflight", "_key", "_critical", "_lease")

    def __init__(self, inflight, key, critical):
        self._inflight, self._key, self._critical = inflight, key, critical
        self._lease = None

    async def __aenter__(self):
        d, lease = await self._inflight.acquire(self._key,
                                                critical=self._critical)
        if lease is None:
            raise Limited(d)
        self._lease = lease
        return lease

    async def __aexit__(self, exc_type, exc, tb):
        if self._lease.released:
            return False
        try:
            # Started before any await: a second cancellation of the task
            # cannot stop the release, only the wait for its answer.
            await self._inflight.release(self._lease)
        except Exception:
            if exc_type is None:
                raise  # the block's own error, if any, is the one raised
        return False


__all__ = ["AsyncFair", "AsyncInFlight", "AsyncLimiter", "Outcome", "Rules", "RulesHeld", "Fair", "InFlight", "Lease", "Limited", "redis_async_store", "Decision", "Error", "Limiter", "Policy", "Store", "memory_store",
           "shm_store", "redis_store", "limits_text", "raise_store_error", "monotonic_ns",
           "parse_duration", "strerror", "noop", "NEVER", "KEY_MAX"] + _CODES
__all__ += ["SyncedLimiter"] + [n for n in ("dynamodb_store", "dynamodb_counters",
                                            "dynamodb_last_error") if n in globals()]
