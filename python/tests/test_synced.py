# SPDX-License-Identifier: MIT
"""The synced mode (SyncedLimiter, docs/sync.md) over each remote: with a
lease of one permit and one process it decides as `ratelimit replay` does
(a denial's retry_after too); with larger leases and two processes it
stays within the stated bound of the exact decisions; close() gives the
leases back; bad input raises."""

import random
import subprocess
import threading

import pytest

import ratelimit
from test_replay import POLICIES, replay_line, seconds, trace

REMOTES = ["memory", "shm", "redis", "redis-module", "dynamodb"]
# the synced mode takes no reservation (max_wait) and no block= limit
SYNCED_POLICIES = [p for p, wait in POLICIES if wait == "0" and "block" not in p]


def replay(cli, policy, requests):
    text = "".join("%s %s %d\n" % (seconds(t), k, p) for t, k, p in requests)
    out = subprocess.run([cli, "replay", "--policy", policy],
                         input=text.encode(), capture_output=True,
                         check=True).stdout.decode()
    return out.splitlines()


@pytest.mark.parametrize("remote", REMOTES)
@pytest.mark.parametrize("policy", SYNCED_POLICIES)
def test_lease_of_one_decides_as_replay(cli, make_store, remote, policy):
    # L = 1: every permit is borrowed by an exact decision of the remote
    # and spent at once, and a denial is cached until its exact
    # retry_after: the verdicts and the denials' retry_after are the
    # command's (remaining is the lease's, not compared)
    requests = trace(random.Random("synced|%s|%s" % (remote, policy)), 200)
    want = replay(cli, policy, requests)
    got = []
    with ratelimit.SyncedLimiter(ratelimit.Policy(policy), make_store(remote),
                                 lease=1) as s:
        assert s.lease == 1
        for t, k, p in requests:
            d = s.check(k, p, now=t)
            got.append(replay_line(t, k, p, d))
    assert len(got) == len(want) == len(requests)
    for g, w in zip(got, want):
        g, w = g.split("\t"), w.split("\t")
        assert g[3] == w[3], (g, w)               # allow / deny
        if w[3] == "deny":
            assert g[6] == w[6], (g, w)           # retry_after


@pytest.mark.parametrize("remote", ["memory", "redis", "dynamodb"])
def test_two_processes_stay_within_the_bound(cli, make_store, remote):
    # Two synced limiters (two processes) on one remote, leases of L: per
    # key, from the cold start never more than the token bucket's own
    # bound (burst + rate x t; the C suite's +1 for a token due at t), and
    # at the end within P x L of the command's exact decisions.
    policy, P = "token-bucket 50/s burst=40", 2
    store = make_store(remote)
    rng = random.Random("bound|" + remote)
    for lease in (3, 8):
        prefix = "L%d:" % lease
        procs = [ratelimit.SyncedLimiter(ratelimit.Policy(policy), store,
                                         lease=lease, lease_ttl=0.2)
                 for _ in range(P)]
        t, requests, got = 0, [], {}
        for i in range(600):
            t += rng.randrange(2 * 10**6)
            k, n = prefix + rng.choice("abc"), 1 + rng.randrange(3)
            requests.append((t, k, n))
            if rng.choice(procs).check(k, n, now=t).allowed:
                got[k] = got.get(k, 0) + n
            assert got.get(k, 0) <= 40 + t * 50 // 10**9 + 1, (k, t)
            if i % 150 == 0:
                for q in procs:
                    q.flush(now=t)
        exact = {}
        for line in replay(cli, policy, requests):
            f = line.split("\t")
            if f[3] == "allow":
                exact[f[1]] = exact.get(f[1], 0) + int(f[2])
        for k in exact.keys() | got.keys():
            assert abs(exact.get(k, 0) - got.get(k, 0)) <= P * lease, \
                (k, exact.get(k), got.get(k))
        for q in procs:
            q.close()


