# SPDX-License-Identifier: MIT
"""close() racing on other threads: an object closed twice at once gives
its parent back once."""

import threading
import time

import pytest

from ratelimit import Fair, Limiter, Policy


def wait_for(cond, what, bound=30.0):
    end = time.monotonic() + bound
    while not cond():
        assert time.monotonic() < end, "never: " + what
        time.sleep(0.005)


def test_two_closes_at_once_give_the_limiter_back_once():
    # A waiter holds the fair limit (its permit comes 3 s later), so both
    # close() calls are under way together; the limiter keeps one user,
    # the other fair limit, and refuses to close.
    lim = Limiter(Policy("token-bucket 1/3s burst=1"))
    f1 = Fair(lim, "k")
    f2 = Fair(lim, "k2")
    assert f1.check("a").allowed
    waiter = threading.Thread(target=lambda: f1.acquire("a", timeout=30))
    waiter.start()
    wait_for(lambda: f1.stats()["waiting"] == 1, "the waiter waits")
    closers = [threading.Thread(target=f1.close) for _ in range(2)]
    for c in closers:
        c.start()
    for c in closers:
        c.join()
    waiter.join()
    with pytest.raises(RuntimeError, match="open fair limits"):
        lim.close()
    assert f2.check("x").allowed
    f2.close()
    lim.close()
