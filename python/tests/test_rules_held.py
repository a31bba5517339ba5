# SPDX-License-Identifier: MIT
"""The rules file's in-flight rules: Rules.acquire holds a lease of each
in-flight policy until the request's release."""

import threading
import time

import pytest

import ratelimit
from ratelimit import Limiter, Policy, Rules

RULES = """\
[policies]
slow = concurrency 2 ttl=30s
free = fixed-window 100000/1m

[rule slow]
group = route
match = route=/slow*
policy = slow

[rule free]
group = tier
policy = free
"""

SLOW = {"route": "/slow/report"}


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "rules.conf"
    path.write_text(RULES)
    r = Rules(str(path))
    yield r
    r.close()


@pytest.fixture
def lim():
    with Limiter(Policy("fixed-window 1000/1m")) as l:
        yield l


def admitted(rules, lim, key="alice", n=10):
    """How many more requests of key are admitted now: each is held, then
    all are released."""
    held = []
    for _ in range(n):
        req = rules.acquire(lim, key, SLOW)
        if not req.outcome.allowed:
            break
        held.append(req)
    for req in held:
        req.release()
    return len(held)


def test_inflight_rule_admits_two_and_refuses_a_third_until_a_release(
        rules, lim):
    a = rules.acquire(lim, "alice", SLOW)
    b = rules.acquire(lim, "alice", SLOW)
    assert a.outcome.allowed and b.outcome.allowed and a.held and b.held
    assert [x[0] for x in a.outcome.applied] == ["slow", "free"]
    assert a.outcome.headers["RateLimit-Policy"] == '"slow";q=2, "free";q=100000;w=60'
    c = rules.acquire(lim, "alice", SLOW)
    assert not c.outcome.allowed and not c.held
    assert c.outcome.status == 429 and c.outcome.denied_by == 0
    assert "Retry-After" in c.outcome.headers
    c.release()                           # holds nothing: nothing to do
    assert admitted(rules, lim, "bob") == 2   # another key has its own
    a.release()
    assert a.released and not a.held
    d = rules.acquire(lim, "alice", SLOW)
    assert d.outcome.allowed and d.held
    assert not rules.acquire(lim, "alice", SLOW).outcome.allowed
    b.release()
    d.release()
    assert admitted(rules, lim) == 2
    # no in-flight policy applies: nothing held, nothing to release
    plain = rules.acquire(lim, "alice", {"route": "/fast"})
    assert plain.outcome.allowed and not plain.held
    # check() cannot hold the lease an in-flight rule needs
    with pytest.raises(ratelimit.Error) as e:
        rules.check(lim, "alice", SLOW)
    assert e.value.name == "RATE_EPOLICY"


def test_a_second_release_does_nothing(rules, lim):
    a = rules.acquire(lim, "alice", SLOW)
    b = rules.acquire(lim, "alice", SLOW)
    a.release()
    a.release()                           # b's lease stays held
    with a:
        pass
    assert b.held
    assert admitted(rules, lim) == 1
    b.release()
    assert admitted(rules, lim) == 2


def test_a_with_block_releases_on_leaving_it_even_by_an_error(rules, lim):
    with rules.acquire(lim, "alice", SLOW) as req:
        assert req.outcome.allowed and req.held
        assert admitted(rules, lim) == 1
    assert req.released and not req.held
    assert admitted(rules, lim) == 2
    with pytest.raises(KeyError):
        with rules.acquire(lim, "alice", SLOW) as req:
            with rules.acquire(lim, "alice", SLOW):
                assert admitted(rules, lim) == 0
                raise KeyError("the handler failed")
    assert req.released
    assert admitted(rules, lim) == 2
    # released inside the block: leaving it does nothing more
    with rules.acquire(lim, "alice", SLOW) as req:
        req.release()
        assert admitted(rules, lim) == 2


def test_a_request_dropped_unreleased_is_released(rules, lim):
    for _ in range(5):
        assert rules.acquire(lim, "alice", SLOW).outcome.allowed
    req = rules.acquire(lim, "alice", SLOW)
    del req
    assert admitted(rules, lim) == 2
    rules.close()                         # nothing is held any more
    lim.close()


def test_requests_held_across_a_reload_release_fine(rules, lim, tmp_path):
    a = rules.acquire(lim, "alice", SLOW)
    b = rules.acquire(lim, "alice", SLOW)
    (tmp_path / "rules.conf").write_text(
        RULES.replace("concurrency 2", "concurrency 3"))
    assert rules.reload() == 2
    # the held leases count against the new limit
    c = rules.acquire(lim, "alice", SLOW)
    assert c.outcome.allowed and c.outcome.applied[0][1].limit == 3
    assert not rules.acquire(lim, "alice", SLOW).outcome.allowed
    a.release()
    b.release()
    assert admitted(rules, lim) == 2
    c.release()
    assert admitted(rules, lim) == 3
    # a smaller limit denies until fewer are held
    d = rules.acquire(lim, "alice", SLOW)
    (tmp_path / "rules.conf").write_text(
        RULES.replace("concurrency 2", "concurrency 1"))
    assert rules.reload() == 3
    assert admitted(rules, lim) == 0
    d.release()
    assert admitted(rules, lim) == 1


