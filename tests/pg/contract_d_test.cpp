// Contract section D: the demo, run as a user would run it.
#include "pg_test_database.hpp"
#include "run_program.hpp"

#include "catch.hpp"

#include <cstdlib>
#include <string>

#ifndef BULKHEAD_DEMO_PATH
#define BULKHEAD_DEMO_PATH ""
#endif

TEST_CASE("[D1] examples/demo prints overload=rejected, query=42, available=1 and exits 0", "[pg][D1]") {
    const std::string demo = BULKHEAD_DEMO_PATH;
    if (demo.empty()) {
        FAIL("examples/demo was not built: configure with -DBULKHEAD_BUILD_EXAMPLES=ON");
    }
    // The demo reads its settings from the environment. No other thread runs
    // here (every test joins its threads before it ends).
    // NOLINTBEGIN(concurrency-mt-unsafe)
    REQUIRE(::setenv("DB_URL", bulkhead_test::conninfo().c_str(), 1) == 0);
    ::unsetenv("DB_USER");
    ::unsetenv("DB_PASSWORD");
    // NOLINTEND(concurrency-mt-unsafe)
    const bulkhead_test::program_result run = bulkhead_test::run_program(demo);
    CHECK(run.output == "overload=rejected\nquery=42\navailable=1\n");
    CHECK(run.exited_zero());
}
