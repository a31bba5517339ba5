# SPDX-License-Identifier: MIT
"""Policies, decisions, refunds, errors and bad input."""

import math

import pytest

import ratelimit
from ratelimit import Error, Limiter, Policy

T0 = 10**12  # a virtual time, ns


def test_policy_text_and_canonical_form():
    p = Policy("token-bucket 10/s burst=20", name="free")
    assert str(p) == "name=free token-bucket 10/s burst=20"
    assert p.name == "free"
    assert p.limits == [{"algorithm": "token-bucket", "limit": 10,
                         "period_ns": 10**9, "burst": 20, "block_ns": 0}]
    assert Policy(str(p)) == p
    assert Policy("unlimited").unlimited


@pytest.mark.parametrize("text,expect", [
    ("10/minute", "fixed-window 10/m"),
    ("10 per minute", "fixed-window 10/m"),
    ("10 per 2 minutes", "fixed-window 10/2m"),
    ("5/second; 100/hour", "fixed-window 5/s; fixed-window 100/h"),
    ("1/day|7 per month", "fixed-window 1/d; fixed-window 7/30d"),
    ("2 per year", "fixed-window 2/360d"),
    ("10/s", "fixed-window 10/s"),
    ("100/5m; 1000 per d", "fixed-window 100/5m; fixed-window 1000/d"),
])
def test_policy_limits_wording(text, expect):
    assert str(Policy(text)) == str(Policy(expect))


@pytest.mark.parametrize("text", ["10/ms", "10/sm", "10/x"])
def test_policy_not_limits_wording_is_the_library_s(text):
    with pytest.raises(ratelimit.Error):
        Policy(text)


def test_policy_limits_wording_other_algorithm():
    assert str(Policy("10/minute", algorithm="token-bucket")) == \
        str(Policy("token-bucket 10/m burst=10"))
    assert str(Policy("10/minute", algorithm="sliding-log")) == \
        str(Policy("sliding-log 10/m"))
    with pytest.raises(ValueError):
        Policy("10/minute", algorithm="bogus")


def test_policy_errors_carry_the_library_message():
    with pytest.raises(Error) as e:
        Policy("fixed-window 10/s burst=5")
    assert e.value.code == ratelimit.EPOLICY
    assert e.value.name == "RATE_EPOLICY"
    assert str(e.value) == "limit 1: option 'burst' does not belong to fixed-window"
    with pytest.raises(Error) as e:
        Policy("fixed-window 10/s", name="bad name")
    assert e.value.name == "RATE_EINVAL"
    with pytest.raises(ValueError):
        Policy("fixed-window 10/s\0; sliding-log 1/s")
    with pytest.raises(TypeError):
        Policy(10)


def test_decision_fields_token_bucket():
    with Limiter(Policy("token-bucket 2/s burst=2")) as lim:
        d = lim.check("k", now=T0)
        assert d.allowed and d.reason == "allowed"
        assert (d.remaining, d.limit) == (1, 2)
        assert d.reset_after_ns == 500_000_000 and d.reset_after == 0.5
        lim.check("k", now=T0)
        d = lim.check("k", now=T0)
        assert not d.allowed and d.reason == "limited"
        assert d.retry_after_ns == 500_000_000 and d.retry_after == 0.5
        d = lim.check("k", 3, now=T0)
        assert d.reason == "never" and d.retry_after == math.inf
        assert d.retry_after_ns == ratelimit.NEVER
        # a reservation waits instead of being denied
        d = lim.check("k", max_wait=1.0, now=T0)
        assert d.allowed and d.delay_ns == 500_000_000


def test_refund_penalize_reset():
    with Limiter(Policy("fixed-window 3/m")) as lim:
        for _ in range(3):
            assert lim.check("k", now=T0).allowed
        assert not lim.check("k", now=T0).allowed
        lim.refund("k", 2, now=T0)
        assert lim.check("k", now=T0).remaining == 1
        lim.penalize("k", 5, now=T0)
        assert not lim.check("k", now=T0).allowed
        lim.reset("k")
        assert lim.check("k", now=T0).remaining == 2


