# SPDX-License-Identifier: MIT
"""One limit shared by this package and the C command (`ratelimit check`)
on one shared-memory region and on Redis: the same decisions whichever
side asks."""

import subprocess
import uuid

import pytest

import ratelimit

POLICY = "token-bucket 3/1h burst=3"


def cli_check(cli, key, store_url):
    out = subprocess.run([cli, "check", "--key", key, "--policy", POLICY,
                          "--store", store_url], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    fields = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    return out.returncode == 0, int(fields["remaining"])


@pytest.mark.parametrize("kind", ["shm", "redis"])
def test_python_and_the_command_share_one_limit(cli, shm_path, request, kind):
    key = "shared-%s" % uuid.uuid4().hex
    if kind == "shm":
        store = ratelimit.shm_store(shm_path, max_keys=1024)
        url = "shm:" + shm_path
    else:
        url = request.getfixturevalue("redis_url")
        store = ratelimit.redis_store(url)  # the command's prefix, its default
    with ratelimit.Limiter(ratelimit.Policy(POLICY), store) as lim:
        assert lim.check(key).remaining == 2
        assert cli_check(cli, key, url) == (True, 1)
        assert lim.check(key).remaining == 0
        assert cli_check(cli, key, url) == (False, 0)
        d = lim.check(key)
        assert not d.allowed and d.retry_after > 1000
        lim.refund(key, 2)
        assert cli_check(cli, key, url) == (True, 1)
        lim.reset(key)
    store.close()
