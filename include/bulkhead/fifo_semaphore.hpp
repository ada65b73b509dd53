// bulkhead: a strict-FIFO counting semaphore for threads and asynchronous callers.
//
// fifo_semaphore hands out permits in arrival order. It is the execution
// stage of a gate: of all callers admitted, at most B run, the rest queue here
// and are served oldest first.
//
// Fairness. Strict FIFO among waiters: a release() that finds waiters hands
// its permit to the oldest one. No barging: while anyone is queued, no
// newcomer can take a permit, even one counted free for a moment;
// try_acquire() fails then, so it never overtakes a waiter. Each permit
// released wakes at most one thread, the one it was given to; there is no
// wake-all.
//
// Costs. When nobody waits, try_acquire() is one compare-and-swap and
// release() one fetch_add on a single atomic word: no lock, no syscall. Waiting
// takes the mutex, and the waiter's queue node (with its own mutex and
// condition variable) lives on the waiting thread's stack: no allocation per
// wait. A handoff wakes the grantee once: the releaser notifies it holding no
// lock, so the woken thread does not block again on a lock its waker still
// holds (which, with the notify under a lock, happened to about half of all
// handoffs and cost a second wake).
//
// The state word. m_state packs two 32-bit counts: the free permits (low
// half, stored with a bias of 2^31 so that it can go negative) and the
// queued waiters (high half). The waiter count changes only
// under the mutex, together with the queue (so under the mutex it equals the
// queue's length). Nobody takes a free permit while the waiter count is
// non-zero except hand_over(), under the mutex: try_acquire() fails then, and
// take_or_enqueue() queues. release() is one fetch_add, whatever it finds;
// if it saw waiters, it then takes the mutex and hand_over() moves free
// permits to the oldest waiters while both remain. Invariant: "waiters > 0
// and free permits > 0" holds only while some release() that saw waiters has
// not yet finished its hand_over(), which then grants those permits (or finds
// the waiters gone: timed out or cancelled meanwhile, leaving the permits
// free for anyone). tests/model/fifo_semaphore.pml checks this in every
// state of its configurations.
//
// Shrinking. shrink(n) takes n permits out of circulation with one
// fetch_sub: free ones at once; the rest make the free count negative, a
// debt that the next releases pay (their fetch_add brings it back towards
// zero, and hand_over() serves nobody while it is not positive). Growing is
// release(n). So a limit that moves (adaptive_limit.hpp) never waits for a
// holder, never takes a permit from one, and never strands a waiter: a
// shrink only lowers the free count, and every grow goes through release()
// and its hand_over().
//
// Timeout or cancellation racing a release. Under the mutex, hand_over()
// decides whom to grant: it unlinks the oldest waiters (`queued` = false),
// then, with the mutex released, marks each granted under the node's own
// lock, notifies it, and finally sets `handed_over`, its last touch of the
// node. A waiter whose deadline expires, or whose stop_token fires, takes
// the semaphore's mutex: if it is still queued, no release can reach it any
// more; it unlinks itself and reports `timed_out` / `cancelled`. If it is no
// longer queued, a grant is on its way and wins: the waiter waits for it and
// reports `acquired` (the caller now holds the permit and must release it).
// Either way exactly one party owns each permit: none is lost, none is
// duplicated. A granted waiter returns only after `handed_over`, so its
// node (on its stack) outlives the releaser's use of it. The unit tests run
// these races many thousands of times (tests/unit/fifo_semaphore_test.cpp);
// tests/model/fifo_semaphore.pml checks every interleaving of its
// configurations (3 threads making one call each, 2 threads making two, 4
// threads with 2 permits, threads mixed with async nodes whose cancel()
// races their grant, and a resizer whose shrink() and grow race them all;
// see tests/model/CMakeLists.txt).
//
// Asynchronous waiters. A caller that must not block a thread (a coroutine,
// see asio.hpp) queues an async_node instead: acquire_or_enqueue() takes a
// permit at once or links the node into the same queue as the blocked
// threads, in the same arrival order, and returns. hand_over() treats both
// kinds alike: it unlinks the oldest nodes under the mutex, then, with the
// mutex released, calls each one's grant: a thread's marks it granted and
// wakes it (one wake), an async node's runs the caller's on_granted on the
// releasing thread. cancel() is the async form of a timeout or a stop:
// under the mutex, a node still queued leaves and holds nothing; a node no
// longer queued has a grant on its way, which wins. The node lives in the
// caller's operation state (allocated by its completion token), so waiting
// allocates nothing here either.
//
// Thread safety and memory ordering. All members may be called concurrently.
// A successful acquire synchronizes with the release that provided the
// permit: on the fast path through acquire/release on m_state; on the slow
// path the permit's releaser publishes through m_state (release) to
// hand_over()'s compare-and-swap (acquire), and hand_over() marks the node
// granted under the node's lock, where the waiter reads it; an async node's
// on_granted runs on the thread that did that CAS, after it. Destroying a
// semaphore while anyone waits on it is undefined behaviour, as for
// std::counting_semaphore.
#pragma once

