// bench/pg: the load drivers and what they record.
//
// Closed loop: N threads call back to back for a fixed time; throughput is
// the completions within the window.
//
// Open loop: a dispatcher releases jobs at precomputed Poisson arrival times
// into a FIFO that a fixed set of workers drains. Every latency is measured
// from the job's INTENDED start time, so time spent behind a busy worker, a
// late dispatcher or a full pool is counted, never hidden (coordinated
// omission). When the arrivals end, in-flight calls may finish for a grace
// period; jobs still queued then are recorded as unserved.
//
// The rejection probe: two extra threads that, every period, meet at a spin
// rendezvous and then each call the gate a burst of times, to time rejections
// with two threads rejecting at once (the same API in a round, alternating
// the throwing and the try_ API from round to round).
//
// Every call leaves one record; all figures are computed from the records
// after the run, so the drivers do nothing but time and store.
#pragma once

#include "arms.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <latch>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace bulkhead_bench {

/// One call (or one job that never got a call).
struct record {
    std::int64_t intended_ns = 0;  ///< intended start, since the run's start
    std::int64_t latency_ns = 0;   ///< intended start to the end of the call
    std::int64_t call_ns = 0;      ///< the call itself: for a rejection, the time to say no
    std::int64_t pickup_ns = 0;    ///< intended start to a worker taking the job (dispatch lag)
    std::int64_t began_ns = 0;     ///< the call's start, since the run's start (probe overlap)
    std::int64_t round = -1;       ///< probe: the rendezvous round
    outcome what = outcome::completed;
    api which = api::try_api;
    bool preempted = false;  ///< see call_result::preempted
    bool blocked = false;    ///< see call_result::blocked
    std::uint8_t slot = 0;   ///< probe: which of the two threads
};

struct run_records {
    std::vector<record> calls;
    std::vector<record> probe;
    double window_s = 0;  ///< the arrival (or measurement) window
    double wall_s = 0;    ///< from the first job to the last call's end
};

[[nodiscard]] inline std::int64_t nanoseconds_between(clock::time_point from, clock::time_point to) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}

// ---------------------------------------------------------------------------
// Arrival schedules
// ---------------------------------------------------------------------------

/// One stretch of a schedule: Poisson arrivals at `rate` per second.
struct phase {
    std::chrono::nanoseconds length;
    double rate;
};

/// Poisson arrival offsets (ns since the start) through the phases, in order.
[[nodiscard]] inline std::vector<std::int64_t> poisson_arrivals(const std::vector<phase>& phases, std::uint64_t seed) {
    std::mt19937_64 random(seed);
    std::vector<std::int64_t> arrivals;
    double phase_start = 0;
    for (const phase& stretch : phases) {
        const double phase_end = phase_start + static_cast<double>(stretch.length.count());
        // Exponential gaps are memoryless: starting afresh at each phase
        // boundary gives a non-homogeneous Poisson process with these rates.
        std::exponential_distribution<double> gap(stretch.rate / 1e9);
        for (double t = phase_start + gap(random); t < phase_end; t += gap(random)) {
            arrivals.push_back(static_cast<std::int64_t>(t));
        }
        phase_start = phase_end;
    }
    return arrivals;
}

// ---------------------------------------------------------------------------
// Closed loop
// ---------------------------------------------------------------------------

