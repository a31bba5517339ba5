# SPDX-License-Identifier: MIT
"""Fixtures: the C command (RATELIMIT_CLI), a Redis server of the suite's
own on a free loopback port (with ratelimit.so loaded when
RATELIMIT_REDIS_MODULE names it), a shared-memory file."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

import pytest

import ratelimit


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("RATELIMIT_CLI")
    assert path and os.access(path, os.X_OK), \
        "RATELIMIT_CLI must name the ratelimit command"
    return path


class RedisServer:
    def __init__(self, module=None):
        self.dir = tempfile.mkdtemp(prefix="rl-py-redis-")
        self.port = free_port()
        args = [shutil.which("redis-server") or "redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.dir]
        if module:
            args += ["--loadmodule", module]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                break
            except OSError:
                assert self.proc.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server never listened"
                time.sleep(0.05)
        self.url = "redis://127.0.0.1:%d" % self.port

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url():
    server = RedisServer()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def redis_module_url():
    module = os.environ.get("RATELIMIT_REDIS_MODULE")
    assert module and os.path.exists(module), \
        "RATELIMIT_REDIS_MODULE must name ratelimit.so"
    server = RedisServer(module)
    yield server.url
    server.stop()


@pytest.fixture
def shm_path():
    path = "/dev/shm/rl-py-%s.rl" % uuid.uuid4().hex
    yield path
    if os.path.exists(path):
        os.unlink(path)


def fork_workers(count, child):
    """Forks `count` workers, as a pre-fork server does; each runs
    child(w), w its pipe to the parent, and exits 0 unless it raised.
    Returns their pids and the pipes' read ends."""
    pids, reads = [], []
    for _ in range(count):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 1
            try:
                child(w)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        pids.append(pid)
        reads.append(r)
    return pids, reads


def wait_workers(pids):
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def unique_prefix():
    return "py%s:" % uuid.uuid4().hex[:12]


@pytest.fixture
def make_store(request, shm_path):
    """make_store(kind): a fresh store of that kind: memory, shm, redis
    (the scripts), redis-module (ratelimit.so), closed after the test."""
    made = []

    def make(kind):
        if kind == "memory":
            st = ratelimit.memory_store()
        elif kind == "shm":
            st = ratelimit.shm_store(shm_path, max_keys=4096, state_max=4096)
        elif kind == "redis":
            url = request.getfixturevalue("redis_url")
            st = ratelimit.redis_store(url, prefix=unique_prefix(), no_ttl=True,
                                       module="off")
        elif kind == "redis-module":
            url = request.getfixturevalue("redis_module_url")
            st = ratelimit.redis_store(url, prefix=unique_prefix(), no_ttl=True,
                                       module="on")
        else:
            raise ValueError(kind)
        made.append(st)
        return st

    yield make
    for st in made:
        if st.kind in ("redis", "shm"):
            st.drop()
        st.close()