def test_check_under_another_policy_and_refund_under_it():
    with Limiter(Policy("fixed-window 100/m")) as lim:
        small = Policy("fixed-window 1/m")
        assert lim.check("k", now=T0, policy=small).allowed
        assert not lim.check("k", now=T0, policy=small).allowed
        lim.refund("k", 1, now=T0, policy=small)
        assert lim.check("k", now=T0, policy=small).allowed


def test_try_acquire_and_acquire():
    with Limiter(Policy("token-bucket 1000/s burst=1")) as lim:
        assert lim.try_acquire("k", now=T0)
        assert not lim.try_acquire("k", now=T0)
        assert lim.try_acquire("k", now=T0 + 1_000_000)
        # a blocking acquire that waits its 1 ms (the library's clock)
        assert lim.acquire("w").allowed
        assert lim.acquire("w", timeout=1.0).allowed
        assert not lim.acquire("w", 2, timeout=1.0).allowed  # never


def test_headers():
    with Limiter(Policy("fixed-window 2/10s", name="api")) as lim:
        lim.check("k", now=T0)
        lim.check("k", now=T0)
        status, fields = lim.headers(lim.check("k", now=T0))
        assert status == 429
        assert fields["RateLimit-Policy"] == '"api";q=2;w=10'
        assert fields["RateLimit"].startswith('"api";r=0;t=')
        assert int(fields["Retry-After"]) >= 1
        with pytest.raises(TypeError):
            lim.headers((True, "allowed"))


def test_keys_are_bytes_with_their_length():
    with Limiter(Policy("fixed-window 1/m")) as lim:
        assert lim.check(b"a\0b", now=T0).allowed
        assert lim.check("a", now=T0).allowed  # not the same key
        assert lim.check(bytearray(b"a\0b"), now=T0).reason == "limited"
        assert lim.check("\u00e9", now=T0).allowed
        assert lim.check("\u00e9".encode(), now=T0).reason == "limited"


@pytest.mark.parametrize("call", [
    lambda l: l.check(""),
    lambda l: l.check("x" * (ratelimit.KEY_MAX + 1)),
    lambda l: l.check(b"\xffLEASE\x01\x00rest"),
    lambda l: l.try_acquire(""),
    lambda l: l.check("k", 2**63),
    lambda l: l.check("k", now=2**63),
    lambda l: l.refund("k", 2**63),
    lambda l: l.try_acquire("k", 2**63),
])
def test_bad_input_raises_library_errors(call):
    with Limiter(Policy("fixed-window 1/m")) as lim:
        with pytest.raises(Error) as e:
            call(lim)
        assert e.value.name in ("RATE_EKEY", "RATE_ERANGE")
        assert lim.check("k").allowed  # nothing was charged


@pytest.mark.parametrize("call,exc", [
    (lambda l: l.check(None), TypeError),
    (lambda l: l.check(5), TypeError),
    (lambda l: l.check("k", 1.5), TypeError),
    (lambda l: l.check("k", "1"), TypeError),
    (lambda l: l.check("k", -1), OverflowError),
    (lambda l: l.check("k", 2**64), OverflowError),
    (lambda l: l.check("k", 10**100), OverflowError),
    (lambda l: l.check("k", max_wait=-1.0), ValueError),
    (lambda l: l.check("k", max_wait=float("nan")), ValueError),
    (lambda l: l.check("k", max_wait=1e300), OverflowError),
    (lambda l: l.check("k", max_wait="1s"), TypeError),
    (lambda l: l.check("k", policy="fixed-window 1/s"), TypeError),
    (lambda l: l.acquire("k", timeout=float("inf")), OverflowError),
    (lambda l: l.refund("k", policy=1), TypeError),
    (lambda l: l.reset(b"k", 1), TypeError),
    (lambda l: l.check(), TypeError),
    (lambda l: l.check(permits=1), TypeError),
    (lambda l: l.check("k", 1, 0), TypeError),
    (lambda l: l.check("k", bogus=1), TypeError),
    (lambda l: l.check("k", key="k"), TypeError),
    (lambda l: l.try_acquire("k", 1, 2), TypeError),
    (lambda l: l.try_acquire("k", max_wait=1), TypeError),
])
def test_wrong_types_raise(call, exc):
    with Limiter(Policy("fixed-window 1/m")) as lim:
        with pytest.raises(exc):
            call(lim)