/// `threads` threads call `target` back to back for `duration`. Calls that end
/// after the window are recorded but do not count as completed in it.
[[nodiscard]] inline run_records run_closed_loop(arm& target, int threads, std::chrono::nanoseconds duration,
                                                 std::uint64_t seed, api which = api::try_api) {
    std::vector<std::vector<record>> per_thread(static_cast<std::size_t>(threads));
    std::latch ready(threads + 1);
    std::atomic<bool> stop{false};
    clock::time_point start{};
    std::atomic<bool> started{false};
    std::vector<std::thread> pool;
    pool.reserve(static_cast<std::size_t>(threads));
    for (int index = 0; index < threads; ++index) {
        pool.emplace_back([&, index] {
            std::mt19937_64 random(seed + static_cast<std::uint64_t>(index));
            std::vector<record>& out = per_thread[static_cast<std::size_t>(index)];
            out.reserve(1U << 16U);
            ready.arrive_and_wait();
            while (!started.load(std::memory_order_acquire)) {
                std::this_thread::yield();
            }
            while (!stop.load(std::memory_order_relaxed)) {
                const clock::time_point began = clock::now();
                const call_result result = target.call(index, began, which, random);
                out.push_back({.intended_ns = nanoseconds_between(start, began),
                               .latency_ns = nanoseconds_between(began, result.ended),
                               .call_ns = nanoseconds_between(result.began, result.ended),
                               .pickup_ns = 0,
                               .began_ns = nanoseconds_between(start, result.began),
                               .what = result.what,
                               .which = which,
                               .preempted = result.preempted,
                               .blocked = result.blocked});
            }
        });
    }
    ready.arrive_and_wait();
    start = clock::now();
    started.store(true, std::memory_order_release);  // publishes `start`
    std::this_thread::sleep_until(start + duration);
    stop.store(true);
    for (std::thread& thread : pool) {
        thread.join();
    }
    run_records records;
    records.window_s = std::chrono::duration<double>(duration).count();
    records.wall_s = std::chrono::duration<double>(clock::now() - start).count();
    for (std::vector<record>& part : per_thread) {
        records.calls.insert(records.calls.end(), part.begin(), part.end());
    }
    return records;
}

// ---------------------------------------------------------------------------
// Open loop
// ---------------------------------------------------------------------------

struct open_loop_plan {
    std::vector<std::int64_t> arrivals_ns;   ///< intended starts, since the run's start, ascending
    std::chrono::nanoseconds window{};       ///< the arrival window
    std::chrono::nanoseconds grace = 500ms;  ///< after the window, for calls in progress and queued jobs
    bool alternate_api = true;               ///< even jobs try_transaction, odd ones transaction()
    bool probe = false;                      ///< run the two-thread rejection probe
    std::chrono::nanoseconds probe_period = 10ms;
    std::chrono::nanoseconds probe_burst = 300us;  ///< back-to-back calls per probe thread and round
    std::uint64_t seed = 1;
};

/// Lets the calling thread's timed sleeps end within a microsecond or so
/// instead of the default 50 µs slack (Linux; elsewhere a no-op).
inline void tighten_timer_slack() noexcept {
#if defined(__linux__)
    (void)::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
}

