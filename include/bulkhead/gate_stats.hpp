// bulkhead: what a gate counts, always on.
//
// Every db_bulkhead keeps a gate_metrics: monotonic counters for each outcome
// of a call and log-linear histograms of where the time went. They cost a
// relaxed atomic add per event (the admission path adds one: "admitted", or
// the rejection's reason) and, on the transaction path only, a handful of
// steady_clock reads, which are small next to a database round trip.
// gate.stats() copies them into a plain gate_stats.
//
// Thread safety: all members may be used concurrently. Counters are relaxed
// atomics: a snapshot is not one atomic cut, but every value it shows was
// really reached, and counters only grow.
#pragma once

#include <bulkhead/error.hpp>
#include <bulkhead/histogram.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace bulkhead {

/// The number of reject_reason values.
inline constexpr std::size_t reject_reason_count = 5;

/// A plain copy of a gate's counters, gauges and latency distributions.
struct gate_stats {
    // --- configuration -------------------------------------------------------
    int concurrent = 0;   ///< B
    int extra_slots = 0;  ///< Q

    // --- gauges, at the time of the snapshot ---------------------------------
    int available = 0;        ///< free execution permits
    int available_slots = 0;  ///< free admission slots
    int running = 0;          ///< calls holding an execution permit (B - available)
    int queued = 0;           ///< calls waiting for an execution permit

    // --- counters since construction -------------------------------------------
    std::uint64_t admitted = 0;  ///< calls that got a slot and a permit
    /// Calls turned away, by reject_reason (index: static_cast<size_t>(reason)).
    std::array<std::uint64_t, reject_reason_count> rejected{};
    std::uint64_t completed = 0;               ///< transactions committed (value returned)
    std::uint64_t failed = 0;                  ///< transactions that started and did not commit
    std::uint64_t work_cancelled = 0;          ///< of those: cancelled by a stop request
    std::uint64_t work_deadline_exceeded = 0;  ///< of those: cut short by the deadline
    std::uint64_t rollback_failures = 0;       ///< rollbacks that failed (connection discarded)
    std::uint64_t commit_unknown = 0;          ///< COMMITs whose outcome could not be settled

    // --- latency distributions (nanoseconds) ----------------------------------
    histogram_snapshot permit_wait;      ///< admission to execution permit
    histogram_snapshot pool_wait;        ///< execution permit to pool connection
    histogram_snapshot connection_hold;  ///< connection acquired to connection returned
    histogram_snapshot work;             ///< the callback itself
    histogram_snapshot call;             ///< admission to connection returned (end to end)

    /// Rejections for one reason.
    [[nodiscard]] std::uint64_t rejections(reject_reason reason) const noexcept {
        return rejected[static_cast<std::size_t>(reason)];
    }
};

namespace detail {

/// The live counters behind gate_stats.
class gate_metrics {
public:
    void admitted() noexcept { bump(m_admitted); }
    void rejected(reject_reason reason) noexcept { bump(m_rejected[static_cast<std::size_t>(reason)]); }
    void completed() noexcept { bump(m_completed); }
    void failed() noexcept { bump(m_failed); }
    void work_cancelled() noexcept { bump(m_work_cancelled); }
    void work_deadline_exceeded() noexcept { bump(m_work_deadline_exceeded); }
    void rollback_failed() noexcept { bump(m_rollback_failures); }
    void commit_unknown() noexcept { bump(m_commit_unknown); }

    log_linear_histogram permit_wait;
    log_linear_histogram pool_wait;
    log_linear_histogram connection_hold;
    log_linear_histogram work;
    log_linear_histogram call;

    /// Fills the counters and distributions of `stats`.
    void copy_to(gate_stats& stats) const noexcept {
        stats.admitted = read(m_admitted);
        for (std::size_t i = 0; i < reject_reason_count; ++i) {
            stats.rejected[i] = read(m_rejected[i]);
        }
        stats.completed = read(m_completed);
        stats.failed = read(m_failed);
        stats.work_cancelled = read(m_work_cancelled);
        stats.work_deadline_exceeded = read(m_work_deadline_exceeded);
        stats.rollback_failures = read(m_rollback_failures);
        stats.commit_unknown = read(m_commit_unknown);
        stats.permit_wait = permit_wait.snapshot();
        stats.pool_wait = pool_wait.snapshot();
        stats.connection_hold = connection_hold.snapshot();
        stats.work = work.snapshot();
        stats.call = call.snapshot();
    }

private:
    // relaxed: independent statistics, they order nothing.
    static void bump(std::atomic<std::uint64_t>& counter) noexcept { counter.fetch_add(1, std::memory_order_relaxed); }
    static std::uint64_t read(const std::atomic<std::uint64_t>& counter) noexcept {
        return counter.load(std::memory_order_relaxed);
    }

    // The admission-path counters get a cache line of their own, away from
    // the gate's permit state and the transaction-path counters.
    alignas(64) std::atomic<std::uint64_t> m_admitted{0};
    std::array<std::atomic<std::uint64_t>, reject_reason_count> m_rejected{};
    alignas(64) std::atomic<std::uint64_t> m_completed{0};
    std::atomic<std::uint64_t> m_failed{0};
    std::atomic<std::uint64_t> m_work_cancelled{0};
    std::atomic<std::uint64_t> m_work_deadline_exceeded{0};
    std::atomic<std::uint64_t> m_rollback_failures{0};
    std::atomic<std::uint64_t> m_commit_unknown{0};
};

}  // namespace detail

}  // namespace bulkhead
