// bulkhead: what a gate counts, always on.
//
// Every db_bulkhead keeps a gate_metrics: monotonic counters for each outcome
// of a call and log-linear histograms of where the time went. The counts the
// admission path makes ("admitted", or the rejection's reason, and
// "completed") are striped per thread (detail/striped_counters.hpp): a plain
// load and store in the thread's own cache line, no locked instruction, no
// line shared between threads (up to 63 threads; later ones share one line). The rarer outcomes are relaxed atomic
// adds. The transaction path also reads steady_clock a few times and records five histograms, which is small next to a
// database round trip. gate.stats() copies all of it into a plain gate_stats.
//
// Thread safety: all members may be used concurrently. Counters are relaxed
// atomics: a snapshot is not one atomic cut, but every value it shows was
// really reached, and counters only grow.
#pragma once

#include <bulkhead/adaptive_limit.hpp>
#include <bulkhead/detail/striped_counters.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/histogram.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bulkhead {

/// The number of reject_reason values.
inline constexpr std::size_t reject_reason_count = 6;

/// One class's figures in gate_stats::workloads.
struct workload_stats {
    std::string name;  ///< the class
    int reserved = 0;  ///< its reserved permits
    int ceiling = 0;   ///< the most it holds at once, as configured
    /// The most it holds at once now: its ceiling, or its adaptive limit
    /// (in [adaptive_floor, ceiling]) when the class adapts.
    int limit = 0;
    bool adaptive = false;                                                  ///< its ceiling adapts
    bulkhead::limit_reason limit_reason = bulkhead::limit_reason::initial;  ///< why its limit last changed
    std::uint64_t limit_changes = 0;                                        ///< how often it changed
    int queue = 0;                                                          ///< its waiting room beyond the ceiling
    int priority = 0;                                                       ///< its rank for shared permits
    int running = 0;                                                        ///< its calls holding a permit now
    int queued = 0;                                                         ///< its calls waiting for a permit now
    int available_slots = 0;     ///< its free admission slots (of ceiling + queue)
    std::uint64_t admitted = 0;  ///< its calls that got a permit
    /// Its calls turned away, by reject_reason (index: static_cast<size_t>(reason)).
    std::array<std::uint64_t, reject_reason_count> rejected{};
    /// The running mean of its permit holds; zero before the first.
    std::chrono::nanoseconds mean_permit_hold{0};
    /// How long a call of this class arriving now would wait for a permit
    /// (db_bulkhead::expected_queue_wait(workload)).
    std::chrono::nanoseconds expected_queue_wait{0};
    histogram_snapshot permit_wait;  ///< admission to execution permit, its calls

    /// Rejections for one reason.
    [[nodiscard]] std::uint64_t rejections(reject_reason reason) const noexcept {
        return rejected[static_cast<std::size_t>(reason)];
    }
};

/// A plain copy of a gate's counters, gauges and latency distributions.
struct gate_stats {
    // --- configuration -------------------------------------------------------
    int concurrent = 0;   ///< B
    int extra_slots = 0;  ///< Q

    // --- gauges, at the time of the snapshot ---------------------------------
    int available = 0;        ///< free execution permits
    int available_slots = 0;  ///< free admission slots
    int running = 0;          ///< calls holding an execution permit
    /// The execution permits in circulation: B for a fixed gate, the
    /// adaptive limit otherwise. running may exceed it for a while after
    /// it shrank: a shrink does not take permits away from their holders.
    int limit = 0;
    // --- the adaptive limit (adaptive_limit.hpp) ----------------------------
    bool adaptive = false;                                                  ///< the limit adapts
    int limit_floor = 0;                                                    ///< its floor (B for a fixed gate)
    bulkhead::limit_reason limit_reason = bulkhead::limit_reason::initial;  ///< why it last changed
    std::uint64_t limit_changes = 0;                                        ///< how often it changed
    /// What a call costs when the database is not congested, as the
    /// adaptive limit tracks it; zero until known (and for a fixed gate).
    std::chrono::nanoseconds latency_baseline{0};
    int queued = 0;  ///< calls waiting for an execution permit

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
    /// Of rejected[deadline_exceeded]: calls refused at admission because
    /// their deadline left less time than the expected queue wait (they
    /// would have waited only to fail).
    std::uint64_t deadline_rejected_early = 0;

    // --- the gate's own estimates, at the time of the snapshot ----------------
    /// The running mean of how long a transaction holds its execution
    /// permit (from the permit to the connection's return; each finished
    /// transaction weighs 1/16). Zero before the first one finished.
    std::chrono::nanoseconds mean_permit_hold{0};
    /// The same mean over committed transactions only: what a call needs
    /// once it has its permit (G8 refuses a call whose deadline leaves less
    /// than the expected queue wait plus this). Zero before the first commit.
    std::chrono::nanoseconds mean_committed_hold{0};
    /// How long a call arriving now would wait for its permit:
    /// (queued + 1) x mean_permit_hold / limit when no permit is free, else
    /// zero (limit: B, or an adaptive gate's limit now).
    std::chrono::nanoseconds expected_queue_wait{0};
    /// The retry delay a rejection now would carry (rejected::retry_after()):
    /// (running + queued + 1) x mean_permit_hold / limit in whole milliseconds,
    /// rounded up, at least 1 ms; zero before the first transaction finished.
    std::chrono::milliseconds suggested_retry_delay{0};

