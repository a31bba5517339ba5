# SPDX-License-Identifier: MIT
"""Per-decision cost of the binding beside `limits`, in one run on one
machine (docs/python.md, "Bench").

    python bench.py [--redis redis://127.0.0.1:6379] [--n 200000]

Rows: the floor (a Python call into a C function that does nothing), then
per strategy `limits`'s own storage, this package's Limiter, this package's
storage under `limits`'s strategy (the drop-in), and `limits`'s strategy
over a storage that does nothing (the ceiling: what `limits`'s own code
costs a hit, which no storage can go below).  Redis rows need --redis (and
python3-redis for `limits`'s); their floor is a round trip from Python on a
raw socket (PING, and EVALSHA of a script that returns 1); this package's
rows are by the scripts and, when the server has ratelimit.so loaded, by
the module.  The asyncio row runs 64 decisions in flight on the
asynchronous Redis store.  Keys cycle over 1000, so that a moving window of
10000 never fills.  Prints ns per decision and the ratios ("vs floor": the
C no-op's for memory rows, the raw PING's for Redis rows); asserts nothing
(no timing is a test).
"""

import argparse
import asyncio
import hashlib
import os
import socket
import sys
import time
import urllib.parse
import uuid

# The installed package, not the source folder beside this file (which has
# no built extension).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import limits
from limits.storage import MemoryStorage, MovingWindowSupport, Storage, \
    storage_from_string
from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

import ratelimit
from ratelimit.limits_storage import RatelimitStorage

KEYS = ["user:%d" % i for i in range(1000)]


def per_call(fn, n):
    """ns per call of fn(i), the best of three runs."""
    best = None
    for _ in range(3):
        t = time.perf_counter_ns()
        fn(n)
        ns = (time.perf_counter_ns() - t) / n
        best = ns if best is None else min(best, ns)
    return best


def loop_floor(n):
    noop = ratelimit.noop
    for i in range(n):
        noop(KEYS[i % 1000])


class NullStorage(Storage, MovingWindowSupport):
    """A storage for `limits` that does nothing: its strategies' own cost."""

    def incr(self, key, expiry, elastic_expiry=False, amount=1):
        return amount

    def get(self, key):
        return 0

    def get_expiry(self, key):
        return 0

    def check(self):
        return True

    def reset(self):
        return None

    def clear(self, key):
        return None

    def acquire_entry(self, key, limit, expiry, amount=1):
        return True

    def get_moving_window(self, key, limit, expiry):
        return 0, 0


