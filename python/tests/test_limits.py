# SPDX-License-Identifier: MIT
"""The storage for limits and Flask-Limiter: what limits documents for its
strategies (hit, test, get_window_stats, clear, reset) on each store, the
ratelimit-* strategies, one limit shared with a Limiter of the binding,
and a real Flask app that names nothing but its storage URI."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
from limits import parse
from limits.storage import storage_from_string
from limits.strategies import STRATEGIES

import conftest
import ratelimit
from ratelimit.limits_storage import RatelimitStorage


@pytest.fixture(params=["memory", "shm", "redis", "dynamodb"])
def storage(request, shm_path):
    if request.param == "memory":
        uri = "ratelimit+memory://"
    elif request.param == "shm":
        uri = "ratelimit+shm://" + shm_path + "?max_keys=1024&state_max=512"
    elif request.param == "dynamodb":
        # credentials as an application gets them: the environment
        env = request.getfixturevalue("monkeypatch")
        env.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
        env.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
        uri = ("ratelimit+" + request.getfixturevalue("dynalite").url() +
               "&create_table=1&prefix=" + conftest.unique_prefix())
    else:
        url = request.getfixturevalue("redis_url")
        uri = "ratelimit+" + url + "/0?prefix=" + conftest.unique_prefix()
    st = storage_from_string(uri)
    assert isinstance(st, RatelimitStorage)
    yield st
    st.reset()
    st.close()


@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window",
                                      "ratelimit-token-bucket",
                                      "ratelimit-sliding-window"])
def test_strategy_contract(storage, strategy):
    limiter = STRATEGIES[strategy](storage)
    item = parse("5/minute")
    assert limiter.test(item, "user")
    assert limiter.hit(item, "user", cost=2)
    for _ in range(3):
        assert limiter.hit(item, "user")
    assert not limiter.hit(item, "user")
    assert not limiter.test(item, "user")
    reset, remaining = limiter.get_window_stats(item, "user")
    assert remaining == 0
    # (the two-window counter forgets a key two windows on)
    span = 120 if strategy == "ratelimit-sliding-window" else 60
    assert time.time() - 1 <= reset <= time.time() + span + 1
    assert limiter.hit(item, "other")  # keys apart
    limiter.clear(item, "user")
    assert limiter.test(item, "user")
    assert limiter.get_window_stats(item, "user")[1] == 5
    limiter.hit(item, "user")
    storage.reset()
    assert limiter.get_window_stats(item, "user")[1] == 5


@pytest.mark.parametrize("strategy", ["fixed-window",
                                      "ratelimit-token-bucket",
                                      "ratelimit-sliding-window"])
def test_an_unused_key_is_whole_now(storage, strategy):
    # A key with nothing to give back resets now (the second, as limits's
    # own storages say it), not a second on: on the first call (Python)
    # and on a key seen before (the C base's get_expiry).
    limiter = STRATEGIES[strategy](storage)
    item = parse("10 per 2 second")
    for _ in range(2):
        before = int(time.time())
        reset, remaining = limiter.get_window_stats(item, "unused")
        assert remaining == 10
        assert before <= reset <= int(time.time())
        if strategy == "fixed-window":
            before = int(time.time())
            assert before <= storage.get_expiry(item.key_for("unused")) \
                <= int(time.time())


def test_fixed_window_counts_and_expiry(storage):
    item = parse("3 per hour")
    key = item.key_for("k")
    assert storage.incr(key, item.get_expiry()) == 1
    assert storage.incr(key, item.get_expiry(), amount=2) == 3
    assert storage.incr(key, item.get_expiry()) == 4  # denied, not counted
    assert storage.get(key) == 3
    now = time.time()
    assert now <= storage.get_expiry(key) <= now + 3601
    with pytest.raises(NotImplementedError):
        storage.incr(key, item.get_expiry(), elastic_expiry=True)
    with pytest.raises(ValueError):
        storage.incr("not-a-limits-key", 60)
    with pytest.raises(ValueError):
        storage.incr(key, 60)  # the key says an hour
    assert storage.check()


def test_a_key_seen_before_is_decided_alike(storage):
    # The first call on a key parses it; the next ones are decided by the
    # storage's C base from what was kept: the same counts, the same
    # errors, and a reset seen.
    item, window = parse("3 per hour"), parse("2 per minute")
    key, mkey = item.key_for("seen"), window.key_for("seen")
    assert [storage.incr(key, 3600) for _ in range(4)] == [1, 2, 3, 4]
    assert storage.incr(key, 3600, False, 0) == 3
    assert storage.incr(key=key, expiry=3600, amount=5) == 8
    assert [storage.acquire_entry(mkey, 2, 60) for _ in range(3)] == \
        [True, True, False]
    assert not storage.acquire_entry(mkey, 2, 60, amount=1)
    with pytest.raises(TypeError):
        storage.incr(key, 3600, amount="1")
    with pytest.raises(OverflowError):
        storage.incr(key, 3600, amount=-1)
    with pytest.raises(TypeError):
        storage.acquire_entry(mkey, 2, 60, amount=1.0)
    with pytest.raises(TypeError):
        storage.incr(key)
    with pytest.raises(TypeError):
        storage.incr(key, 3600, cost=1)
    with pytest.raises(NotImplementedError):
        storage.incr(key, 3600, elastic_expiry=True)
    with pytest.raises(ValueError):
        storage.incr(key, 60)  # the key says an hour
    assert storage.get(key) == 3
    now = time.time()
    assert now <= storage.get_expiry(key) <= now + 3601
    assert storage.get(item.key_for("unseen")) == 0
    with pytest.raises(ValueError):
        storage.get("LIMITER/unseen/3/1/fortnight")
    storage.reset()
    assert storage.get(key) == 0
    assert storage.incr(key, 3600) == 1
    assert storage.get(key) == 1
    assert storage.acquire_entry(mkey, 2, 60)


def test_a_closed_storage_raises_on_a_key_seen_before():
    st = RatelimitStorage("ratelimit+memory://")
    key, mkey = parse("3/hour").key_for("k"), parse("2/minute").key_for("k")
    assert st.incr(key, 3600) == 1 and st.acquire_entry(mkey, 2, 60)
    st.close()
    for call in (lambda: st.incr(key, 3600), lambda: st.get(key),
                 lambda: st.get_expiry(key)):
        with pytest.raises(ValueError, match="closed"):
            call()
    with pytest.raises(ValueError, match="closed"):
        st.acquire_entry(mkey, 2, 60)


def test_arguments_that_change_the_storage_as_they_are_compared():
    # an expiry or limit whose == empties the storage's kept entries: the
    # entry in use stays alive, and the decision is made all the same
    st = RatelimitStorage("ratelimit+memory://")
    key, mkey = parse("3/hour").key_for("k"), parse("2/minute").key_for("k")
    assert st.incr(key, 3600) == 1 and st.acquire_entry(mkey, 2, 60)

    class Emptying(int):
        def __eq__(self, other):
            st._fixed.clear()
            st._moving.clear()
            return int(self) == other
        __hash__ = int.__hash__

    assert st.incr(key, Emptying(3600)) == 2
    assert st.acquire_entry(mkey, Emptying(2), 60)
    assert not st.acquire_entry(mkey, 2, Emptying(60))
    st.close()


def test_library_strategies_need_this_storage():
    with pytest.raises(NotImplementedError):
        STRATEGIES["ratelimit-token-bucket"](storage_from_string("memory://"))


def test_one_limit_shared_with_the_binding(shm_path):
    # limits's fixed window 4/minute and the library's "fixed-window 4/m"
    # on one shared-memory region are one limit.
    st = storage_from_string("ratelimit+shm://" + shm_path)
    fw = STRATEGIES["fixed-window"](st)
    item = parse("4/minute")
    store = ratelimit.shm_store(shm_path, max_keys=65536, key_max=256)
    with ratelimit.Limiter(ratelimit.Policy("fixed-window 4/m"), store) as lim:
        key = item.key_for("site")
        assert fw.hit(item, "site") and fw.hit(item, "site")
        assert lim.check(key).remaining == 1
        assert fw.hit(item, "site")
        assert not lim.check(key).allowed
        assert not fw.hit(item, "site")
    store.close()
    st.close()


def test_store_failures_raise():
    # at creation, and in a decision (Flask-Limiter's swallow_errors and
    # in_memory_fallback then have their say)
    st = RatelimitStorage("ratelimit+memory://")
    st._limiter.close()
    st._store.close()
    st._store = ratelimit.redis_store("redis://127.0.0.1:1", lazy_connect=True)
    st._limiter = ratelimit.Limiter(ratelimit.Policy("unlimited"), st._store)
    with pytest.raises(ratelimit.Error) as e:
        st.incr(parse("1/second").key_for("k"), 1)
    assert e.value.name == "RATE_ESTORE"
    assert not st.check()
    st.close()


def test_store_failures_raise_on_a_key_seen_before():
    # a key decided before (its parse kept), then the store fails
    st = RatelimitStorage("ratelimit+memory://")
    key, mkey = parse("5/second").key_for("k"), parse("5/minute").key_for("k")
    assert st.incr(key, 1) == 1 and st.acquire_entry(mkey, 5, 60)
    st._limiter.close()
    st._store.close()
    st._store = ratelimit.redis_store("redis://127.0.0.1:1", lazy_connect=True)
    st._limiter = ratelimit.Limiter(ratelimit.Policy("unlimited"), st._store)
    st._use(st._limiter)
    for call in (lambda: st.incr(key, 1), lambda: st.get(key),
                 lambda: st.get_expiry(key),
                 lambda: st.acquire_entry(mkey, 5, 60)):
        with pytest.raises(ratelimit.Error) as e:
            call()
        assert e.value.name == "RATE_ESTORE"
    st.close()


FLASK_APP = textwrap.dedent("""
    import sys
    from flask import Flask
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    app = Flask(__name__)
    limiter = Limiter(get_remote_address, app=app, storage_uri=sys.argv[1],
                      strategy=sys.argv[2], headers_enabled=True)

    @app.route("/")
    @limiter.limit("3/minute")
    def index():
        return "ok"

    @app.route("/free")
    @limiter.exempt
    def free():
        return "free"

    assert "ratelimit" in sys.modules  # the .pth registered the storage
    client = app.test_client()
    for _ in range(5):
        r = client.get("/")
        print(r.status_code, r.headers.get("X-RateLimit-Remaining"))
    print(client.get("/free").status_code)
