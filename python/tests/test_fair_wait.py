# SPDX-License-Identifier: MIT
"""Fair shares' waiting calls: Fair.acquire (threads, the GIL released,
Ctrl-C) and AsyncFair.acquire (asyncio, never blocking the loop).  Counted,
not timed: the waits' answers, the grants, the table's counters."""

import asyncio
import os
import signal
import threading
import time

import pytest

import conftest
import ratelimit
from ratelimit import AsyncFair, Fair, Limiter, Policy


def wait_for(cond, what, bound=30.0):
    """Polls cond() until true; fails after `bound` s (slack for a loaded
    machine: the conditions come within a few seconds)."""
    end = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < end, "never: " + what
        time.sleep(0.005)


async def await_for(cond, what, bound=30.0):
    end = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < end, "never: " + what
        await asyncio.sleep(0.005)


def test_threads_waiting_are_all_admitted_in_turn():
    # 12 waiters of 4 flows on a limit of 20/s, one at a time: each is
    # admitted within its timeout (30 s for well under 1 s of waiting).
    with Limiter(Policy("token-bucket 20/s burst=1")) as lim:
        with Fair(lim, "shared") as fair:
            got = []

            def worker(i):
                for _ in range(3):
                    got.append(fair.acquire("flow%d" % i, timeout=30))

            ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert len(got) == 12 and all(d.allowed for d in got)
            st = fair.stats()
            assert st["waiting"] == 0 and st["timed_out"] == 0


def test_a_waiter_is_answered_at_its_deadline():
    with Limiter(Policy("token-bucket 1/3s burst=1")) as lim:
        with Fair(lim, "shared", queue_max=1) as fair:
            assert fair.check("a").allowed  # the only permit for 3 s
            # a retry after the deadline: denied at once, not queued
            d = fair.acquire("b", timeout=0.05)
            assert not d.allowed and d.reason == "limited"
            # one waiter queued (its retry within its timeout) ...
            first = []
            t = threading.Thread(
                target=lambda: first.append(fair.acquire("b", timeout=20)))
            t.start()
            wait_for(lambda: fair.stats()["waiting"] == 1, "b waits")
            # ... the flow's queue is full: denied at once
            d = fair.acquire("b", timeout=20)
            assert not d.allowed and d.reason == "limited"
            assert fair.stats()["queue_full"] == 1
            # another flow queues behind it and is answered at its deadline
            d = fair.acquire("c", timeout=0.3)
            assert not d.allowed and d.reason == "limited"
            assert fair.stats()["timed_out"] == 1
            t.join()
            assert first[0].allowed  # admitted when the permit came back


def test_never_and_bad_input():
    with Limiter(Policy("fixed-window 2/1h")) as lim:
        fair = Fair(lim, "shared")
        d = fair.acquire("a", 3, timeout=5)
        assert not d.allowed and d.reason == "never"
        assert d.retry_after == float("inf")
        for call, exc, name in [
                (lambda: fair.acquire(""), ratelimit.Error, "RATE_EKEY"),
                (lambda: fair.acquire("a", weight=2**20 + 1),
                 ratelimit.Error, "RATE_EINVAL"),
                (lambda: fair.acquire("a", 2**63, timeout=1),
                 ratelimit.Error, "RATE_ERANGE")]:
            with pytest.raises(exc) as e:
                call()
            assert e.value.name == name
        for call, exc in [(lambda: fair.acquire(None), TypeError),
                          (lambda: fair.acquire("a", "1"), TypeError),
                          (lambda: fair.acquire("a", -1), OverflowError),
                          (lambda: fair.acquire("a", weight=-1), OverflowError),
                          (lambda: fair.acquire("a", timeout=-1.0), ValueError),
                          (lambda: fair.acquire("a", timeout="1s"), TypeError),
                          (lambda: fair.acquire("a", 1, 1), TypeError)]:
            with pytest.raises(exc):
                call()
        assert fair.acquire("a", 2).allowed  # nothing was charged above
        fair.close()
        with pytest.raises(ValueError, match="closed"):
            fair.acquire("a")


