# Thin wrapper over CMake.  `make demo` and `make test` install what is
# missing (scripts/deps.sh) before building.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps build demo test test-plain test-asan test-tsan valgrind \
        fuzz bench install clean

all: build

deps:
	@scripts/deps.sh test

build:
	@scripts/deps.sh build
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATE_BUILD_TOOLS=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j $(JOBS)

# The main job on the in-memory default: sample traffic aimed at
# fixed-window edges through all five algorithms, a table and a chart.
demo: build
	@sh scripts/gen-traces.sh build/traces
	./build/tools/ratelimit/ratelimit compare --rate 10/s --burst 10 \
	  --svg build/demo.svg build/traces/edges.trace
	@echo "chart: build/demo.svg"

# Every test: plain build, AddressSanitizer + UndefinedBehaviorSanitizer,
# ThreadSanitizer on the concurrency test, and valgrind.
test: deps test-plain test-asan test-tsan valgrind fuzz

test-plain:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATE_BUILD_TOOLS=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j $(JOBS)
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DRATE_ASAN=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS)

test-tsan:
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DRATE_TSAN=ON -DRATE_BUILD_TOOLS=OFF $(CMAKE_FLAGS) >/dev/null
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && setarch "$$(uname -m)" -R env TSAN_OPTIONS=halt_on_error=1 \
	  ctest --output-on-failure -L concurrency

VALGRIND_TESTS = policy algorithms limiter store property
valgrind: test-plain
	@for t in $(VALGRIND_TESTS); do \
	  echo "valgrind: test_$$t"; \
	  valgrind -q --error-exitcode=1 --leak-check=full \
	    --errors-for-leak-kinds=definite build/tests/test_$$t >/dev/null || exit 1; \
	done; echo "valgrind: clean"

# libFuzzer (clang): each target for FUZZ_SECONDS from the seed corpus in
# tests/fuzz/corpus (copied, so new inputs stay in the build tree).
FUZZ_SECONDS ?= 30
FUZZ_TARGETS = policy trace clf
fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATE_FUZZ=ON \
	  -DRATE_BUILD_TESTS=OFF -DRATE_BUILD_TOOLS=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target fuzz_policy fuzz_trace fuzz_clf
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus-$$t && cp tests/fuzz/corpus/$$t/* build-fuzz/corpus-$$t/; \
	  echo "fuzz: fuzz_$$t for $(FUZZ_SECONDS) s"; \
	  build-fuzz/tests/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	    -rss_limit_mb=2048 build-fuzz/corpus-$$t >build-fuzz/fuzz-$$t.log 2>&1 \
	    || { tail -n 40 build-fuzz/fuzz-$$t.log; exit 1; }; \
	  grep -E "^Done [0-9]+ runs" build-fuzz/fuzz-$$t.log || true; \
	done; echo "fuzz: no crash, leak or hang"

bench: build
	./build/tools/ratelimit/ratelimit bench

install: build
	cmake --install build

clean:
	rm -rf build build-asan build-tsan build-fuzz
