# BulkheadPostgresFixture.cmake: the `postgres` CTest fixture for the [pg] tests.
#
#   include(cmake/BulkheadPostgresFixture.cmake)
#   bulkhead_postgres_fixture()
#   set_tests_properties(my_pg_test PROPERTIES
#     FIXTURES_REQUIRED postgres
#     ENVIRONMENT "${BULKHEAD_PG_TEST_ENVIRONMENT}")
#
# The fixture starts a throwaway PostgreSQL server with
# tests/support/pg_throwaway.sh before the first test that requires it and
# stops it, deleting its data, after the last one. When BULKHEAD_TEST_DATABASE
# is set in ctest's environment, that server is used instead and nothing is
# started. A run that was killed leaves its state in the build tree; the next
# start stops that server and deletes it first.

include_guard(GLOBAL)

# Adds the tests `postgres: start throwaway server` (FIXTURES_SETUP postgres)
# and `postgres: stop throwaway server` (FIXTURES_CLEANUP postgres), and sets
# in the caller's scope:
#   BULKHEAD_PG_TEST_ENVIRONMENT  the ENVIRONMENT a [pg] test needs:
#                                 BULKHEAD_PG_STATE_DIR=<state dir>. The test
#                                 reads the conninfo, and the script's path for
#                                 a private cluster, from files in that dir.
#   BULKHEAD_PG_SCRIPT            the absolute path of pg_throwaway.sh
#   BULKHEAD_PG_STATE_DIR         the state directory, ${CMAKE_BINARY_DIR}/pg-fixture
#
# BULKHEAD_PG_TEST_ENVIRONMENT holds one item on purpose: Catch2 v2's
# catch_discover_tests(... PROPERTIES ENVIRONMENT "${list}") splits a list of
# two into separate arguments, which shifts every property after it.
function(bulkhead_postgres_fixture)
  cmake_path(SET _script NORMALIZE
             "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../tests/support/pg_throwaway.sh")
  set(_state_dir "${CMAKE_BINARY_DIR}/pg-fixture")
  if(NOT EXISTS "${_script}")
    message(FATAL_ERROR "bulkhead_postgres_fixture: ${_script} is missing")
  endif()

  add_test(NAME "postgres: start throwaway server"
           COMMAND bash "${_script}" start "${_state_dir}")
  # initdb, up to five port attempts of at most 30 s each, and role creation.
  set_tests_properties("postgres: start throwaway server" PROPERTIES
    FIXTURES_SETUP postgres
    TIMEOUT 240
    LABELS pg)

  add_test(NAME "postgres: stop throwaway server"
           COMMAND bash "${_script}" stop "${_state_dir}")
  set_tests_properties("postgres: stop throwaway server" PROPERTIES
    FIXTURES_CLEANUP postgres
    TIMEOUT 120
    LABELS pg)

  set(BULKHEAD_PG_TEST_ENVIRONMENT "BULKHEAD_PG_STATE_DIR=${_state_dir}" PARENT_SCOPE)
  set(BULKHEAD_PG_SCRIPT "${_script}" PARENT_SCOPE)
  set(BULKHEAD_PG_STATE_DIR "${_state_dir}" PARENT_SCOPE)
endfunction()

# Adds the tests `pgbouncer: start before the throwaway server` (FIXTURES_SETUP
# pgbouncer) and `pgbouncer: stop` (FIXTURES_CLEANUP pgbouncer), both
# requiring the `postgres` fixture, so that PgBouncer starts after the server
# and stops before it. tests/support/pgbouncer_throwaway.sh runs PgBouncer in
# transaction pooling mode in front of the server that the `postgres` fixture
# names (the throwaway one, or BULKHEAD_TEST_DATABASE's). Call it after
# bulkhead_postgres_fixture(). Sets in the caller's scope:
#   BULKHEAD_PGBOUNCER_TEST_ENVIRONMENT  the ENVIRONMENT of a test that goes
#                                        through PgBouncer: BULKHEAD_PG_STATE_DIR=
#                                        <PgBouncer's state dir>, whose conninfo
#                                        names PgBouncer (one item, as above). The
#                                        tests read the server's own conninfo, the
#                                        script's path and PgBouncer's version from
#                                        files there (tests/support/pg_test_database.hpp).
#   BULKHEAD_PGBOUNCER_STATE_DIR         ${CMAKE_BINARY_DIR}/pgbouncer-fixture
function(bulkhead_pgbouncer_fixture)
  cmake_path(SET _script NORMALIZE
             "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../tests/support/pgbouncer_throwaway.sh")
  set(_state_dir "${CMAKE_BINARY_DIR}/pgbouncer-fixture")
  set(_pg_state_dir "${CMAKE_BINARY_DIR}/pg-fixture")
  if(NOT EXISTS "${_script}")
    message(FATAL_ERROR "bulkhead_pgbouncer_fixture: ${_script} is missing")
  endif()

  add_test(NAME "pgbouncer: start before the throwaway server"
           COMMAND bash "${_script}" start "${_state_dir}" "${_pg_state_dir}")
  # Up to five port attempts of at most 20 s each.
  set_tests_properties("pgbouncer: start before the throwaway server" PROPERTIES
    FIXTURES_SETUP pgbouncer
    FIXTURES_REQUIRED postgres
    TIMEOUT 120
    LABELS pgbouncer)

  add_test(NAME "pgbouncer: stop"
           COMMAND bash "${_script}" stop "${_state_dir}")
  set_tests_properties("pgbouncer: stop" PROPERTIES
    FIXTURES_CLEANUP pgbouncer
    FIXTURES_REQUIRED postgres
    TIMEOUT 60
    LABELS pgbouncer)

  set(BULKHEAD_PGBOUNCER_TEST_ENVIRONMENT "BULKHEAD_PG_STATE_DIR=${_state_dir}" PARENT_SCOPE)
  set(BULKHEAD_PGBOUNCER_STATE_DIR "${_state_dir}" PARENT_SCOPE)
endfunction()
