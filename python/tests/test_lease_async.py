# SPDX-License-Identifier: MIT
"""Asynchronous leases: AsyncInFlight's calls and `async with` on the
asynchronous Redis store (through the loop) and on the stores that answer
at once; released on leaving the block by an error or a cancellation; a
lease granted to a cancelled task released."""

import asyncio
import time

import pytest

import conftest
import ratelimit
from ratelimit import AsyncInFlight, Limited

KINDS = ["memory", "shm", "redis-async"]


async def await_for(cond, what, bound=30.0):
    end = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < end, "never: " + what
        await asyncio.sleep(0.005)


def store_of(kind, request):
    """A fresh store of `kind`, made on the running loop's thread."""
    if kind == "memory":
        return ratelimit.memory_store()
    if kind == "shm":
        return ratelimit.shm_store(request.getfixturevalue("shm_path"),
                                   max_keys=64, state_max=256)
    return ratelimit.redis_async_store(
        request.getfixturevalue("redis_url"), asyncio.get_running_loop(),
        prefix=conftest.unique_prefix(), command_timeout=10.0)


@pytest.mark.parametrize("kind", KINDS)
def test_async_with_releases_on_leaving(request, kind):
    async def main():
        store = store_of(kind, request)
        f = AsyncInFlight("concurrency 2 ttl=30s", store)
        async with f.lease("k") as a:
            async with f.lease("k", critical=True):
                assert f.held("k") == 2
                with pytest.raises(Limited) as e:
                    async with f.lease("k"):
                        pass
                assert e.value.decision.reason == "limited"
            assert f.held("k") == 1
        assert a.released and f.held("k") == 0
        with pytest.raises(KeyError):
            async with f.lease("k"):
                raise KeyError("the body's error is the one raised")
        assert f.held("k") == 0
        # a task cancelled inside the block releases its lease
        inside = asyncio.Event()

        async def holder():
            async with f.lease("k"):
                inside.set()
                await asyncio.sleep(3600)

        task = asyncio.ensure_future(holder())
        await inside.wait()
        assert f.held("k") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert f.held("k") == 0 and f.pending == 0
        # the calls one by one
        d, lease = await f.acquire("k")
        assert d.allowed and lease.key == b"k"
        before = lease.expires_ns
        await f.extend(lease, 60)
        assert lease.expires_ns > before
        await f.release(lease)
        assert lease.released and f.held("k") == 0
        with pytest.raises(ValueError, match="released already"):
            await f.release(lease)
        f.close()
        store.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_many_in_flight_exactly_the_limit(request, kind):
    async def main():
        store = store_of(kind, request)
        f = AsyncInFlight("concurrency 5 ttl=1m", store)
        got = await asyncio.gather(*[f.acquire("site") for _ in range(40)])
        leases = [lease for _, lease in got if lease is not None]
        assert len(leases) == 5 and f.held("site") == 5
        assert all(d.reason == "limited" for d, lease in got if lease is None)
        await asyncio.gather(*[f.release(lease) for lease in leases])
        assert f.held("site") == 0 and f.pending == 0
        f.close()
        store.close()

    asyncio.run(main())


def test_cancelled_acquire_leaves_no_lease(redis_url):
    async def main():
        store = ratelimit.redis_async_store(
            redis_url, asyncio.get_running_loop(),
            prefix=conftest.unique_prefix(), command_timeout=10.0)
        f = AsyncInFlight("concurrency 3 ttl=1m", store)
        tasks = [asyncio.ensure_future(f.acquire("k")) for _ in range(3)]
        await asyncio.sleep(0)  # each task runs to its await: started
        assert f.pending == 3
        for t in tasks:
            t.cancel()  # before the store's answer: granted, then released
        await asyncio.gather(*tasks, return_exceptions=True)
        await await_for(lambda: f.pending == 0, "the releases came back")
        assert f.held("k") == 0
        got = await asyncio.gather(*[f.acquire("k") for _ in range(3)])
        assert all(lease is not None for _, lease in got)  # none leaked
        await asyncio.gather(*[f.release(lease) for _, lease in got])
        f.close()
        store.close()

    asyncio.run(main())


