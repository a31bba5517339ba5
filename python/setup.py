# SPDX-License-Identifier: MIT
"""The Python binding of libratelimit (docs/python.md).

Built against the library in one of two places:
  RATELIMIT_BUILD=DIR   a CMake build directory of this source tree
                        (its libratelimit.a and ratelimit.pc)
  otherwise             an installed library, found by pkg-config
                        (`make install`; PKG_CONFIG_PATH for another prefix)
The library is linked in statically, so the extension needs no
LD_LIBRARY_PATH; its own dependencies (hiredis, libcurl, ...) are the
system's shared libraries.
"""

import glob
import os
import shlex
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

# ratelimit-limits.pth: registers the ratelimit+ storages of limits and
# Flask-Limiter when limits is imported (_ratelimit_autoload.py), so that a
# storage URI is all an application changes.
PTH = "ratelimit-limits.pth"


class build_py_pth(build_py):
    def run(self):
        super().run()
        with open(os.path.join(self.build_lib, PTH), "w") as f:
            f.write("import _ratelimit_autoload as m; m.install()\n")

HERE = os.path.dirname(os.path.abspath(__file__))


def pkg_config_flags():
    env = dict(os.environ)
    args = ["pkg-config", "--static", "--cflags", "--libs"]
    build = os.environ.get("RATELIMIT_BUILD")
    if build:
        build = os.path.abspath(build)
        env["PKG_CONFIG_PATH"] = build
        args += ["--define-variable=libdir=" + build,
                 "--define-variable=includedir=" +
                 os.path.join(HERE, os.pardir, "include")]
    args.append("ratelimit")
    try:
        out = subprocess.run(args, env=env, check=True, capture_output=True,
                             text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        raise SystemExit("ratelimit: libratelimit not found by pkg-config (run "
                         "`make install`, or set RATELIMIT_BUILD to a CMake build "
                         "directory): " + detail.strip())
    inc, libdirs, libs, other = [], [], [], []
    for flag in shlex.split(out):
        if flag.startswith("-I"):
            inc.append(flag[2:])
        elif flag.startswith("-L"):
            libdirs.append(flag[2:])
        elif flag == "-lratelimit":
            libs.append(":libratelimit.a")
        elif flag.startswith("-l"):
            libs.append(flag[2:])
        else:
            other.append(flag)
    return inc, libdirs, libs, other


inc, libdirs, libs, other = pkg_config_flags()

setup(
    name="ratelimit",
    version="0.4.0",
    description="Exact rate limiting over libratelimit; a storage for limits "
                "and Flask-Limiter",
    license="MIT",
    packages=["ratelimit"],
    py_modules=["_ratelimit_autoload"],
    ext_modules=[Extension(
        "ratelimit._ratelimit", sorted(glob.glob("src/*.c")),
        depends=glob.glob("src/*.h"),
        include_dirs=inc + ["src"], library_dirs=libdirs, libraries=libs,
        extra_compile_args=other + ["-std=c11", "-Wall", "-Wextra",
                                    "-Wconversion", "-Wshadow",
                                    "-Wstrict-prototypes", "-Werror",
                                    "-fvisibility=hidden"])],
    cmdclass={"build_py": build_py_pth},
    zip_safe=False,
)
