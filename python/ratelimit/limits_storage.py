# SPDX-License-Identifier: MIT
"""A storage for `limits` and Flask-Limiter whose decisions the library
makes (docs/python.md, "limits and Flask-Limiter").

Importing this module registers the storage schemes the way `limits`
extends itself (its storage registry):

    ratelimit+memory://
    ratelimit+shm:///dev/shm/app.rl[?max_keys=N&key_max=N&state_max=N&prefix=P]
    ratelimit+redis://[[user]:password@]host[:port][/db][?prefix=P&module=off]
    ratelimit+dynamodb://TABLE?region=R[&endpoint=URL&prefix=P&create_table=1]

and the strategies "ratelimit-token-bucket" and "ratelimit-sliding-window"
beside the three of `limits` (a leaky bucket, which
spaces requests out, has no place in limits's hit-or-miss strategies),
whose fixed and moving windows this storage decides as the library's fixed window and
sliding log.  Flask-Limiter then switches with its storage URI:

    Limiter(get_remote_address, app=app, storage_uri="ratelimit+shm:///dev/shm/app.rl")
"""

import hashlib
import math
import threading
import time
import urllib.parse

from limits.limits import GRANULARITIES
from limits.storage import MovingWindowSupport, Storage
from limits.strategies import STRATEGIES, RateLimiter

import ratelimit
from ratelimit import _ratelimit

# The largest sliding log; a moving window of a larger limit is decided by
# the two-window counter (docs/algorithms.md).
SLIDING_LOG_MAX = 10000
# Keys whose parse is kept (the cache starts over when full).
_KEYS_CACHED = 65536
_SECONDS = {g.GRANULARITY.name: g.GRANULARITY.seconds
            for g in GRANULARITIES.values()}


def _reset_at(reset_after):
    """The epoch second the whole quota is back: now, as limits says it,
    for a key with nothing to give back; else rounded up."""
    now = time.time()
    return int(now) if reset_after == 0 else math.ceil(now + reset_after)


