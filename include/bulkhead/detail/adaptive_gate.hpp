// bulkhead: a gate's adaptive limit at run time. adaptive_limit.hpp has
// the rules (limit_controller); this holds the counts of the current
// interval, written by every call, and runs the controller once per
// interval for whichever call first sees the interval end.
#pragma once

#include <bulkhead/adaptive_limit.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace bulkhead::detail {

/// A gate's adaptive limit at run time: the counts of the current interval
/// (atomics, written by every call), and the controller, which whoever
/// first sees the interval end runs under m_mutex, resizing the gate's
/// permits by the difference (fifo_semaphore::release() to grow, shrink()
/// to shrink; a shrink that finds the permits held becomes a debt that
/// their releases pay).
///
/// Thread safety: the counters are relaxed atomics; a call that lands in
/// the next interval instead of this one changes nothing that matters. The
/// controller and m_started are guarded by m_mutex; the published figures
/// (limit, reason, changes, baseline) are relaxed atomics written under it:
/// observations only. Resizes are serialized by m_mutex, so the permits in
/// circulation always equal m_limit once each resize has returned.
class adaptive_gate {
public:
    using clock = std::chrono::steady_clock;

    adaptive_gate(const adaptive_options& options, int ceiling)
        : m_next_ns(ticks(clock::now() + options.interval)),
          m_controller(options, ceiling),
          m_interval(options.interval),
          m_limit(m_controller.limit()),
          m_started(clock::now()) {}

    adaptive_gate(const adaptive_gate&) = delete;
    adaptive_gate& operator=(const adaptive_gate&) = delete;

    /// A call released its permit after holding it for `held`.
    void finished(std::chrono::nanoseconds held) noexcept {
        m_calls.fetch_add(1, std::memory_order_relaxed);
        m_held_ns.fetch_add(held.count(), std::memory_order_relaxed);
    }

    /// A call found no permit free (it queues, or was turned away).
    void limited() noexcept {
        if (!m_limited.load(std::memory_order_relaxed)) {
            m_limited.store(true, std::memory_order_relaxed);
        }
    }

    /// A finished call failed in a way that says the database is loaded.
    void overloaded(overload_kind kind) noexcept {
        switch (kind) {
            case overload_kind::saturated:
                m_saturated.fetch_add(1, std::memory_order_relaxed);
                break;
            case overload_kind::timeout:
                m_timeouts.fetch_add(1, std::memory_order_relaxed);
                break;
            case overload_kind::conflict:
                m_conflicts.fetch_add(1, std::memory_order_relaxed);
                break;
            case overload_kind::none:
                break;
        }
    }

    /// Runs the controller if the interval has ended and nobody else is
    /// running it, and resizes `permits` to its decision: a fifo_semaphore,
    /// or anything with its balance(), release(n) and shrink(n).
    template <class Permits>
    void maybe_update(clock::time_point now, Permits& permits) noexcept {
        if (ticks(now) < m_next_ns.load(std::memory_order_relaxed)) {
            return;
        }
        const std::unique_lock lock(m_mutex, std::try_to_lock);
        if (!lock.owns_lock() || ticks(now) < m_next_ns.load(std::memory_order_relaxed)) {
            return;  // another thread is at it, or has just done it
        }
        interval_sample sample;
        sample.length = now - m_started;
        sample.calls = m_calls.exchange(0, std::memory_order_relaxed);
        sample.held = std::chrono::nanoseconds(m_held_ns.exchange(0, std::memory_order_relaxed));
        sample.limited = m_limited.exchange(false, std::memory_order_relaxed);
        sample.saturated = m_saturated.exchange(0, std::memory_order_relaxed);
        sample.timeouts = m_timeouts.exchange(0, std::memory_order_relaxed);
        sample.conflicts = m_conflicts.exchange(0, std::memory_order_relaxed);
        const int before = m_limit.load(std::memory_order_relaxed);
        sample.inside = std::max<std::int64_t>(before - permits.balance(), 0);
        const int after = m_controller.update(sample);
        if (after > before) {
            permits.release(after - before);
        } else if (after < before) {
            permits.shrink(before - after);
        }
        m_limit.store(after, std::memory_order_relaxed);
        m_reason.store(m_controller.reason(), std::memory_order_relaxed);
        m_changes.store(m_controller.changes(), std::memory_order_relaxed);
        m_baseline_ns.store(m_controller.baseline().count(), std::memory_order_relaxed);
        m_started = now;
        m_next_ns.store(ticks(now + m_interval), std::memory_order_relaxed);
    }

    /// The permits in circulation now.
    [[nodiscard]] int limit() const noexcept { return m_limit.load(std::memory_order_relaxed); }
    [[nodiscard]] int floor() const noexcept { return m_controller.floor(); }
    [[nodiscard]] limit_reason reason() const noexcept { return m_reason.load(std::memory_order_relaxed); }
    [[nodiscard]] std::uint64_t changes() const noexcept { return m_changes.load(std::memory_order_relaxed); }
    [[nodiscard]] std::chrono::nanoseconds baseline() const noexcept {
        return std::chrono::nanoseconds(m_baseline_ns.load(std::memory_order_relaxed));
    }

private:
    static std::int64_t ticks(clock::time_point at) noexcept {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
    }

    // Written by every call: a line of their own.
    alignas(64) std::atomic<std::int64_t> m_calls{0};
    std::atomic<std::int64_t> m_held_ns{0};
    std::atomic<bool> m_limited{false};
    std::atomic<std::int64_t> m_saturated{0};
    std::atomic<std::int64_t> m_timeouts{0};
    std::atomic<std::int64_t> m_conflicts{0};
    // Read by every call, written once per interval.
    alignas(64) std::atomic<std::int64_t> m_next_ns;  // steady_clock ticks: when the interval ends
    std::mutex m_mutex;
    limit_controller m_controller;                              // guarded by m_mutex
    std::chrono::nanoseconds m_interval;                        // constant
    std::atomic<int> m_limit;                                   // written under m_mutex
    std::atomic<limit_reason> m_reason{limit_reason::initial};  // written under m_mutex
    std::atomic<std::uint64_t> m_changes{0};                    // written under m_mutex
    std::atomic<std::int64_t> m_baseline_ns{0};                 // written under m_mutex
    clock::time_point m_started;                                // guarded by m_mutex
};

}  // namespace bulkhead::detail
