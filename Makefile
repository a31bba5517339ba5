# SPDX-License-Identifier: MIT
# Thin wrapper over CMake.  `make demo` and `make test` install what is
# missing (scripts/deps.sh, with progress) before building; `make demo`
# builds only what it runs (the library and the command); `make` and
# `make install`
# install no package: they name what is missing and how to install it.
# `make`, `make demo` and `make install` build the library and the command
# without the test suites (-DRATE_BUILD_TESTS=OFF), so they need no cmocka;
# `make test` builds the suites into the same build directory.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
# Where `make install` puts things (CMAKE_INSTALL_PREFIX); see docs/install.md.
PREFIX ?= /usr/local

.PHONY: all deps build build-only demo test test-plain test-minimal abi-check test-asan test-tsan \
        valgrind fuzz bench install uninstall fresh-check spdx-check clean

all: build

deps:
	@scripts/deps.sh test
	@scripts/dynalite.sh >/dev/null

# CORE=1: the core alone (every optional part off; docs/install.md), which
# needs only the core's packages; with `make install` too.
ifeq ($(CORE),1)
PARTS_FLAGS = $(DEMO_FLAGS)
PARTS_DEPS = core
else
PARTS_FLAGS = $(ALL_PARTS)
PARTS_DEPS = build
endif

build:
	@scripts/deps.sh check $(PARTS_DEPS)
	@$(MAKE) --no-print-directory build-only

# (The parts `make demo` turns off are turned back on here: one build tree.)
build-only:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATE_BUILD_TOOLS=ON \
	  -DRATE_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX="$(PREFIX)" $(PARTS_FLAGS) \
	  $(CMAKE_FLAGS)
	cmake --build build -j $(JOBS)

# The main job on the in-memory default: sample traffic aimed at
# fixed-window edges through all five algorithms, a table and a chart.
# Only the core and the command are built (the optional parts off), so
# only the core's packages are needed.
DEMO_FLAGS = -DRATE_WITH_REDIS=OFF -DRATE_WITH_DYNAMODB=OFF -DRATE_WITH_HTTP=OFF \
  -DRATE_BUILD_REDIS_MODULE=OFF -DRATE_BUILD_EXAMPLES=OFF -DRATE_BUILD_NGINX=OFF
demo:
	@echo "demo: set-up (missing packages: a few minutes on a fresh machine;"
	@echo "demo: nothing when they are there), then the library and the command"
	@scripts/deps.sh core
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATE_BUILD_TOOLS=ON \
	  -DRATE_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX="$(PREFIX)" $(DEMO_FLAGS) \
	  $(CMAKE_FLAGS)
	cmake --build build -j $(JOBS) --target ratelimit_cli
	@sh scripts/gen-traces.sh build/traces
	./build/tools/ratelimit/ratelimit compare --rate 10/s --burst 10 \
	  --svg build/demo.svg build/traces/edges.trace
	@echo "chart: build/demo.svg"

# Every test: each suite once under AddressSanitizer +
# UndefinedBehaviorSanitizer (the plain build runs the few a sanitized
# build cannot: nginx's, installing), ThreadSanitizer on the concurrency
# suites, valgrind on the plain build.  The fuzz targets' seed corpus is
# replayed by suites of the ASan build (fuzz_NAME); `make fuzz` searches.
test: deps test-plain abi-check test-minimal test-asan test-tsan valgrind

# The ABI of build/'s library against abi/libratelimit.abi (abidiff).
abi-check: test-plain
	@scripts/abi-check.sh build

# Every part on, whatever an earlier `make demo` left in build/'s cache.
ALL_PARTS = -DRATE_WITH_REDIS=ON -DRATE_WITH_DYNAMODB=ON -DRATE_WITH_HTTP=ON \
  -DRATE_BUILD_REDIS_MODULE=ON -DRATE_BUILD_EXAMPLES=ON -DRATE_BUILD_NGINX=ON

# ctest in two phases: the suites without a time bound JOBS at a time, then
# those with one (label serial: SERIAL in tests/suites.cmake) SERIAL_JOBS
# at a time and beside nothing else; they mostly wait (on timeouts, on
# their servers), each using about a quarter of a core.  $(1): more options.
SERIAL_JOBS ?= 3
CTEST_PHASES = ctest --output-on-failure -j $(JOBS) -LE serial $(1) && \
  ctest --output-on-failure -j $(SERIAL_JOBS) -L serial $(1)

