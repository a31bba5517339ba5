# SPDX-License-Identifier: MIT
"""The same decisions as the C command's `replay` (its trace contract) on
random traces, on each store."""

import asyncio
import random
import subprocess

import pytest

import conftest
import ratelimit

POLICIES = [
    ("token-bucket 5/s burst=3", "0"),
    ("token-bucket 5/s burst=3", "2s"),
    ("leaky-bucket 4/s capacity=2", "1s"),
    ("fixed-window 3/700ms", "0"),
    ("sliding-log 3/1s", "0"),
    ("sliding-window 4/1s", "0"),
    ("token-bucket 10/s burst=4; fixed-window 20/3s", "0"),
    ("sliding-window 5/2s block=1s", "0"),
]
STORES = ["memory", "shm", "redis", "redis-module", "redis-async",
          "redis-cluster", "redis-cluster-async", "dynamodb"]


def seconds(ns):
    return "%d.%09d" % divmod(ns, 10**9)


def trace(rng, n=300):
    t, lines = 0, []
    for _ in range(n):
        t += rng.choice([0, 0, 1, rng.randrange(1, 10**9),
                         rng.randrange(1, 3 * 10**8)])
        key = rng.choice(["a", "b", "c", "key:with:colons"])
        permits = rng.choice([1, 1, 1, 0, 2, 3, 5])
        lines.append((t, key, permits))
    return lines


def replay_line(t, key, permits, d):
    return "\t".join([
        seconds(t), key, str(permits), "allow" if d.allowed else "deny",
        seconds(d.delay_ns), str(d.remaining),
        "inf" if d.retry_after_ns == ratelimit.NEVER else seconds(d.retry_after_ns),
        seconds(d.reset_after_ns)])


async def replay_async(url, policy, wait_s, requests):
    """The trace through the asynchronous Redis store (a single server or a
    cluster) on asyncio, one decision at a time (a trace's order is its
    meaning)."""
    store = ratelimit.redis_async_store(
        url, asyncio.get_running_loop(),
        prefix=conftest.unique_prefix(), no_ttl=True, module="off")
    lim = ratelimit.AsyncLimiter(ratelimit.Policy(policy), store)
    got = []
    for t, k, p in requests:
        d = await lim.check(k, p, max_wait=wait_s, now=t)
        got.append(replay_line(t, k, p, d))
    lim.close()
    store.drop()
    store.close()
    return got


@pytest.mark.parametrize("store_kind", STORES)
@pytest.mark.parametrize("policy,max_wait", POLICIES)
def test_replay_differential(cli, make_store, request, store_kind, policy,
                             max_wait):
    rng = random.Random("%s|%s|%s" % (store_kind, policy, max_wait))
    requests = trace(rng)
    text = "".join("%s %s %d\n" % (seconds(t), k, p) for t, k, p in requests)
    want = subprocess.run(
        [cli, "replay", "--policy", policy, "--max-wait", max_wait],
        input=text.encode(), capture_output=True, check=True).stdout.decode()
    wait_s = ratelimit.parse_duration(max_wait) / 1e9 if max_wait != "0" else 0
    if store_kind.startswith("redis-cluster"):
        url = request.getfixturevalue("redis_cluster").url
    elif store_kind.startswith("redis"):
        url = request.getfixturevalue("redis_url")
    if store_kind in ("redis-async", "redis-cluster-async"):
        got = asyncio.run(replay_async(url, policy, wait_s, requests))
    elif store_kind == "redis-cluster":
        store = ratelimit.redis_store(url, prefix=conftest.unique_prefix(),
                                      no_ttl=True)
        with ratelimit.Limiter(ratelimit.Policy(policy), store) as lim:
            got = [replay_line(t, k, p, lim.check(k, p, max_wait=wait_s, now=t))
                   for t, k, p in requests]
        store.drop()
        store.close()
    else:
        got = []
        with ratelimit.Limiter(ratelimit.Policy(policy),
                               make_store(store_kind)) as lim:
            for t, k, p in requests:
                got.append(replay_line(
                    t, k, p, lim.check(k, p, max_wait=wait_s, now=t)))
    assert "\n".join(got) == want.rstrip("\n")
    assert want.count("\n") == len(requests)


def test_cluster_keys_live_on_every_master(redis_cluster):
    # the cluster rows above decide on three masters, not on one
    store = ratelimit.redis_store(redis_cluster.url,
                                  prefix=conftest.unique_prefix())
    with ratelimit.Limiter(ratelimit.Policy("fixed-window 5/1m"),
                           store) as lim:
        for i in range(60):
            assert lim.check("key%d" % i).allowed
        assert all(redis_cluster.keys_on(p) > 0 for p in redis_cluster.ports)
    store.drop()
    store.close()
