// The examples, run as a user would run them against the suite's server.
#include "http_get.hpp"
#include "pg_test_database.hpp"
#include "run_program.hpp"

#include "catch.hpp"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <thread>

#ifndef BULKHEAD_ORDERS_PATH
#define BULKHEAD_ORDERS_PATH ""
#endif
#ifndef BULKHEAD_WORKLOADS_PATH
#define BULKHEAD_WORKLOADS_PATH ""
#endif
#ifndef BULKHEAD_METRICS_SERVER_PATH
#define BULKHEAD_METRICS_SERVER_PATH ""
#endif

namespace {

std::string require_example(const char* path, const char* name) {
    if (std::string(path).empty()) {
        FAIL("examples/" << name << " was not built: configure with -DBULKHEAD_BUILD_EXAMPLES=ON");
    }
    return path;
}

/// GET `path` from 127.0.0.1:port, which must answer 200; returns the body.
std::string http_get_ok(int port, const std::string& path) {
    const std::optional<bulkhead_test::http_answer> answer = bulkhead_test::http_get(port, path);
    REQUIRE(answer.has_value());
    INFO(answer->head);
    REQUIRE(answer->status == 200);
    return answer->body;
}

}  // namespace

TEST_CASE("examples/orders writes through one gate from several threads and ends consistent", "[pg][examples]") {
    const std::string orders = require_example(BULKHEAD_ORDERS_PATH, "orders");
    // NOLINTNEXTLINE(concurrency-mt-unsafe): no other thread runs here (every test joins its threads)
    REQUIRE(::setenv("DB_URL", bulkhead_test::conninfo().c_str(), 1) == 0);
    const bulkhead_test::program_result run = bulkhead_test::run_program(orders);
    INFO(run.output);
    CHECK_THAT(run.output, Catch::Matchers::ContainsSubstring("consistent\n"));
    CHECK_THAT(run.output, Catch::Matchers::ContainsSubstring("attempted=1600"));
    CHECK(run.exited_zero());
}

TEST_CASE("[G2] examples/workloads keeps interactive's reservation while batch saturates the rest",
          "[pg][examples][G2]") {
    const std::string workloads = require_example(BULKHEAD_WORKLOADS_PATH, "workloads");
    // NOLINTNEXTLINE(concurrency-mt-unsafe): no other thread runs here (every test joins its threads)
    REQUIRE(::setenv("DB_URL", bulkhead_test::conninfo().c_str(), 1) == 0);
    const bulkhead_test::program_result run = bulkhead_test::run_program(workloads);
    INFO(run.output);
    CHECK_THAT(run.output,
               Catch::Matchers::ContainsSubstring("interactive: reserved=2 ceiling=4 admitted=20 timed_out=0\n"));
    CHECK_THAT(run.output, Catch::Matchers::ContainsSubstring("interactive served=20/20"));
    CHECK_THAT(run.output, Catch::Matchers::ContainsSubstring("reservation kept\n"));
    CHECK(run.exited_zero());
}

TEST_CASE("[G10] examples/workloads reads its plan from BULKHEAD_WORKLOADS and prints it, or refuses it by name",
          "[pg][examples][G10]") {
    const std::string workloads = require_example(BULKHEAD_WORKLOADS_PATH, "workloads");
    // NOLINTNEXTLINE(concurrency-mt-unsafe): no other thread runs here (every test joins its threads)
    REQUIRE(::setenv("DB_URL", bulkhead_test::conninfo().c_str(), 1) == 0);
    // NOLINTNEXTLINE(concurrency-mt-unsafe): as above
    REQUIRE(::setenv("BULKHEAD_WORKLOADS", "interactive reserved=1 queue=8; batch ceiling=2 queue=8", 1) == 0);
    const bulkhead_test::program_result run = bulkhead_test::run_program(workloads);
    INFO(run.output);
    CHECK_THAT(run.output, Catch::Matchers::ContainsSubstring("interactive: reserved=1 ceiling=4 admitted=20"));
    CHECK_THAT(run.output, Catch::Matchers::ContainsSubstring("batch: reserved=0 ceiling=2"));
    CHECK_THAT(run.output, Catch::Matchers::ContainsSubstring("reservation kept\n"));
    CHECK(run.exited_zero());
    // NOLINTNEXTLINE(concurrency-mt-unsafe): as above
    REQUIRE(::setenv("BULKHEAD_WORKLOADS", "interactive reserved=5; batch", 1) == 0);
    const bulkhead_test::program_result refused = bulkhead_test::run_program(workloads, "2>&1");
    // NOLINTNEXTLINE(concurrency-mt-unsafe): as above
    REQUIRE(::unsetenv("BULKHEAD_WORKLOADS") == 0);
    INFO(refused.output);
    CHECK_THAT(refused.output, Catch::Matchers::ContainsSubstring("do not fit inside B = 4"));
    CHECK_FALSE(refused.exited_zero());
}

