// log_linear_histogram: bucket geometry, the stated relative error on known
// distributions, merging, and concurrent recording.
#include <bulkhead/histogram.hpp>

#include "catch.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

using bulkhead::histogram_snapshot;
using bulkhead::log_linear_histogram;

namespace {

/// The exact value of rank ceil(q * n) in sorted `values`.
std::uint64_t exact_quantile(std::vector<std::uint64_t> values, double q) {
    std::sort(values.begin(), values.end());
    auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size())));
    rank = std::max<std::size_t>(rank, 1);
    return values[rank - 1];
}

void check_quantiles(const std::vector<std::uint64_t>& values) {
    log_linear_histogram histogram;
    for (const auto value : values) {
        histogram.record(value);
    }
    const histogram_snapshot snapshot = histogram.snapshot();
    REQUIRE(snapshot.count() == values.size());
    for (const double q : {0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0}) {
        const auto exact = static_cast<double>(exact_quantile(values, q));
        const double reported = snapshot.quantile(q);
        INFO("q=" << q << " exact=" << exact << " reported=" << reported);
        CHECK(std::abs(reported - exact) <= log_linear_histogram::relative_error * exact + 0.5);
    }
}

}  // namespace

TEST_CASE("histogram buckets tile the value range without gaps", "[histogram]") {
    CHECK(log_linear_histogram::bucket_of(0) == 0);
    CHECK(log_linear_histogram::bucket_of(15) == 15);
    for (std::size_t i = 0; i + 1 < log_linear_histogram::bucket_count; ++i) {
        const auto low = log_linear_histogram::lower_bound(i);
        const auto high = log_linear_histogram::upper_bound(i);
        REQUIRE(low < high);
        REQUIRE(log_linear_histogram::bucket_of(low) == i);
        REQUIRE(log_linear_histogram::bucket_of(high - 1) == i);
        REQUIRE(log_linear_histogram::lower_bound(i + 1) == high);
        // The width bound behind the stated error: width <= lower / 2^sub_bits (above the linear range).
        if (low >= 16) {
            REQUIRE(static_cast<double>(high - low) <= static_cast<double>(low) / 16.0);
        }
    }
    CHECK(log_linear_histogram::bucket_of(std::uint64_t{1} << 50) == log_linear_histogram::bucket_count - 1);
    CHECK(log_linear_histogram::relative_error == Catch::Approx(0.03125));
}

TEST_CASE("histogram quantiles hold the stated relative error on known distributions", "[histogram]") {
    std::mt19937_64 random(2026);
    SECTION("uniform, 1 us to 10 ms") {
        std::uniform_int_distribution<std::uint64_t> uniform(1'000, 10'000'000);
        std::vector<std::uint64_t> values(100'000);
        for (auto& value : values) {
            value = uniform(random);
        }
        check_quantiles(values);
    }
    SECTION("log-normal latencies around 2 ms with a heavy tail") {
        std::lognormal_distribution<double> lognormal(std::log(2e6), 1.0);
        std::vector<std::uint64_t> values(100'000);
        for (auto& value : values) {
            value = static_cast<std::uint64_t>(lognormal(random));
        }
        check_quantiles(values);
    }
    SECTION("exponential, small values included") {
        std::exponential_distribution<double> exponential(1.0 / 200.0);
        std::vector<std::uint64_t> values(50'000);
        for (auto& value : values) {
            value = static_cast<std::uint64_t>(exponential(random));
        }
        check_quantiles(values);
    }
    SECTION("a single value") { check_quantiles({123'456'789}); }
}

TEST_CASE("histogram snapshots merge and count what was recorded", "[histogram]") {
    log_linear_histogram a;
    log_linear_histogram b;
    a.record(std::chrono::milliseconds(1));
    a.record(std::chrono::milliseconds(3));
    b.record(std::chrono::milliseconds(5));
    b.record(std::chrono::nanoseconds(-5));  // counts as 0
    histogram_snapshot merged = a.snapshot();
    merged.merge(b.snapshot());
    CHECK(merged.count() == 4);
    CHECK(merged.sum() == 9'000'000);
    CHECK(merged.count_at_or_below(0) == 1);
    CHECK(merged.count_at_or_below(2'000'000) == 2);
    CHECK(merged.count_at_or_below(10'000'000) == 4);
    CHECK(histogram_snapshot{}.quantile(0.5) == 0.0);
}

TEST_CASE("histogram records from many threads without losing a sample", "[histogram][stress]") {
    log_linear_histogram histogram;
    std::vector<std::thread> threads;
    threads.reserve(8);
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&histogram, t] {
            for (std::uint64_t i = 0; i < 50'000; ++i) {
                histogram.record(i * static_cast<std::uint64_t>(t + 1));
            }
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    CHECK(histogram.snapshot().count() == std::uint64_t{8} * 50'000);
}
