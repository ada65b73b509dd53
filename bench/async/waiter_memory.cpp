// bulkhead: what a coroutine queued for a permit costs in memory (contract
// F11; docs/performance.md "Coroutine callers", docs/async.md).
//
//   bulkhead_waiter_memory [--waiters N] [--max-excess BYTES]
//
// Measures each kind of waiter in a process of its own (this program runs
// itself once per kind): an allocator hands memory an earlier measurement
// freed to the next one, so two measurements in one process understate the
// second. Each child grows its resident set by N parked waiters, all
// created after the fixed costs (the gate, its work threads, the timer
// thread, the event loop) are paid, and reports the growth:
//
//   bare      a coroutine (a lambda's, as the gate's below) parked on the
//             cheapest Asio operation there is, one that only keeps its
//             handler (the baseline: what any awaiting coroutine costs);
//   gate      a coroutine queued in a held gate (B = 1) with a queue wait,
//             co_await async_transaction(..., as_tuple(use_awaitable));
//   callback  a plain callback queued in the gate: the gate's own state,
//             with no coroutine;
//   thread    a thread blocked in transaction() (default stack), for
//             comparison; at most 2,000 of them.
//
// Prints a Markdown table; with --max-excess, measures the first two kinds
// only and exits 1 unless a queued coroutine costs at most BYTES more than
// a bare one (the [F11] test).
// A null pool stands in for the database: what is measured is the gate.
#include "asio_support.hpp"  // tests/support: standalone Asio, as the tests use it
#include "null_pool.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using bulkhead_bench::null_pool;
using bulkhead_test::as_tuple;

/// Resident set size of this process, in bytes (/proc/self/statm).
long resident_bytes() {
    std::ifstream statm("/proc/self/statm");
    long pages = 0;
    long resident = 0;
    statm >> pages >> resident;
    return resident * sysconf(_SC_PAGESIZE);
}

/// The handlers of the bare waiters, kept so that they stay parked.
template <class Handler>
std::vector<Handler>& parked_handlers() {
    static std::vector<Handler> handlers;
    return handlers;
}

/// An Asio operation that completes never: it only keeps its handler
/// (the vector's storage is reserved by the first call and becomes
/// resident as each waiter writes its handler, as any parked state would).
auto park(int waiters) {
    auto token = as_tuple(asio::use_awaitable);
    return asio::async_initiate<decltype(token), void()>(
        [waiters](auto handler) {
            auto& handlers = parked_handlers<decltype(handler)>();
            handlers.reserve(static_cast<std::size_t>(waiters));
            handlers.push_back(std::move(handler));
        },
        token);
}

/// A coroutine of the caller's that awaits park(), as the gate's waiters
/// await the gate.
void spawn_parked(asio::io_context& io, int waiters) {
    asio::co_spawn(
        io, [waiters]() -> asio::awaitable<void> { co_await park(waiters); }, asio::detached);
}

/// Prints `grown` and ends the process at once: the waiters stay parked,
/// the gate full (destroying it would end the process with a message).
[[noreturn]] void report(long grown) {
    std::printf("%ld\n", grown);
    std::fflush(stdout);
    std::_Exit(0);
}

