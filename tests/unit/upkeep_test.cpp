// Contract K, the parts that need no database: the jitter on a connection's
// lifetime (K3), a gate's settings from text (K7), closing a gate that
// holds only permits (K5), the gate's health (K6).
#include <bulkhead/bulkhead.hpp>
#include <bulkhead/detail/clock.hpp>
#include <bulkhead/settings_config.hpp>

#include "fake_pool.hpp"
#include "test_util.hpp"

#include "catch.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

using namespace std::chrono_literals;

TEST_CASE("[K3] max_lifetime is jittered: up to 2.5 % shorter, never longer, spread across the range", "[K3]") {
    using bulkhead::detail::jittered_lifetime;
    const std::chrono::milliseconds lifetime = 1800s;  // the pool's default
    const std::chrono::milliseconds shortest = lifetime - lifetime / 40;
    CHECK(jittered_lifetime(lifetime, 0) == lifetime);
    CHECK(jittered_lifetime(lifetime, static_cast<std::uint64_t>(lifetime.count() / 40)) == shortest);
    CHECK(jittered_lifetime(lifetime, UINT64_MAX) >= shortest);
    // Zero (never) and lifetimes too short for a whole millisecond of jitter
    // stay as they are.
    CHECK(jittered_lifetime(0ms, 12345) == 0ms);
    CHECK(jittered_lifetime(39ms, 12345) == 39ms);
    // Drawn from random numbers: every draw in range, the draws spread over
    // it (16 connections opened at once retire over about a minute).
    std::mt19937_64 random(7);
    std::chrono::milliseconds low = lifetime;
    std::chrono::milliseconds high = 0ms;
    for (int i = 0; i < 16; ++i) {
        const std::chrono::milliseconds drawn = jittered_lifetime(lifetime, random());
        CHECK(drawn >= shortest);
        CHECK(drawn <= lifetime);
        low = std::min(low, drawn);
        high = std::max(high, drawn);
    }
    CHECK(high - low > lifetime / 80);
}

TEST_CASE("[K7] a gate's settings read from text or the environment, errors naming the key", "[K7]") {
    SECTION("every key, comments, ';' and line ends") {
        const bulkhead::gate_settings settings = bulkhead::parse_gate_settings(
            "concurrent=16 extra_slots=32   # B and Q\n"
            "adaptive_floor=2; adaptive_interval=500ms adaptive_tolerance=1.75 adaptive_headroom=1.1\n"
            "adaptive_error_rate=0.1 adaptive_min_samples=5 adaptive_queue_allowance=0");
        CHECK(settings.concurrent == 16);
        CHECK(settings.extra_slots == 32);
        REQUIRE(settings.adaptive.has_value());
        CHECK(settings.adaptive->floor == 2);
        CHECK(settings.adaptive->interval == 500ms);
        CHECK(settings.adaptive->tolerance == 1.75);
        CHECK(settings.adaptive->headroom == 1.1);
        CHECK(settings.adaptive->error_rate == 0.1);
        CHECK(settings.adaptive->min_samples == 5);
        CHECK(settings.adaptive->queue_allowance == 0.0);
        // The double nearest each decimal, as a compiler reads the literal.
        for (const auto& [text, expected] :
             {std::pair{"0.1", 0.1}, std::pair{"123.456", 123.456}, std::pair{"2.675", 2.675}, std::pair{"7", 7.0},
              std::pair{"0.00000000000001", 0.00000000000001}}) {
            INFO(text);
            CHECK(bulkhead::parse_gate_settings(std::string("adaptive_tolerance=") + text).adaptive->tolerance ==
                  expected);
        }
        // What the text leaves out keeps the default: a fixed limit.
        CHECK_FALSE(bulkhead::parse_gate_settings("concurrent=4").adaptive.has_value());
    }
    SECTION("what it refuses, naming the line and the key") {
        const auto refused = [](const char* text) {
            return bulkhead_test::message_of<std::invalid_argument>([&] { (void)bulkhead::parse_gate_settings(text); });
        };
        CHECK(refused("concurrent=16 concurent=4") ==
              "bulkhead gate settings: line 1: unknown key \"concurent\" (known: concurrent, extra_slots, "
              "adaptive_floor, adaptive_interval, adaptive_tolerance, adaptive_headroom, adaptive_error_rate, "
              "adaptive_min_samples, adaptive_queue_allowance)");
        CHECK(refused("concurrent=16\nextra_slots=-1") ==
              "bulkhead gate settings: line 2: extra_slots \"-1\" must not be negative");
        CHECK(refused("concurrent = 16") ==
              "bulkhead gate settings: line 1: \"concurrent\" has no '=' right after it: write \"concurrent\"=value, "
              "with no space around the '='");
        CHECK(refused("concurrent=16 concurrent=8") == "bulkhead gate settings: line 1: concurrent is given twice");
        CHECK(refused("adaptive_interval=1.5s") ==
              "bulkhead gate settings: line 1: adaptive_interval \"1.5s\" is not a whole number: use a smaller unit "
              "(1500ms, not 1.5s)");
        CHECK(refused("adaptive_interval=1500us") ==
              "bulkhead gate settings: line 1: adaptive_interval \"1500us\" is not a whole number of milliseconds");
        CHECK(refused("adaptive_tolerance=1e3") ==
              "bulkhead gate settings: line 1: adaptive_tolerance \"1e3\" is not a decimal number: write one as in "
              "adaptive_tolerance=1.5 (at most 15 digits)");
        for (const char* decimal : {"1.", ".5", "1..5", "1.5.", "-1.5", "1234567890123456"}) {
            INFO(decimal);
            CHECK_THAT(refused((std::string("adaptive_tolerance=") + decimal).c_str()),
                       Catch::Matchers::ContainsSubstring("is not a decimal number"));
        }
        CHECK(refused("concurrent=") == "bulkhead gate settings: line 1: concurrent has no value after its '='");
        CHECK(refused("concurrent='16") ==
              "bulkhead gate settings: line 1: the quoted value of concurrent has no closing quote");
        CHECK(refused("=16") == "bulkhead gate settings: line 1: expected a key=value pair, found \"=\"");
    }
    SECTION("from the environment: unset is nothing, errors name the variable") {
        CHECK_FALSE(bulkhead::gate_settings_from_env("BULKHEAD_GATE_K7_UNSET").has_value());
        bulkhead_test::scoped_env variable("BULKHEAD_GATE_K7_TEST", "concurrent=8 extra_slots=x");
        CHECK_THROWS_WITH(bulkhead::gate_settings_from_env("BULKHEAD_GATE_K7_TEST"),
                          "bulkhead gate settings in BULKHEAD_GATE_K7_TEST: line 1: extra_slots \"x\" is not a "
                          "number: write a whole number, as in extra_slots=4");
        variable.set("concurrent=8 extra_slots=2");
        const std::optional<bulkhead::gate_settings> read = bulkhead::gate_settings_from_env("BULKHEAD_GATE_K7_TEST");
        REQUIRE(read.has_value());
        CHECK(read->concurrent == 8);
        CHECK(read->extra_slots == 2);
        CHECK_THROWS_AS(bulkhead::gate_settings_from_env(""), std::invalid_argument);
    }
}