# The plain build runs the suites labelled plain: those a sanitized build
# leaves out (tests/CMakeLists.txt).  It builds the library, the command,
# the modules and the examples, and of the suites' programs only those
# labelled valgrind (the ASan build compiles and runs every one).
# PLAIN=all: every suite, every program.  (One target per `cmake --build`:
# CMake's makefiles build the targets of one call one after another.)
PLAIN ?= plain
PLAIN_LABEL = $(if $(filter all,$(PLAIN)),,-L $(PLAIN))
PLAIN_PROGRAMS = $(if $(filter all,$(PLAIN)),suites,suites-valgrind)
test-plain:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATE_BUILD_TOOLS=ON \
	  -DRATE_BUILD_TESTS=ON -DRATE_SUITES_IN_ALL=OFF -DCMAKE_INSTALL_PREFIX="$(PREFIX)" \
	  $(ALL_PARTS) $(CMAKE_FLAGS)
	cmake --build build -j $(JOBS)
	cmake --build build -j $(JOBS) --target $(PLAIN_PROGRAMS)
	cd build && $(call CTEST_PHASES,$(PLAIN_LABEL))

# The core alone (every optional part off): its own build of the library,
# the command and the programs of the suites whose checks depend on the
# parts (label parts: tests/CMakeLists.txt), and those suites run.  The
# others run the same core sources as the sanitized builds'.
test-minimal:
	cmake -S . -B build-min -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATE_BUILD_TOOLS=ON \
	  -DRATE_BUILD_TESTS=ON $(DEMO_FLAGS) $(CMAKE_FLAGS)
	cmake --build build-min -j $(JOBS) --target ratelimit ratelimit_static \
	  ratelimit_cli shm_keys suites-parts
	cd build-min && $(call CTEST_PHASES,-L parts)

test-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DRATE_ASAN=ON $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  && $(call CTEST_PHASES)

# Only the programs of the suites it runs (tests/suites.cmake's label).
test-tsan:
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DRATE_TSAN=ON -DRATE_BUILD_TOOLS=OFF $(CMAKE_FLAGS)
	cmake --build build-tsan -j $(JOBS) --target suites-concurrency
	cd build-tsan && setarch "$$(uname -m)" -R env TSAN_OPTIONS=halt_on_error=1 \
	  $(SHELL) -c '$(call CTEST_PHASES,-L concurrency)'

# memcheck for what ASan cannot see (reads of uninitialised memory), on
# suites that run every source file of the library at least once, the
# cheapest that do (docs/contributing.md, "What runs where"): those
# labelled valgrind in tests/suites.cmake, which the plain build builds
# and lists in build/tests/valgrind.list ("PROGRAM [ENV...]" a line), JOBS
# at a time (each valgrind runs on one core).  (A suite exits 77 when it
# is skipped: no dynalite, not under CI=true.)
valgrind: test-plain
	@xargs -P $(JOBS) -I{} sh -c '\
	  set -- $$1; t=$$1; shift; \
	  echo "valgrind: $$t $$*"; \
	  env "$$@" valgrind -q --error-exitcode=1 --leak-check=full \
	    --errors-for-leak-kinds=definite build/tests/$$t >/dev/null; \
	  rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 77 ] || { echo "valgrind: $$t failed"; exit 255; }' \
	  sh {} < build/tests/valgrind.list && echo "valgrind: clean"

# libFuzzer (clang): each target for FUZZ_SECONDS from the seed corpus in
# tests/fuzz/corpus (copied, so new inputs stay in the build tree), JOBS
# targets at a time (each fuzzer runs on one core).
FUZZ_SECONDS ?= 30
FUZZ_TARGETS = policy trace clf shm module fair
fuzz:
	@scripts/deps.sh fuzz
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATE_FUZZ=ON \
	  -DRATE_BUILD_TESTS=OFF -DRATE_BUILD_TOOLS=ON $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@printf '%s\n' $(FUZZ_TARGETS) | xargs -P $(JOBS) -I{} sh -c '\
	  mkdir -p build-fuzz/corpus-{} && cp tests/fuzz/corpus/{}/* build-fuzz/corpus-{}/; \
	  echo "fuzz: fuzz_{} for $(FUZZ_SECONDS) s"; \
	  build-fuzz/tests/fuzz/fuzz_{} -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	    -rss_limit_mb=2048 build-fuzz/corpus-{} >build-fuzz/fuzz-{}.log 2>&1 \
	    || { tail -n 40 build-fuzz/fuzz-{}.log; exit 255; }; \
	  grep -E "^Done [0-9]+ runs" build-fuzz/fuzz-{}.log || true' \
	  && echo "fuzz: no crash, leak or hang"

bench: build
	./build/tools/ratelimit/ratelimit bench

# Installs into PREFIX (default /usr/local), runs ldconfig when the library
# directory is one ld.so searches, and records every file and directory it
# wrote in build/ratelimit-installed.txt for `make uninstall`.
install: build
	@scripts/install.sh install build

uninstall:
	@scripts/install.sh uninstall build

# As root: `make demo` and `make test` in a fresh Debian 12 root (debootstrap,
# chroot) on a clean clone of HEAD.  See scripts/fresh-check.sh.
fresh-check:
	scripts/fresh-check.sh

# Lists the tracked source files without an SPDX license line.
spdx-check:
	@scripts/spdx.sh check

clean:
	rm -rf build build-asan build-tsan build-fuzz