[[nodiscard]] inline run_records run_open_loop(arm& target, const open_loop_plan& plan) {
    struct job {
        std::size_t index;
        clock::time_point intended;
    };
    std::mutex mutex;
    std::condition_variable wake;     // a job, the end of the arrivals, or stop
    std::condition_variable drained;  // the queue is empty and nothing is in flight
    std::deque<job> queue;            // guarded by mutex
    int in_flight = 0;                // guarded by mutex
    bool arrivals_done = false;       // guarded by mutex
    bool stopping = false;            // guarded by mutex

    const int workers = target.workers();
    std::vector<std::vector<record>> per_worker(static_cast<std::size_t>(workers));
    std::latch ready(workers + 1);
    clock::time_point start{};  // written before the first job is queued (published by the mutex)

    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(workers) + 2);
    for (int index = 0; index < workers; ++index) {
        threads.emplace_back([&, index] {
            std::mt19937_64 random(plan.seed * 7919U + static_cast<std::uint64_t>(index));
            std::vector<record>& out = per_worker[static_cast<std::size_t>(index)];
            out.reserve(plan.arrivals_ns.size() / static_cast<std::size_t>(workers) + 1024);
            ready.arrive_and_wait();
            for (;;) {
                job next{};
                {
                    std::unique_lock lock(mutex);
                    wake.wait(lock, [&] { return stopping || arrivals_done || !queue.empty(); });
                    if (stopping) {
                        for (const job& left : queue) {  // whoever wakes first records them
                            out.push_back(
                                {.intended_ns = nanoseconds_between(start, left.intended), .what = outcome::unserved});
                        }
                        queue.clear();
                        return;
                    }
                    if (queue.empty()) {
                        return;  // arrivals done, nothing left
                    }
                    next = queue.front();
                    queue.pop_front();
                    ++in_flight;
                }
                const clock::time_point picked = clock::now();
                const api which = plan.alternate_api && (next.index % 2U == 1U) ? api::throwing : api::try_api;
                const call_result result = target.call(index, next.intended, which, random);
                out.push_back({.intended_ns = nanoseconds_between(start, next.intended),
                               .latency_ns = nanoseconds_between(next.intended, result.ended),
                               .call_ns = nanoseconds_between(result.began, result.ended),
                               .pickup_ns = nanoseconds_between(next.intended, picked),
                               .began_ns = nanoseconds_between(start, result.began),
                               .what = result.what,
                               .which = which,
                               .preempted = result.preempted,
                               .blocked = result.blocked});
                const std::lock_guard lock(mutex);
                if (--in_flight == 0 && queue.empty() && arrivals_done) {
                    drained.notify_all();
                }
            }
        });
    }

    // The probe: two threads meeting at a spin rendezvous each period, then
    // each rejecting back to back for probe_burst (a burst ends early when a
    // call is admitted: the gate was not full).
    std::vector<std::vector<record>> probe_records(2);
    const auto rounds = static_cast<std::size_t>(plan.window / plan.probe_period);
    std::vector<std::atomic<int>> arrived(plan.probe ? rounds : 0);  // per round: no drift after a missed one
    std::atomic<bool> probe_go{false};
    if (plan.probe) {
        for (std::uint8_t slot = 0; slot < 2; ++slot) {
            threads.emplace_back([&, slot] {
                tighten_timer_slack();
                std::mt19937_64 random(plan.seed * 104729U + slot);
                std::vector<record>& out = probe_records[slot];
                out.reserve(1U << 16U);
                while (!probe_go.load(std::memory_order_acquire)) {
                    std::this_thread::sleep_for(1ms);
                }
                const clock::time_point end = start + plan.window;
                for (std::size_t round = 0; round < rounds; ++round) {
                    std::this_thread::sleep_until(start + static_cast<std::int64_t>(round) * plan.probe_period);
                    if (clock::now() >= end) {
                        break;
                    }
                    arrived[round].fetch_add(1);
                    const clock::time_point give_up = clock::now() + plan.probe_period / 2;
                    while (arrived[round].load() < 2 && clock::now() < give_up) {
                    }
                    const api which = round % 2 == 0 ? api::try_api : api::throwing;
                    const clock::time_point burst_end = clock::now() + plan.probe_burst;
                    for (clock::time_point now = clock::now(); now < burst_end; now = clock::now()) {
                        const call_result result = target.call(-1, now, which, random);
                        out.push_back({.intended_ns = nanoseconds_between(start, now),
                                       .latency_ns = nanoseconds_between(now, result.ended),
                                       .call_ns = nanoseconds_between(result.began, result.ended),
                                       .began_ns = nanoseconds_between(start, result.began),
                                       .round = static_cast<std::int64_t>(round),
                                       .what = result.what,
                                       .which = which,
                                       .preempted = result.preempted,
                                       .blocked = result.blocked,
                                       .slot = slot});
                        if (result.what != outcome::rejected_full) {
                            break;
                        }
                    }
                }
            });
        }
    }

    ready.arrive_and_wait();
    tighten_timer_slack();
    start = clock::now() + 20ms;  // the workers settle into their wait first
    probe_go.store(true, std::memory_order_release);
    for (std::size_t index = 0; index < plan.arrivals_ns.size(); ++index) {
        const clock::time_point intended = start + std::chrono::nanoseconds(plan.arrivals_ns[index]);
        if (clock::now() < intended) {
            std::this_thread::sleep_until(intended);
        }
        {
            const std::lock_guard lock(mutex);
            queue.push_back({index, intended});
        }
        wake.notify_one();
    }
    std::this_thread::sleep_until(start + plan.window);
    {
        std::unique_lock lock(mutex);
        arrivals_done = true;
        wake.notify_all();
        drained.wait_until(lock, clock::now() + plan.grace, [&] { return in_flight == 0 && queue.empty(); });
        stopping = true;
        wake.notify_all();
    }
    for (std::thread& thread : threads) {
        thread.join();
    }
    run_records records;
    records.window_s = std::chrono::duration<double>(plan.window).count();
    records.wall_s = std::chrono::duration<double>(clock::now() - start).count();
    for (std::vector<record>& part : per_worker) {
        records.calls.insert(records.calls.end(), part.begin(), part.end());
    }
    for (std::vector<record>& part : probe_records) {
        records.probe.insert(records.probe.end(), part.begin(), part.end());
    }
    return records;
}

