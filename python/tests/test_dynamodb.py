# SPDX-License-Identifier: MIT
"""The DynamoDB store (dynamodb_store, docs/dynamodb.md) on a private
dynalite: its options, its figures, drop(), threads sharing one exact
limit, the GIL released in its calls, and bad input with the library's
messages.  (Its decisions against `ratelimit replay`: test_replay.py.)"""

import threading

import pytest

import conftest
import ratelimit
from test_concurrency import Proxy

T0 = 10**12


def test_decisions_counters_and_drop(dynalite):
    store = dynalite.store(no_ttl=True)
    assert store.kind == "dynamodb"
    assert ratelimit.dynamodb_last_error(store) == ""
    with ratelimit.Limiter(ratelimit.Policy("fixed-window 3/1h"), store) as lim:
        assert [lim.check("k", now=T0).allowed for _ in range(4)] == \
            [True, True, True, False]
        lim.refund("k", now=T0)
        assert lim.check("k", now=T0).allowed
    c = ratelimit.dynamodb_counters(store)
    assert c["reads"] >= 6 and c["writes"] >= 4
    assert c["requests"] == c["reads"] + c["writes"] + c["deletes"]
    assert c["errors"] == c["throttled"] == 0
    # another store on the same prefix sees the same limit
    other = dynalite.store(prefix=None, no_ttl=True)   # no prefix: the table
    with pytest.raises(ratelimit.Error) as e:
        other.drop()              # the whole table is not drop()'s to delete
    assert e.value.name == "RATE_EINVAL"
    other.close()
    store.drop()
    with ratelimit.Limiter(ratelimit.Policy("fixed-window 3/1h"), store) as lim:
        assert lim.check("k", 3, now=T0).allowed     # dropped: a fresh key
    store.drop()
    store.close()


def test_wall_clock_and_ttl(dynalite):
    # the defaults: decisions on the wall clock, items with an expiry
    store = dynalite.store(connect_timeout=2, request_timeout=5.0)
    with ratelimit.Limiter(ratelimit.Policy("token-bucket 1/h burst=2"),
                           store) as lim:
        assert lim.check("k").allowed and lim.check("k").allowed
        d = lim.check("k")
        assert not d.allowed and 0 < d.retry_after <= 3600
    store.drop()
    store.close()


def test_policy_too_long_for_an_item_is_refused_with_the_reason(dynalite):
    store = dynalite.store()
    big = ratelimit.Policy("sliding-log 10000/1h; sliding-log 9999/10m; "
                           "sliding-log 9998/1m")
    with pytest.raises(ratelimit.Error) as e:
        ratelimit.Limiter(big, store)
    assert e.value.name == "RATE_EPOLICY" and "bytes" in str(e.value)
    with pytest.raises(ratelimit.Error):
        store.check_policy(big)
    store.close()


