// bulkhead: the execution permits of a gate with workload classes.
//
// workload_scheduler hands out a gate's permits to the classes of its
// workload_plan (workload.hpp): reserved permits to their own class, shared
// ones by priority, FIFO inside a class. detail/permit_engine.hpp holds one
// for a gate with a plan; a gate without one never touches it.
//
// Policy. permits in circulation (`limit`: B, or an adaptive limit) =
// reserved sum + shared capacity. A class c may take a permit when
//   running[c] < reserved[c]                        (one of its own), or
//   running[c] < ceiling[c] && shared_used < shared (a shared one),
// where shared_used = sum over classes of max(0, running[c] - reserved[c]).
// Every release, grow and arrival that finds waiters runs serve(): first any
// class with waiters below its reservation gets its own permits; then, while
// a shared permit is free, the class with waiters and room under its
// ceiling that has the highest priority gets one, the class whose oldest
// waiter came first among equal priorities; inside a class, the oldest
// waiter first. After serve() no waiter could take a permit, so an arrival
// that finds its class's queue empty and a permit it may take is no
// barging: nobody waiting could have had that permit. Hence (G1) the total
// running never exceeds the permits in circulation: sum(min(running,
// reserved)) + shared_used <= reserved sum + shared capacity; and (G2) a
// class with waiters gets its reserved permits as soon as they are free,
// whatever other classes hold. tests/model/workload_scheduler.pml checks
// both in every interleaving of its configurations, with seeded bugs.
//
// A shrink (adaptive limit) lowers the shared capacity, possibly below
// shared_used: a debt that releases pay before anyone is served from the
// shared permits; reservations are never shrunk (the adaptive floor is at
// least the reserved sum). A grow raises it and serves.
//
// Waiting: blocked threads queue a detail::waiter and wait exactly as on
// fifo_semaphore (detail/blocking_wait.hpp: a grant decided under the
// mutex, delivered outside it, a timeout or a stop that loses to a grant on
// its way); asynchronous callers queue a fifo_semaphore::async_node whose
// on_granted runs on the granting thread.
//
// Costs. One mutex guards all of it: every take and release locks it once
// (uncontended, about 20 ns). That is the price of classes; a gate without
// a plan keeps the lock-free fifo_semaphore (detail/permit_engine.hpp).
//
// Thread safety: all members may be called concurrently. Everything under
// m_mutex; the per-class counters read by stats() are relaxed atomics
// (statistics), or read under the mutex (running, queued).
#pragma once

#include <bulkhead/detail/blocking_wait.hpp>
#include <bulkhead/detail/wait_queue.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/fifo_semaphore.hpp>
#include <bulkhead/gate_stats.hpp>
#include <bulkhead/histogram.hpp>
#include <bulkhead/workload.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

namespace bulkhead::detail {

/// See the file comment.
class workload_scheduler {
public:
    /// `plan` must come from checked_workload_plan(); `limit` permits start
    /// in circulation (B, or an adaptive limit's start), at least the
    /// reserved sum.
    workload_scheduler(const workload_plan& plan, int limit)
        : m_count(plan.classes.size()), m_classes(std::make_unique<class_state[]>(plan.classes.size())) {
        int reserved = 0;
        for (std::size_t c = 0; c < m_count; ++c) {
            m_classes[c].config = plan.classes[c];
            m_classes[c].ceiling =
                plan.classes[c].adaptive_floor > 0 ? plan.classes[c].adaptive_floor : plan.classes[c].ceiling;
            reserved += plan.classes[c].reserved;
        }
        assert(limit >= reserved);
        m_shared = limit - reserved;
    }

    workload_scheduler(const workload_scheduler&) = delete;
    workload_scheduler& operator=(const workload_scheduler&) = delete;

    [[nodiscard]] int classes() const noexcept { return static_cast<int>(m_count); }
    [[nodiscard]] const workload_class& config(int c) const noexcept { return m_classes[index(c)].config; }