def test_ctrl_c_ends_a_long_wait_and_gives_an_admission_back():
    # The waiter's permit comes 2 s after the first was taken, its timeout
    # 20 s; SIGINT comes once it waits.  Its waiting thread stays queued,
    # is admitted at 2 s, and gives the permit back: the limit has it then.
    lim = Limiter(Policy("token-bucket 1/2s burst=1"))
    fair = Fair(lim, "shared")
    assert fair.check("a").allowed
    sender = threading.Thread(target=lambda: (
        wait_for(lambda: fair.stats()["waiting"] == 1, "b waits"),
        os.kill(os.getpid(), signal.SIGINT)))
    sender.start()
    with pytest.raises(KeyboardInterrupt):
        fair.acquire("b", timeout=20)
    # before its answer (at 2 s): the waiting thread still waits
    waiting = fair.stats()["waiting"]
    sender.join()
    fair.close()  # waits for the waiting thread's answer (at 2 s)
    assert waiting == 1
    assert lim.check("shared").allowed  # the admission given back
    lim.close()


def test_async_waiters_admitted_without_blocking_the_loop():
    async def main():
        lim = Limiter(Policy("token-bucket 20/s burst=1"))
        fair = AsyncFair(lim, "shared")
        ticks = [0]
        stop = asyncio.Event()

        async def ticker():
            while not stop.is_set():
                ticks[0] += 1
                await asyncio.sleep(0.001)

        tick = asyncio.ensure_future(ticker())
        got = await asyncio.gather(*[
            fair.acquire("flow%d" % (i % 3), timeout=30) for i in range(9)])
        stop.set()
        await tick
        assert all(d.allowed for d in got) and len(got) == 9
        # 8 of them waited ~50 ms each: the loop ran the ticker meanwhile
        assert ticks[0] >= 8
        assert fair.pending == 0 and fair.stats()["waiting"] == 0
        fair.close()
        lim.close()

    asyncio.run(main())


def test_async_deadline_queue_full_and_weights():
    async def main():
        lim = Limiter(Policy("token-bucket 1/3s burst=1"))
        fair = AsyncFair(lim, "shared", queue_max=1)
        assert fair.check("a").allowed
        d = await fair.acquire("b", timeout=0.05)  # at once: retry > timeout
        assert not d.allowed and d.reason == "limited"
        long = asyncio.ensure_future(fair.acquire("b", timeout=20))
        await await_for(lambda: fair.pending == 1, "b waits")
        d = await fair.acquire("b", timeout=20)  # the queue is full
        assert not d.allowed and fair.stats()["queue_full"] == 1
        d = await fair.acquire("c", timeout=0.3, weight=4)
        assert not d.allowed and d.reason == "limited"
        assert fair.stats()["timed_out"] == 1
        long.cancel()
        await await_for(lambda: fair.pending == 0, "b answered", 40)
        with pytest.raises(ratelimit.Error) as e:
            await fair.acquire("c", weight=2**21)
        assert e.value.name == "RATE_EINVAL"
        fair.close()
        lim.close()

    asyncio.run(main())


def test_async_cancelled_waiter_gives_its_admission_back():
    async def main():
        lim = Limiter(Policy("token-bucket 1/2s burst=1"))
        fair = AsyncFair(lim, "shared")
        assert fair.check("a").allowed
        task = asyncio.ensure_future(fair.acquire("b", timeout=20))
        await await_for(lambda: fair.pending == 1, "b waits")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the waiter keeps its place and is admitted at 2 s; nobody takes
        # the permit, which goes back to the shared limit
        await await_for(lambda: fair.pending == 0, "b answered")
        assert lim.check("shared").allowed
        fair.close()
        lim.close()

    asyncio.run(main())


def test_async_admitted_then_cancelled_gives_its_admission_back():
    # Admitted (its future answered) but cancelled before the task ran
    # again: the permit goes back to the shared limit.
    async def main():
        lim = Limiter(Policy("token-bucket 1/500ms burst=1"))
        fair = AsyncFair(lim, "total")
        assert (await fair.acquire("a")).allowed  # the only permit
        t = asyncio.ensure_future(fair.acquire("a", timeout=30))
        await asyncio.sleep(0)
        while fair.pending:
            await asyncio.sleep(0)
        assert not t.done()  # admitted; the task not resumed yet
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        assert lim.check("total").allowed  # the permit is back
        fair.close()
        lim.close()

    asyncio.run(main())