def test_threads_share_one_limit_exactly(dynalite):
    threads, per_thread, limit = 4, 25, 40
    allowed, errors = [0] * threads, [0] * threads
    store = dynalite.store(no_ttl=True)
    with ratelimit.Limiter(ratelimit.Policy("fixed-window %d/1h" % limit),
                           store) as lim:
        start = threading.Barrier(threads)

        def worker(i):
            start.wait()
            for _ in range(per_thread):
                d = lim.check("shared", now=T0)
                allowed[i] += d.allowed
                errors[i] += d.reason == "store-error"

        ts = [threading.Thread(target=worker, args=(i,))
              for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    # conflicting writes are retried by the limiter: none is lost
    assert sum(errors) == 0
    assert sum(allowed) == limit
    assert ratelimit.dynamodb_counters(store)["conflicts"] >= 0
    store.drop()
    store.close()


def proxied_store(dynalite, proxy):
    """A store reaching dynalite through the proxy."""
    url = ("dynamodb://rl_py?region=us-east-1&endpoint=http://127.0.0.1:%d"
           % proxy.port)
    return ratelimit.dynamodb_store(
        url, prefix=conftest.unique_prefix(), create_table=True,
        access_key_id="AKIDTEST", secret_access_key="test-secret",
        connect_timeout=5, request_timeout=10)


def test_gil_released_in_store_calls(dynalite):
    # Held through a call, the GIL would stop the proxy's threads: the
    # store's creation and decisions would time out instead.
    proxy = Proxy(dynalite.port)
    try:
        store = proxied_store(dynalite, proxy)
        with ratelimit.Limiter(ratelimit.Policy("token-bucket 20/s burst=1"),
                               store) as lim:
            assert lim.check("k").allowed
            assert lim.acquire("k", timeout=5.0).allowed
            lim.reset("k")
            assert lim.try_acquire("k")
        store.drop()
        store.close()
    finally:
        proxy.close()


def test_synced_over_dynamodb_releases_the_gil(dynalite):
    proxy = Proxy(dynalite.port)
    try:
        store = proxied_store(dynalite, proxy)
        policy = ratelimit.Policy("fixed-window 10/h")
        with ratelimit.SyncedLimiter(policy, store, lease=4) as s:
            assert s.check("k").allowed                # a borrow
            s.flush(all=True)                          # a give-back
            assert s.stats()["returned"] == 3
        store.drop()
        store.close()
    finally:
        proxy.close()


def test_bad_input(dynalite, monkeypatch):
    url, opts = dynalite.url(), {"access_key_id": "AKIDTEST",
                                 "secret_access_key": "test-secret"}
    # the library's refusals, with its message
    for bad, says in [
            ("dynamodb://t?region=us-east-1", "table name"),
            ("dynamodb://table", "region"),
            ("dynamodb://table?region=us-east-1&colour=blue", "colour"),
            ("dynamodb://table?region=us-east-1&endpoint=ftp://x", "endpoint"),
            ("redis://127.0.0.1:6379", "dynamodb://")]:
        with pytest.raises(ratelimit.Error) as e:
            ratelimit.dynamodb_store(bad, **opts)
        assert e.value.name == "RATE_EINVAL" and says in str(e.value), \
            (bad, str(e.value))
    # a missing table, without create_table: the service's message
    with pytest.raises(ratelimit.Error) as e:
        ratelimit.dynamodb_store(dynalite.url("rl_py_absent"), **opts)
    assert e.value.name == "RATE_ESTORE"
    assert "ResourceNotFoundException" in str(e.value)
    # nothing listening
    with pytest.raises(ratelimit.Error) as e:
        ratelimit.dynamodb_store(
            "dynamodb://table?region=us-east-1&endpoint=http://127.0.0.1:1",
            connect_timeout=1, **opts)
    assert e.value.name in ("RATE_ESTORE", "RATE_ETIMEDOUT") and str(e.value)
    # no credentials anywhere
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/creds")
    with pytest.raises(ratelimit.Error) as e:
        ratelimit.dynamodb_store(url)
    assert e.value.name == "RATE_EINVAL" and "credentials" in str(e.value)
    with pytest.raises(ratelimit.Error) as e:       # one of the two alone
        ratelimit.dynamodb_store(url, access_key_id="AKIDTEST")
    assert e.value.name == "RATE_EINVAL"
    # the binding's checks
    with pytest.raises(TypeError):
        ratelimit.dynamodb_store(42, **opts)
    with pytest.raises(ValueError, match="NUL"):
        ratelimit.dynamodb_store(url + "\0", **opts)
    with pytest.raises(ValueError, match="NUL"):
        ratelimit.dynamodb_store(url, prefix="a\0b", **opts)
    with pytest.raises(ValueError, match="request_timeout"):
        ratelimit.dynamodb_store(url, request_timeout=-1.0, **opts)
    with pytest.raises(OverflowError, match="safety_ttl"):
        ratelimit.dynamodb_store(url, safety_ttl=2**63, **opts)
    with pytest.raises(ratelimit.Error) as e:        # above 1024 bytes
        ratelimit.dynamodb_store(url, prefix="p" * 1025, **opts)
    assert e.value.name == "RATE_EINVAL"
    with pytest.raises(TypeError):
        ratelimit.dynamodb_store(url, "prefix", **opts)   # keywords only
    mem = ratelimit.memory_store()
    with pytest.raises(TypeError, match="DynamoDB"):
        ratelimit.dynamodb_counters(mem)
    with pytest.raises(TypeError, match="DynamoDB"):
        ratelimit.dynamodb_last_error(None)
    mem.close()
    with pytest.raises(ValueError, match="closed"):
        ratelimit.dynamodb_counters(mem)
