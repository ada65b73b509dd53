// bulkhead: how a thread waits for a permit in a queue of nodes.
//
// The waiting half of fifo_semaphore and of the workload scheduler: a
// blocked thread's node (detail::waiter, on its own stack) is queued under
// the owner's mutex; a release decides under that mutex whom to grant,
// unlinks the node, and with the mutex released marks it granted under the
// node's own lock, wakes it and finally sets `handed_over`. A waiter whose
// deadline passes or whose stop_token fires takes the owner's mutex: still
// queued, it leaves and holds nothing; no longer queued, the grant on its way
// wins and the waiter holds the permit. Either way one party owns each
// permit. A granted waiter returns only after `handed_over`, so its node
// outlives the granter's last touch (fifo_semaphore.hpp's file comment has
// the whole protocol; tests/model/ checks it).
#pragma once

#include <bulkhead/detail/wait_queue.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <type_traits>

namespace bulkhead {

/// How a wait that can time out or be cancelled ended.
enum class wait_status : std::uint8_t {
    acquired,   ///< a permit is held; the caller must release it
    timed_out,  ///< the deadline passed first; nothing is held
    cancelled,  ///< a stop was requested first; nothing is held
};

namespace detail {

/// A wait without a deadline.
struct no_deadline {};

/// The time from now until `abs_time`, computed in floating point so that
/// no time point (max(), coarse durations) can overflow.
template <class Clock, class Duration>
std::chrono::duration<double> time_left(const std::chrono::time_point<Clock, Duration>& abs_time) {
    using std::chrono::duration;
    return duration<double>(abs_time.time_since_epoch()) - duration<double>(Clock::now().time_since_epoch());
}

/// A relative wait becomes one steady_clock deadline; a wait too long to
/// represent (hours::max()) saturates to "no deadline"; a zero, negative
/// or NaN wait means "do not wait".
template <class Rep, class Period>
std::optional<std::chrono::steady_clock::time_point> relative_deadline(
    const std::chrono::duration<Rep, Period>& rel_time) {
    using namespace std::chrono;
    const auto now = steady_clock::now();
    if (!(duration<double>(rel_time).count() > 0.0)) {  // also NaN
        return now;
    }
    if (duration<double>(rel_time) >= duration<double>(steady_clock::time_point::max() - now)) {
        return std::nullopt;
    }
    return now + ceil<steady_clock::duration>(rel_time);
}

/// Runs in the thread that requests a stop: marks the waiter cancelled
/// under the node's lock (so the wake cannot be missed), then wakes it.
/// The node outlives this: the waiter's ~stop_callback waits for a
/// callback that is running.
struct cancel_waiter {
    waiter* node;
    void operator()() const noexcept {
        {
            const std::lock_guard lock(node->lock);
            node->cancelled = true;
        }
        node->wake.notify_one();
    }
};

/// A granted waiter's last step: the releaser may still be inside its
/// notify (a syscall, about a microsecond); the node must outlive that.
/// Spins briefly (the releaser usually runs on another core), then
/// yields (it may have been preempted by this very thread), then sleeps
/// with a growing pause: a yield does not let a releaser of lower
/// real-time priority run, a sleep does.
inline void await_handed_over(const waiter& node) noexcept {
    constexpr int spins = 1000;
    constexpr int yields = 100;
    int round = 0;
    auto pause = std::chrono::microseconds(1);
    while (!node.handed_over.load(std::memory_order_acquire)) {
        if (round < spins) {
            cpu_relax();
            ++round;
        } else if (round < spins + yields) {
            std::this_thread::yield();
            ++round;
        } else {
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::microseconds(1000));
        }
    }
}

/// Sleeps on the node until it is granted (acquired), cancelled or
/// `deadline` passes (timed_out). A grant is checked first, so it wins
/// over a timeout or a stop seen at the same time.
template <class Deadline>
wait_status sleep_on(waiter& node, const Deadline& deadline) noexcept {
    std::unique_lock node_lock(node.lock);
    for (;;) {
        if (node.granted) {
            return wait_status::acquired;
        }
        if (node.cancelled) {
            return wait_status::cancelled;
        }
        if constexpr (std::is_same_v<Deadline, no_deadline>) {
            node.wake.wait(node_lock);
        } else if (node.wake.wait_until(node_lock, deadline) == std::cv_status::timeout && !node.granted &&
                   !node.cancelled) {
            return wait_status::timed_out;
        }
    }
}

/// A thread's wait for a permit from `owner`, which provides, each called
/// with `owner.mutex()` held: `bool take_or_enqueue(queue_node&)` (takes a
/// permit now and returns true, or queues the node and returns false) and
/// `void leave(queue_node&)` (unlinks a node that is still queued). Its
/// grants unlink the node under that mutex and then call node.grant.
template <class Owner, class Deadline>
wait_status wait_for_grant(Owner& owner, const Deadline& deadline, const std::stop_token* stop) {
    waiter node;
    // The stop callback is registered first: if the stop was already
    // requested it runs right here. It is destroyed (and, if running
    // elsewhere, waited for) before `node` goes away.
    std::optional<std::stop_callback<cancel_waiter>> on_stop;
    if (stop != nullptr && stop->stop_possible()) {
        on_stop.emplace(*stop, cancel_waiter{&node});
    }
    {
        const std::lock_guard node_lock(node.lock);
        if (node.cancelled) {
            return wait_status::cancelled;
        }
    }
    {
        const std::lock_guard lock(owner.mutex());
        if (owner.take_or_enqueue(node)) {
            return wait_status::acquired;
        }
    }
    // From here noexcept in effect: a failure to lock (std::system_error,
    // which glibc's mutexes do not raise) would leave the dead node linked
    // in the queue; std::terminate is the only safe outcome.
    return [&]() noexcept {
        wait_status outcome = sleep_on(node, deadline);
        if (outcome != wait_status::acquired) {
            std::unique_lock lock(owner.mutex());
            if (node.queued) {
                owner.leave(node);  // no release can reach it any more
                return outcome;
            }
            // Unlinked by a grant: it is on its way and wins.
            lock.unlock();
            std::unique_lock node_lock(node.lock);
            node.wake.wait(node_lock, [&node] { return node.granted; });
            outcome = wait_status::acquired;
        }
        await_handed_over(node);
        return outcome;
    }();
}

/// As above, for an optional deadline (nullopt: none).
template <class Owner, class Deadline>
wait_status wait_for_grant(Owner& owner, const std::optional<Deadline>& deadline, const std::stop_token* stop) {
    return deadline ? wait_for_grant(owner, *deadline, stop) : wait_for_grant(owner, no_deadline{}, stop);
}

}  // namespace detail
}  // namespace bulkhead