""")


@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window",
                                      "ratelimit-token-bucket"])
@pytest.mark.parametrize("kind", ["shm", "redis"])
def test_flask_app_switches_by_its_storage_uri(tmp_path, shm_path, request,
                                               strategy, kind):
    if kind == "shm":
        uri = "ratelimit+shm://" + shm_path
    else:
        uri = ("ratelimit+" + request.getfixturevalue("redis_url") +
               "?prefix=" + conftest.unique_prefix())
    app = tmp_path / "app.py"
    app.write_text(FLASK_APP)
    # The app imports neither ratelimit nor its storage module.
    assert "ratelimit" not in FLASK_APP.replace('"ratelimit" in', "")
    out = subprocess.run([sys.executable, str(app), uri, strategy],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:6] == [
        "200 2", "200 1", "200 0", "429 0", "429 0", "200"]


@pytest.mark.parametrize("kind, size", [("memory", 600), ("shm", 300)])
def test_a_key_too_long_for_the_store_is_limited_all_the_same(shm_path, kind,
                                                              size):
    # a client-supplied key (an API key header) longer than the store keeps
    # (RATE_KEY_MAX; the URI's key_max of 256 on shm) is limited under its
    # digest, not refused
    uri = "ratelimit+memory://" if kind == "memory" else \
        "ratelimit+shm://" + shm_path
    st = storage_from_string(uri)
    item = parse("3/minute")
    for strategy in ("fixed-window", "moving-window"):
        limiter = STRATEGIES[strategy](st)
        long_a, long_b = "a" * size + strategy, "a" * size + strategy + "b"
        assert [limiter.hit(item, long_a) for _ in range(4)] == \
            [True, True, True, False]
        assert not limiter.test(item, long_a)
        assert limiter.get_window_stats(item, long_a)[1] == 0
        assert limiter.hit(item, long_b)  # another key, another digest
        limiter.clear(item, long_a)
        assert limiter.hit(item, long_a)
    st.reset()
    st.close()


def test_a_redis_storage_starts_while_redis_is_down():
    # the store connects on first use, so an app starts and its first
    # request's error lets Flask-Limiter's in-memory fallback apply
    st = storage_from_string("ratelimit+redis://127.0.0.1:1")
    with pytest.raises(ratelimit.Error) as e:
        st.incr(parse("1/second").key_for("k"), 1)
    assert e.value.name == "RATE_ESTORE"
    assert not st.check()
    st.close()


def test_a_policy_the_store_cannot_keep_raises_the_store_s_reason(shm_path):
    # a moving window of 100 on a region of the default state_max (96 bytes)
    st = storage_from_string("ratelimit+shm://" + shm_path + "?state_max=96")
    with pytest.raises(ratelimit.Error, match="states take up to") as e:
        STRATEGIES["moving-window"](st).hit(parse("100/minute"), "k")
    assert e.value.name == "RATE_EPOLICY"
    st.close()


def test_dynamodb_reset_without_a_prefix_says_so(dynalite, monkeypatch):
    # Without a prefix the drop would be the whole table's: refused, and
    # the message names the URI's prefix= (it said "invalid argument").
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    st = storage_from_string("ratelimit+" + dynalite.url() + "&create_table=1")
    try:
        with pytest.raises(ValueError, match="prefix="):
            st.reset()
    finally:
        st.close()