#include <bulkhead/detail/blocking_wait.hpp>
#include <bulkhead/detail/wait_queue.hpp>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <thread>
#include <type_traits>

namespace bulkhead {

namespace detail {
class workload_scheduler;
}  // namespace detail

/// A counting semaphore that serves waiters in strict arrival order.
/// \note Fairness: strict FIFO; try_acquire() fails while anyone is queued.
class fifo_semaphore {
public:
    /// The most permits a semaphore can hold.
    static constexpr std::int64_t max_permits = std::numeric_limits<std::int32_t>::max();

    /// Creates a semaphore with `permits` free permits.
    /// \throws std::invalid_argument when permits is negative or above max_permits.
    explicit fifo_semaphore(std::int64_t permits) : m_state(checked_permits(permits) + bias) {}

    fifo_semaphore(const fifo_semaphore&) = delete;
    fifo_semaphore& operator=(const fifo_semaphore&) = delete;

    /// Takes a permit if one is free and nobody is queued. Never blocks.
    /// \note Fails while anyone waits, even if a permit is about to be handed
    /// over: it never overtakes a queued waiter.
    [[nodiscard]] bool try_acquire() noexcept {
        // relaxed load: a starting guess, the CAS re-validates it.
        std::uint64_t seen = m_state.load(std::memory_order_relaxed);
        do {
            if (waiters_of(seen) != 0 || !has_free(seen)) {
                return false;
            }
            // acquire on success: pairs with the release CAS/fetch_add in release().
        } while (!m_state.compare_exchange_weak(seen, seen - 1, std::memory_order_acquire, std::memory_order_relaxed));
        return true;
    }

    /// Blocks until a permit is granted.
    void acquire() {
        if (!try_acquire()) {
            (void)wait(detail::no_deadline{}, nullptr);
        }
    }

    /// Blocks until a permit is granted or `stop` is requested.
    /// \returns acquired or cancelled.
    [[nodiscard]] wait_status acquire(const std::stop_token& stop) {
        if (stop.stop_requested()) {
            return wait_status::cancelled;
        }
        return try_acquire() ? wait_status::acquired : wait(detail::no_deadline{}, &stop);
    }

    /// Waits at most `rel_time` for a permit. A zero or negative wait still
    /// succeeds when a permit is free and nobody is queued.
    template <class Rep, class Period>
    [[nodiscard]] bool try_acquire_for(const std::chrono::duration<Rep, Period>& rel_time) {
        return try_acquire() || wait(detail::relative_deadline(rel_time), nullptr) == wait_status::acquired;
    }

    /// Waits at most `rel_time` for a permit, giving up when `stop` is requested.
    /// A stop already requested on entry returns `cancelled` without taking a permit.
    template <class Rep, class Period>
    [[nodiscard]] wait_status try_acquire_for(const std::chrono::duration<Rep, Period>& rel_time,
                                              const std::stop_token& stop) {
        if (stop.stop_requested()) {
            return wait_status::cancelled;
        }
        return try_acquire() ? wait_status::acquired : wait(detail::relative_deadline(rel_time), &stop);
    }

    /// Waits until `abs_time` (on any clock) for a permit. The time left is
    /// taken on entry and becomes one steady_clock deadline (so a jump of
    /// `Clock` during the wait does not change it); time_point::max() and
    /// other points too far away to represent mean "no deadline".
    template <class Clock, class Duration>
    [[nodiscard]] bool try_acquire_until(const std::chrono::time_point<Clock, Duration>& abs_time) {
        return try_acquire() ||
               wait(detail::relative_deadline(detail::time_left(abs_time)), nullptr) == wait_status::acquired;
    }

    /// Waits until `abs_time` (on any clock) for a permit, giving up when
    /// `stop` is requested.
    template <class Clock, class Duration>
    [[nodiscard]] wait_status try_acquire_until(const std::chrono::time_point<Clock, Duration>& abs_time,
                                                const std::stop_token& stop) {
        if (stop.stop_requested()) {
            return wait_status::cancelled;
        }
        return try_acquire() ? wait_status::acquired
                             : wait(detail::relative_deadline(detail::time_left(abs_time)), &stop);
    }

