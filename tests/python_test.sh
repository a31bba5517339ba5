#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Python binding (python/, docs/python.md): installs it into a fresh
# virtual environment by the command docs/python.md gives, against this
# build's libratelimit.a, with Debian's python3 (its venv sees Debian's
# pytest, limits and Flask-Limiter), then runs python/tests with pytest.
# Usage: python_test.sh BUILD_DIR RATELIMIT_CLI REDIS_MODULE [DYNALITE]
# (the DynamoDB tests run on DYNALITE, or $DYNALITE; without either they
# are skipped, unless CI=true)
set -eu
B=$(cd "$1" && pwd)
S=$(cd "$(dirname "$0")/.." && pwd)
PY=${RATE_PYTHON:-/usr/bin/python3}
V="$B/python-venv"
rm -rf "$V"
"$PY" -m venv --system-site-packages "$V"
RATELIMIT_BUILD="$B" "$V/bin/pip" install --quiet --no-build-isolation \
  --no-index --no-deps "$S/python"
cd "$S/python/tests"
RATELIMIT_CLI=$2 RATELIMIT_REDIS_MODULE=$3 RATELIMIT_DYNALITE=${DYNALITE:-${4:-}} \
  exec "$V/bin/python" -m pytest -q -p no:cacheprovider .