TEST_CASE("examples/metrics_server serves an exposition that passes the format check", "[pg][examples][prometheus]") {
    const std::string server = require_example(BULKHEAD_METRICS_SERVER_PATH, "metrics_server");
    // NOLINTNEXTLINE(concurrency-mt-unsafe): no other thread runs here (every test joins its threads)
    REQUIRE(::setenv("DB_URL", bulkhead_test::conninfo().c_str(), 1) == 0);
    std::FILE* pipe = ::popen(("'" + server + "' 0 3").c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::array<char, 256> line{};
    REQUIRE(std::fgets(line.data(), static_cast<int>(line.size()), pipe) != nullptr);
    std::smatch port;
    const std::string first(line.data());
    REQUIRE(std::regex_search(first, port, std::regex(R"(127\.0\.0\.1:([0-9]+)/metrics)")));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the load run: the figures must move
    const std::string body = http_get_ok(std::stoi(port[1].str()), "/metrics");
    std::string rest;
    while (std::fgets(line.data(), static_cast<int>(line.size()), pipe) != nullptr) {
        rest += line.data();
    }
    const int status = ::pclose(pipe);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    INFO(rest);
    CHECK_THAT(body, Catch::Matchers::ContainsSubstring("bulkhead_completed_total{gate=\"metrics-demo\"}"));
    CHECK_THAT(body,
               Catch::Matchers::ContainsSubstring("bulkhead_pool_connections{pool=\"metrics-demo\",state=\"in_use\"}"));

    const auto path = std::filesystem::temp_directory_path() / "bulkhead-metrics-server.txt";
    std::ofstream(path) << body;
    const std::string check =
        "/usr/bin/python3 '" BULKHEAD_SOURCE_DIR "/tests/support/check_prometheus.py' '" + path.string() + "'";
    CHECK(std::system(check.c_str()) == 0);  // NOLINT(concurrency-mt-unsafe): no other thread runs here
    std::filesystem::remove(path);
}

TEST_CASE("examples/metrics_server survives a server restart and says what happened", "[pg][examples]") {
    const std::string server = require_example(BULKHEAD_METRICS_SERVER_PATH, "metrics_server");
    bulkhead_test::private_cluster cluster;
    // NOLINTNEXTLINE(concurrency-mt-unsafe): no other thread runs here (every test joins its threads)
    REQUIRE(::setenv("DB_URL", cluster.conninfo().c_str(), 1) == 0);
    std::FILE* pipe = ::popen(("'" + server + "' 0 6 2>&1").c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::array<char, 512> line{};
    REQUIRE(std::fgets(line.data(), static_cast<int>(line.size()), pipe) != nullptr);
    CHECK(std::string(line.data()).find("listening on") != std::string::npos);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the load run against the live server
    cluster.stop_server();                                        // fast shutdown: every session is terminated
    std::this_thread::sleep_for(std::chrono::seconds(1));
    cluster.start_server();
    std::string rest;
    while (std::fgets(line.data(), static_cast<int>(line.size()), pipe) != nullptr) {
        rest += line.data();
    }
    const int status = ::pclose(pipe);
    INFO(rest);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);  // it did not die with the database
    // And it said so: the calls refused while the server was down, and the
    // calls the restart failed, if one was running at that moment (with 2 ms
    // statements not every run has one).
    CHECK(rest.find("rejected_pool_timeout=0 ") == std::string::npos);
    CHECK((rest.find("failed=0") != std::string::npos) == (rest.find("call(s) failed") == std::string::npos));
    CHECK(rest.find("completed=") != std::string::npos);
    CHECK(rest.find(cluster.conninfo().substr(cluster.conninfo().find("password=") + 9, 8)) == std::string::npos);
}