    /// Returns `count` permits. Each goes straight to the oldest waiter, if
    /// any (one wake per permit); the rest become free.
    /// \note Precondition: the caller holds `count` permits. Releasing permits
    /// that were never acquired breaks the semaphore's accounting (checked by
    /// an assertion in debug builds).
    void release(std::int64_t count = 1) noexcept {
        assert(count >= 0 && count <= max_permits);
        if (count <= 0) {
            return;
        }
        const auto add = static_cast<std::uint64_t>(count);
        assert(free_of(m_state.load(std::memory_order_relaxed)) + count <= max_permits);
        // release: publishes the releaser's writes to the next acquirer (on
        // the fast path directly, on the slow path through hand_over's CAS).
        const std::uint64_t before = m_state.fetch_add(add, std::memory_order_release);
        if (waiters_of(before) != 0) {
            hand_over();
        }
    }

    /// The queue entry of a caller that waits without blocking a thread (a
    /// coroutine, a callback). It lives wherever the caller keeps its state,
    /// for as long as it is queued; `on_granted` is how a release hands it
    /// the permit.
    /// \note Neither copyable nor movable: the queue links to it by address.
    class async_node : private detail::queue_node {
    public:
        /// Called once when a release grants this node its permit, on the
        /// releasing thread, with no lock of the semaphore held. From then
        /// the permit is the caller's; the node is no longer used and may be
        /// destroyed inside the call. Must not block: the releaser is
        /// usually another caller that has just finished its own work.
        using granted_function = void (*)(async_node& node) noexcept;

        explicit async_node(granted_function on_granted) noexcept
            : detail::queue_node(&deliver), m_on_granted(on_granted) {}
        async_node(const async_node&) = delete;
        async_node& operator=(const async_node&) = delete;
        ~async_node() = default;

    private:
        friend class fifo_semaphore;
        friend class detail::workload_scheduler;  // queues the same nodes for a gate with classes

        static void deliver(detail::queue_node& base) noexcept {
            auto& node = static_cast<async_node&>(base);
            node.m_on_granted(node);
        }

        granted_function m_on_granted;
    };

    /// Takes a permit now, or queues `node` behind everyone already queued
    /// (threads and asynchronous callers alike, in arrival order) and
    /// returns at once. Never blocks, never allocates.
    /// \returns true when a permit was taken (nothing is queued and
    /// `on_granted` is not called); false when `node` is queued: a release
    /// will call its `on_granted`, unless cancel(node) takes it out first.
    [[nodiscard]] bool acquire_or_enqueue(async_node& node) noexcept {
        if (try_acquire()) {
            return true;
        }
        const std::lock_guard lock(m_mutex);
        return take_or_enqueue(node);
    }

    /// Takes a queued `node` out of the queue, if no release has reached it.
    /// \returns true when it was still queued: it is gone, holds nothing,
    /// and `on_granted` will not be called. false when a release has taken
    /// it already: its `on_granted` has run or is about to, and the permit
    /// is the caller's (it must be released). Safe from any thread, also
    /// while a release runs.
    [[nodiscard]] bool cancel(async_node& node) noexcept {
        const std::lock_guard lock(m_mutex);
        if (!node.queued) {
            return false;
        }
        m_queue.remove(node);
        m_state.fetch_sub(one_waiter, std::memory_order_relaxed);  // mutex-guarded bookkeeping
        return true;
    }

    /// Takes `count` permits out of circulation, for a limit that shrinks:
    /// free permits at once, the rest as a debt that the next release()s
    /// pay before any waiter is served (the free count goes negative:
    /// see balance()). Never blocks, never waits for a holder; nobody
    /// queued is woken, skipped or stranded. release(count) is the
    /// inverse: it pays the debt first, then serves waiters.
    /// \note Precondition: count >= 0, and the debt stays within
    /// max_permits (checked by an assertion in debug builds).
    void shrink(std::int64_t count) noexcept {
        assert(count >= 0 && count <= max_permits);
        assert(free_of(m_state.load(std::memory_order_relaxed)) - count >= -max_permits);
        // relaxed: it only takes; a later acquire synchronizes with the
        // release that freed the permit it gets, not with this.
        m_state.fetch_sub(static_cast<std::uint64_t>(count), std::memory_order_relaxed);
    }

    /// Free permits right now, never negative: an observation, stale as
    /// soon as it returns.
    [[nodiscard]] std::int64_t available() const noexcept { return std::max<std::int64_t>(balance(), 0); }

    /// Free permits right now, negative while a shrink() is in debt (by
    /// that many permits): an observation, stale as soon as it returns.
    [[nodiscard]] std::int64_t balance() const noexcept {
        // relaxed: monitoring only.
        return free_of(m_state.load(std::memory_order_relaxed));
    }