def test_closed_limiter_raises_and_store_stays_open_while_used(shm_path):
    store = ratelimit.shm_store(shm_path, max_keys=100)
    lim = Limiter(Policy("fixed-window 1/m"), store)
    with pytest.raises(RuntimeError):
        store.close()
    lim.close()
    lim.close()  # twice: nothing
    assert lim.closed
    for call in (lambda: lim.check("k"), lambda: lim.try_acquire("k"),
                 lambda: lim.refund("k"), lambda: lim.reset("k"),
                 lambda: lim.acquire("k"), lambda: lim.stats()):
        with pytest.raises(ValueError):
            call()
    store.close()
    with pytest.raises(ValueError):
        Limiter(Policy("fixed-window 1/m"), store)
    with pytest.raises(TypeError):
        Limiter("fixed-window 1/m")
    with pytest.raises(TypeError):
        Limiter(Policy("fixed-window 1/m"), store="memory")
    with pytest.raises(ValueError):
        Limiter(Policy("fixed-window 1/m"), fail="maybe")


def test_uninitialized_objects_raise():
    lim = Limiter.__new__(Limiter)
    with pytest.raises(ValueError):
        lim.check("k")
    pol = ratelimit._ratelimit.Policy.__new__(ratelimit._ratelimit.Policy)
    with pytest.raises(ValueError):
        Limiter(pol)
    with pytest.raises(RuntimeError):
        good = Limiter(Policy("fixed-window 1/m"))
        good.__init__(Policy("fixed-window 1/m"))


def test_store_errors():
    with pytest.raises(Error) as e:
        ratelimit.shm_store("/nonexistent-dir/x.rl", max_keys=10)
    assert e.value.name == "RATE_ESTORE" and "/nonexistent-dir" in str(e.value)
    with pytest.raises(Error) as e:
        ratelimit.shm_store("/dev/shm/never.rl", max_keys=10, no_create=True)
    assert e.value.name == "RATE_ESTORE"
    with pytest.raises(ValueError):
        ratelimit.shm_store("/dev/shm/a\0b", max_keys=10)
    with pytest.raises(Error) as e:
        ratelimit.redis_store("redis://127.0.0.1:1", connect_timeout=0.5)
    assert e.value.name in ("RATE_ESTORE", "RATE_ETIMEDOUT")
    with pytest.raises(Error) as e:
        ratelimit.redis_store("rediss://127.0.0.1:1")
    assert e.value.name == "RATE_EINVAL"
    with pytest.raises(ValueError):
        ratelimit.redis_store("redis://127.0.0.1:1", module="sometimes")


def test_fail_open_and_closed_on_a_store_that_is_down():
    store = ratelimit.redis_store("redis://127.0.0.1:1", lazy_connect=True,
                                  connect_timeout=0.2, command_timeout=0.2)
    with Limiter(Policy("fixed-window 1/m"), store, fail="open") as lim:
        d = lim.check("k")
        assert d.allowed and d.reason == "store-error"
        assert d.error == ratelimit.ESTORE
    with Limiter(Policy("fixed-window 1/m"), store) as lim:
        d = lim.check("k")
        assert not d.allowed and d.reason == "store-error"
    store.close()


