# SPDX-License-Identifier: MIT
"""The rules file: policies picked by a request's attributes, the outcome
and its header fields."""

import pytest

import ratelimit
from ratelimit import Limiter, Policy, Rules

T0 = 10**12
RULES = """\
[policies]
free = fixed-window 2/1m
pro = fixed-window 5/1m
search = fixed-window 3/1m

[rule pro]
group = tier
match = tier=pro
policy = pro

[rule free]
group = tier
policy = free

[rule search]
group = route
match = route=/search*
policy = search
key = route
"""


def test_rules_pick_policies_by_attributes(tmp_path):
    path = tmp_path / "rules.conf"
    path.write_text(RULES)
    rules = Rules(str(path))
    with Limiter(Policy("fixed-window 100/1m")) as lim:
        out = rules.check(lim, "alice", {"tier": "free"}, now=T0)
        assert out.allowed and out.status == 0
        assert [a[0] for a in out.applied] == ["free"]
        assert out.headers["RateLimit-Policy"] == '"free";q=2;w=60'
        rules.check(lim, "alice", {"tier": "free"}, now=T0)
        out = rules.check(lim, "alice", {"tier": "free"}, now=T0)
        assert not out.allowed and out.status == 429 and out.denied_by == 0
        assert "Retry-After" in out.headers
        # a pro key has its own policy; the route is the search rule's key
        for user in ("bob", "carol", "dave"):
            out = rules.check(lim, user, {"tier": "pro", "route": "/search?q"},
                              now=T0)
            assert out.allowed
            assert [a[0] for a in out.applied] == ["pro", "search"]
        out = rules.check(lim, "erin", {"tier": "pro", "route": "/search?q"},
                          now=T0)
        assert not out.allowed and out.denied_by == 1
        name, decision, refunded = out.applied[0]
        assert name == "pro" and decision.allowed and refunded  # given back
        with pytest.raises(TypeError):
            rules.check(lim, "k", ["tier"])
        with pytest.raises(ValueError):
            rules.check(lim, "k", {"tier": "a\0b"})
    with pytest.raises(ValueError):
        rules.check(lim, "k", {"tier": "free"})  # the limiter is closed
    rules.close()
    with pytest.raises(ValueError):
        rules.check(Limiter(Policy("fixed-window 1/s")), "k")


def test_bad_rules_files_name_file_and_line(tmp_path):
    path = tmp_path / "bad.conf"
    path.write_text(RULES.replace("policy = search", "policy = gold"))
    with pytest.raises(ratelimit.Error) as e:
        Rules(str(path))
    assert e.value.name == "RATE_EPOLICY"
    assert "bad.conf:" in str(e.value) and "gold" in str(e.value)
    with pytest.raises(ratelimit.Error) as e:
        Rules(str(tmp_path / "missing.conf"))
    assert e.value.name == "RATE_EINVAL"
    with pytest.raises(ValueError):
        Rules("a\0b")


def test_reload_takes_a_changed_file_and_keeps_on_a_bad_one(tmp_path):
    path = tmp_path / "rules.conf"
    path.write_text(RULES)
    rules = Rules(path)                               # a path-like too
    assert rules.generation == 1
    with Limiter(Policy("fixed-window 100/1m")) as lim:
        def passes(user):
            n = 0
            while rules.check(lim, user, {"tier": "free"}, now=T0).allowed:
                n += 1
            return n
        assert passes("u1") == 2
        # the file changed on disk: the next decision has the new policy
        path.write_text(RULES.replace("free = fixed-window 2/1m",
                                      "free = fixed-window 4/1m"))
        assert rules.reload() == 2 and rules.generation == 2
        out = rules.check(lim, "u2", {"tier": "free"}, now=T0)
        assert out.headers["RateLimit-Policy"] == '"free";q=4;w=60'
        assert passes("u3") == 4
        # a damaged file: the library's error, the rules in use stay
        path.write_text(RULES.replace("policy = search", "policy = gold"))
        with pytest.raises(ratelimit.Error) as e:
            rules.reload()
        assert e.value.name == "RATE_EPOLICY"
        assert "rules.conf:" in str(e.value) and "gold" in str(e.value)
        assert rules.generation == 2
        assert passes("u4") == 4
        path.write_text(RULES[:len(RULES) // 2])        # torn midway
        with pytest.raises(ratelimit.Error):
            rules.reload()
        path.unlink()                                   # gone
        with pytest.raises(ratelimit.Error) as e:
            rules.reload()
        assert e.value.name == "RATE_EINVAL"
        assert passes("u5") == 4 and rules.generation == 2
        # another file, which later reloads then read
        other = tmp_path / "other.conf"
        other.write_text(RULES.replace("free = fixed-window 2/1m",
                                       "free = fixed-window 1/1m"))
        assert rules.reload(str(other)) == 3
        assert passes("u6") == 1
        other.write_text(RULES)
        assert rules.reload() == 4 and passes("u7") == 2
        with pytest.raises(ValueError):
            rules.reload("a\0b")
        with pytest.raises(TypeError):
            rules.reload(42)
    rules.close()
    with pytest.raises(ValueError, match="closed"):
        rules.reload()
    with pytest.raises(ValueError, match="closed"):
        rules.generation


def test_check_on_an_in_flight_rule_says_what_to_call(tmp_path):
    # check() cannot hold a lease: a request that matches an in-flight rule
    # raises, naming the call that can (the message was "invalid policy").
    path = tmp_path / "slow.conf"
    path.write_text("[policies]\nslow = concurrency 2 ttl=30s\n"
                    "[rule slow]\nmatch = route=/slow*\npolicy = slow\n"
                    "key = shared\n")
    rules = Rules(str(path))
    with Limiter(Policy("fixed-window 100/1m")) as lim:
        with pytest.raises(ratelimit.Error, match="Rules.acquire") as e:
            rules.check(lim, "k", {"route": "/slow/1"})
        assert e.value.name == "RATE_EPOLICY"
        assert rules.check(lim, "k", {"route": "/fast"}).allowed
    rules.close()