    /// The class named `name`, or -1.
    [[nodiscard]] int find(std::string_view name) const noexcept {
        for (std::size_t c = 0; c < m_count; ++c) {
            if (m_classes[c].config.name == name) {
                return static_cast<int>(c);
            }
        }
        return -1;
    }

    // --- execution permits ---------------------------------------------------

    /// Takes a permit for class c if it may take one now and none of its
    /// callers is queued. Never blocks.
    [[nodiscard]] bool try_acquire(int c) noexcept {
        const std::lock_guard lock(m_mutex);
        return try_take(index(c));
    }

    /// Waits at most `wait` for a permit for class c, giving up on `stop`.
    /// A zero wait still takes a permit that is free to take.
    [[nodiscard]] wait_status try_acquire_for(int c, std::chrono::nanoseconds wait, const std::stop_token& stop) {
        if (stop.stop_requested()) {
            return wait_status::cancelled;
        }
        waiting_side side{*this, index(c)};
        return detail::wait_for_grant(side, detail::relative_deadline(wait), &stop);
    }

    /// Takes a permit for class c now, or queues `node` behind its class's
    /// waiters and returns false: a grant will call its on_granted, unless
    /// cancel() takes it out first.
    [[nodiscard]] bool acquire_or_enqueue(int c, fifo_semaphore::async_node& node) noexcept {
        const std::lock_guard lock(m_mutex);
        return take_or_enqueue(index(c), node);
    }

    /// Takes a queued async node out of class c's queue, if no grant has
    /// reached it: true then (it holds nothing); false when a grant is on
    /// its way (the permit is the caller's).
    [[nodiscard]] bool cancel(int c, fifo_semaphore::async_node& node) noexcept {
        const std::lock_guard lock(m_mutex);
        queue_node& base = node;
        if (!base.queued) {
            return false;
        }
        leave(index(c), base);
        return true;
    }

    /// Returns a permit of class c; it goes to whoever serve() picks.
    void release(int c) noexcept {
        queue_node* grantees = nullptr;
        {
            const std::lock_guard lock(m_mutex);
            class_state& state = m_classes[index(c)];
            assert(state.running > 0);
            --state.running;
            if (state.running >= state.config.reserved) {
                --m_shared_used;  // it held a shared permit
            }
            grantees = serve();
        }
        grant(grantees);
    }

    /// Takes `count` shared permits out of circulation (a shrinking limit):
    /// those held become a debt that releases pay first.
    void shrink(std::int64_t count) noexcept {
        const std::lock_guard lock(m_mutex);
        m_shared -= static_cast<int>(count);
    }

    /// Puts `count` shared permits back into circulation and serves.
    void grow(std::int64_t count) noexcept {
        queue_node* grantees = nullptr;
        {
            const std::lock_guard lock(m_mutex);
            m_shared += static_cast<int>(count);
            grantees = serve();
        }
        grant(grantees);
    }

    /// Lowers class c's ceiling by `count` (its adaptive limit shrank):
    /// calls above it keep their permits; no new one is taken above it.
    void shrink_ceiling(int c, std::int64_t count) noexcept {
        const std::lock_guard lock(m_mutex);
        m_classes[index(c)].ceiling -= static_cast<int>(count);
    }

    /// Raises class c's ceiling by `count` and serves.
    void grow_ceiling(int c, std::int64_t count) noexcept {
        queue_node* grantees = nullptr;
        {
            const std::lock_guard lock(m_mutex);
            m_classes[index(c)].ceiling += static_cast<int>(count);
            grantees = serve();
        }
        grant(grantees);
    }

    /// Class c's ceiling now (its adaptive limit, or the configured one).
    [[nodiscard]] int ceiling(int c) const noexcept {
        const std::lock_guard lock(m_mutex);
        return m_classes[index(c)].ceiling;
    }

    // --- observations (stale as soon as they return) -------------------------