def test_closing_refuses_while_requests_are_held(rules, lim):
    req = rules.acquire(lim, "alice", SLOW)
    with pytest.raises(RuntimeError, match="held"):
        rules.close()
    with pytest.raises(RuntimeError, match="held"):
        lim.close()
    assert admitted(rules, lim) == 1      # both still work
    req.release()
    lim.close()
    with pytest.raises(ValueError, match="closed"):
        rules.acquire(lim, "alice", SLOW)
    other = Limiter(Policy("fixed-window 1/s"))
    rules.close()
    with pytest.raises(ValueError, match="closed"):
        rules.acquire(other, "alice", SLOW)
    req.release()                         # still nothing to do


def test_bad_input_raises_and_holds_nothing(rules, lim):
    with pytest.raises(TypeError):
        rules.acquire("not a limiter", "alice", SLOW)
    with pytest.raises(TypeError):
        rules.acquire(lim, 42, SLOW)
    with pytest.raises(TypeError):
        rules.acquire(lim, "alice", ["route"])
    with pytest.raises(TypeError):
        rules.acquire(lim, "alice", {"route": 1})
    with pytest.raises(TypeError):
        rules.acquire(lim, "alice", {1: "/slow"})
    with pytest.raises(ValueError):
        rules.acquire(lim, "alice", {"route": "/slow\0x"})
    with pytest.raises(ValueError):
        rules.acquire(lim, "alice", {"ro\0ute": "/slow"})
    for permits in (-1, 2**64):
        with pytest.raises(OverflowError):
            rules.acquire(lim, "alice", SLOW, permits)
    with pytest.raises(TypeError):
        rules.acquire(lim, "alice", SLOW, max_wait="1s")
    for key in ("", "k" * 5000):
        with pytest.raises(ratelimit.Error) as e:
            rules.acquire(lim, key, SLOW)
        assert e.value.name == "RATE_EKEY"
    with pytest.raises(ratelimit.Error) as e:
        rules.acquire(lim, "alice", SLOW, 2**63)
    assert e.value.name == "RATE_ERANGE"
    # a key goes with its length: NUL is one of its bytes
    with rules.acquire(lim, "al\0ice", SLOW) as req:
        assert req.held and admitted(rules, lim, "al\0ice") == 1
        assert admitted(rules, lim, "al") == 2
    with pytest.raises(TypeError):
        ratelimit.RulesHeld()
    assert admitted(rules, lim) == 2      # none of them held a lease
    rules.close()
    lim.close()


def test_threads_never_hold_more_than_the_limit(rules, lim, tmp_path):
    inside, most, served, lock = [0], [0], [0], threading.Lock()
    errors = []

    def worker():
        try:
            for _ in range(200):
                with rules.acquire(lim, "shared", SLOW) as req:
                    if not req.outcome.allowed:
                        continue
                    with lock:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                        served[0] += 1
                    with lock:
                        inside[0] -= 1
        except Exception as e:            # reported below
            errors.append(e)

    def reloader():
        for _ in range(20):
            rules.reload()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    threads.append(threading.Thread(target=reloader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 0 < most[0] <= 2 and served[0] > 0
    assert admitted(rules, lim, "shared") == 2   # every lease given back
    rules.close()
    lim.close()


@pytest.mark.parametrize("store_kind", ["memory", "shm", "redis",
                                        "redis-module"])
def test_leases_are_the_stores(rules, make_store, store_kind):
    store = make_store(store_kind)
    one = Limiter(Policy("fixed-window 1000/1m"), store)
    two = Limiter(Policy("fixed-window 1000/1m"), store)
    with rules.acquire(one, "alice", SLOW) as a:
        b = rules.acquire(one, "alice", SLOW)
        assert a.held and b.held
        # another limiter on the store sees the same leases
        c = rules.acquire(two, "alice", SLOW)
        assert not c.outcome.allowed and c.outcome.status == 429
        b.release()
        assert admitted(rules, two) == 1
    assert admitted(rules, two) == 2
    one.close()
    two.close()


def test_a_lease_that_lapsed_raises_at_its_release(tmp_path, lim):
    path = tmp_path / "quick.conf"
    path.write_text(RULES.replace("concurrency 2 ttl=30s",
                                  "concurrency 2 ttl=20ms"))
    rules = Rules(str(path))
    req = rules.acquire(lim, "alice", SLOW)
    time.sleep(0.2)                       # at least ten times the TTL
    with pytest.raises(ratelimit.Error) as e:
        req.release()
    assert e.value.name == "RATE_EEXPIRED"
    assert req.released and not req.held
    req.release()                         # once only
    # leaving a block raises it too, unless the block raised
    with pytest.raises(ratelimit.Error) as e:
        with rules.acquire(lim, "alice", SLOW):
            time.sleep(0.2)
    assert e.value.name == "RATE_EEXPIRED"
    with pytest.raises(KeyError):
        with rules.acquire(lim, "alice", SLOW):
            time.sleep(0.2)
            raise KeyError("the handler failed")
    rules.close()                         # nothing left held
