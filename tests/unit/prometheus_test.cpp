// The Prometheus exposition: checked with a real parser (prometheus_client's,
// from Debian's python3-prometheus-client) plus the conventions a scraper's
// users rely on (tests/support/check_prometheus.py).
#include "fake_pool.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/prometheus.hpp>

#include "catch.hpp"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <stop_token>
#include <string>

#ifndef BULKHEAD_SOURCE_DIR
#error "BULKHEAD_SOURCE_DIR must name the source tree"
#endif

using namespace std::chrono_literals;
using bulkhead_test::fake_pool;

namespace {

/// Runs the format checker on `text`; returns its exit status and output.
std::pair<int, std::string> check_format(const std::string& text) {
    const auto path =
        std::filesystem::temp_directory_path() / ("bulkhead-metrics-" + std::to_string(::getpid()) + ".txt");
    std::ofstream(path) << text;
    const std::string command =
        "/usr/bin/python3 '" BULKHEAD_SOURCE_DIR "/tests/support/check_prometheus.py' '" + path.string() + "' 2>&1";
    std::FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::string output;
    std::array<char, 512> buffer{};
    while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe) != nullptr) {
        output += buffer.data();
    }
    const int status = ::pclose(pipe);
    std::filesystem::remove(path);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

/// A gate that has seen every kind of outcome.
bulkhead::gate_stats busy_gate_stats(fake_pool& pool) {
    bulkhead::db_bulkhead<fake_pool> gate(pool, 2, 1);
    gate.transaction(0ms, [](fake_pool::work&) {});
    (void)gate.try_transaction({.deadline = std::chrono::steady_clock::now() - 1s}, [](fake_pool::work&) {});
    std::stop_source stopped;
    stopped.request_stop();
    (void)gate.try_enter({.stop = stopped.get_token()});
    CHECK_THROWS(gate.transaction(0ms, [](fake_pool::work&) { throw std::runtime_error("x"); }));
    pool.fail_acquire = true;
    (void)gate.try_transaction(0ms, [](fake_pool::work&) {});
    pool.fail_acquire = false;
    return gate.stats();
}

}  // namespace

TEST_CASE("the Prometheus exposition of gates and pools passes a real parser and the conventions", "[prometheus]") {
    fake_pool pool;
    bulkhead::prometheus_exposition metrics;
    metrics.add("orders", busy_gate_stats(pool));
    metrics.add("with \"quotes\" \\ and\nnewline", busy_gate_stats(pool));
    bulkhead::pool_stats pool_stats;
    pool_stats.max_size = 4;
    pool_stats.size = 3;
    pool_stats.idle = 1;
    pool_stats.in_use = 2;
    pool_stats.opened = 7;
    pool_stats.closed[static_cast<std::size_t>(bulkhead::close_reason::broken)] = 2;
    metrics.add("main", pool_stats);
    const std::string text = metrics.render();

    const auto [status, output] = check_format(text);
    INFO(output);
    CHECK(status == 0);
    CHECK_THAT(output, Catch::Matchers::ContainsSubstring("valid"));

    CHECK_THAT(text,
               Catch::Matchers::ContainsSubstring("bulkhead_rejections_total{gate=\"orders\",reason=\"full\"} 0\n"));
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring(
                         "bulkhead_rejections_total{gate=\"orders\",reason=\"cancelled\"} 1\n"));
    CHECK_THAT(
        text, Catch::Matchers::ContainsSubstring("bulkhead_rejections_total{gate=\"orders\",reason=\"deadline\"} 1\n"));
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring(
                         "bulkhead_rejections_total{gate=\"orders\",reason=\"pool_timeout\"} 1\n"));
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring("bulkhead_completed_total{gate=\"orders\"} 1\n"));
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring("bulkhead_failed_total{gate=\"orders\"} 1\n"));
    // Timed end to end: the committed call, the failed one and the pool timeout (they all reached the pool).
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring("bulkhead_call_seconds_count{gate=\"orders\"} 3\n"));
    CHECK_THAT(text,
               Catch::Matchers::ContainsSubstring("bulkhead_pool_closed_total{pool=\"main\",reason=\"broken\"} 2\n"));
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring("gate=\"with \\\"quotes\\\" \\\\ and\\nnewline\""));
}

