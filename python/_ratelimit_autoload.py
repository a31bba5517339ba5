# SPDX-License-Identifier: MIT
"""Run at interpreter start by ratelimit-limits.pth (a module apart from the
ratelimit package, which it does not import): once `limits.strategies`
is imported (Flask-Limiter and limits's own users import it before they
read a storage URI), import ratelimit.limits_storage, which registers the
ratelimit+ storage schemes and strategies.  Nothing is imported before."""

import importlib.abc
import importlib.machinery
import sys

_TARGET = "limits.strategies"


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                import ratelimit.limits_storage  # noqa: F401 (registers)
            except ImportError:
                pass

        spec.loader.exec_module = exec_module
        return spec


def install():
    if _TARGET in sys.modules:
        import ratelimit.limits_storage  # noqa: F401
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
