# SPDX-License-Identifier: MIT
# Every suite, one line each, named by its subject (tests/CMakeLists.txt,
# rate_suite, says what each word means; docs/contributing.md, "A tour of
# the tests", what each suite checks).  TIMEOUTs only stop a hung suite:
# they are far above what a suite takes on a loaded machine.

# The core, no server.
rate_suite(policy LABELS valgrind)
rate_suite(algorithms LABELS valgrind)
rate_suite(limiter LABELS valgrind)
rate_suite(store)
rate_suite(property)
rate_suite(concurrency LABELS concurrency)
rate_suite(mutants)
# (Under a sanitizer 2 draws, not 6: each draw covers every pair and trace
# kind, the same code paths; a plain build's ctest runs all 6.)
set(RATE_CARRY_ENV "")
if(RATE_SANITIZED)
  set(RATE_CARRY_ENV "CARRY_DRAWS=2")
endif()
rate_suite(carry_bound ENV ${RATE_CARRY_ENV})
rate_suite(headers NEEDS HTTP LABELS valgrind)
rate_suite(store_public SH store_public_test.sh ARGS ${CMAKE_C_COMPILER}
           ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src/store/memory.c
           ${CMAKE_SOURCE_DIR}/src/store/shm.c)
rate_suite(part_includes SH part_includes_test.sh ARGS ${CMAKE_SOURCE_DIR})
rate_suite(sync LABELS valgrind concurrency)
rate_suite(rules NEEDS HTTP LABELS valgrind)
rate_suite(rules_reloads C test_rules.c ARGS --reloads NEEDS HTTP LABELS concurrency)
rate_suite(rules_linear C test_rules.c ARGS --linear NEEDS HTTP)
rate_suite(rules_lease NEEDS HTTP)
rate_suite(rules_lease_threads C test_rules_lease.c ARGS --threads NEEDS HTTP LABELS concurrency)

# Every store: conformance and differential traces (tests/lib/store_matrix.h).
# Not SERIAL (their stores' timeouts are 30 s: no bound a loaded machine
# can pass), and DynamoDB's kind apart (it takes as long as the others
# together; skipped without dynalite, failed under CI=true): the two run
# beside other suites.
rate_suite(stores LABELS valgrind redis TIMEOUT 900 USES_MODULE USES_ASYNC
           ENV "RATE_STORES=-dynamodb"
           VALGRIND_ENV "RATE_STORES=cas,shm,redis_async_uv")
rate_suite(stores_dynamodb C test_stores.c NEEDS DYNAMODB LABELS dynamodb
           TIMEOUT 900 SKIP77 USES_MODULE USES_ASYNC ENV "RATE_STORES=dynamodb")

# Shared memory.
rate_suite(shm)
rate_suite(shm_threads C test_shm_procs.c ARGS threads LABELS concurrency)
rate_suite(shm_procs C test_shm_procs.c ARGS procs LABELS shm_procs)
rate_suite(shm_cli SH shm_cli_test.sh NEEDS TOOLS ARGS $<TARGET_FILE:ratelimit_cli>
           $<TARGET_FILE:shm_keys> ${CMAKE_CURRENT_SOURCE_DIR}/vectors)

# Redis.
rate_suite(redis NEEDS REDIS LABELS redis concurrency SERIAL)
rate_suite(redis_faults NEEDS REDIS LABELS redis concurrency SERIAL)
rate_suite(redis_mutants NEEDS REDIS LABELS valgrind redis)
rate_suite(redis_router NEEDS REDIS LABELS valgrind)
rate_suite(redis_protocol NEEDS REDIS LABELS valgrind)
rate_suite(lua_assemble SH lua_assemble_test.sh ARGS ${CMAKE_COMMAND}
           ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/generated NEEDS REDIS)
rate_suite(sha1 NEEDS REDIS LABELS valgrind)
rate_suite(redis_cluster NEEDS REDIS TOOLS LABELS redis SERIAL TIMEOUT 600
           ARGS $<TARGET_FILE:ratelimit_cli>)
rate_suite(redis_module NEEDS REDIS MODULE USES_MODULE LABELS redis)
rate_suite(module_symbols SH module_symbols_test.sh NEEDS MODULE LABELS redis SKIP77
           ARGS $<TARGET_FILE:ratelimit_redis_module>)
