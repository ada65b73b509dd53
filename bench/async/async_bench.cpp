// bulkhead: the figures of coroutine callers (issue 14, docs/performance.md
// "Coroutine callers"), each next to a baseline measured in the same run:
//
//   rejection  time and operator-new calls per rejection (admission full)
//              with a callback token and with as_tuple(use_awaitable),
//              against a bare asio::post of the same handler and a bare
//              co_await of asio::post (what the token itself forces), and the
//              blocking try_transaction;
//   handoff    latency from a permit's release to the next caller's callback
//              starting, thread to coroutine and coroutine to coroutine,
//              against thread to thread; p50/p99 and voluntary context
//              switches per handoff: every time a thread of the process
//              blocked between the release and the waiter's completion (the
//              measuring thread spins meanwhile, so it adds none).
//
//   bulkhead_async_bench [--rejections K] [--handoffs M]
//
// Memory per waiting caller is bench/async/waiter_memory.cpp's: each kind
// in a process of its own.
//
// A null pool (bench/micro/null_pool.hpp) stands in for the database:
// what is measured is the gate. Prints Markdown.
#include "asio_support.hpp"  // tests/support: standalone Asio, as the tests use it
#include "bench_support.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <latch>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

namespace {

using bulkhead_test::as_tuple;

using bulkhead_bench::null_pool;
using gate_t = bulkhead::db_bulkhead<null_pool>;
using clock_type = std::chrono::steady_clock;

long voluntary_switches() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_nvcsw;
}

void spin_until(const std::atomic<bool>& flag) {
    while (!flag.load(std::memory_order_acquire)) {
        std::this_thread::yield();
    }
}

/// Yields until `done()`: the waiting thread never blocks (a yield counts
/// as an involuntary switch, if any), so the process's voluntary context
/// switches count only the threads measured, and on a loaded machine it
/// still lets them run.
template <class Predicate>
void spin_for(Predicate done) {
    while (!done()) {
        std::this_thread::yield();
    }
}

