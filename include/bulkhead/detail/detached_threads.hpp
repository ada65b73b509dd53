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
// A finished thread is still joined, by the next thread that finishes or by
// the exit hook: the libraries run their thread-exit destructors after the
// work (libkrb5support locks a mutex of its own there), and only a join
// orders those before the exit that tears the libraries down
// (ThreadSanitizer reported exactly that race when the count alone was
// waited for).
//
// Thread safety: all members may be called from any thread. A thread's
// work, including the destruction of everything it captured, happens-before
// a running() or wait_until() that no longer counts it (the count is
// changed under one mutex).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <list>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace bulkhead::detail {

class detached_threads {
public:
    using clock = std::chrono::steady_clock;

    /// Runs `work()` on a new thread that nobody waits for, counted until
    /// `work` and everything it captured are gone. `expected_end` is the time
    /// by which `work` ends on its own (its network timeout); the exit hook
    /// waits for it no longer. An exception from `work` is swallowed.
    /// \returns false (and runs nothing) when no thread could be started.
    template <class Work>
    static bool start(clock::time_point expected_end, Work&& work) noexcept {
        registry& shared = instance();
        register_exit_hook();
        try {
            // Under the lock: the new thread's finish() waits until its
            // handle is stored.
            const std::lock_guard lock(shared.mutex);
            const auto entry = shared.threads.insert(shared.threads.end(), thread_entry{expected_end, {}, false});
            try {
                entry->thread =
                    std::thread([entry, task = std::decay_t<Work>(std::forward<Work>(work))]() mutable noexcept {
                        {
                            std::decay_t<Work> own = std::move(task);  // its captures end in this scope
                            try {
                                own();
                            } catch (...) {  // nobody to report to: the work says what it did itself
                            }
                        }
                        finish(entry);
                    });
            } catch (...) {
                shared.threads.erase(entry);
                return false;
            }
            return true;
        } catch (...) {
            return false;
        }
    }

    /// Threads started here that have not finished.
    [[nodiscard]] static std::size_t running() noexcept {
        registry& shared = instance();
        const std::lock_guard lock(shared.mutex);
        return static_cast<std::size_t>(std::count_if(shared.threads.begin(), shared.threads.end(),
                                                      [](const thread_entry& each) { return !each.done; }));
    }

    /// Waits until no thread started here is running, but not past `until`
    /// nor past the latest expected end of those still running.
    /// \returns true when none is running.
    static bool wait_until(clock::time_point until) noexcept {
        registry& shared = instance();
        std::unique_lock lock(shared.mutex);
        for (;;) {
            clock::time_point latest = clock::time_point::min();
            for (const thread_entry& each : shared.threads) {
                if (!each.done) {
                    latest = std::max(latest, each.expected_end);
                }
            }
            if (latest == clock::time_point::min()) {
                return true;
            }
            const clock::time_point bound = std::min(until, latest);
            if (clock::now() >= bound) {
                return false;
            }
            shared.finished.wait_until(lock, bound);
        }
    }

private:
    struct thread_entry {
        clock::time_point expected_end;
        std::thread thread;  // joined once done, by another thread's finish() or the exit hook
        bool done = false;   // the work and its captures are gone
    };

    struct registry {
        std::mutex mutex;
        std::condition_variable finished;  // notified under mutex when one ends
        std::list<thread_entry> threads;   // guarded by mutex
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

    /// Takes the threads that are done, except `self`, out of the registry
    /// (under its mutex), for joining outside it.
    static std::vector<std::thread> take_done(registry& shared, std::thread::id self) noexcept {
        std::vector<std::thread> done;
        for (auto each = shared.threads.begin(); each != shared.threads.end();) {
            if (each->done && each->thread.get_id() != self) {
                try {
                    done.push_back(std::move(each->thread));
                } catch (...) {  // out of memory: joined another time
                    ++each;
                    continue;
                }
                each = shared.threads.erase(each);
            } else {
                ++each;
            }
        }
        return done;
    }

    static void join_all(std::vector<std::thread>& threads) noexcept {
        for (std::thread& each : threads) {
            if (each.joinable()) {
                each.join();  // it is done: this waits for its thread-exit destructors only
            }
        }
    }

    static void finish(std::list<thread_entry>::iterator entry) noexcept {
        registry& shared = instance();
        std::vector<std::thread> done;
        {
            const std::lock_guard lock(shared.mutex);
            entry->done = true;
            done = take_done(shared, std::this_thread::get_id());
            shared.finished.notify_all();
        }
        join_all(done);
    }

    /// The exit hook: waits for the running threads (bounded), joins those
    /// that are done, leaves the others be.
    static void at_exit() noexcept {
        (void)wait_until(clock::time_point::max());
        registry& shared = instance();
        std::vector<std::thread> done;
        {
            const std::lock_guard lock(shared.mutex);
            done = take_done(shared, std::this_thread::get_id());
            for (thread_entry& each : shared.threads) {
                if (each.thread.joinable()) {
                    each.thread.detach();  // still running past its bound: not waited for
                }
            }
        }
        join_all(done);
    }

    static void register_exit_hook() noexcept {
        try {
            std::call_once(instance().hook, [] {
                // Without the hook (the table is full) an exit is not
                // delayed; nothing else changes.
                (void)std::atexit(at_exit);
            });
        } catch (...) {  // std::system_error from call_once: as above
        }
    }
};

}  // namespace bulkhead::detail
