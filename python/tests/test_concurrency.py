# SPDX-License-Identifier: MIT
"""Threads on one limiter, the GIL released in every store call, and a
pre-fork server's worker processes sharing one shared-memory limit."""

import os
import socket
import threading
import time

import pytest

import conftest
import ratelimit
from ratelimit import Limiter, Policy

T0 = 10**12


@pytest.mark.parametrize("store_kind", ["memory", "shm", "redis",
                                        "redis-cluster"])
def test_threads_share_one_limit_exactly(make_store, store_kind):
    threads, per_thread, limit = 8, 250, 777
    allowed = [0] * threads
    with Limiter(Policy("fixed-window %d/1h" % limit),
                 make_store(store_kind)) as lim:
        start = threading.Barrier(threads)

        def worker(i):
            start.wait()
            for _ in range(per_thread):
                if lim.check("shared", now=T0).allowed:
                    allowed[i] += 1

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sum(allowed) == limit
        assert lim.stats()["denied"] == threads * per_thread - limit


def test_close_waits_for_calls_in_flight_and_later_calls_raise():
    lim = Limiter(Policy("token-bucket 1000/s burst=1000"))
    stop = threading.Event()
    errors, counts = [], [0]

    def worker():
        while not stop.is_set():
            try:
                lim.check("k")
                counts[0] += 1
            except ValueError:
                return
            except Exception as e:  # anything else is a defect
                errors.append(e)
                return

    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    while counts[0] < 1000:
        time.sleep(0.001)
    lim.close()
    stop.set()
    for t in ts:
        t.join()
    assert errors == []


class Proxy:
    """A TCP proxy whose every byte is moved by Python threads: a store
    behind it gets answers only while the calling thread lets go of the
    GIL."""

    def __init__(self, port):
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b, up in ((client, upstream, True),
                             (upstream, client, False)):
                threading.Thread(target=self.pump, args=(a, b, up),
                                 daemon=True).start()

    def passing(self, up):
        """Called before each piece is passed on (up: to the server)."""

    def pump(self, a, b, up):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                self.passing(up)
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


def test_gil_released_in_store_calls(redis_url):
    # Held through a call, the GIL would stop the proxy's threads: the
    # call would time out (10 s) instead of being answered.
    port = int(redis_url.rsplit(":", 1)[1])
    proxy = Proxy(port)
    try:
        store = ratelimit.redis_store("redis://127.0.0.1:%d" % proxy.port,
                                      prefix=conftest.unique_prefix(),
                                      connect_timeout=10.0,
                                      command_timeout=10.0)
        with Limiter(Policy("token-bucket 20/s burst=1"), store) as lim:
            d = lim.check("k")
            assert d.allowed and d.reason == "allowed"
            d = lim.acquire("k", timeout=5.0)  # waits ~50 ms, then asks
            assert d.allowed and d.reason == "allowed"
            lim.refund("k")
            lim.reset("k")
            assert lim.try_acquire("k")
        store.drop()
        store.close()
    finally:
        proxy.close()


class GatedProxy(Proxy):
    """A proxy that holds Redis's replies while `gate` is clear, and says
    by `asked` that a request went through."""

    def __init__(self, port):
        self.gate, self.asked = threading.Event(), threading.Event()
        self.gate.set()
        super().__init__(port)

    def passing(self, up):
        if up:
            self.asked.set()
        else:
            self.gate.wait()


def test_close_refused_while_a_store_call_is_under_way(redis_url):
    # drop() runs without the GIL: a close() from another thread meanwhile
    # is refused (the store would be freed under it), and works after.
    proxy = GatedProxy(int(redis_url.rsplit(":", 1)[1]))
    try:
        store = ratelimit.redis_store("redis://127.0.0.1:%d" % proxy.port,
                                      prefix=conftest.unique_prefix(),
                                      command_timeout=10.0)
        with Limiter(Policy("token-bucket 20/s"), store) as lim:
            assert lim.try_acquire("k")  # connected
        proxy.gate.clear()
        proxy.asked.clear()
        done = []
        t = threading.Thread(target=lambda: done.append(store.drop()))
        t.start()
        assert proxy.asked.wait(10)
        with pytest.raises(RuntimeError, match="in use"):
            store.close()
        assert not store.closed
        proxy.gate.set()
        t.join(10)
        assert done == [None]
        store.close()
        assert store.closed
    finally:
        proxy.gate.set()
        proxy.close()


def test_prefork_workers_share_one_shm_limit(shm_path):
    # The parent makes the store and the limiter, then forks its workers,
    # as a pre-fork server (gunicorn) does; every worker decides on the
    # same region.
    workers, per_worker, limit = 4, 300, 500
    store = ratelimit.shm_store(shm_path, max_keys=1024)
    lim = Limiter(Policy("sliding-window %d/1h" % limit), store)
    def child(w):
        n = 0
        for _ in range(per_worker):
            n += lim.check("site", now=T0).allowed
        os.write(w, str(n).encode())

    pids, reads = conftest.fork_workers(workers, child)
    conftest.wait_workers(pids)
    total = sum(int(os.read(r, 64) or b"0") for r in reads)
    assert total == limit
    # the parent sees the workers' state
    assert lim.check("site", now=T0).remaining == 0
    lim.close()
    store.close()