rate_suite(module_cli SH module_cli_test.sh NEEDS REDIS MODULE TOOLS LABELS redis SERIAL
           ARGS $<TARGET_FILE:ratelimit_cli> ${CMAKE_CURRENT_SOURCE_DIR}/vectors
           $<TARGET_FILE:ratelimit_redis_module>)
rate_suite(carry NEEDS REDIS LABELS redis SERIAL)
rate_suite(carry_cli SH carry_cli_test.sh NEEDS REDIS TOOLS LABELS redis SERIAL
           ARGS $<TARGET_FILE:ratelimit_cli>)
rate_suite(async NEEDS ASYNC USES_ASYNC LABELS redis SERIAL TIMEOUT 600)
rate_suite(async_cluster NEEDS ASYNC USES_ASYNC LABELS redis SERIAL TIMEOUT 600)
rate_suite(async_module NEEDS ASYNC MODULE USES_ASYNC USES_MODULE LABELS redis SERIAL
           TIMEOUT 600)
rate_suite(sync_redis NEEDS REDIS LABELS redis concurrency SERIAL)
# The synced mode over each remote behind a delay line (tests/lib/
# store_matrix.h's runner), DynamoDB's kind apart as in the store matrix.
rate_suite(sync_remotes NEEDS REDIS LABELS redis concurrency SERIAL
           ENV "RATE_STORES=-dynamodb")

# DynamoDB (dynalite; skipped without it, failed under CI=true).
rate_suite(dynamodb NEEDS DYNAMODB LABELS valgrind dynamodb concurrency SERIAL SKIP77)
rate_suite(dynamodb_cli SH dynamodb_cli_test.sh NEEDS DYNAMODB TOOLS LABELS dynamodb
           SERIAL SKIP77 ARGS $<TARGET_FILE:ratelimit_cli>
           ${CMAKE_CURRENT_SOURCE_DIR}/vectors ${RATE_DYNALITE})
rate_suite(sync_dynamodb NEEDS DYNAMODB LABELS dynamodb concurrency SERIAL SKIP77)
rate_suite(sync_remotes_dynamodb C test_sync_remotes.c NEEDS DYNAMODB
           LABELS dynamodb concurrency SERIAL SKIP77 ENV "RATE_STORES=dynamodb")

# The command, the example server, nginx, installing.
rate_suite(parsers NEEDS TOOLS LIBS ratelimit_cli_parse)
rate_suite(cli SH cli_test.sh NEEDS TOOLS ENV "${RATE_PARTS_ENV}"
           ARGS $<TARGET_FILE:ratelimit_cli> ${CMAKE_CURRENT_SOURCE_DIR}/vectors)
rate_suite(api_server SH api_server_test.sh NEEDS API_SERVER
           ARGS $<TARGET_FILE:api-server> ${CMAKE_SOURCE_DIR}/examples/api-server/example.conf)
rate_suite(nginx SH nginx_test.sh NEEDS NGINX SKIP77 TIMEOUT 900 ARGS "${RATE_NGINX_SO}")
rate_suite(nginx_redis SH nginx_redis_test.sh NEEDS NGINX LABELS redis SERIAL SKIP77
           TIMEOUT 900 ARGS "${RATE_NGINX_SO}")
rate_suite(nginx_redis_slow SH nginx_redis_slow_test.sh NEEDS NGINX LABELS redis SERIAL
           SKIP77 TIMEOUT 900 ARGS "${RATE_NGINX_SO}")
rate_suite(install SH install_test.sh NEEDS TOOLS PLAIN ENV "${RATE_PARTS_ENV}"
           ARGS ${CMAKE_BINARY_DIR})
# The Python binding (python/, docs/python.md): a plain build's, since
# CPython has no sanitizer runtime to load it with.
rate_suite(python SH python_test.sh NEEDS TOOLS PLAIN REDIS HTTP MODULE
           LABELS redis TIMEOUT 900 ARGS ${CMAKE_BINARY_DIR}
           $<TARGET_FILE:ratelimit_cli> $<TARGET_FILE:ratelimit_redis_module>
           ${RATE_DYNALITE})