// ---------------------------------------------------------------------------
// Figures from records
// ---------------------------------------------------------------------------

/// The q-quantile (nearest rank) of `values`, which it sorts; NaN when empty.
[[nodiscard]] inline double quantile(std::vector<std::int64_t>& values, double q) {
    if (values.empty()) {
        return std::nan("");
    }
    std::sort(values.begin(), values.end());
    const double rank = std::ceil(q * static_cast<double>(values.size()));
    const auto index = static_cast<std::size_t>(std::max(rank, 1.0)) - 1;
    return static_cast<double>(values[std::min(index, values.size() - 1)]);
}

[[nodiscard]] inline bool started_work(outcome what) noexcept {
    return what == outcome::completed || what == outcome::cut_by_deadline || what == outcome::failed;
}

/// What one run comes to.
struct run_summary {
    std::uint64_t offered = 0;
    std::uint64_t on_time = 0;  ///< completed within the deadline
    std::uint64_t late = 0;     ///< completed after it
    std::uint64_t rejected_full = 0;
    std::uint64_t rejected_wait = 0;
    std::uint64_t cut = 0;
    std::uint64_t failed = 0;
    std::uint64_t unserved = 0;
    std::uint64_t reached_database = 0;  ///< calls (probe included) that began a transaction
    double goodput = 0;                  ///< on time, per second of the window
    double throughput = 0;               ///< completed (on time or not), per second of the window
    double admitted_p50_ms = 0, admitted_p99_ms = 0, admitted_p999_ms = 0;
    double rejection_p50_us = 0, rejection_p99_us = 0;    ///< every rejection: the time to say no
    double full_try_p50_us = 0, full_try_p99_us = 0;      ///< admission_full via try_transaction
    double full_throw_p50_us = 0, full_throw_p99_us = 0;  ///< admission_full via transaction()
    std::uint64_t full_try_count = 0, full_throw_count = 0;
    double pickup_p99_ms = 0;  ///< dispatch lag: intended start to a worker taking the job

    [[nodiscard]] double share(std::uint64_t part) const noexcept {
        return offered == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(offered);
    }
};