    struct figures {
        int running = 0;
        int queued = 0;
    };

    [[nodiscard]] figures of(int c) const noexcept {
        const std::lock_guard lock(m_mutex);
        const class_state& state = m_classes[index(c)];
        return {state.running, state.queued};
    }

    [[nodiscard]] figures total() const noexcept {
        const std::lock_guard lock(m_mutex);
        figures sum;
        for (std::size_t c = 0; c < m_count; ++c) {
            sum.running += m_classes[c].running;
            sum.queued += m_classes[c].queued;
        }
        return sum;
    }

    /// Permits a call of class c could take right now if none of its
    /// callers were queued (0 or more).
    [[nodiscard]] int free_for(int c) const noexcept {
        const std::lock_guard lock(m_mutex);
        const class_state& state = m_classes[index(c)];
        const int own = std::max(state.config.reserved - state.running, 0);
        const int shared = std::max(std::min(state.ceiling - state.running, m_shared - m_shared_used), 0);
        return own + shared;
    }

    /// The most permits class c can use at once under the current limit.
    [[nodiscard]] int usable_by(int c) const noexcept {
        const std::lock_guard lock(m_mutex);
        const class_state& state = m_classes[index(c)];
        return std::max(std::min(state.ceiling, state.config.reserved + std::max(m_shared, 0)), 1);
    }

    // --- per-class statistics ------------------------------------------------