    /// Callers queued right now (threads and asynchronous callers): an
    /// observation, stale as soon as it returns.
    [[nodiscard]] std::int64_t waiting() const noexcept {
        // relaxed: monitoring only.
        return static_cast<std::int64_t>(waiters_of(m_state.load(std::memory_order_relaxed)));
    }

private:
    static constexpr std::uint64_t one_waiter = std::uint64_t{1} << 32;
    /// The low half holds free permits + bias: [-2^31, 2^31) free permits.
    static constexpr std::uint64_t bias = std::uint64_t{1} << 31;
    static constexpr std::int64_t free_of(std::uint64_t state) noexcept {
        return static_cast<std::int64_t>(state & 0xffff'ffffU) - static_cast<std::int64_t>(bias);
    }
    /// free_of(state) > 0, as one 32-bit compare with an immediate (the
    /// fast paths' test).
    static constexpr bool has_free(std::uint64_t state) noexcept {
        return static_cast<std::uint32_t>(state) > static_cast<std::uint32_t>(bias);
    }
    static constexpr std::uint64_t waiters_of(std::uint64_t state) noexcept { return state >> 32; }

    static std::uint64_t checked_permits(std::int64_t permits) {
        if (permits < 0 || permits > max_permits) {
            throw std::invalid_argument("bulkhead::fifo_semaphore: permits must be in [0, max_permits]");
        }
        return static_cast<std::uint64_t>(permits);
    }

    /// What detail::wait_for_grant needs of the semaphore (every member
    /// called with m_mutex held but mutex() itself).
    struct waiting_side {
        fifo_semaphore& semaphore;
        [[nodiscard]] std::mutex& mutex() const noexcept { return semaphore.m_mutex; }
        [[nodiscard]] bool take_or_enqueue(detail::queue_node& node) const noexcept {
            return semaphore.take_or_enqueue(node);
        }
        void leave(detail::queue_node& node) const noexcept {
            semaphore.m_queue.remove(node);
            semaphore.m_state.fetch_sub(one_waiter, std::memory_order_relaxed);  // mutex-guarded bookkeeping
        }
    };

    /// The slow path: take a permit under the mutex or queue for one
    /// (detail/blocking_wait.hpp).
    template <class Deadline>
    wait_status wait(const Deadline& deadline, const std::stop_token* stop) {
        waiting_side side{*this};
        return detail::wait_for_grant(side, deadline, stop);
    }

    /// Under the mutex: takes a free permit if nobody is queued, otherwise
    /// counts `node` in and queues it. Returns true if a permit was taken.
    bool take_or_enqueue(detail::queue_node& node) noexcept {
        std::uint64_t seen = m_state.load(std::memory_order_relaxed);
        for (;;) {
            if (waiters_of(seen) == 0 && has_free(seen)) {
                if (m_state.compare_exchange_weak(seen, seen - 1, std::memory_order_acquire,
                                                  std::memory_order_relaxed)) {
                    return true;
                }
                continue;
            }
            // Joining: permits are either zero, or free while others wait
            // (a release that saw them is on its way to hand_over(), which
            // serves the queue in order, this node last). relaxed: the queue
            // itself is guarded by the mutex.
            if (m_state.compare_exchange_weak(seen, seen + one_waiter, std::memory_order_relaxed,
                                              std::memory_order_relaxed)) {
                m_queue.push_back(node);
                return false;
            }
        }
    }

    /// Moves free permits to the oldest waiters, one wake each, while both
    /// remain: chosen and unlinked under the mutex, then granted and woken
    /// with the mutex released. Only permits can change concurrently (a
    /// release() adds; no one else takes while anyone is queued), so the CAS
    /// retries only for those.
    void hand_over() noexcept {
        detail::queue_node* grantees = nullptr;  // oldest first, linked through `next`
        detail::queue_node* last = nullptr;
        {
            const std::lock_guard lock(m_mutex);
            std::uint64_t seen = m_state.load(std::memory_order_relaxed);
            while (!m_queue.empty() && has_free(seen)) {
                // One permit and one waiter out in one step. acquire: pairs
                // with the release fetch_add of whoever freed the permit.
                const std::uint64_t taken = seen - one_waiter - 1;
                if (!m_state.compare_exchange_weak(seen, taken, std::memory_order_acquire, std::memory_order_relaxed)) {
                    continue;
                }
                seen = taken;  // what is there now, unless a release added since (the next CAS sees it)
                detail::queue_node& next = m_queue.pop_front();
                // The waiter no longer touches its links: they serve this list.
                (last != nullptr ? last->next : grantees) = &next;
                last = &next;
            }
        }
        while (grantees != nullptr) {
            detail::queue_node& node = *grantees;
            grantees = node.next;  // read first: the grant may end the node's life
            node.grant(node);
        }
    }

    alignas(64) std::atomic<std::uint64_t> m_state;  // free permits | waiters << 32; see file comment
    std::mutex m_mutex;                              // guards m_queue, and the links and `queued` of its nodes
    detail::wait_queue m_queue;                      // guarded by m_mutex
};

}  // namespace bulkhead