/// Summarizes the calls with intended start in [from, to) (ns since the
/// start); `deadline` decides what is on time.
[[nodiscard]] inline run_summary summarize(const std::vector<record>& calls, std::chrono::nanoseconds deadline,
                                           double window_s, std::int64_t from = 0, std::int64_t to = INT64_MAX) {
    run_summary summary;
    std::vector<std::int64_t> admitted, rejections, full_try, full_throw, pickups;
    for (const record& call : calls) {
        if (call.intended_ns < from || call.intended_ns >= to) {
            continue;
        }
        ++summary.offered;
        if (call.what != outcome::unserved) {
            pickups.push_back(call.pickup_ns);
        }
        switch (call.what) {
            case outcome::completed:
                if (call.latency_ns <= deadline.count()) {
                    ++summary.on_time;
                } else {
                    ++summary.late;
                }
                break;
            case outcome::rejected_full:
                ++summary.rejected_full;
                (call.which == api::try_api ? full_try : full_throw).push_back(call.call_ns);
                break;
            case outcome::rejected_wait:
                ++summary.rejected_wait;
                break;
            case outcome::cut_by_deadline:
                ++summary.cut;
                break;
            case outcome::failed:
                ++summary.failed;
                break;
            case outcome::unserved:
                ++summary.unserved;
                break;
        }
        if (started_work(call.what)) {
            admitted.push_back(call.latency_ns);
            ++summary.reached_database;
        }
        if (call.what == outcome::rejected_full || call.what == outcome::rejected_wait) {
            rejections.push_back(call.call_ns);
        }
    }
    summary.goodput = static_cast<double>(summary.on_time) / window_s;
    summary.throughput = static_cast<double>(summary.on_time + summary.late) / window_s;
    summary.admitted_p50_ms = quantile(admitted, 0.50) / 1e6;
    summary.admitted_p99_ms = quantile(admitted, 0.99) / 1e6;
    summary.admitted_p999_ms = quantile(admitted, 0.999) / 1e6;
    summary.rejection_p50_us = quantile(rejections, 0.50) / 1e3;
    summary.rejection_p99_us = quantile(rejections, 0.99) / 1e3;
    summary.full_try_count = full_try.size();
    summary.full_throw_count = full_throw.size();
    summary.full_try_p50_us = quantile(full_try, 0.50) / 1e3;
    summary.full_try_p99_us = quantile(full_try, 0.99) / 1e3;
    summary.full_throw_p50_us = quantile(full_throw, 0.50) / 1e3;
    summary.full_throw_p99_us = quantile(full_throw, 0.99) / 1e3;
    summary.pickup_p99_ms = quantile(pickups, 0.99) / 1e6;
    return summary;
}

/// `text` read whole by `parse` (std::stoi, std::stod: value, characters
/// used), or nothing when it is not a number or has anything after one.
template <class T, class Parse>
[[nodiscard]] std::optional<T> whole_number(const std::string& text, Parse parse) {
    std::size_t used = 0;
    try {
        const T value = parse(text, &used);
        if (used == text.size()) {
            return value;
        }
    } catch (const std::exception&) {  // not a number, or out of range
    }
    return std::nullopt;
}

/// A command-line value that must be a whole number, at least 1.
/// \throws std::invalid_argument naming the option and (the start of) the value.
[[nodiscard]] inline int positive_argument(const std::string& option, const std::string& text) {
    const std::optional<int> value =
        whole_number<int>(text, [](const std::string& t, std::size_t* used) { return std::stoi(t, used); });
    if (!value || *value < 1) {
        throw std::invalid_argument(option + " wants a whole number, at least 1, not '" + text.substr(0, 20) + "'");
    }
    return *value;
}

/// A command-line value that must be a number from `at_least` to `at_most`.
/// \throws std::invalid_argument naming the option, the range and (the start of) the value.
[[nodiscard]] inline double ratio_argument(const std::string& option, const std::string& text, double at_least,
                                           double at_most) {
    const std::optional<double> value =
        whole_number<double>(text, [](const std::string& t, std::size_t* used) { return std::stod(t, used); });
    if (!value || !(*value >= at_least) || !(*value <= at_most)) {
        const auto shown = [](double number) {
            std::array<char, 32> text_of{};
            std::snprintf(text_of.data(), text_of.size(), "%g", number);
            return std::string(text_of.data());
        };
        throw std::invalid_argument(option + " wants a number from " + shown(at_least) + " to " + shown(at_most) +
                                    ", not '" + text.substr(0, 20) + "'");
    }
    return *value;
}

/// The server a PostgreSQL benchmark runs against: BULKHEAD_TEST_DATABASE
/// (a libpq connection string, as scripts/bench-on-throwaway sets it).
/// \throws std::runtime_error naming `program` and the variable when it is
///         not set. Call it before starting any thread.
[[nodiscard]] inline std::string database_from_env(const std::string& program) {
    const char* database = std::getenv("BULKHEAD_TEST_DATABASE");  // NOLINT(concurrency-mt-unsafe): no threads yet
    if (database == nullptr) {
        throw std::runtime_error(program + ": set BULKHEAD_TEST_DATABASE to a libpq connection string");
    }
    return database;
}

}  // namespace bulkhead_bench