@pytest.mark.parametrize("remote", ["memory", "redis"])
def test_threads_share_one_synced_limiter(make_store, remote):
    # one process, 8 threads on one key: from the cold start never more
    # than the window's 300, and what is not admitted is what the lease
    # still holds
    threads, per_thread = 8, 60
    allowed = [0] * threads
    with ratelimit.SyncedLimiter(ratelimit.Policy("fixed-window 300/1h"),
                                 make_store(remote), lease=7) as s:
        start = threading.Barrier(threads)

        def worker(i):
            start.wait()
            for _ in range(per_thread):
                allowed[i] += s.check("shared", now=10**12).allowed

        ts = [threading.Thread(target=worker, args=(i,))
              for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        st = s.stats()
        assert sum(allowed) + st["held"] == 300
        assert st["held"] < 7
        assert st["allowed"] == sum(allowed)


def test_close_gives_the_leases_back():
    store = ratelimit.memory_store()
    policy = ratelimit.Policy("fixed-window 10/h")
    s = ratelimit.SyncedLimiter(policy, store, lease=4)
    assert s.check("k", now=10**9).allowed
    st = s.stats()
    assert (st["borrowed"], st["held"], st["round_trips"]) == (4, 3, 1)
    assert s.check("k", now=10**9).allowed            # from the lease
    assert s.stats()["local"] == 1
    with pytest.raises(RuntimeError):
        store.close()                                 # the limiter uses it
    s.close()
    assert s.closed
    with pytest.raises(ValueError, match="closed"):
        s.check("k")
    # the 2 left were given back: 8 more pass on the remote
    with ratelimit.Limiter(policy, store) as lim:
        assert lim.check("k", 8, now=10**9).allowed
        assert not lim.check("k", now=10**9).allowed
    store.close()


def test_flush_gives_back_what_is_due():
    store = ratelimit.memory_store()
    with ratelimit.SyncedLimiter(ratelimit.Policy("token-bucket 1/m burst=10"),
                                 store, lease=5, lease_ttl=1) as s:
        assert s.check("k", now=10**9).allowed
        s.flush(now=10**9)                            # not 1 s old yet
        assert s.stats()["held"] == 4
        s.flush(now=2 * 10**9)
        st = s.stats()
        assert (st["held"], st["returned"], st["keys"]) == (0, 4, 0)
        assert s.check("k", now=2 * 10**9).allowed
        s.flush(all=True, now=2 * 10**9)
        assert s.stats()["held"] == 0
    store.close()


def test_remote_failing_follows_the_fail_mode():
    # a Redis that is not there: fail="open" admits, the default denies
    # with reason store-error, and the limiter stays usable
    dead = ratelimit.redis_store("redis://127.0.0.1:1", lazy_connect=True,
                                 connect_timeout=0.2)
    policy = ratelimit.Policy("token-bucket 10/s burst=10")
    with ratelimit.SyncedLimiter(policy, dead, fail="open") as s:
        assert s.check("k").allowed
    with ratelimit.SyncedLimiter(policy, dead) as s:
        d = s.check("k")
        assert not d.allowed and d.reason == "store-error"
        assert s.stats()["remote_errors"] >= 1
    dead.close()


def test_bad_input():
    store = ratelimit.memory_store()
    P = ratelimit.Policy
    tb = P("token-bucket 10/s burst=10")
    with pytest.raises(TypeError):
        ratelimit.SyncedLimiter("token-bucket 10/s burst=10", store)
    with pytest.raises(TypeError):
        ratelimit.SyncedLimiter(tb, None)
    with pytest.raises(TypeError):
        ratelimit.SyncedLimiter(tb, "memory")
    # the library's own refusals, with its message
    with pytest.raises(ratelimit.Error) as e:
        ratelimit.SyncedLimiter(tb, store, lease=11)
    assert e.value.name == "RATE_EINVAL" and "lease" in str(e.value)
    with pytest.raises(ratelimit.Error) as e:
        ratelimit.SyncedLimiter(P("sliding-window 5/2s block=1s"), store)
    assert e.value.name == "RATE_EPOLICY" and str(e.value)
    with pytest.raises(ratelimit.Error) as e:
        ratelimit.SyncedLimiter(P("unlimited"), store)
    assert e.value.name == "RATE_EPOLICY"
    # options out of range name themselves
    with pytest.raises(ValueError, match="lease"):
        ratelimit.SyncedLimiter(tb, store, lease=-1)
    with pytest.raises(OverflowError, match="max_keys"):
        ratelimit.SyncedLimiter(tb, store, max_keys=2**64)
    with pytest.raises(OverflowError, match="lease_ttl"):
        ratelimit.SyncedLimiter(tb, store, lease_ttl=2**63)
    with pytest.raises(ValueError, match="fail"):
        ratelimit.SyncedLimiter(tb, store, fail="maybe")
    with pytest.raises(TypeError, match="sweep"):
        ratelimit.SyncedLimiter(tb, store, sweep="1s")
    with ratelimit.SyncedLimiter(tb, store, max_keys=100, sweep=0.05,
                                 prefetch=True, denial_ttl=0.5,
                                 retry=0.1) as s:
        with pytest.raises(ratelimit.Error) as e:
            s.check("")
        assert e.value.name == "RATE_EKEY"
        with pytest.raises(ratelimit.Error) as e:
            s.check("k" * (ratelimit.KEY_MAX + 1))
        assert e.value.name == "RATE_EKEY"
        with pytest.raises(ratelimit.Error) as e:
            s.check("k", 2**63)
        assert e.value.name == "RATE_ERANGE"
        with pytest.raises(OverflowError):
            s.check("k", -1)
        with pytest.raises(TypeError):
            s.check(42)
        with pytest.raises(TypeError):
            s.check("k", max_wait=1)                  # no reservations
        with pytest.raises(ratelimit.Error) as e:
            s.try_acquire("")                         # raises, not False
        assert e.value.name == "RATE_EKEY"
        assert s.try_acquire(b"a\0b") is True         # any bytes
        assert s.check("a").remaining == s.lease - 1  # another key
    with pytest.raises(ValueError, match="__init__"):
        ratelimit.SyncedLimiter.__new__(ratelimit.SyncedLimiter).check("k")
    store.close()