def test_cancelled_after_the_grant_came_leaves_no_lease(redis_url):
    # The store's answer is in (pending 0) but the task has not run again
    # when it is cancelled: the lease it was granted is released.
    async def main():
        store = ratelimit.redis_async_store(
            redis_url, asyncio.get_running_loop(),
            prefix=conftest.unique_prefix(), command_timeout=10.0)
        f = AsyncInFlight("concurrency 2 ttl=1m", store)
        for _ in range(3):
            t = asyncio.ensure_future(f.acquire("k"))
            await asyncio.sleep(0)
            while f.pending:
                await asyncio.sleep(0)
            assert not t.done()  # answered; the task not resumed yet
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
            await await_for(lambda: f.pending == 0 and f.held("k") == 0,
                            "the lease given back")
        f.close()
        store.close()

    asyncio.run(main())


def test_async_lease_errors(redis_url):
    async def main():
        store = ratelimit.redis_async_store(
            redis_url, asyncio.get_running_loop(),
            prefix=conftest.unique_prefix(), command_timeout=10.0)
        f = AsyncInFlight("concurrency 1 ttl=1ms", store)
        with pytest.raises(ratelimit.Error) as e:
            await f.acquire("")
        assert e.value.name == "RATE_EKEY"
        with pytest.raises(TypeError):
            await f.acquire(None)
        with pytest.raises(TypeError):
            await f.extend((await f.acquire("x"))[1], "1s")
        for call in (f.release, f.extend):
            with pytest.raises(TypeError, match="ratelimit.Lease, not str"):
                await call("x")
        d, lease = await f.acquire("k")
        await asyncio.sleep(0.05)  # past its TTL: at least 49 ms of slack
        with pytest.raises(ratelimit.Error) as e:
            await f.release(lease)
        assert e.value.name == "RATE_EEXPIRED" and lease.released
        pending = asyncio.ensure_future(f.acquire("k"))
        await asyncio.sleep(0)
        assert f.pending == 1
        with pytest.raises(RuntimeError, match="in flight"):
            f.close()
        await pending
        f.close()
        with pytest.raises(ValueError, match="closed"):
            await f.acquire("k")
        store.close()

    asyncio.run(main())


def test_only_stores_that_never_block_the_loop(redis_url):
    # The blocking Redis store would make each call a round trip with the
    # GIL held on the loop's thread: refused, naming what to use.
    store = ratelimit.redis_store(redis_url, prefix=conftest.unique_prefix())
    with pytest.raises(TypeError, match="redis_async_store"):
        AsyncInFlight("concurrency 1 ttl=1m", store)
    assert not store.closed
    store.close()  # the refused AsyncInFlight did not keep it
    for store in (None, ratelimit.memory_store()):
        AsyncInFlight("concurrency 1 ttl=1m", store).close()


def test_close_refused_while_an_acquire_is_answered(redis_url):
    # The loop's call_soon, which the future's answer calls from within
    # the library's callback, tries close(): the acquire is still in
    # flight there, so close() refuses (RuntimeError) rather than free
    # the in-flight limit under the callback.
    tried = []

    class Loop(asyncio.SelectorEventLoop):
        target = None

        def call_soon(self, cb, *args, context=None):
            if args and args[0] is self.target:
                self.target = None
                try:
                    f.close()
                    tried.append("closed")
                except RuntimeError:
                    tried.append("refused")
            return super().call_soon(cb, *args, context=context)

    loop = Loop()
    store = ratelimit.redis_async_store(
        redis_url, loop, prefix=conftest.unique_prefix(),
        command_timeout=10.0)
    f = AsyncInFlight("concurrency 1 ttl=1m", store)

    async def main():
        fut = loop.create_future()
        loop.target = fut
        assert f._acquire_start("k", False, fut) is None
        return await fut

    d, lease = loop.run_until_complete(main())
    assert tried == ["refused"] and d.allowed
    loop.run_until_complete(f.release(lease))
    f.close()
    store.close()
    loop.close()