TEST_CASE(
    "[K5] close() on a gate: at once when empty, and a permit from enter() has no stop and is reported still inside",
    "[K5]") {
    bulkhead_test::fake_pool pool;
    using upkept_gate = bulkhead::db_bulkhead<bulkhead_test::fake_pool>;
    {
        upkept_gate gate(pool, 2, 2);
        const auto start = std::chrono::steady_clock::now();
        const bulkhead::close_report report = gate.close(start + 10s);
        CHECK(std::chrono::steady_clock::now() - start < 5s);  // it did not wait for the deadline
        CHECK(report.in_flight == 0);
        CHECK(report.drained());
        CHECK(gate.closed());
        CHECK_FALSE(gate.try_enter());
        CHECK(gate.try_transaction(0ms, [](bulkhead_test::fake_pool::work&) { return 1; }).error() ==
              bulkhead::reject_reason::closed);
        CHECK(gate.stats().rejections(bulkhead::reject_reason::closed) == 2);
        CHECK(pool.acquired == 0);
    }
    upkept_gate gate(pool, 2, 2);
    std::optional<bulkhead::permit> held;
    held.emplace(gate.enter());
    CHECK(gate.in_flight() == 1);
    const auto start = std::chrono::steady_clock::now();
    const bulkhead::close_report report = gate.close(start + 20ms, 30ms);
    CHECK(std::chrono::steady_clock::now() - start >= 50ms);
    CHECK(report.in_flight == 1);
    CHECK(report.cancelled == 1);
    CHECK(report.still_running == 1);
    CHECK_FALSE(report.drained());
    held.reset();
    CHECK(gate.in_flight() == 0);
    CHECK(gate.close(std::chrono::steady_clock::now()).drained());
}

TEST_CASE("[K6] health: serving, a warning for an adaptive limit at its floor, not serving once closed", "[K6]") {
    bulkhead_test::fake_pool pool;
    using upkept_gate = bulkhead::db_bulkhead<bulkhead_test::fake_pool>;
    upkept_gate plain(pool, 2, 2);
    bulkhead::gate_health health = plain.health();
    CHECK(health.serving);
    CHECK(health.reason == bulkhead::health_reason::none);
    CHECK(health.detail.empty());

    // A plan's reservations start an adaptive limit at its floor.
    const bulkhead::workload_plan plan{{
        bulkhead::workload_class{.name = "interactive", .reserved = 1, .queue = 4},
        bulkhead::workload_class{.name = "batch", .reserved = 1, .queue = 4},
    }};
    upkept_gate adaptive(pool,
                         {.concurrent = 6, .workloads = plan, .adaptive = bulkhead::adaptive_options{.floor = 2}});
    REQUIRE(adaptive.limit() == 2);
    health = adaptive.health();
    CHECK(health.serving);
    CHECK(health.reason == bulkhead::health_reason::limit_at_floor);
    CHECK(health.detail == "the adaptive limit is at its floor, 2 of 6 permits");
    CHECK(bulkhead::to_string(health.reason) == "limit_at_floor");

    (void)plain.close(std::chrono::steady_clock::now());
    health = plain.health();
    CHECK_FALSE(health.serving);
    CHECK(health.reason == bulkhead::health_reason::closed);
}
