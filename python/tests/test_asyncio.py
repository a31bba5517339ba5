# SPDX-License-Identifier: MIT
"""asyncio: decisions of the asynchronous Redis store driven by asyncio's
own reader, writer and timer calls, which never block the event loop."""

import asyncio

import pytest

import conftest
import ratelimit
from ratelimit import AsyncLimiter, Policy


async def proxy_on_this_loop(port):
    """A TCP proxy served by the running loop itself: a call that blocked
    the loop's thread would stop it, and the store would get no answer."""

    async def pump(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(client_r, client_w):
        up_r, up_w = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pump(client_r, up_w), pump(up_r, client_w))

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def redis_port(url):
    return int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("module", ["off", "on"])
def test_64_in_flight_share_one_limit_through_the_loop(redis_url,
                                                       redis_module_url,
                                                       module):
    url = redis_module_url if module == "on" else redis_url

    async def main():
        server = await proxy_on_this_loop(redis_port(url))
        port = server.sockets[0].getsockname()[1]
        # lazy_connect: the store's first connection is made by the loop
        store = ratelimit.redis_async_store(
            "redis://127.0.0.1:%d" % port, asyncio.get_running_loop(),
            prefix=conftest.unique_prefix(), module=module, lazy_connect=True,
            command_timeout=10.0)
        lim = AsyncLimiter(Policy("fixed-window 100/1h"), store)
        decisions = await asyncio.gather(
            *[lim.check("shared") for _ in range(64)])
        decisions += await asyncio.gather(
            *[lim.check("shared") for _ in range(64)])
        lim.close()
        store.close()
        server.close()
        await server.wait_closed()
        return decisions

    decisions = asyncio.run(main())
    assert [d.reason for d in decisions].count("allowed") == 100
    assert [d.reason for d in decisions].count("limited") == 28
    assert sorted(d.remaining for d in decisions if d.allowed) == \
        list(range(100))


def test_acquire_sleeps_its_reservation_and_other_stores_answer_at_once():
    async def main():
        lim = AsyncLimiter(Policy("token-bucket 20/s burst=1"))
        first = await lim.acquire("k")
        second = await lim.acquire("k", timeout=1.0)
        never = await lim.acquire("k", 2, timeout=1.0)
        lim.close()
        return first, second, never

    first, second, never = asyncio.run(main())
    assert first.allowed and first.delay_ns == 0
    assert second.allowed and 0 < second.delay_ns <= 50_000_000
    assert not never.allowed and never.reason == "never"


def test_errors_and_a_closed_store_cancel_decisions(redis_url):
    async def main():
        loop = asyncio.get_running_loop()
        store = ratelimit.redis_async_store(redis_url, loop,
                                            prefix=conftest.unique_prefix())
        lim = AsyncLimiter(Policy("fixed-window 5/1h"), store)
        with pytest.raises(ratelimit.Error) as e:
            await lim.check("")
        assert e.value.name == "RATE_EKEY"
        with pytest.raises(OverflowError):
            await lim.check("k", -1)
        pending = asyncio.ensure_future(lim.check("k"))
        await asyncio.sleep(0)  # started, not answered
        with pytest.raises(RuntimeError):
            lim.close()  # a decision in flight
        d = await pending
        assert d.allowed
        lim.close()
        store.close()
        with pytest.raises(TypeError):
            ratelimit.redis_async_store(redis_url, object())

    asyncio.run(main())


def test_acquire_waits_for_a_fixed_window_as_the_sync_one_does():
    # a window of 1 s: the next window comes within the 5 s timeout
    async def main():
        lim = AsyncLimiter(Policy("fixed-window 1/1s"))
        first = await lim.acquire("k")
        second = await lim.acquire("k", timeout=5.0)
        third = await lim.acquire("k")  # no timeout: denied at once
        lim.close()
        return first, second, third

    first, second, third = asyncio.run(main())
    assert first.allowed and second.allowed
    assert not third.allowed and third.reason == "limited"
    sync = ratelimit.Limiter(Policy("fixed-window 1/1s"))
    assert sync.acquire("k").allowed and sync.acquire("k", timeout=5.0).allowed
    sync.close()
