# SPDX-License-Identifier: MIT
"""Fair shares: a shared limit divided between a heavy and a light flow."""

import pytest

import ratelimit
from ratelimit import Fair, Limiter, Policy

T0 = 10**12


@pytest.mark.parametrize("store_kind", ["memory", "shm", "redis"])
def test_a_light_flow_keeps_its_share(make_store, store_kind):
    # 10/s shared; the heavy flow asks 500/s, the light one 100/s, over
    # 20 s of virtual time: max-min fairness gives each about half, where
    # first come, first served would give the light one a sixth.
    with Limiter(Policy("token-bucket 10/s burst=10"),
                 make_store(store_kind)) as lim:
        with Fair(lim, "shared") as fair:
            got = {"heavy": 0, "light": 0}
            for i in range(2000):
                t = T0 + i * 10_000_000
                for flow in ["heavy"] * 5 + ["light"]:
                    got[flow] += fair.check(flow, now=t).allowed
            total = got["heavy"] + got["light"]
            assert 200 <= total <= 211  # 10/s for 20 s, plus the burst
            assert got["light"] >= 0.4 * total
            assert got["heavy"] >= 0.4 * total


def test_weights_and_errors():
    with Limiter(Policy("token-bucket 10/s burst=10")) as lim:
        fair = Fair(lim, "shared")
        got = {"a": 0, "b": 0}
        for i in range(2000):
            t = T0 + i * 10_000_000
            for flow in ["a", "b"] * 5:
                got[flow] += fair.check(flow, weight=3 if flow == "a" else 1,
                                        now=t).allowed
        assert got["a"] >= 2 * got["b"]  # weight 3 against 1
        with pytest.raises(ratelimit.Error) as e:
            fair.check("")
        assert e.value.name == "RATE_EKEY"
        with pytest.raises(ratelimit.Error) as e:
            fair.check("a", weight=2**21)
        assert e.value.name == "RATE_EINVAL"
        with pytest.raises(RuntimeError):
            lim.close()  # the fair limit is open on it
        fair.close()
        with pytest.raises(ValueError):
            fair.check("a")
    with pytest.raises(TypeError):
        Fair("limiter", "k")
    with pytest.raises(ratelimit.Error) as e:
        Fair(Limiter(Policy("fixed-window 1/s")), "k", slots=10**6)
    assert e.value.name == "RATE_EINVAL"
