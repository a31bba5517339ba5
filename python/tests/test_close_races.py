# SPDX-License-Identifier: MIT
"""close() and constructors racing on other threads: a parent (a Store, a
Limiter) stays open while an object made on it is; an object closed twice
at once gives its parent back once; freeing a Fair whose waiter was
abandoned at Ctrl-C never waits for that waiter."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ratelimit import Fair, Limiter, Policy, memory_store


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


def run_race(make_parent, make_child, close_parent, rounds=300):
    """Rounds of a child made on a parent while another thread closes the
    parent as the child's constructor runs: either the child is refused
    (ValueError: closed) or the parent's close is (RuntimeError), never
    both done."""
    both = 0
    for _ in range(rounds):
        parent = make_parent()
        go = threading.Event()
        closed = []

        def closer():
            go.wait()
            try:
                close_parent(parent)
                closed.append(True)
            except RuntimeError:
                closed.append(False)

        t = threading.Thread(target=closer)
        t.start()
        go.set()
        try:
            child = make_child(parent)
        except ValueError:
            child = None
        t.join()
        if child is not None:
            both += closed[0]
            if not closed[0]:
                child.close()
                close_parent(parent)
    assert both == 0, "%d of %d children made on a closed parent" % (
        both, rounds)


def test_a_limiter_made_while_its_store_closes_keeps_it_open():
    run_race(lambda: memory_store(),
             lambda s: Limiter(Policy("10/s"), s),
             lambda s: s.close())


def test_a_fair_limit_made_while_its_limiter_closes_keeps_it_open(tmp_path):
    n = iter(range(10**6))
    run_race(lambda: Limiter(Policy("10/s")),
             lambda lim: Fair(lim, "k", shm_path=str(tmp_path / (
                 "t%d" % next(n)))),
             lambda lim: lim.close())


def test_freeing_a_fair_limit_never_waits_for_an_abandoned_waiter():
    # The waiter's permit comes in 5 minutes; Ctrl-C (SIGALRM's handler
    # raises it) ends the call after 0.5 s.  Deleting the Fair and the
    # interpreter's exit return at once (60 s of slack) rather than wait
    # for the abandoned waiter's answer (its timeout: 10 minutes).
    script = textwrap.dedent("""
        import signal, ratelimit
        lim = ratelimit.Limiter(ratelimit.Policy("token-bucket 1/300s burst=1"))
        f = ratelimit.Fair(lim, "k")
        assert f.check("a").allowed
        def interrupt(*a):
            raise KeyboardInterrupt()
        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        try:
            f.acquire("a", timeout=600)
            raise SystemExit("not interrupted")
        except KeyboardInterrupt:
            pass
        del f
        print("deleted", flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], timeout=60,
                       capture_output=True, text=True,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert p.stdout == "deleted\n"


def test_an_abandoned_waiter_frees_its_fair_limit_once_answered():
    # The Fair deleted after Ctrl-C lives on in its waiting thread, which
    # is admitted at 2 s, gives the permit back and frees it: the limiter
    # then has no user left and closes.
    lim = Limiter(Policy("token-bucket 1/2s burst=1"))
    fair = Fair(lim, "shared")
    assert fair.check("a").allowed
    sender = threading.Thread(target=lambda f=fair: (
        wait_for(lambda: f.stats()["waiting"] == 1, "b waits"),
        os.kill(os.getpid(), signal.SIGINT)))
    sender.start()
    with pytest.raises(KeyboardInterrupt):
        fair.acquire("b", timeout=20)
    sender.join()
    del sender
    del fair

    def closed():
        try:
            lim.close()
            return True
        except RuntimeError:
            return False
    wait_for(closed, "the waiting thread frees the fair limit")
