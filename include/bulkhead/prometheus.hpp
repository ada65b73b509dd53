// bulkhead: gate and pool statistics in the Prometheus text exposition
// format, version 0.0.4.
//
//   bulkhead::prometheus_exposition metrics;
//   metrics.add("orders", gate.stats());
//   metrics.add("main", pool.stats());
//   std::string body = metrics.render();   // Content-Type: text/plain; version=0.0.4
//
// Each metric family is written once (# HELP, # TYPE, then every gate's or
// pool's samples, told apart by the label gate="..." or pool="..."). Names
// follow Prometheus conventions: counters end in _total, durations are
// histograms in seconds (_bucket with cumulative le buckets, _sum, _count).
// Label values are escaped; nothing from a connection string ever becomes a
// label (the names are the caller's).
//
// A gate with workload classes (workload.hpp) adds the bulkhead_workload_*
// families, one sample per class, labelled gate="..." and workload="...".
//
// Histogram buckets come from bulkhead's log-linear histogram: a sample is
// counted in an `le` bucket when its whole log-linear bucket lies at or below
// `le`, so a bucket can undercount by the samples within about 3 % below its
// bound; +Inf always equals _count.
#pragma once

#include <bulkhead/gate_stats.hpp>
#include <bulkhead/pool_stats.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace bulkhead {

/// Collects named gate and pool snapshots and renders them as one exposition.
class prometheus_exposition {
public:
    /// The `le` bounds of every duration histogram, in seconds.
    static constexpr std::array<double, 16> bucket_bounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                             0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};

    /// Adds a gate's snapshot under the label gate="name".
    void add(std::string name, gate_stats stats) { m_gates.emplace_back(std::move(name), std::move(stats)); }

    /// Adds a pool's snapshot under the label pool="name".
    void add(std::string name, pool_stats stats) { m_pools.emplace_back(std::move(name), stats); }

    /// The exposition text (ends with a newline).
    [[nodiscard]] std::string render() const {
        std::string out;
        out.reserve(4096 + m_gates.size() * 16384);
        render_gates(out);
        render_pools(out);
        return out;
    }

    /// The label value for a rejection reason: full, queue_timeout,
    /// cancelled, pool_timeout, deadline, closed.
    [[nodiscard]] static constexpr std::string_view reason_label(reject_reason reason) noexcept {
        switch (reason) {
            case reject_reason::admission_full:
                return "full";
            case reject_reason::admission_timeout:
                return "queue_timeout";
            case reject_reason::admission_cancelled:
                return "cancelled";
            case reject_reason::pool_timeout:
                return "pool_timeout";
            case reject_reason::deadline_exceeded:
                return "deadline";
            case reject_reason::closed:
                return "closed";
        }
        return "unknown";
    }