    void admitted(int c) noexcept { m_classes[index(c)].admitted.fetch_add(1, std::memory_order_relaxed); }
    void rejected(int c, reject_reason reason) noexcept {
        m_classes[index(c)].rejected[static_cast<std::size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
    }
    void held(int c, std::chrono::nanoseconds hold) noexcept { m_classes[index(c)].mean_hold.add(hold); }
    void committed(int c, std::chrono::nanoseconds hold) noexcept { m_classes[index(c)].committed_hold.add(hold); }
    [[nodiscard]] std::chrono::nanoseconds mean_committed_hold(int c) const noexcept {
        return m_classes[index(c)].committed_hold.get();
    }
    [[nodiscard]] std::chrono::nanoseconds mean_hold(int c) const noexcept {
        return m_classes[index(c)].mean_hold.get();
    }
    [[nodiscard]] log_linear_histogram& permit_wait(int c) noexcept { return m_classes[index(c)].permit_wait; }

    /// Class c's configuration and counters (not expected_queue_wait, which
    /// the gate computes, nor available_slots: detail/permit_engine.hpp
    /// keeps the slots).
    [[nodiscard]] workload_stats stats(int c) const {
        const class_state& state = m_classes[index(c)];
        workload_stats out;
        out.name = state.config.name;
        out.reserved = state.config.reserved;
        out.ceiling = state.config.ceiling;
        out.limit = ceiling(c);
        out.queue = state.config.queue;
        out.priority = state.config.priority;
        const figures now = of(c);
        out.running = now.running;
        out.queued = now.queued;
        out.admitted = state.admitted.load(std::memory_order_relaxed);
        for (std::size_t r = 0; r < reject_reason_count; ++r) {
            out.rejected[r] = state.rejected[r].load(std::memory_order_relaxed);
        }
        out.mean_permit_hold = state.mean_hold.get();
        out.permit_wait = state.permit_wait.snapshot();
        return out;
    }

private:
    struct class_state {
        workload_class config;
        int ceiling = 0;                         // guarded by m_mutex: config.ceiling, or the class's adaptive limit
        int running = 0;                         // guarded by m_mutex
        int queued = 0;                          // guarded by m_mutex
        intrusive_fifo<queue_node> waiters;      // guarded by m_mutex
        std::atomic<std::uint64_t> admitted{0};  // relaxed: statistics
        std::array<std::atomic<std::uint64_t>, reject_reason_count> rejected{};  // relaxed: statistics
        running_mean mean_hold;
        running_mean committed_hold;
        log_linear_histogram permit_wait;
    };

    /// What detail::wait_for_grant needs (called with m_mutex held but mutex()).
    struct waiting_side {
        workload_scheduler& scheduler;
        std::size_t c;
        [[nodiscard]] std::mutex& mutex() const noexcept { return scheduler.m_mutex; }
        [[nodiscard]] bool take_or_enqueue(queue_node& node) const noexcept {
            return scheduler.take_or_enqueue(c, node);
        }
        void leave(queue_node& node) const noexcept { scheduler.leave(c, node); }
    };

    [[nodiscard]] std::size_t index(int c) const noexcept {
        assert(c >= 0 && static_cast<std::size_t>(c) < m_count);
        return static_cast<std::size_t>(c);
    }

    // All below: with m_mutex held.

    [[nodiscard]] bool can_take(const class_state& state) const noexcept {
        return state.running < state.config.reserved || (state.running < state.ceiling && m_shared_used < m_shared);
    }

    void take(class_state& state) noexcept {
        if (state.running >= state.config.reserved) {
            ++m_shared_used;
        }
        ++state.running;
    }

    bool try_take(std::size_t c) noexcept {
        class_state& state = m_classes[c];
        if (!state.waiters.empty() || !can_take(state)) {
            return false;
        }
        take(state);
        return true;
    }

    bool take_or_enqueue(std::size_t c, queue_node& node) noexcept {
        if (try_take(c)) {
            return true;
        }
        class_state& state = m_classes[c];
        node.ticket = ++m_tickets;
        state.waiters.push_back(node);
        ++state.queued;
        return false;
    }

    void leave(std::size_t c, queue_node& node) noexcept {
        class_state& state = m_classes[c];
        state.waiters.remove(node);
        --state.queued;
    }

    /// Picks and unlinks every waiter that may take a permit now (see the
    /// file comment for the order); returns them linked through `next`,
    /// oldest grant first, for grant() to deliver with the mutex released.
    queue_node* serve() noexcept {
        queue_node* first = nullptr;
        queue_node* last = nullptr;
        const auto pop = [&](class_state& state) noexcept {
            queue_node& node = state.waiters.pop_front();
            --state.queued;
            take(state);
            (last != nullptr ? last->next : first) = &node;
            last = &node;
        };
        // Reserved permits first: they are no one else's.
        for (std::size_t c = 0; c < m_count; ++c) {
            class_state& state = m_classes[c];
            while (!state.waiters.empty() && state.running < state.config.reserved) {
                pop(state);
            }
        }
        // Then the shared ones: priority, then the oldest head.
        while (m_shared_used < m_shared) {
            class_state* best = nullptr;
            for (std::size_t c = 0; c < m_count; ++c) {
                class_state& state = m_classes[c];
                if (state.waiters.empty() || state.running >= state.ceiling) {
                    continue;
                }
                if (best == nullptr || state.config.priority > best->config.priority ||
                    (state.config.priority == best->config.priority &&
                     state.waiters.front()->ticket < best->waiters.front()->ticket)) {
                    best = &state;
                }
            }
            if (best == nullptr) {
                break;
            }
            pop(*best);
        }
        return first;
    }

    /// Delivers the grants serve() decided, with no lock held.
    static void grant(queue_node* grantees) noexcept {
        while (grantees != nullptr) {
            queue_node& node = *grantees;
            grantees = node.next;  // read first: the grant may end the node's life
            node.grant(node);
        }
    }

    std::size_t m_count;
    std::unique_ptr<class_state[]> m_classes;
    mutable std::mutex m_mutex;
    int m_shared = 0;             // guarded by m_mutex: shared permits in circulation (may be < m_shared_used)
    int m_shared_used = 0;        // guarded by m_mutex: sum of max(0, running - reserved)
    std::uint64_t m_tickets = 0;  // guarded by m_mutex: arrival order across classes
};

}  // namespace bulkhead::detail
