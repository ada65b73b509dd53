// bulkhead: the threads the library starts and does not join, and the wait
// for them when the process exits.
//
// The libpqxx layer starts two kinds of short-lived threads that nobody
// joins: a connection attempt that its caller gave up on (it finishes alone
// and gives the connection to the pool), and a cancel request (PQcancel
// connects to the server and waits for it). Each holds what it uses by
// shared_ptr, so nothing it touches is freed under it. What it cannot hold
// is the process: a program that returns from main while one of them is
// inside libpq runs the libraries' exit-time teardown under it (libgssapi,
// which libpq calls while connecting, destroys its mutexes then), which is
// undefined behaviour and what ThreadSanitizer reports.
//
// So every such thread is started here, with the time by which it is
// expected to have ended (its own network timeout). The first one registers
// an exit hook (std::atexit; it runs before the shared libraries' own
// destructors) that waits until none is running, but never past the latest
// of those times: an exit is delayed at most by the longest timeout of a
// thread still running, and not at all when none is.
//
// Thread safety: all members may be called from any thread. A thread's
// work, including the destruction of everything it captured, happens-before
// a running() or wait_until() that no longer counts it (the count is
// changed under one mutex).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

namespace bulkhead::detail {

class detached_threads {
public:
    using clock = std::chrono::steady_clock;

    /// Runs `work()` on a new thread that nobody joins, counted until `work`
    /// and everything it captured are gone. `expected_end` is the time by
    /// which `work` ends on its own (its network timeout); the exit hook
    /// waits for it no longer. An exception from `work` is swallowed.
    /// \returns false (and runs nothing) when no thread could be started.
    template <class Work>
    static bool start(clock::time_point expected_end, Work&& work) noexcept {
        registry& shared = instance();
        std::multiset<clock::time_point>::iterator entry;
        try {
            const std::lock_guard lock(shared.mutex);
            entry = shared.running.insert(expected_end);
        } catch (...) {
            return false;
        }
        register_exit_hook();
        try {
            std::thread([entry, task = std::decay_t<Work>(std::forward<Work>(work))]() mutable noexcept {
                {
                    std::decay_t<Work> own = std::move(task);  // its captures end in this scope
                    try {
                        own();
                    } catch (...) {  // nobody to report to: the work says what it did itself
                    }
                }
                finish(entry);
            }).detach();
            return true;
        } catch (...) {
            finish(entry);
            return false;
        }
    }

    /// Threads started here that have not finished.
    [[nodiscard]] static std::size_t running() noexcept {
        registry& shared = instance();
        const std::lock_guard lock(shared.mutex);
        return shared.running.size();
    }

    /// Waits until no thread started here is running, but not past `until`
    /// nor past the latest expected end of those still running.
    /// \returns true when none is running.
    static bool wait_until(clock::time_point until) noexcept {
        registry& shared = instance();
        std::unique_lock lock(shared.mutex);
        while (!shared.running.empty()) {
            const clock::time_point bound = std::min(until, *shared.running.rbegin());
            if (clock::now() >= bound) {
                return false;
            }
            shared.finished.wait_until(lock, bound);
        }
        return true;
    }

private:
    struct registry {
        std::mutex mutex;
        std::condition_variable finished;          // notified under mutex when one ends
        std::multiset<clock::time_point> running;  // guarded by mutex: expected ends
        std::once_flag hook;
    };

    /// Never destroyed (a union member is destroyed only when its
    /// destructor says so): the exit hook, and a thread still running past
    /// its bound, use it after static destructors may have run.
    static registry& instance() noexcept {
        union never_destroyed {
            registry value;
            never_destroyed() : value() {}
            never_destroyed(const never_destroyed&) = delete;
            never_destroyed& operator=(const never_destroyed&) = delete;
            ~never_destroyed() {}  // NOLINT(modernize-use-equals-default): = default would destroy value
        };
        static never_destroyed shared;
        return shared.value;
    }

    static void finish(std::multiset<clock::time_point>::iterator entry) noexcept {
        registry& shared = instance();
        const std::lock_guard lock(shared.mutex);
        shared.running.erase(entry);
        shared.finished.notify_all();
    }

    static void register_exit_hook() noexcept {
        try {
            std::call_once(instance().hook, [] {
                // Without the hook (the table is full) an exit is not
                // delayed; nothing else changes.
                (void)std::atexit([] { (void)wait_until(clock::time_point::max()); });
            });
        } catch (...) {  // std::system_error from call_once: as above
        }
    }
};

}  // namespace bulkhead::detail