private:
    template <class Stats>
    using named = std::pair<std::string, Stats>;

    // --- text helpers ---------------------------------------------------------------
    static void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
        out.append("# HELP ").append(name).append(" ").append(help).append("\n");
        out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
    }

    static void escaped(std::string& out, std::string_view value) {
        for (const char c : value) {
            switch (c) {
                case '\\':
                    out += "\\\\";
                    break;
                case '"':
                    out += "\\\"";
                    break;
                case '\n':
                    out += "\\n";
                    break;
                default:
                    out += c;
                    break;
            }
        }
    }

    static void number(std::string& out, std::uint64_t value) {
        std::array<char, 24> buffer{};
        const auto end = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value).ptr;
        out.append(buffer.data(), end);
    }

    static void number(std::string& out, double value) {
        std::array<char, 32> buffer{};
        const auto end = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value).ptr;
        out.append(buffer.data(), end);
    }

    using label = std::pair<std::string_view, std::string_view>;

    /// name{key="value",...} value
    template <class Value>
    static void labelled_sample(std::string& out, std::string_view name, std::initializer_list<label> labels,
                                Value value) {
        out.append(name).append("{");
        bool first = true;
        for (const auto& [key, text] : labels) {
            if (key.empty()) {
                continue;
            }
            out.append(first ? "" : ",").append(key).append("=\"");
            escaped(out, text);
            out.append("\"");
            first = false;
        }
        out.append("} ");
        number(out, value);
        out.append("\n");
    }

    /// name{key="owner"[,extra_key="extra"]} value
    template <class Value>
    static void sample(std::string& out, std::string_view name, std::string_view key, std::string_view owner,
                       Value value, std::string_view extra_key = {}, std::string_view extra = {}) {
        labelled_sample(out, name, {{key, owner}, {extra_key, extra}}, value);
    }

    // --- gates -------------------------------------------------------------------------
    /// One family with one sample per gate or pool: `field(stats)` is the value.
    template <class Stats, class Field>
    static void family(std::string& out, std::string_view name, std::string_view type, std::string_view help,
                       std::string_view key, const std::vector<named<Stats>>& owners, Field field) {
        header(out, name, type, help);
        for (const auto& [owner, stats] : owners) {
            sample(out, name, key, owner, static_cast<std::uint64_t>(field(stats)));
        }
    }

    template <class Field>
    void gate_family(std::string& out, std::string_view name, std::string_view type, std::string_view help,
                     Field field) const {
        family(out, name, type, help, "gate", m_gates, field);
    }

    /// A gauge in seconds from a duration of gate_stats.
    template <class Field>
    void gate_seconds(std::string& out, std::string_view name, std::string_view help, Field field) const {
        header(out, name, "gauge", help);
        for (const auto& [gate, stats] : m_gates) {
            sample(out, name, "gate", gate, std::chrono::duration<double>(field(stats)).count());
        }
    }

    void gate_histogram(std::string& out, std::string_view name, std::string_view help,
                        histogram_snapshot gate_stats::*field) const {
        header(out, name, "histogram", help);
        for (const auto& [gate, stats] : m_gates) {
            histogram_samples(out, name, gate, {}, stats.*field);
        }
    }

    /// One histogram's _bucket, _sum and _count samples for a gate (and a
    /// workload class, when `workload` is not empty).
    static void histogram_samples(std::string& out, std::string_view name, std::string_view gate,
                                  std::string_view workload, const histogram_snapshot& histogram) {
        const std::string bucket = std::string(name) + "_bucket";
        const std::string_view workload_key = workload.empty() ? std::string_view{} : std::string_view{"workload"};
        for (const double bound : bucket_bounds) {
            std::string le;
            number(le, bound);
            const auto bound_ns = static_cast<std::uint64_t>(bound * 1e9);
            labelled_sample(out, bucket, {{"gate", gate}, {workload_key, workload}, {"le", le}},
                            histogram.count_at_or_below(bound_ns));
        }
        labelled_sample(out, bucket, {{"gate", gate}, {workload_key, workload}, {"le", "+Inf"}}, histogram.count());
        labelled_sample(out, std::string(name) + "_sum", {{"gate", gate}, {workload_key, workload}},
                        static_cast<double>(histogram.sum()) / 1e9);
        labelled_sample(out, std::string(name) + "_count", {{"gate", gate}, {workload_key, workload}},
                        histogram.count());
    }

    /// One family with one sample per workload class of every gate that has
    /// classes: `field(workload_stats)` is the value.
    template <class Field>
    void workload_family(std::string& out, std::string_view name, std::string_view type, std::string_view help,
                         Field field) const {
        header(out, name, type, help);
        for (const auto& [gate, stats] : m_gates) {
            for (const workload_stats& one : stats.workloads) {
                labelled_sample(out, name, {{"gate", gate}, {"workload", one.name}}, field(one));
            }
        }
    }

    /// The families of the workload classes (workload.hpp), labelled
    /// gate="..." and workload="...": written only when a gate has classes.
    void render_workloads(std::string& out) const {
        const bool any = std::any_of(m_gates.begin(), m_gates.end(),
                                     [](const named<gate_stats>& gate) { return !gate.second.workloads.empty(); });
        if (!any) {
            return;
        }
        const auto count = [](int value) { return static_cast<std::uint64_t>(value); };
        const auto seconds = [](std::chrono::nanoseconds value) {
            return std::chrono::duration<double>(value).count();
        };
        workload_family(out, "bulkhead_workload_admitted_total", "counter",
                        "Calls of a workload class that got an admission slot and an execution permit.",
                        [](const workload_stats& w) { return w.admitted; });
        header(out, "bulkhead_workload_rejections_total", "counter",
               "Calls of a workload class turned away before their work started, by reason.");
        for (const auto& [gate, stats] : m_gates) {
            for (const workload_stats& one : stats.workloads) {
                for (std::size_t i = 0; i < reject_reason_count; ++i) {
                    labelled_sample(out, "bulkhead_workload_rejections_total",
                                    {{"gate", gate},
                                     {"workload", one.name},
                                     {"reason", reason_label(static_cast<reject_reason>(i))}},
                                    one.rejected[i]);
                }
            }
        }
        workload_family(out, "bulkhead_workload_running", "gauge",
                        "Calls of a workload class holding an execution permit.",
                        [&](const workload_stats& w) { return count(w.running); });
        workload_family(out, "bulkhead_workload_queued", "gauge",
                        "Calls of a workload class waiting for an execution permit.",
                        [&](const workload_stats& w) { return count(w.queued); });
        workload_family(out, "bulkhead_workload_available_slots", "gauge",
                        "Free admission slots of a workload class (of ceiling + queue).",
                        [&](const workload_stats& w) { return count(w.available_slots); });
        workload_family(out, "bulkhead_workload_reserved_permits", "gauge",
                        "Execution permits reserved for a workload class.",
                        [&](const workload_stats& w) { return count(w.reserved); });
        workload_family(out, "bulkhead_workload_ceiling", "gauge",
                        "The most execution permits a workload class holds at once.",
                        [&](const workload_stats& w) { return count(w.ceiling); });
        workload_family(out, "bulkhead_workload_limit", "gauge",
                        "The most execution permits a workload class holds at once now: its ceiling, or its "
                        "adaptive limit.",
                        [&](const workload_stats& w) { return count(w.limit); });
        workload_family(out, "bulkhead_workload_limit_changes_total", "counter",
                        "Changes of a workload class's adaptive limit.",
                        [](const workload_stats& w) { return w.limit_changes; });
        header(out, "bulkhead_workload_limit_reason", "gauge",
               "Why a workload class's adaptive limit last changed: 1 for that reason.");
        for (const auto& [gate, stats] : m_gates) {
            for (const workload_stats& one : stats.workloads) {
                for (std::size_t i = 0; i < limit_reason_count; ++i) {
                    const auto reason = static_cast<limit_reason>(i);
                    labelled_sample(out, "bulkhead_workload_limit_reason",
                                    {{"gate", gate}, {"workload", one.name}, {"reason", to_string(reason)}},
                                    std::uint64_t{one.limit_reason == reason ? 1U : 0U});
                }
            }
        }
        workload_family(out, "bulkhead_workload_mean_permit_hold_seconds", "gauge",
                        "Running mean of how long a call of a workload class holds its execution permit.",
                        [&](const workload_stats& w) { return seconds(w.mean_permit_hold); });
        workload_family(out, "bulkhead_workload_expected_queue_wait_seconds", "gauge",
                        "How long a call of a workload class arriving now would wait for its execution permit.",
                        [&](const workload_stats& w) { return seconds(w.expected_queue_wait); });
        header(out, "bulkhead_workload_permit_wait_seconds", "histogram",
               "Time from admission to an execution permit, by workload class.");
        for (const auto& [gate, stats] : m_gates) {
            for (const workload_stats& one : stats.workloads) {
                histogram_samples(out, "bulkhead_workload_permit_wait_seconds", gate, one.name, one.permit_wait);
            }
        }
    }

    void render_gates(std::string& out) const {
        if (m_gates.empty()) {
            return;
        }
        gate_family(out, "bulkhead_admitted_total", "counter",
                    "Calls that got an admission slot and an execution permit.",
                    [](const gate_stats& s) { return s.admitted; });
        header(out, "bulkhead_rejections_total", "counter", "Calls turned away before their work started, by reason.");
        for (const auto& [gate, stats] : m_gates) {
            for (std::size_t i = 0; i < reject_reason_count; ++i) {
                sample(out, "bulkhead_rejections_total", "gate", gate, stats.rejected[i], "reason",
                       reason_label(static_cast<reject_reason>(i)));
            }
        }
        gate_family(out, "bulkhead_completed_total", "counter", "Transactions committed.",
                    [](const gate_stats& s) { return s.completed; });
        gate_family(out, "bulkhead_failed_total", "counter", "Transactions that started and did not commit.",
                    [](const gate_stats& s) { return s.failed; });
        gate_family(out, "bulkhead_work_cancelled_total", "counter",
                    "Transactions cancelled on the server by a stop request.",
                    [](const gate_stats& s) { return s.work_cancelled; });
        gate_family(out, "bulkhead_work_deadline_exceeded_total", "counter",
                    "Transactions cut short by the call's deadline.",
                    [](const gate_stats& s) { return s.work_deadline_exceeded; });
        gate_family(out, "bulkhead_rollback_failures_total", "counter",
                    "Rollbacks that failed; the connection was discarded.",
                    [](const gate_stats& s) { return s.rollback_failures; });
        gate_family(out, "bulkhead_commit_unknown_total", "counter",
                    "Commits whose connection was lost and whose outcome could not be settled.",
                    [](const gate_stats& s) { return s.commit_unknown; });
        gate_family(out, "bulkhead_deadline_rejected_early_total", "counter",
                    "Of the deadline rejections: calls refused at admission, their deadline shorter than the "
                    "expected queue wait.",
                    [](const gate_stats& s) { return s.deadline_rejected_early; });
        gate_seconds(out, "bulkhead_mean_permit_hold_seconds",
                     "Running mean of how long a transaction holds its execution permit.",
                     [](const gate_stats& s) { return s.mean_permit_hold; });
        gate_seconds(out, "bulkhead_expected_queue_wait_seconds",
                     "How long a call arriving now would wait for its execution permit, by the gate's estimate.",
                     [](const gate_stats& s) { return s.expected_queue_wait; });
        gate_seconds(out, "bulkhead_suggested_retry_delay_seconds", "The retry delay a rejection now would carry.",
                     [](const gate_stats& s) { return s.suggested_retry_delay; });
        gate_family(out, "bulkhead_running", "gauge", "Calls holding an execution permit.",
                    [](const gate_stats& s) { return static_cast<std::uint64_t>(s.running); });
        gate_family(out, "bulkhead_queued", "gauge", "Calls waiting for an execution permit.",
                    [](const gate_stats& s) { return static_cast<std::uint64_t>(s.queued); });
        gate_family(out, "bulkhead_available_permits", "gauge", "Free execution permits.",
                    [](const gate_stats& s) { return static_cast<std::uint64_t>(s.available); });
        gate_family(out, "bulkhead_available_slots", "gauge", "Free admission slots.",
                    [](const gate_stats& s) { return static_cast<std::uint64_t>(s.available_slots); });
        gate_family(out, "bulkhead_concurrency_limit", "gauge", "Execution permits B.",
                    [](const gate_stats& s) { return static_cast<std::uint64_t>(s.concurrent); });
        gate_family(out, "bulkhead_admission_limit", "gauge", "Admission slots B + Q.", [](const gate_stats& s) {
            return static_cast<std::uint64_t>(s.concurrent) + static_cast<std::uint64_t>(s.extra_slots);
        });
        gate_family(out, "bulkhead_effective_limit", "gauge",
                    "Execution permits in circulation: B, or the adaptive limit.",
                    [](const gate_stats& s) { return static_cast<std::uint64_t>(s.limit); });
        gate_family(out, "bulkhead_limit_floor", "gauge", "The adaptive limit's floor (B for a fixed gate).",
                    [](const gate_stats& s) { return static_cast<std::uint64_t>(s.limit_floor); });
        gate_family(out, "bulkhead_limit_changes_total", "counter", "Changes of the adaptive limit.",
                    [](const gate_stats& s) { return s.limit_changes; });
        header(out, "bulkhead_limit_reason", "gauge", "Why the adaptive limit last changed: 1 for that reason.");
        for (const auto& [gate, stats] : m_gates) {
            for (std::size_t i = 0; i < limit_reason_count; ++i) {
                const auto reason = static_cast<limit_reason>(i);
                sample(out, "bulkhead_limit_reason", "gate", gate,
                       std::uint64_t{stats.limit_reason == reason ? 1U : 0U}, "reason", to_string(reason));
            }
        }
        gate_seconds(out, "bulkhead_latency_baseline_seconds",
                     "What a call costs when the database is not congested, as the adaptive limit tracks it.",
                     [](const gate_stats& s) { return s.latency_baseline; });
        gate_histogram(out, "bulkhead_permit_wait_seconds", "Time from admission to an execution permit.",
                       &gate_stats::permit_wait);
        gate_histogram(out, "bulkhead_pool_wait_seconds", "Time from the execution permit to a pool connection.",
                       &gate_stats::pool_wait);
        gate_histogram(out, "bulkhead_connection_hold_seconds", "Time a call held its pool connection.",
                       &gate_stats::connection_hold);
        gate_histogram(out, "bulkhead_work_seconds", "Time spent in the callback.", &gate_stats::work);
        gate_histogram(out, "bulkhead_call_seconds", "Time from admission until the connection was returned.",
                       &gate_stats::call);
        render_workloads(out);
    }

    // --- pools -------------------------------------------------------------------------
    template <class Field>
    void pool_family(std::string& out, std::string_view name, std::string_view type, std::string_view help,
                     Field field) const {
        family(out, name, type, help, "pool", m_pools, field);
    }

    void render_pools(std::string& out) const {
        if (m_pools.empty()) {
            return;
        }
        pool_family(out, "bulkhead_pool_max_connections", "gauge", "The pool's max_size.",
                    [](const pool_stats& s) { return s.max_size; });
        pool_family(out, "bulkhead_pool_open_connections", "gauge", "Connections open or being opened.",
                    [](const pool_stats& s) { return s.size; });
        header(out, "bulkhead_pool_connections", "gauge", "Open connections by state.");
        for (const auto& [pool, stats] : m_pools) {
            sample(out, "bulkhead_pool_connections", "pool", pool, static_cast<std::uint64_t>(stats.idle), "state",
                   "idle");
            sample(out, "bulkhead_pool_connections", "pool", pool, static_cast<std::uint64_t>(stats.in_use), "state",
                   "in_use");
        }
        pool_family(out, "bulkhead_pool_waiting", "gauge", "Threads waiting for a connection.",
                    [](const pool_stats& s) { return s.waiting; });
        pool_family(out, "bulkhead_pool_opened_total", "counter", "Connections opened.",
                    [](const pool_stats& s) { return s.opened; });
        pool_family(out, "bulkhead_pool_connect_failures_total", "counter", "Connection attempts that failed.",
                    [](const pool_stats& s) { return s.connect_failures; });
        pool_family(out, "bulkhead_pool_acquire_timeouts_total", "counter",
                    "Waits for a connection that ended in pool_timeout.",
                    [](const pool_stats& s) { return s.acquire_timeouts; });
        header(out, "bulkhead_pool_closed_total", "counter", "Connections closed, by reason.");
        for (const auto& [pool, stats] : m_pools) {
            for (std::size_t i = 0; i < close_reason_count; ++i) {
                sample(out, "bulkhead_pool_closed_total", "pool", pool, stats.closed[i], "reason",
                       to_string(static_cast<close_reason>(i)));
            }
        }
    }

    std::vector<named<gate_stats>> m_gates;
    std::vector<named<pool_stats>> m_pools;
};

}  // namespace bulkhead