TEST_CASE("the format checker rejects a broken exposition (it can fail)", "[prometheus]") {
    const auto [status, output] = check_format(
        "# HELP bulkhead_things counter without _total\n# TYPE bulkhead_things counter\nbulkhead_things 1\n");
    INFO(output);
    CHECK(status == 1);
    const auto [status2, output2] = check_format(
        "# HELP h x\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1\"} 3\n"
        "h_seconds_bucket{le=\"+Inf\"} 2\nh_seconds_count 2\nh_seconds_sum 1\n");
    INFO(output2);
    CHECK(status2 != 0);
}

TEST_CASE("a gate with workload classes adds per-class families labelled workload, valid for a real parser",
          "[prometheus]") {
    fake_pool pool;
    const bulkhead::workload_plan plan{{
        bulkhead::workload_class{.name = "interactive", .reserved = 1, .queue = 2},
        bulkhead::workload_class{.name = "batch", .ceiling = 1, .queue = 0, .priority = 2},
    }};
    bulkhead::db_bulkhead<fake_pool> gate(pool, {.concurrent = 2, .workloads = plan});
    const bulkhead::workload_id batch = gate.workload("batch");
    gate.transaction({.workload = batch}, [](fake_pool::work&) {});
    // Read before the options are built, as in workload_test.cpp (a g++ 12 false warning).
    const bulkhead::workload_id interactive = gate.workload("interactive");
    gate.transaction({.workload = interactive}, [](fake_pool::work&) {});
    bulkhead::permit held = gate.enter({.workload = batch});
    (void)gate.try_enter({.task = &pool, .workload = batch});  // the class's one slot is taken: full
    bulkhead::prometheus_exposition metrics;
    metrics.add("orders", gate.stats());
    metrics.add("plain", busy_gate_stats(pool));
    const std::string text = metrics.render();
    const auto [status, report] = check_format(text);
    INFO(report);
    CHECK(status == 0);
    CHECK(text.find("bulkhead_workload_admitted_total{gate=\"orders\",workload=\"batch\"} 2\n") != std::string::npos);
    CHECK(text.find("bulkhead_workload_admitted_total{gate=\"orders\",workload=\"interactive\"} 1\n") !=
          std::string::npos);
    CHECK(text.find("bulkhead_workload_rejections_total{gate=\"orders\",workload=\"batch\",reason=\"full\"} 1\n") !=
          std::string::npos);
    CHECK(text.find("bulkhead_workload_running{gate=\"orders\",workload=\"batch\"} 1\n") != std::string::npos);
    CHECK(text.find("bulkhead_workload_reserved_permits{gate=\"orders\",workload=\"interactive\"} 1\n") !=
          std::string::npos);
    CHECK(text.find("bulkhead_workload_ceiling{gate=\"orders\",workload=\"interactive\"} 2\n") != std::string::npos);
    CHECK(text.find("bulkhead_workload_permit_wait_seconds_count{gate=\"orders\",workload=\"interactive\"} 1\n") !=
          std::string::npos);
    // The plain gate has no class samples.
    CHECK(text.find("workload=\"default\"") == std::string::npos);
    held.release();
}

TEST_CASE("an exposition of plain gates only has no workload families", "[prometheus]") {
    fake_pool pool;
    bulkhead::prometheus_exposition metrics;
    metrics.add("plain", busy_gate_stats(pool));
    CHECK(metrics.render().find("bulkhead_workload_") == std::string::npos);
}

TEST_CASE("[K10] every metric the dashboard and the alert rules query is one the library exports",
          "[prometheus][K10]") {
    fake_pool pool;
    bulkhead::prometheus_exposition metrics;
    metrics.add("orders", busy_gate_stats(pool));
    metrics.add("main", bulkhead::pool_stats{});
    const std::string text = metrics.render();
    for (const char* file : {"contrib/grafana/bulkhead.json", "contrib/prometheus/alerts.yml"}) {
        std::ifstream in(std::string(BULKHEAD_SOURCE_DIR "/") + file);
        REQUIRE(in);
        const std::string queries((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const std::regex name("bulkhead_[a-z_]+");
        int found = 0;
        for (auto match = std::sregex_iterator(queries.begin(), queries.end(), name); match != std::sregex_iterator();
             ++match) {
            std::string family = match->str();
            for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
                if (family.ends_with(suffix) && text.find("# TYPE " + family.substr(0, family.size() - suffix.size()) +
                                                          " histogram") != std::string::npos) {
                    family.resize(family.size() - suffix.size());
                }
            }
            INFO(file << " queries " << match->str());
            CHECK(text.find("# TYPE " + family + " ") != std::string::npos);
            ++found;
        }
        CHECK(found >= 6);  // the pattern did find the queries
    }
}
