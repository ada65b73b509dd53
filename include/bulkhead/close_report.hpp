// bulkhead: what closing a gate or a pool saw (db_bulkhead::close(),
// pqxx_pool::close()), and the end of a process that destroys either with
// work still inside.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

namespace bulkhead {

/// What close() saw. For a gate the units are calls (each holds an
/// admission slot, queued or running; so does, for an instant, a call
/// being refused because the gate is closed); for a pool, leases out and
/// threads waiting for one. A gate counts in_flight before it closes, and
/// also counts there a call admitted in that instant if it is still
/// inside at the deadline.
struct close_report {
    int in_flight = 0;      ///< inside when close() began
    int cancelled = 0;      ///< still inside at the deadline, and asked to stop (a pool stops nothing: 0)
    int still_running = 0;  ///< still inside when close() returned

    /// Those that ended on their own before the deadline.
    [[nodiscard]] int finished() const noexcept { return std::max(in_flight - cancelled, 0); }

    /// Nothing is inside any more: the gate or pool may be destroyed.
    [[nodiscard]] bool drained() const noexcept { return still_running == 0; }
};

namespace detail {

/// close()'s wait, for a gate and a pool alike: until `busy()` is zero or
/// `until`, polled every millisecond (a shutdown can spare that; the calls
/// pay nothing for it). Returns the last count seen, so that a report
/// says what the wait itself saw.
template <class Busy>
int wait_until_idle(std::chrono::steady_clock::time_point until, Busy busy) {
    for (auto now = std::chrono::steady_clock::now();; now = std::chrono::steady_clock::now()) {
        const int left = busy();
        if (left == 0 || now >= until) {
            return left;
        }
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(1), until - now));
    }
}

/// A gate or pool destroyed with work inside: that work would touch freed
/// memory. Says so on stderr and ends the process, in every build.
[[noreturn, gnu::cold]] inline void die_with_calls_inside(const char* what, int inside) noexcept {
    std::fprintf(stderr,
                 "%s destroyed with %d call(s) still inside; close() it and destroy it only once close() reports "
                 "it drained\n",
                 what, inside);
    std::terminate();
}

}  // namespace detail
}  // namespace bulkhead
