# SPDX-License-Identifier: MIT
"""In-flight limits: leases as context managers, on each store, across
threads and across processes forked from one parent."""

import os
import threading
import time

import pytest

import conftest
import ratelimit
from ratelimit import InFlight, Limited


@pytest.mark.parametrize("store_kind", ["memory", "shm", "redis"])
def test_lease_context_manager(make_store, store_kind):
    with InFlight("concurrency 2 ttl=30s", make_store(store_kind)) as f:
        with f.lease("k") as a:
            with f.lease("k"):
                assert f.held("k") == 2
                with pytest.raises(Limited) as e:
                    f.lease("k")
                assert e.value.decision.reason == "limited"
            assert f.held("k") == 1
        assert a.released and f.held("k") == 0
        with pytest.raises(RuntimeError):
            with f.lease("k"):
                raise RuntimeError("the body's error is the one raised")
        assert f.held("k") == 0
        d, lease = f.acquire("k", critical=True)
        assert d.allowed and lease.key == b"k"
        lease.extend(60)
        lease.release()
        with pytest.raises(ValueError):
            lease.release()


def test_lease_errors():
    with pytest.raises(ratelimit.Error) as e:
        InFlight("concurrency 0 ttl=1s")
    assert e.value.name == "RATE_EPOLICY" and "concurrency" in str(e.value)
    with pytest.raises(TypeError):
        InFlight(b"concurrency 1 ttl=1s", store="memory")
    f = InFlight("concurrency 1 ttl=1ms")
    d, lease = f.acquire("k")
    time.sleep(0.05)  # past its TTL: at least 49 ms of slack
    with pytest.raises(ratelimit.Error) as e:
        lease.release()
    assert e.value.name == "RATE_EEXPIRED"
    with pytest.raises(ratelimit.Error) as e:
        f.acquire("")
    assert e.value.name == "RATE_EKEY"
    _, lease = f.acquire("k")
    f.close()
    with pytest.raises(ValueError):
        lease.release()
    with pytest.raises(ValueError):
        f.acquire("k")


def test_threads_never_hold_more_than_the_limit():
    limit, threads, rounds = 3, 8, 200
    f = InFlight("concurrency %d ttl=1m" % limit)
    lock = threading.Lock()
    inside = [0]
    peak = [0]
    granted = [0]

    def worker():
        for _ in range(rounds):
            d, lease = f.acquire("k")
            if lease is None:
                continue
            with lease:
                with lock:
                    inside[0] += 1
                    granted[0] += 1
                    peak[0] = max(peak[0], inside[0])
                with lock:
                    inside[0] -= 1

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert peak[0] <= limit and granted[0] > 0
    assert f.held("k") == 0
    f.close()


def test_forked_workers_share_one_in_flight_limit(shm_path):
    limit, workers = 2, 5
    store = ratelimit.shm_store(shm_path, max_keys=64, state_max=256)
    f = InFlight("concurrency %d ttl=1m" % limit, store)
    go_r, go_w = os.pipe()

    def child(w):
        _, lease = f.acquire("site")
        os.write(w, b"1" if lease else b"0")
        os.read(go_r, 1)  # hold it until the parent has counted
        if lease:
            lease.release()

    pids, results = conftest.fork_workers(workers, child)
    got = [os.read(r, 1) for r in results]
    assert got.count(b"1") == limit and f.held("site") == limit
    os.write(go_w, b"x" * workers)
    conftest.wait_workers(pids)
    assert f.held("site") == 0
    f.close()
    store.close()


def test_a_lease_nobody_gets_is_given_back_at_once():
    # One allocation of the binding's fails at a time (CPython's test
    # hooks), all along acquire() and _acquire_start(): a call that raises
    # MemoryError holds no slot, one that answers holds exactly its own.
    testcapi = pytest.importorskip("_testcapi")
    import asyncio
    loop = asyncio.new_event_loop()
    calls = [lambda f: f.acquire("k"),
             lambda f: f._acquire_start("k", False, loop.create_future())]
    for call in calls:
        f = InFlight("concurrency 1 ttl=1h")
        failed = 0
        for n in range(1, 40):
            r = None
            testcapi.set_nomemory(n, n + 1)
            try:
                r = call(f)
            except MemoryError:
                failed += 1
            finally:
                testcapi.remove_mem_hooks()
            lease = r[1] if r is not None else None
            assert f.held("k") == (lease is not None), n
            if lease is not None:
                lease.release()
        assert failed > 0
        f.close()
    loop.close()


def test_a_region_too_small_for_the_leases_is_refused_when_made(shm_path):
    # A key of N leases takes 14 + 24 N bytes: the default state_max (96)
    # holds 3, so 4 is refused at once, with what to give, not at the
    # fourth lease ("no room for a new key").
    store = ratelimit.shm_store(shm_path, max_keys=64)
    with pytest.raises(ratelimit.Error, match="state_max") as e:
        InFlight("concurrency 4 ttl=30s", store)
    assert e.value.name == "RATE_EPOLICY"
    with InFlight("concurrency 3 ttl=30s", store) as inflight:
        got = [inflight.acquire("k") for _ in range(4)]
        assert [lease is not None for _, lease in got] == [True] * 3 + [False]
        for _, lease in got[:3]:
            lease.release()
    store.close()
