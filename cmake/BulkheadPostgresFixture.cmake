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