    // --- latency distributions (nanoseconds) ----------------------------------
    histogram_snapshot permit_wait;      ///< admission to execution permit
    histogram_snapshot pool_wait;        ///< execution permit to pool connection
    histogram_snapshot connection_hold;  ///< connection acquired to connection returned
    histogram_snapshot work;             ///< the callback itself
    histogram_snapshot call;             ///< admission to connection returned (end to end)

    /// Per class, in id order, for a gate with workload classes
    /// (workload.hpp); empty for a plain gate.
    std::vector<workload_stats> workloads;

    /// Rejections for one reason.
    [[nodiscard]] std::uint64_t rejections(reject_reason reason) const noexcept {
        return rejected[static_cast<std::size_t>(reason)];
    }
};

namespace detail {

/// A running mean of durations in which each new sample weighs
/// 1/weight: it follows a change of the database's speed within a few dozen
/// calls, and one slow call moves it by a sixteenth. Racing updates may lose
/// a sample; every stored value is a mean of real samples.
class running_mean {
public:
    static constexpr std::int64_t weight = 16;

    void add(std::chrono::nanoseconds sample) noexcept {
        const std::int64_t value = sample.count() > 0 ? sample.count() : 1;
        // relaxed: a statistic; it orders nothing.
        const std::int64_t mean = m_ns.load(std::memory_order_relaxed);
        m_ns.store(mean == 0 ? value : mean + (value - mean) / weight, std::memory_order_relaxed);
    }

    /// The mean; zero before the first sample.
    [[nodiscard]] std::chrono::nanoseconds get() const noexcept {
        return std::chrono::nanoseconds(m_ns.load(std::memory_order_relaxed));
    }

private:
    std::atomic<std::int64_t> m_ns{0};
};

/// The live counters behind gate_stats.
class gate_metrics {
public:
    void admitted() noexcept { m_frequent.bump(admitted_index); }
    void rejected(reject_reason reason) noexcept { m_frequent.bump(rejected_index + static_cast<std::size_t>(reason)); }
    void completed() noexcept { m_frequent.bump(completed_index); }
    void failed() noexcept { bump(m_failed); }
    void work_cancelled() noexcept { bump(m_work_cancelled); }
    void work_deadline_exceeded() noexcept { bump(m_work_deadline_exceeded); }
    void rollback_failed() noexcept { bump(m_rollback_failures); }
    void commit_unknown() noexcept { bump(m_commit_unknown); }
    void deadline_rejected_early() noexcept { bump(m_deadline_rejected_early); }

    /// Folds the permit hold of one finished transaction into the running
    /// mean (running_mean: each sample weighs 1/16).
    void permit_held(std::chrono::nanoseconds held) noexcept { m_mean_hold.add(held); }

    /// The running mean of permit holds; zero before the first sample.
    [[nodiscard]] std::chrono::nanoseconds mean_permit_hold() const noexcept { return m_mean_hold.get(); }

    /// Folds the permit hold of a committed transaction into its own mean:
    /// what a call needs once it has its permit, not counting the calls
    /// that failed or were cut short (their holds are shorter).
    void committed_hold(std::chrono::nanoseconds held) noexcept { m_mean_committed_hold.add(held); }

    /// The running mean of committed transactions' holds; zero before the first.
    [[nodiscard]] std::chrono::nanoseconds mean_committed_hold() const noexcept { return m_mean_committed_hold.get(); }

    log_linear_histogram permit_wait;
    log_linear_histogram pool_wait;
    log_linear_histogram connection_hold;
    log_linear_histogram work;
    log_linear_histogram call;

    /// Fills the counters and distributions of `stats`.
    void copy_to(gate_stats& stats) const noexcept {
        stats.admitted = m_frequent.sum(admitted_index);
        for (std::size_t i = 0; i < reject_reason_count; ++i) {
            stats.rejected[i] = m_frequent.sum(rejected_index + i);
        }
        stats.completed = m_frequent.sum(completed_index);
        stats.failed = read(m_failed);
        stats.work_cancelled = read(m_work_cancelled);
        stats.work_deadline_exceeded = read(m_work_deadline_exceeded);
        stats.rollback_failures = read(m_rollback_failures);
        stats.commit_unknown = read(m_commit_unknown);
        stats.deadline_rejected_early = read(m_deadline_rejected_early);
        stats.mean_permit_hold = mean_permit_hold();
        stats.mean_committed_hold = mean_committed_hold();
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

    // The counts of every call, striped per thread: admitted, one per
    // reject_reason, completed.
    static constexpr std::size_t admitted_index = 0;
    static constexpr std::size_t rejected_index = 1;
    static constexpr std::size_t completed_index = rejected_index + reject_reason_count;
    detail::striped_counters<completed_index + 1> m_frequent;
    // The rarer outcomes, on a line of their own.
    alignas(64) std::atomic<std::uint64_t> m_failed{0};
    std::atomic<std::uint64_t> m_work_cancelled{0};
    std::atomic<std::uint64_t> m_work_deadline_exceeded{0};
    std::atomic<std::uint64_t> m_rollback_failures{0};
    std::atomic<std::uint64_t> m_commit_unknown{0};
    std::atomic<std::uint64_t> m_deadline_rejected_early{0};
    // Written by every finished transaction: a line of its own.
    alignas(64) running_mean m_mean_hold;
    running_mean m_mean_committed_hold;
};

}  // namespace detail

}  // namespace bulkhead