def resp(*args):
    """A command in Redis's protocol."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def raw_redis(url):
    """A connected socket to the server of a redis:// URL (AUTH and SELECT
    sent), with the call that sends a command and reads its reply."""
    u = urllib.parse.urlparse(url)
    sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(cmd):
        sock.sendall(cmd)
        return sock.recv(65536)
    if u.password:
        call(resp("AUTH", *([u.username] if u.username else []),
                  urllib.parse.unquote(u.password)))
    if u.path.strip("/"):
        call(resp("SELECT", u.path.strip("/")))
    return sock, call


def raw_loop(url, cmd):
    """n round trips of one command on a raw socket: the floor of a
    decision on Redis from Python (no client library, no decision)."""
    sock, call = raw_redis(url)

    def run(n):
        for _ in range(n):
            call(cmd)
    run.close = sock.close
    return run


def has_module(url):
    """Whether the server has ratelimit.so (RATELIMIT.STEP) loaded."""
    sock, call = raw_redis(url)
    reply = call(resp("COMMAND", "INFO", "ratelimit.step"))
    sock.close()
    return b"ratelimit.step" in reply


def limits_loop(strategy, item):
    hit = strategy.hit

    def run(n):
        for i in range(n):
            hit(item, KEYS[i % 1000])
    return run


def limiter_loop(lim, fast):
    call = lim.try_acquire if fast else lim.check

    def run(n):
        for i in range(n):
            call(KEYS[i % 1000])
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200000)
    ap.add_argument("--redis", default=None)
    args = ap.parse_args()
    n = args.n
    rows = []
    floor = per_call(loop_floor, n)
    rows.append(("floor: a call into a C no-op", floor, None, floor))

    cases = [("fixed window", "fixed-window", FixedWindowRateLimiter,
              limits.parse("1000000/minute"), "fixed-window 1000000/m"),
             ("moving window", "sliding-log", MovingWindowRateLimiter,
              limits.parse("10000/minute"), "sliding-log 10000/m")]
    for name, _, strategy, item, text in cases:
        theirs = per_call(limits_loop(strategy(MemoryStorage()), item), n)
        # a limiter of its own for each row, as limits's storage is: a
        # moving window's log grows with the hits a row leaves behind
        ours = []
        for fast in (False, True):
            lim = ratelimit.Limiter(ratelimit.Policy(text))
            ours.append(per_call(limiter_loop(lim, fast), n))
            lim.close()
        ours_check, ours_fast = ours
        st = RatelimitStorage("ratelimit+memory://")
        dropin = per_call(limits_loop(strategy(st), item), n)
        st.close()
        null = NullStorage()  # held: a strategy keeps a weak reference
        ceiling = per_call(limits_loop(strategy(null), item), n)
        rows += [("memory %s: limits" % name, theirs, theirs, floor),
                 ("memory %s: Limiter.check" % name, ours_check, theirs, floor),
                 ("memory %s: Limiter.try_acquire" % name, ours_fast, theirs,
                  floor),
                 ("memory %s: limits on ratelimit+memory" % name, dropin,
                  theirs, floor),
                 ("memory %s: limits on a storage doing nothing" % name,
                  ceiling, theirs, floor)]

    if args.redis:
        rows += bench_redis(args.redis, max(n // 100, 500))

    print("%-62s %12s %10s %9s" % ("", "ns/decision", "vs limits", "vs floor"))
    for name, ns, theirs, base in rows:
        if ns is None:
            continue
        vs = "%.1fx" % (theirs / ns) if theirs else ""
        print("%-62s %12.0f %10s %8.1fx" % (name, ns, vs, ns / base))


def bench_redis(url, chunk, rounds=9):
    """The Redis rows.  A round trip's time swings with the machine's load:
    every case runs `chunk` decisions in turn, `rounds` times over, and
    keeps its best, so that a busy moment of the machine weighs on one
    chunk of each case alike."""
    cases = []  # (label, run, label of limits's row or None)
    ping = raw_loop(url, resp("PING"))
    cases.append(("redis floor: PING on a raw socket", ping, None))
    sock, call = raw_redis(url)
    call(resp("SCRIPT", "LOAD", "return 1"))
    sock.close()
    sha = hashlib.sha1(b"return 1").hexdigest()
    cases.append(("redis floor: EVALSHA 'return 1' on a raw socket",
                  raw_loop(url, resp("EVALSHA", sha, 0)), None))
    ways = [("scripts", "off")]
    if has_module(url):
        ways.append(("ratelimit.so", "on"))
    opened = []  # (thing, how it is undone)
    for name, strategy, item, text in [
            ("fixed window", FixedWindowRateLimiter,
             limits.parse("1000000/minute"), "fixed-window 1000000/m"),
            ("moving window", MovingWindowRateLimiter,
             limits.parse("10000/minute"), "sliding-log 10000/m")]:
        theirs = "redis %s: limits" % name
        try:
            theirs_st = storage_from_string(url)
            cases.append((theirs, limits_loop(strategy(theirs_st), item), None))
            opened.append((theirs_st, theirs_st.reset))
        except Exception as e:  # no python3-redis: no row of theirs
            print("limits on Redis: %s" % e)
            theirs = None
        for way, module in ways:
            prefix = "bench%s:" % uuid.uuid4().hex[:8]
            store = ratelimit.redis_store(url, prefix=prefix, module=module)
            lim = ratelimit.Limiter(ratelimit.Policy(text), store)
            st = storage_from_string("ratelimit+" + url + "?prefix=" +
                                     prefix + "&module=" + module)
            opened += [(lim, lim.close), (store, store.drop),
                       (store, store.close), (st, st.reset), (st, st.close)]
            cases += [("redis %s: Limiter.check, %s" % (name, way),
                       limiter_loop(lim, False), theirs),
                      ("redis %s: Limiter.try_acquire, %s" % (name, way),
                       limiter_loop(lim, True), theirs),
                      ("redis %s: limits on ratelimit+redis, %s" % (name, way),
                       limits_loop(strategy(st), item), theirs)]
    best = {}
    for _ in range(rounds):
        for label, run, _ in cases:
            t = time.perf_counter_ns()
            run(chunk)
            ns = (time.perf_counter_ns() - t) / chunk
            best[label] = min(best.get(label, ns), ns)
    for thing, undo in opened:
        undo()
    rfloor = best[cases[0][0]]
    rows = []
    for label, _, theirs in cases:
        if label.endswith(": limits"):
            theirs = label
        rows.append((label, best[label], best[theirs] if theirs else None,
                     rfloor))
    rows.append(("redis fixed window: AsyncLimiter, 64 in flight",
                 asyncio.run(bench_async(url, chunk * rounds)), None, rfloor))
    return rows


async def bench_async(url, n):
    prefix = "bench%s:" % uuid.uuid4().hex[:8]
    store = ratelimit.redis_async_store(url, asyncio.get_running_loop(),
                                        prefix=prefix)
    lim = ratelimit.AsyncLimiter(ratelimit.Policy("fixed-window 1000000/m"),
                                 store)

    async def worker(w):
        for i in range(w, n, 64):
            await lim.check(KEYS[i % 1000])

    t = time.perf_counter_ns()
    await asyncio.gather(*[worker(w) for w in range(64)])
    ns = (time.perf_counter_ns() - t) / n
    lim.close()
    store.drop()
    store.close()
    return ns


if __name__ == "__main__":
    main()
