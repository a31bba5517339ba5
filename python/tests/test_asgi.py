# SPDX-License-Identifier: MIT
"""The ASGI middleware in a Starlette app served by a real uvicorn server,
hit over HTTP: the RateLimit fields, 429 with Retry-After, and one limit
shared with a Limiter of this process on one shared-memory region."""

import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import conftest
import ratelimit

APP = textwrap.dedent("""
    import sys
    import ratelimit
    from ratelimit.asgi import RateLimitMiddleware
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    import uvicorn

    async def index(request):
        return PlainTextResponse("ok")

    store = ratelimit.shm_store(sys.argv[1], max_keys=1024)
    policy = ratelimit.Policy("fixed-window 3/1h", name="api")
    limiter = ratelimit.Limiter(policy, store)
    app = Starlette(routes=[Route("/", index)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter,
                       key=lambda scope: "site")
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]),
                log_level="warning")
""")


def get(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/" % port,
                                    timeout=30) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def test_uvicorn_starlette_over_http(tmp_path, shm_path):
    app = tmp_path / "app.py"
    app.write_text(APP)
    port = conftest.free_port()
    proc = subprocess.Popen([sys.executable, str(app), shm_path, str(port)])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/none" % port,
                                       timeout=5)
            except urllib.error.HTTPError:
                break  # 404: up (this request was limited too: 1 of 3)
            except OSError:
                assert proc.poll() is None, "the server exited"
                assert time.monotonic() < deadline, "the server never listened"
                time.sleep(0.1)
        status, h = get(port)
        assert status == 200
        assert h["RateLimit-Policy"] == '"api";q=3;w=3600'
        assert h["RateLimit"].startswith('"api";r=1;t=')
        # the third request of the limit is this process's, on the region
        store = ratelimit.shm_store(shm_path, no_create=True)
        with ratelimit.Limiter(ratelimit.Policy("fixed-window 3/1h"),
                               store) as lim:
            assert lim.check("site").remaining == 0
            status, h = get(port)
            assert status == 429
            assert int(h["Retry-After"]) >= 1
            assert h["RateLimit"].startswith('"api";r=0;t=')
            assert not lim.check("site").allowed
        store.close()
    finally:
        proc.terminate()
        proc.wait(30)