template <class Predicate>
void wait_for(Predicate done) {
    while (!done()) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

double ns(clock_type::duration d) { return std::chrono::duration<double, std::nano>(d).count(); }

double percentile(std::vector<double> values, double p) {
    std::sort(values.begin(), values.end());
    const auto index = static_cast<std::size_t>(p * static_cast<double>(values.size() - 1));
    return values[index];
}

// --- rejection ---------------------------------------------------------------

struct per_call {
    double nanoseconds;
    double allocations;
};

template <class Body>
per_call measure_loop(int count, Body&& body) {
    const std::uint64_t allocations = bulkhead_bench::allocations_on_this_thread();
    const auto start = clock_type::now();
    body();
    const auto took = clock_type::now() - start;
    return {ns(took) / count, static_cast<double>(bulkhead_bench::allocations_on_this_thread() - allocations) / count};
}

void rejection(int count) {
    std::printf("## Asynchronous rejection (admission full)\n\n");
    std::printf("| form | ns per call | operator new per call | ratio to its baseline |\n|---|---|---|---|\n");
    bulkhead_bench::full_gate<> gate;
    asio::io_context io(1);
    int handled = 0;
    gate->async_transaction(
        {}, [](null_pool::work&) {}, [](std::error_code) {});  // starts the work threads
    io.poll();
    io.restart();
    constexpr int batch = 1000;

    auto bare_post = measure_loop(count, [&] {
        for (int i = 0; i < count; i += batch) {
            for (int j = 0; j < batch; ++j) {
                asio::post(io, [&handled] { ++handled; });
            }
            io.poll();
            io.restart();
        }
    });
    auto callback = measure_loop(count, [&] {
        for (int i = 0; i < count; i += batch) {
            for (int j = 0; j < batch; ++j) {
                gate->async_transaction(
                    {}, [](null_pool::work&) {}, asio::bind_executor(io, [&handled](std::error_code) { ++handled; }));
            }
            io.poll();
            io.restart();
        }
    });
    std::printf("| asio::post of a callback (baseline) | %.1f | %.2f | 1.00 |\n", bare_post.nanoseconds,
                bare_post.allocations);
    std::printf("| async_transaction, callback token | %.1f | %.2f | %.2f |\n", callback.nanoseconds,
                callback.allocations, callback.nanoseconds / bare_post.nanoseconds);

    auto awaited = [&](bool through_gate) {
        return measure_loop(count, [&] {
            asio::co_spawn(
                io,
                [&]() -> asio::awaitable<void> {
                    for (int i = 0; i < count; ++i) {
                        if (through_gate) {
                            auto [ec] = co_await gate->async_transaction(
                                {}, [](null_pool::work&) {}, as_tuple(asio::use_awaitable));
                            handled += ec ? 1 : 0;
                        } else {
                            co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
                            ++handled;
                        }
                    }
                },
                asio::detached);
            io.run();
            io.restart();
        });
    };
    const per_call bare_await = awaited(false);
    const per_call gate_await = awaited(true);
    std::printf("| co_await asio::post (baseline) | %.1f | %.2f | 1.00 |\n", bare_await.nanoseconds,
                bare_await.allocations);
    std::printf("| co_await async_transaction, as_tuple(use_awaitable) | %.1f | %.2f | %.2f |\n",
                gate_await.nanoseconds, gate_await.allocations, gate_await.nanoseconds / bare_await.nanoseconds);
    const per_call blocking = measure_loop(count, [&] {
        for (int i = 0; i < count; ++i) {
            handled += gate->try_transaction(std::chrono::nanoseconds(0), [](null_pool::work&) {}) ? 0 : 1;
        }
    });
    std::printf("| try_transaction, blocking API (for comparison) | %.1f | %.2f | |\n\n", blocking.nanoseconds,
                blocking.allocations);
    if (handled == 0) {
        std::abort();
    }
}

// --- handoff -----------------------------------------------------------------

struct handoff_figures {
    double p50;
    double p99;
    double switches;
};

/// M handoffs: the holder releases at t0, the waiter's callback starts at t1.
template <class StartWaiter, class Hold, class Release>
handoff_figures handoffs(int count, gate_t& gate, StartWaiter&& start_waiter, Hold&& hold, Release&& release) {
    std::vector<double> samples;
    samples.reserve(static_cast<std::size_t>(count));
    long switches = 0;
    for (int i = 0; i < count; ++i) {
        std::atomic<clock_type::time_point::rep> started{0};
        std::atomic<bool> finished{false};
        hold();
        start_waiter(started, finished);
        wait_for([&] { return gate.waiting() == 1; });
        const long before = voluntary_switches();
        const auto t0 = clock_type::now();
        release(t0);
        spin_for([&] { return finished.load(); });
        switches += voluntary_switches() - before;
        samples.push_back(ns(clock_type::time_point(clock_type::duration(started.load())) - t0));
    }
    return {percentile(samples, 0.5), percentile(samples, 0.99), static_cast<double>(switches) / count};
}

void handoff(int count) {
    std::printf("## Handoff: a permit released to a waiting caller\n\n");
    std::printf("| from → to | p50 µs | p99 µs | voluntary switches per handoff (process) |\n|---|---|---|---|\n");
    null_pool pool;
    gate_t gate(pool, 1, 1);
    asio::io_context io(1);
    auto loop_guard = asio::make_work_guard(io);
    std::thread loop([&] { io.run(); });
    gate.async_transaction(
            {}, [](null_pool::work&) {}, asio::use_future)
        .get();  // starts the work threads

    std::optional<bulkhead::permit> held;
    auto thread_hold = [&] { held.emplace(gate.enter()); };
    auto thread_release = [&](clock_type::time_point) { held.reset(); };
    auto record_start = [](std::atomic<clock_type::time_point::rep>& started) {
        started = clock_type::now().time_since_epoch().count();
    };

    std::thread waiter_thread;
    const auto thread_to_thread = handoffs(
        count, gate,
        [&](auto& started, auto& finished) {
            waiter_thread = std::thread([&] {
                gate.transaction(std::chrono::hours(1), [&](null_pool::work&) { record_start(started); });
                finished = true;
            });
        },
        thread_hold,
        [&](clock_type::time_point t0) {
            thread_release(t0);
            waiter_thread.join();
        });
    auto coroutine_waiter = [&](auto& started, auto& finished) {
        asio::post(io, [&] {
            gate.async_transaction(
                {.queue_wait = std::chrono::hours(1)}, [&](null_pool::work&) { record_start(started); },
                [&](std::error_code) { finished = true; });
        });
    };
    const auto thread_to_coroutine = handoffs(count, gate, coroutine_waiter, thread_hold, thread_release);

    // Coroutine to coroutine: the holder is a coroutine whose callback (on a
    // work thread) returns when told; the permit is released after its cleanup.
    std::atomic<bool> let_go{false};
    std::atomic<bool> holder_done{false};
    const auto coroutine_to_coroutine = handoffs(
        count, gate, coroutine_waiter,
        [&] {
            let_go = false;
            holder_done = false;
            std::atomic<bool> running{false};
            asio::post(io, [&] {
                gate.async_transaction(
                    {},
                    [&](null_pool::work&) {
                        running = true;
                        spin_until(let_go);
                    },
                    [&](std::error_code) { holder_done = true; });
            });
            spin_until(running);
        },
        [&](clock_type::time_point) { let_go = true; });
    wait_for([&] { return holder_done.load(); });
    std::printf("| thread → thread (baseline) | %.1f | %.1f | %.2f |\n", thread_to_thread.p50 / 1000,
                thread_to_thread.p99 / 1000, thread_to_thread.switches);
    std::printf("| thread → coroutine | %.1f | %.1f | %.2f |\n", thread_to_coroutine.p50 / 1000,
                thread_to_coroutine.p99 / 1000, thread_to_coroutine.switches);
    std::printf("| coroutine → coroutine | %.1f | %.1f | %.2f |\n\n", coroutine_to_coroutine.p50 / 1000,
                coroutine_to_coroutine.p99 / 1000, coroutine_to_coroutine.switches);
    loop_guard.reset();
    loop.join();
}

int argument(int argc, char** argv, const char* name, int fallback) {
    for (int i = 1; i + 1 < argc; ++i) {
        if (std::strcmp(argv[i], name) == 0) {
            return std::atoi(argv[i + 1]);
        }
    }
    return fallback;
}

}  // namespace

int main(int argc, char** argv) {
    const int rejections = argument(argc, argv, "--rejections", 200000);
    const int handoff_count = argument(argc, argv, "--handoffs", 2000);
    std::printf("# bulkhead coroutine callers: %d rejections, %d handoffs; Asio %d\n\n", rejections, handoff_count,
                ASIO_VERSION);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    rejection(rejections);
    handoff(handoff_count);
    return 0;
}