/// One measurement: reports the resident set's growth for `waiters`
/// waiters of `kind`.
[[noreturn]] void measure(const std::string& kind, int waiters) {
    asio::io_context io(1);
    if (kind == "bare") {
        // The first waiter pays the first-use costs (the event loop's, the
        // coroutine machinery's), as the gate's fixed costs are paid below.
        spawn_parked(io, waiters);
        io.poll();
        const long before = resident_bytes();
        for (int i = 1; i < waiters; ++i) {
            spawn_parked(io, waiters);
        }
        io.poll();
        report((resident_bytes() - before) * waiters / (waiters - 1));
    }
    null_pool pool;
    using gate_t = bulkhead::db_bulkhead<null_pool>;
    gate_t gate(pool, 1, waiters + 1);
    // The one permit, held by a thread of its own (a caller inside the gate
    // may not call it again) until the process ends: every call below queues.
    std::latch entered(1);
    std::thread([&gate, &entered] {
        const bulkhead::permit held = gate.enter();
        entered.count_down();
        std::this_thread::sleep_for(std::chrono::hours(24));
    }).detach();
    entered.wait();
    // Fixed costs first: the work threads, the timer thread, the queue's
    // first node.
    gate.async_transaction(
        {.queue_wait = std::chrono::hours(1)}, [](null_pool::work&) {}, [](std::error_code) {});
    const gate_t::options options{.queue_wait = std::chrono::hours(1)};
    const auto work = [](null_pool::work&) {};
    const long before = resident_bytes();
    if (kind == "gate") {
        for (int i = 0; i < waiters; ++i) {
            asio::co_spawn(
                io,
                [&]() -> asio::awaitable<void> {
                    auto [ec] = co_await gate.async_transaction(options, work, as_tuple(asio::use_awaitable));
                    (void)ec;
                },
                asio::detached);
        }
        io.poll();
    } else if (kind == "callback") {
        for (int i = 0; i < waiters; ++i) {
            gate.async_transaction(options, work, [](std::error_code) {});
        }
    } else if (kind == "thread") {
        for (int i = 0; i < waiters; ++i) {
            std::thread([&gate] { gate.transaction(std::chrono::hours(1), [](null_pool::work&) {}); }).detach();
        }
        while (gate.waiting() < waiters + 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    } else {
        std::fprintf(stderr, "bulkhead_waiter_memory: unknown kind %s (bare, gate, callback, thread)\n", kind.c_str());
        std::exit(2);
    }
    if (gate.waiting() != waiters + 1) {
        std::fprintf(stderr, "bulkhead_waiter_memory: %d waiting, not %d\n", gate.waiting(), waiters + 1);
        std::exit(2);
    }
    report(resident_bytes() - before);
}

/// Runs this program for one kind and reads what it reports.
long measure_in_child(const char* self, const std::string& kind, int waiters) {
    const std::string command = std::string(self) + " --kind " + kind + " --waiters " + std::to_string(waiters);
    FILE* child = popen(command.c_str(), "r");
    long grown = -1;
    if (child == nullptr || std::fscanf(child, "%ld", &grown) != 1) {
        std::fprintf(stderr, "bulkhead_waiter_memory: %s reported nothing\n", command.c_str());
        std::exit(2);
    }
    if (pclose(child) != 0) {
        std::fprintf(stderr, "bulkhead_waiter_memory: %s failed\n", command.c_str());
        std::exit(2);
    }
    return grown;
}

const char* argument(int argc, char** argv, const char* name, const char* fallback) {
    for (int i = 1; i + 1 < argc; ++i) {
        if (std::strcmp(argv[i], name) == 0) {
            return argv[i + 1];
        }
    }
    return fallback;
}

}  // namespace

int main(int argc, char** argv) {
    const int waiters = std::atoi(argument(argc, argv, "--waiters", "100000"));
    if (waiters < 2) {
        std::fprintf(stderr, "bulkhead_waiter_memory: --waiters must be at least 2\n");
        return 2;
    }
    if (const char* kind = argument(argc, argv, "--kind", nullptr)) {
        measure(kind, waiters);
    }
    const long max_excess = std::atol(argument(argc, argv, "--max-excess", "0"));
    const std::string self = "/proc/" + std::to_string(getpid()) + "/exe";
    const double bare = static_cast<double>(measure_in_child(self.c_str(), "bare", waiters)) / waiters;
    const double gate = static_cast<double>(measure_in_child(self.c_str(), "gate", waiters)) / waiters;
    std::printf("# Memory per waiter: %d waiters, each kind in a process of its own; Asio %d\n\n", waiters,
                ASIO_VERSION);
    std::printf("| waiter | per waiter | beyond a bare coroutine |\n|---|---|---|\n");
    std::printf("| coroutine parked on an Asio operation that only keeps its handler (baseline) | %.0f B | |\n", bare);
    std::printf("| coroutine queued in the gate, `as_tuple(use_awaitable)` | %.0f B | %.0f B |\n", gate, gate - bare);
    if (max_excess == 0) {  // the test needs the two above only
        const double callback = static_cast<double>(measure_in_child(self.c_str(), "callback", waiters)) / waiters;
        const int threads = std::min(waiters, 2000);
        const double thread = static_cast<double>(measure_in_child(self.c_str(), "thread", threads)) / threads;
        std::printf("| callback queued in the gate (the gate's own state, no coroutine) | %.0f B | |\n", callback);
        std::printf("| thread blocked in `transaction()`, default stack (%d of them) | %.0f B | |\n", threads, thread);
    }
    if (max_excess > 0 && gate - bare > static_cast<double>(max_excess)) {
        std::printf("\nFAILED: a queued coroutine costs %.0f B beyond a bare one, more than %ld\n", gate - bare,
                    max_excess);
        return 1;
    }
    return 0;
}