def test_stats():
    with Limiter(Policy("fixed-window 1/m")) as lim:
        lim.check("a", now=T0)
        lim.check("a", now=T0)
        s = lim.stats()
        assert (s["allowed"], s["denied"]) == (1, 1)


@pytest.mark.parametrize("call, exc, name", [
    (lambda p: ratelimit.shm_store(p, max_keys=10, key_max=2**32 + 16),
     OverflowError, "key_max"),
    (lambda p: ratelimit.shm_store(p, max_keys=10, key_max=2**40),
     OverflowError, "key_max"),
    (lambda p: ratelimit.shm_store(p, max_keys=10, state_max=2**32),
     OverflowError, "state_max"),
    (lambda p: ratelimit.shm_store(p, max_keys=10, mode=2**40),
     OverflowError, "mode"),
    (lambda p: ratelimit.shm_store(p, max_keys=-1), ValueError, "max_keys"),
    (lambda p: ratelimit.shm_store(p, max_keys=2**64), OverflowError,
     "max_keys"),
    (lambda p: ratelimit.memory_store(max_keys=-1), ValueError, "max_keys"),
    (lambda p: ratelimit.memory_store(max_keys=2**33), OverflowError,
     "max_keys"),
    (lambda p: ratelimit.memory_store(shards=2**32 + 1), OverflowError,
     "shards"),
    (lambda p: ratelimit.redis_store("redis://127.0.0.1:1", pool_size=2**40,
                                     lazy_connect=True),
     OverflowError, "pool_size"),
    (lambda p: ratelimit.redis_store("redis://127.0.0.1:1", pool_size=-2,
                                     lazy_connect=True),
     ValueError, "pool_size"),
    (lambda p: ratelimit.Fair(Limiter(Policy("token-bucket 5/s")), "k",
                              slots=2**32 + 4), OverflowError, "slots"),
])
def test_integer_options_out_of_range_raise_naming_the_option(shm_path, call,
                                                              exc, name):
    # an option out of its type's range raises, never wraps to another value
    with pytest.raises(exc, match=name):
        call(shm_path)
    with pytest.raises(TypeError, match="key_max"):
        ratelimit.shm_store(shm_path, max_keys=10, key_max="16")


def test_a_denied_decision_is_false():
    with Limiter(Policy("fixed-window 1/1h")) as lim:
        first, second = lim.check("k"), lim.check("k")
        assert first and first.allowed
        assert not second and not second.allowed
        assert bool(lim.acquire("k")) is False
        assert isinstance(second, tuple) and second[0] is False


def test_the_library_s_error_text_reaches_the_exception(shm_path):
    store = ratelimit.shm_store(shm_path, max_keys=100)
    with pytest.raises(Error, match="states take up to [0-9]+ bytes.*"
                                    "keeps at most 96") as e:
        Limiter(Policy("sliding-log 100/1m"), store)
    assert e.value.name == "RATE_EPOLICY"
    with pytest.raises(Error, match="states take up to"):
        store.check_policy(Policy("sliding-log 100/1m"))
    assert store.check_policy(Policy("sliding-log 4/1m")) is None
    store.close()


def test_ctrl_c_stops_a_waiting_acquire():
    # A child waits on an acquire of an hour; SIGINT must end it with
    # KeyboardInterrupt.  Its wait is an hour and the bound 60 s, slack a
    # loaded machine cannot use up.
    import signal
    import subprocess
    import sys
    import time
    code = ("import ratelimit, sys\n"
            "lim = ratelimit.Limiter(ratelimit.Policy('token-bucket 1/1h'))\n"
            "lim.try_acquire('k')\n"
            "try:\n"
            "    print('waiting', flush=True)\n"
            "    lim.acquire('k', timeout=7200)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', flush=True)\n"
            "    sys.exit(3)\n")
    child = subprocess.Popen([sys.executable, "-c", code],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "waiting\n"
        time.sleep(0.2)  # into the acquire
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 3 and out == "interrupted\n"
