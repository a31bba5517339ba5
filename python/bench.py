# SPDX-License-Identifier: MIT
"""Per-decision cost of the binding beside `limits`, in one run on one
machine (docs/python.md, "Bench").

    python bench.py [--redis redis://127.0.0.1:6379] [--n 200000]

Rows: the floor (a Python call into a C function that does nothing), then
per strategy `limits`'s own storage, this package's Limiter, and this
package's storage under `limits`'s strategy (the drop-in).  Redis rows need
--redis (and python3-redis for `limits`'s); the asyncio row runs 64
decisions in flight on the asynchronous Redis store.  Keys cycle over 1000,
so that a moving window of 10000 never fills.  Prints ns per decision and
the ratios; asserts nothing (no timing is a test).
"""

import argparse
import asyncio
import os
import sys
import time
import uuid

# The installed package, not the source folder beside this file (which has
# no built extension).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import limits
from limits.storage import MemoryStorage, storage_from_string
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
    rows.append(("floor: a call into a C no-op", floor, None))

    cases = [("fixed window", "fixed-window", FixedWindowRateLimiter,
              limits.parse("1000000/minute"), "fixed-window 1000000/m"),
             ("moving window", "sliding-log", MovingWindowRateLimiter,
              limits.parse("10000/minute"), "sliding-log 10000/m")]
    for name, _, strategy, item, text in cases:
        theirs = per_call(limits_loop(strategy(MemoryStorage()), item), n)
        lim = ratelimit.Limiter(ratelimit.Policy(text))
        ours_check = per_call(limiter_loop(lim, False), n)
        ours_fast = per_call(limiter_loop(lim, True), n)
        lim.close()
        st = RatelimitStorage("ratelimit+memory://")
        dropin = per_call(limits_loop(strategy(st), item), n)
        st.close()
        rows += [("memory %s: limits" % name, theirs, theirs),
                 ("memory %s: Limiter.check" % name, ours_check, theirs),
                 ("memory %s: Limiter.try_acquire" % name, ours_fast, theirs),
                 ("memory %s: limits on ratelimit+memory" % name, dropin, theirs)]

    if args.redis:
        rn = max(n // 20, 1000)
        for name, _, strategy, item, text in cases:
            prefix = "bench%s:" % uuid.uuid4().hex[:8]
            try:
                theirs_st = storage_from_string(args.redis)
                theirs = per_call(limits_loop(strategy(theirs_st), item), rn)
                theirs_st.reset()
            except Exception as e:  # no python3-redis: no row of theirs
                print("limits on Redis: %s" % e)
                theirs = None
            store = ratelimit.redis_store(args.redis, prefix=prefix)
            lim = ratelimit.Limiter(ratelimit.Policy(text), store)
            ours = per_call(limiter_loop(lim, False), rn)
            lim.close()
            store.drop()
            store.close()
            st = storage_from_string("ratelimit+" + args.redis +
                                     "?prefix=" + prefix)
            dropin = per_call(limits_loop(strategy(st), item), rn)
            st.reset()
            st.close()
            rows += [("redis %s: limits" % name, theirs, theirs),
                     ("redis %s: Limiter.check" % name, ours, theirs),
                     ("redis %s: limits on ratelimit+redis" % name, dropin,
                      theirs)]
        rows.append(("redis fixed window: AsyncLimiter, 64 in flight",
                     asyncio.run(bench_async(args.redis, rn)), None))

    print("%-52s %12s %10s %9s" % ("", "ns/decision", "vs limits", "vs floor"))
    for name, ns, theirs in rows:
        if ns is None:
            continue
        vs = "%.1fx" % (theirs / ns) if theirs else ""
        print("%-52s %12.0f %10s %8.1fx" % (name, ns, vs, ns / floor))


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
