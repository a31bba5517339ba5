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


def free_cluster_port():
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class RedisCluster:
    """Three masters (no replicas) made by redis-cli --cluster create."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rl-py-cluster-")
        self.ports, self.procs = [], []
        for i in range(3):
            port = free_cluster_port()
            node_dir = os.path.join(self.dir, str(i))
            os.mkdir(node_dir)
            self.procs.append(subprocess.Popen(
                [shutil.which("redis-server") or "redis-server",
                 "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", node_dir,
                 "--cluster-enabled", "yes", "--cluster-node-timeout", "1000"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self.ports.append(port)
        for port in self.ports:
            self.wait(lambda: self.cli(port, "ping") == "PONG")
        subprocess.run(
            ["redis-cli", "--cluster", "create"] +
            ["127.0.0.1:%d" % p for p in self.ports] +
            ["--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60)
        for port in self.ports:
            self.wait(lambda: "cluster_state:ok" in self.cli(port, "cluster",
                                                             "info"))
        self.url = "redis://127.0.0.1:%d" % self.ports[0]

    @staticmethod
    def cli(port, *args):
        out = subprocess.run(["redis-cli", "-p", str(port)] + list(args),
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    @staticmethod
    def wait(ok):
        deadline = time.monotonic() + 60
        while not ok():
            assert time.monotonic() < deadline, "the cluster never came up"
            time.sleep(0.1)

    def keys_on(self, port):
        return int(self.cli(port, "dbsize") or 0)

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster():
    cluster = RedisCluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_module_url():
    module = os.environ.get("RATELIMIT_REDIS_MODULE")
    assert module and os.path.exists(module), \
        "RATELIMIT_REDIS_MODULE must name ratelimit.so"
    server = RedisServer(module)
    yield server.url
    server.stop()


class Dynalite:
    """A private dynalite (DynamoDB's API in Node, in memory) on a free
    loopback port, its tables ACTIVE at once, as the C DynamoDB suites
    start it (tests/lib/dynalite_server.h)."""

    def __init__(self, program):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [program, "--host", "127.0.0.1", "--port", str(self.port),
             "--createTableMs", "0", "--deleteTableMs", "0",
             "--updateTableMs", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60  # node starting on a loaded machine
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                break
            except OSError:
                assert self.proc.poll() is None, "dynalite exited"
                assert time.monotonic() < deadline, "dynalite never listened"
                time.sleep(0.05)

    def url(self, table="rl_py"):
        return ("dynamodb://%s?region=us-east-1&endpoint=http://127.0.0.1:%d"
                % (table, self.port))

    def store(self, **options):
        """A DynamoDB store in a namespace of its own (dynalite checks no
        credentials; these are what the store signs with)."""
        options.setdefault("prefix", unique_prefix())
        return ratelimit.dynamodb_store(
            self.url(), create_table=True, access_key_id="AKIDTEST",
            secret_access_key="test-secret", **options)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="session")
def dynalite():
    """The DynamoDB tests' server: $DYNALITE, else the one `make deps`
    installs (python_test.sh passes its path).  Without it they are
    skipped, as the C DynamoDB suites are, and fail under CI=true."""
    program = (os.environ.get("DYNALITE") or
               os.environ.get("RATELIMIT_DYNALITE") or "")
    missing = None
    if not hasattr(ratelimit, "dynamodb_store"):
        missing = "the library was built without the DynamoDB store"
    elif not (program and os.access(program, os.X_OK)
              and shutil.which("node")):
        missing = ("no dynalite (npm package) here: `make deps` installs it "
                   "(scripts/dynalite.sh), or set DYNALITE to its program")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail("DynamoDB tests cannot run (CI=true): " + missing)
        pytest.skip(missing)
    server = Dynalite(program)
    yield server
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
    (the scripts), redis-module (ratelimit.so), redis-cluster (three
    masters), dynamodb (dynalite), closed after the test."""
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
        elif kind == "redis-cluster":
            url = request.getfixturevalue("redis_cluster").url
            st = ratelimit.redis_store(url, prefix=unique_prefix(), no_ttl=True)
        elif kind == "redis-module":
            url = request.getfixturevalue("redis_module_url")
            st = ratelimit.redis_store(url, prefix=unique_prefix(), no_ttl=True,
                                       module="on")
        elif kind == "dynamodb":
            st = request.getfixturevalue("dynalite").store(no_ttl=True)
        else:
            raise ValueError(kind)
        made.append(st)
        return st

    yield make
    for st in made:
        if st.kind in ("redis", "shm", "dynamodb"):  # a cluster's: "redis"
            st.drop()
        st.close()