def _digest_key(key):
    """The key a key too long for the store is decided under: a prefix and
    its BLAKE2b-128 in hex (40 bytes, no "/", so no key of limits's
    key_for is one)."""
    return "blake2b:" + hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def _limit_of_key(key):
    """(amount, expiry in s) of a key made by limits's RateLimitItem.key_for
    (".../AMOUNT/MULTIPLES/GRANULARITY"), or None."""
    parts = key.rsplit("/", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    seconds = _SECONDS.get(parts[3])
    if seconds is None or int(parts[1]) == 0 or int(parts[2]) == 0:
        return None
    return int(parts[1]), int(parts[2]) * seconds


class RatelimitStorage(_ratelimit._LimitsCalls, Storage, MovingWindowSupport):
    """The library's stores behind limits's Storage interface.  Each call is
    one decision of the library under the limit its key names (the count
    and window a limits key ends with).

    The hot calls, incr, get, get_expiry and acquire_entry, are the C
    base's: a key seen before (its parse, policy and store key kept in
    _fixed and _moving) is decided there; the first call on a key comes to
    _incr, _get, _get_expiry and _acquire_entry here."""

    STORAGE_SCHEME = ["ratelimit+memory", "ratelimit+shm", "ratelimit+redis",
                      "ratelimit+dynamodb"]

    def __init__(self, uri, **options):
        parsed = urllib.parse.urlparse(uri)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        query.update({k: str(v) for k, v in options.items()})
        self._make_store = self._store_maker(parsed, query)
        self._prefix = query.get("prefix")
        # the longest key the store keeps (a shared-memory region's key_max
        # counts its prefix); a longer one is decided under its digest
        self._key_room = ratelimit.KEY_MAX
        if parsed.scheme == "ratelimit+shm":
            self._key_room = min(self._key_room,
                                 int(query.get("key_max", 256)) -
                                 len(query.get("prefix", "").encode()))
        self._store = self._make_store()
        self._limiter = ratelimit.Limiter(ratelimit.Policy("unlimited"),
                                          self._store)
        self._use(self._limiter)
        self._policies = {}
        self._policies_lock = threading.Lock()
        self._keys = {}  # key -> (amount, expiry): its parse, cached
        super().__init__(uri, **options)

    @staticmethod
    def _store_maker(parsed, query):
        kind = parsed.scheme.split("+", 1)[1]
        if kind == "memory":
            return ratelimit.memory_store
        if kind == "shm":
            if not parsed.path:
                raise ValueError("ratelimit+shm: the URI needs a path "
                                 "(ratelimit+shm:///dev/shm/app.rl)")
            return lambda: ratelimit.shm_store(
                parsed.path, max_keys=int(query.get("max_keys", 65536)),
                key_max=int(query.get("key_max", 256)),
                state_max=int(query.get("state_max", 0)),
                prefix=query.get("prefix"))
        if kind == "dynamodb":
            return RatelimitStorage._dynamodb_maker(parsed, query)
        url = urllib.parse.urlunparse(("redis",) + tuple(parsed[1:4]) + ("", ""))
        # connected on first use: an app starts while Redis is down, and
        # its requests' errors let Flask-Limiter's in-memory fallback apply
        return lambda: ratelimit.redis_store(
            url, prefix=query.get("prefix"), module=query.get("module", "auto"),
            lazy_connect=True)

    @staticmethod
    def _dynamodb_maker(parsed, query):
        """The library's URL keeps the table, region and endpoint; prefix
        and create_table are the store's options; credentials come from
        the environment or ~/.aws/credentials (docs/dynamodb.md)."""
        params = {k: query[k] for k in ("region", "endpoint") if k in query}
        url = "dynamodb://%s?%s" % (parsed.netloc,
                                    urllib.parse.urlencode(params, safe=":/"))
        create = query.get("create_table", "0").lower() in ("1", "true", "yes")
        return lambda: ratelimit.dynamodb_store(
            url, prefix=query.get("prefix"), create_table=create)

    def _policy(self, algorithm, amount, expiry):
        k = (algorithm, amount, expiry)
        p = self._policies.get(k)
        if p is None:
            if algorithm == "sliding-log" and amount > SLIDING_LOG_MAX:
                algorithm = "sliding-window"
            text = "%s %d/%ds" % (algorithm, amount, expiry)
            if algorithm == "token-bucket":
                text += " burst=%d" % amount
            elif algorithm == "leaky-bucket":
                text += " capacity=%d" % amount
            p = ratelimit.Policy(text)
            with self._policies_lock:
                self._policies[k] = p
        return p

    def _store_key(self, key):
        """The key itself, or its digest when it is longer than the store
        keeps (a client's header as the key): every key is limited."""
        if len(key) * 4 <= self._key_room or len(key.encode()) <= self._key_room:
            return key
        return _digest_key(key)

    def decide(self, algorithm, key, amount, expiry, cost=1):
        """One decision of the library under `algorithm` amount/expiry s; a
        store failure raises ratelimit.Error (Flask-Limiter's swallow_errors
        and in-memory fallback then have their say)."""
        policy = self._policy(algorithm, amount, expiry)
        d = self._limiter.check(self._store_key(key), cost, policy=policy)
        if d.reason == "store-error":
            self._store_failed(d, policy)
        return d

    def _store_failed(self, d, policy):
        """Raises ratelimit.Error for a decision the store failed."""
        if d.error == ratelimit.EPOLICY:
            self._store.check_policy(policy)  # raises with the reason
        ratelimit.raise_store_error(d)

    @staticmethod
    def _cache(cache, key, entry):
        if len(cache) >= _KEYS_CACHED:
            cache.clear()
        cache[key] = entry

    def _window(self, key, expiry=None):
        limit = self._keys.get(key)
        if limit is None:
            limit = _limit_of_key(key)
            if limit is None:
                raise ValueError("ratelimit storage: %r is not a key of "
                                 "limits's RateLimitItem.key_for" % key)
            if len(self._keys) >= _KEYS_CACHED:
                self._keys.clear()
            self._keys[key] = limit
        if expiry is not None and expiry != limit[1]:
            raise ValueError("ratelimit storage: expiry %d does not match the "
                             "key %r" % (expiry, key))
        return limit

    # -- the fixed window (limits's incr, get, get_expiry)

    def _fixed_entry(self, key, expiry=None):
        """(policy, expiry, store key, limit) of a key, kept in _fixed for
        the next calls (the C base's incr reads it)."""
        e = self._fixed.get(key)
        if e is None or (expiry is not None and expiry != e[1]):
            limit, window = self._window(key, expiry)
            e = (self._policy("fixed-window", limit, window), window,
                 self._store_key(key), limit)
            self._cache(self._fixed, key, e)
        return e

    def _incr(self, key, expiry, elastic_expiry=False, amount=1):
        """incr's first call on a key (the C base's incr then decides the
        next ones): the fixed window's hit, the count after it when
        admitted; when denied, the count it would have made (above the
        limit), charging nothing."""
        if elastic_expiry:
            raise NotImplementedError(
                "ratelimit storage: no elastic expiry (fixed-window-elastic-"
                "expiry); use fixed-window or a ratelimit-* strategy")
        policy, window, skey, limit = self._fixed_entry(key, expiry)
        d = self._fixed_decide(policy, skey, amount)
        used = limit - d.remaining
        return used if d.allowed else used + amount

    def _fixed_decide(self, policy, skey, amount):
        d = self._limiter.check(skey, amount, policy=policy)
        if d.reason == "store-error":
            self._store_failed(d, policy)
        return d

    def _get(self, key):
        """get's first call on a key (the C base's get then answers)."""
        policy, _, skey, limit = self._fixed_entry(key)
        return limit - self._fixed_decide(policy, skey, 0).remaining

    def _get_expiry(self, key):
        """get_expiry's first call on a key (the C base's then answers)."""
        policy, _, skey, _ = self._fixed_entry(key)
        d = self._fixed_decide(policy, skey, 0)
        return _reset_at(d.reset_after)

    # -- the moving window

    def _acquire_entry(self, key, limit, expiry, amount=1):
        """acquire_entry's first call on a key with this limit and expiry
        (the C base's acquire_entry then decides the next ones)."""
        policy = self._policy("sliding-log", limit, expiry)
        skey = self._store_key(key)
        self._cache(self._moving, key, (policy, limit, expiry, skey))
        d = self._limiter.check(skey, amount, policy=policy)
        if d.reason == "store-error":
            self._store_failed(d, policy)
        return d.allowed

    def get_moving_window(self, key, limit, expiry):
        """(start, count): start is `expiry` before the full quota is back
        (the newest entry leaves), where limits's own storages give the
        oldest entry's time."""
        d = self.decide("sliding-log", key, limit, expiry, 0)
        count = limit - d.remaining
        now = time.time()
        if count == 0:
            return int(now), 0
        return math.ceil(now + d.reset_after) - expiry, count

    # -- the rest of the interface

    def clear(self, key):
        self._limiter.reset(self._store_key(key))

    def check(self):
        """Healthy when the store answers a query."""
        try:
            self.decide("fixed-window", "ratelimit-health", 1, 1, 0)
            return True
        except ratelimit.Error:
            return False

    def reset(self):
        """Forgets every key: a shared-memory or Redis store's namespace is
        dropped (every process's), a memory store made anew."""
        if self._store.kind == "memory":
            old_limiter, old_store = self._limiter, self._store
            self._store = self._make_store()
            self._limiter = ratelimit.Limiter(ratelimit.Policy("unlimited"),
                                              self._store)
            self._use(self._limiter)
            old_limiter.close()
            old_store.close()
        elif self._store.kind == "dynamodb" and not self._prefix:
            raise ValueError(
                "ratelimit+dynamodb: reset() drops the keys under the URI's "
                "prefix, and this URI has none (it would be the whole "
                "table's): add prefix=... to the URI")
        else:
            self._store.drop()
        return None

    def close(self):
        self._limiter.close()
        self._store.close()


class _LibraryStrategy(RateLimiter):
    """A strategy decided by the library on a RatelimitStorage: hit, test and
    get_window_stats as limits documents them."""

    ALGORITHM = None

    def __init__(self, storage):
        if not isinstance(storage, RatelimitStorage):
            raise NotImplementedError(
                "the ratelimit-* strategies need a ratelimit+ storage, not %s"
                % storage.__class__.__name__)
        super().__init__(storage)

    def hit(self, item, *identifiers, cost=1):
        return self.storage.decide(self.ALGORITHM, item.key_for(*identifiers),
                                   item.amount, item.get_expiry(), cost).allowed

    def test(self, item, *identifiers):
        d = self.storage.decide(self.ALGORITHM, item.key_for(*identifiers),
                                item.amount, item.get_expiry(), 0)
        return d.remaining >= 1

    def get_window_stats(self, item, *identifiers):
        """(reset, remaining): reset is when the full quota is back."""
        d = self.storage.decide(self.ALGORITHM, item.key_for(*identifiers),
                                item.amount, item.get_expiry(), 0)
        return _reset_at(d.reset_after), d.remaining


class TokenBucketRateLimiter(_LibraryStrategy):
    """"ratelimit-token-bucket": AMOUNT per EXPIRY, a burst of AMOUNT."""
    ALGORITHM = "token-bucket"


class SlidingWindowRateLimiter(_LibraryStrategy):
    """"ratelimit-sliding-window": the two-window counter."""
    ALGORITHM = "sliding-window"


STRATEGIES.setdefault("ratelimit-token-bucket", TokenBucketRateLimiter)
STRATEGIES.setdefault("ratelimit-sliding-window", SlidingWindowRateLimiter)