def test_async_close_answers_pending_waiters_and_one_loop_only():
    lim = Limiter(Policy("token-bucket 1/1h burst=1"))
    fair = AsyncFair(lim, "shared")

    async def main():
        assert fair.check("a").allowed
        task = asyncio.ensure_future(fair.acquire("b", timeout=3600))
        await await_for(lambda: fair.pending == 1, "b waits")
        fair.close()  # on the loop's thread: the waiter answered
        with pytest.raises(ratelimit.Error) as e:
            await task
        assert e.value.name == "RATE_ECANCELED" and fair.pending == 0

    asyncio.run(main())
    lim.close()

    lim = Limiter(Policy("token-bucket 1/1h burst=1"))
    fair = AsyncFair(lim, "shared")

    async def one():
        return await fair.acquire("a", timeout=1)

    assert asyncio.run(one()).allowed
    with pytest.raises(ValueError, match="one asyncio loop"):
        asyncio.run(one())
    fair.close()
    lim.close()


RELAY = r"""
import select, socket, sys
# A TCP relay to Redis (argv: its port); once armed by a byte on the
# control connection, it holds the next request until a byte comes back.
target = ("127.0.0.1", int(sys.argv[1]))
srv = socket.create_server(("127.0.0.1", 0))
ctl = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
ctl.sendall(b"%d\n" % srv.getsockname()[1])
pairs, clients, armed = {}, set(), False
while True:
    r, _, _ = select.select([srv, ctl] + list(pairs), [], [])
    if ctl in r:  # first: an arming sent before a request comes first
        if not ctl.recv(1):
            break
        armed = True
        continue
    for s in r:
        if s is srv:
            c, _ = srv.accept()
            u = socket.create_connection(target)
            pairs[c], pairs[u] = u, c
            clients.add(c)
            continue
        data = s.recv(65536)
        if not data:
            del pairs[pairs.pop(s)]
            continue
        if armed and s in clients:
            armed = False
            ctl.sendall(b"h")
            ctl.recv(1)
        pairs[s].sendall(data)
"""


def test_a_cancelled_waiters_refund_keeps_the_limiter_open(redis_url):
    # A waiter whose task is gone (its future done) is admitted at 2 s:
    # its admission goes back by a Redis call, which a relay (a process
    # of its own: the loop's thread holds the GIL in the limiter's calls)
    # holds while another thread closes the fair limit and then its
    # limiter.  That close waits for the refund: it has not ended 2 s
    # later (a thread's start and two closes nothing holds take far less).
    import socket
    import subprocess
    import sys
    listener = socket.create_server(("127.0.0.1", 0))
    relay = subprocess.Popen([sys.executable, "-c", RELAY,
                              redis_url.rsplit(":", 1)[1],
                              str(listener.getsockname()[1])])
    ctl, _ = listener.accept()
    port = int(ctl.makefile().readline())
    store = ratelimit.redis_store("redis://127.0.0.1:%d" % port,
                                  prefix=conftest.unique_prefix(),
                                  command_timeout=30.0)
    lim = Limiter(Policy("token-bucket 1/2s burst=1"), store)
    fair = Fair(lim, "shared")
    assert fair.check("a").allowed
    ended = []

    def closer():
        fair.close()
        lim.close()
        ended.append(True)

    def on_hold():
        assert ctl.recv(1) == b"h"  # the refund is held
        t = threading.Thread(target=closer)
        t.start()
        t.join(2.0)
        ended.append(not t.is_alive())
        ctl.sendall(b"g")
        t.join()

    watcher = threading.Thread(target=on_hold)
    watcher.start()

    class Gone:
        """A future whose task was cancelled: done, taking no answer."""
        asked = False

        def done(self):
            Gone.asked = True
            ctl.sendall(b"a")  # arms the relay: the next request waits
            return True

    async def main():
        loop = asyncio.get_running_loop()
        assert fair._acquire_start("b", 1, 1, 20, Gone(), loop) is None
        await await_for(lambda: Gone.asked, "the waiter answered")

    asyncio.run(main())
    watcher.join()
    assert ended == [False, True]  # held by the refund, then closed
    store.close()
    ctl.close()
    relay.wait(30)
    listener.close()