# Fair shares of a shared limit (docs/fair.md): issue 31's properties on
# the memory table (threads) and the shared table (processes, shm store).
rate_suite(fair LABELS concurrency TIMEOUT 300)
rate_suite(fair_procs C test_fair.c ARGS --procs LABELS shm_procs TIMEOUT 300)
rate_suite(fair_review LABELS valgrind concurrency TIMEOUT 300)
rate_suite(fair_check LABELS valgrind concurrency TIMEOUT 300)
rate_suite(fair_mem LABELS concurrency TIMEOUT 300)
rate_suite(fair_shapes TIMEOUT 600)
rate_suite(fair_corrupt TIMEOUT 300)
rate_suite(fair_async NEEDS ASYNC USES_ASYNC LABELS concurrency TIMEOUT 300)
rate_suite(fair_redis NEEDS REDIS MODULE USES_MODULE LABELS redis SERIAL TIMEOUT 600)
rate_suite(fair_cli SH fair_cli_test.sh NEEDS TOOLS ARGS $<TARGET_FILE:ratelimit_cli>)
rate_suite(fair_api SH fair_api_test.sh NEEDS API_SERVER ARGS $<TARGET_FILE:api-server>)
rate_suite(api_lease SH api_lease_test.sh NEEDS API_SERVER
           ARGS $<TARGET_FILE:api-server> ${CMAKE_SOURCE_DIR}/examples/api-server/example.conf)
rate_suite(fair_nginx SH fair_nginx_test.sh NEEDS NGINX SKIP77 TIMEOUT 900
           ARGS "${RATE_NGINX_SO}")

# In-flight limits with leases (docs/leases.md): the memory and cas stores
# (threads), shm processes killed with SIGKILL, the command, Redis, nginx.
rate_suite(lease LABELS valgrind concurrency)
rate_suite(lease_procs LABELS shm_procs)
set(RATE_LEASE_HOLD "")
if(RATE_WITH_REDIS)
  set(RATE_LEASE_HOLD $<TARGET_FILE:lease_hold>)
endif()
rate_suite(lease_cli SH lease_cli_test.sh NEEDS TOOLS ENV "${RATE_PARTS_ENV}"
           ARGS $<TARGET_FILE:ratelimit_cli> ${RATE_LEASE_HOLD})
rate_suite(lease_redis NEEDS REDIS USES_MODULE LABELS redis SERIAL)
rate_suite(lease_redis_one NEEDS REDIS MODULE USES_MODULE LABELS redis SERIAL)
rate_suite(lease_async NEEDS ASYNC MODULE USES_ASYNC USES_MODULE LABELS redis SERIAL)
rate_suite(nginx_lease SH nginx_lease_test.sh NEEDS NGINX SKIP77 TIMEOUT 900
           ARGS "${RATE_NGINX_SO}")
rate_suite(nginx_lease_redis SH nginx_lease_redis_test.sh NEEDS NGINX LABELS redis
           SKIP77 TIMEOUT 900 ARGS "${RATE_NGINX_SO}")

# The libFuzzer targets' seed corpus, each input once (fuzz/replay.c as
# main; `make fuzz` searches further with libFuzzer itself).
set(RATE_CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus)
rate_suite(fuzz_policy C fuzz/fuzz_policy.c LIBS rate_fuzz_replay ARGS ${RATE_CORPUS}/policy)
rate_suite(fuzz_shm C fuzz/fuzz_shm.c LIBS rate_fuzz_replay ARGS ${RATE_CORPUS}/shm)
rate_suite(fuzz_module C fuzz/fuzz_module.c NEEDS MODULE
           LIBS rate_fuzz_replay rate_test_module_host ratelimit_module_cmds
           ARGS ${RATE_CORPUS}/module)
rate_suite(fuzz_fair C fuzz/fuzz_fair.c LIBS rate_fuzz_replay ARGS ${RATE_CORPUS}/fair)
# ... and 300 randomly damaged copies of the fair table's, each in a process.
rate_suite(fair_damage C fuzz/fuzz_fair.c LIBS rate_fuzz_replay
           ARGS --damage 300 7 ${RATE_CORPUS}/fair/table)
rate_suite(fuzz_trace C fuzz/fuzz_trace.c NEEDS TOOLS LIBS rate_fuzz_replay ratelimit_cli_parse
           ARGS ${RATE_CORPUS}/trace)
rate_suite(fuzz_clf C fuzz/fuzz_clf.c NEEDS TOOLS LIBS rate_fuzz_replay ratelimit_cli_parse
           ARGS ${RATE_CORPUS}/clf)
