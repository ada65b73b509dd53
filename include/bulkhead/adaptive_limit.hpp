// bulkhead: an adaptive concurrency limit driven by the database's own signals.
//
// A gate built with adaptive_options moves its effective limit L (the
// execution permits in circulation) between a floor and B, the ceiling,
// from what its calls see of the database. Once per interval (250 ms by
// default) limit_controller reads one interval_sample: how many calls
// finished and how long each held its permit (pool wait, BEGIN, the
// callback, COMMIT), whether any call found no permit free, how many are
// still inside, and how many failed with an SQLSTATE that says the server
// is saturated (class 53), timed out (57014, 55P03) or conflicted (40001,
// 40P01). The rules, first match wins:
//   1. a saturation error in the interval: L x 1/2 (saturated);
//   2. timeouts and conflicts at or above error_rate of the finished calls:
//      L x 3/4 (errors);
//   3. calls inside, none finished, for longer than tolerance x the
//      baseline: L x 1/2 (stalled);
//   4. L above the floor, the mean hold over tolerance x the baseline in
//      this interval and the last one measured (ratio: the lower of the
//      two), and the calls this implies are queued inside the database,
//      in_flight x (1 - 1 / ratio), more than queue_allowance x log10(L):
//      down to the higher of L x tolerance / ratio (kept within [1/2,
//      9/10]) and in_flight / ratio + the allowance, one permit at least
//      (latency);
//   5. this interval's mean hold within headroom x the baseline, some call
//      found no permit free, and at least half of L in use on average:
//      L x 2 until any of rules 1-4 first acts (a slow start from the
//      floor), L + max(1, L/4) after (recovered);
//   6. otherwise L stays.
// Rules 4 and 5 need min_samples finished calls. L is rounded and clamped
// to [floor, ceiling] (G6).
//
// The baseline is what a call costs uncongested: the first interval with
// min_samples calls sets it; then it follows a lower mean half-way per
// interval, a higher one by 1/8 only from an interval in which no call
// found the permits lacking and the ratio was within the tolerance, or by
// 1/16 at the floor. It never rises from a limited interval above the
// floor: that stops the upward drift of limiters whose baseline is the
// latency under load (G5). docs/adaptive.md explains each rule and
// constant, with the runs that decided them.
//
// Thread safety: limit_controller is a plain value, not synchronized;
// detail::adaptive_gate runs it under a mutex. The structs are plain data.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace bulkhead {

/// Why the adaptive limit last changed.
enum class limit_reason : std::uint8_t {
    initial,    ///< not changed since the gate was built: L is the floor
    saturated,  ///< rule 1: a saturation error (SQLSTATE class 53)
    errors,     ///< rule 2: timeouts or conflicts at or above the error rate
    stalled,    ///< rule 3: calls inside and none finished
    latency,    ///< rule 4: the hold above the tolerance, with a queue beyond the allowance
    recovered,  ///< rule 5: the hold back near the baseline, the limit reached
};

/// The number of limit_reason values.
inline constexpr std::size_t limit_reason_count = 6;

/// A short, stable, lower-case name for `reason`, for metric labels and logs.
[[nodiscard]] constexpr std::string_view to_string(limit_reason reason) noexcept {
    constexpr std::string_view names[limit_reason_count] = {"initial", "saturated", "errors",
                                                            "stalled", "latency",   "recovered"};
    const auto index = static_cast<std::size_t>(reason);
    return index < limit_reason_count ? names[index] : "unknown";
}

/// How a failed call bears on the limit: what a pool's classify_overload()
/// says of the exception that ended it.
enum class overload_kind : std::uint8_t {
    none,       ///< says nothing about the database's load
    saturated,  ///< out of a resource (class 53: 53300 too many connections, 53200 out of memory)
    timeout,    ///< a statement or lock timed out (57014, 55P03)
    conflict,   ///< a serialization failure or deadlock (40001, 40P01)
};

/// The settings of an adaptive limit; docs/adaptive.md explains the defaults.
struct adaptive_options {
    /// The least limit, where the slow start begins and the first baseline
    /// is learnt: the concurrency the steady load needs when the database
    /// is healthy. In [1, B].
    int floor = 1;
    /// How often the limit is reconsidered. The gate looks at the clock when
    /// a call finishes or must queue: a gate nobody calls does not adapt.
    std::chrono::milliseconds interval{250};
    /// A mean hold above tolerance x the baseline is congestion (rules 3,
    /// 4). Finite, above 1.
    double tolerance = 1.5;
    /// A mean hold within headroom x the baseline lets the limit grow
    /// (rule 5). In [1, tolerance].
    double headroom = 1.25;
    /// Rule 2's share of the finished calls. In (0, 1].
    double error_rate = 0.05;
    /// Fewer finished calls in an interval say nothing of the latency. At
    /// least 1.
    int min_samples = 3;
    /// Rule 4's queue per decade of the limit: 6 is 5.4 calls at L = 8, 7.2
    /// at 16, 10.8 at 64. 0: the hold ratio alone decides. Finite, at
    /// least 0.
    double queue_allowance = 6.0;
};

/// What the gate saw in one interval, given to limit_controller::update().
struct interval_sample {
    std::chrono::nanoseconds length{0};  ///< how long the interval lasted
    std::int64_t calls = 0;              ///< calls that released their permit (finished, failed or refused by the pool)
    std::chrono::nanoseconds held{0};    ///< the sum of their permit holds
    std::int64_t inside = 0;             ///< calls holding a permit at the end of the interval
    bool limited = false;                ///< some call found no permit free (it queued or was turned away)
    std::int64_t saturated = 0;          ///< of `calls`: failed with SQLSTATE class 53
    std::int64_t timeouts = 0;           ///< of `calls`: statement or lock timeouts, pool timeouts
    std::int64_t conflicts = 0;          ///< of `calls`: serialization failures and deadlocks
};

/// The rules of the file comment, as a plain value: feed it one
/// interval_sample per interval, read the limit it decides.
class limit_controller {
public:
    /// \throws std::invalid_argument naming the setting out of range
    ///         (floor, interval, tolerance, headroom, error_rate,
    ///         min_samples, queue_allowance) or a ceiling below 1.
    limit_controller(const adaptive_options& options, int ceiling)
        : m_options(checked(options, ceiling)), m_ceiling(ceiling), m_limit(m_options.floor) {}

    /// Reads one interval; returns the limit for the next one.
    int update(const interval_sample& sample) noexcept {
        const int before = m_limit;
        const limit_reason reason = decide(sample);
        if (m_limit != before) {
            m_reason = reason;
            ++m_changes;
        }
        return m_limit;
    }

    /// The limit decided last (the floor until the first change).
    [[nodiscard]] int limit() const noexcept { return m_limit; }
    /// Why it last changed.
    [[nodiscard]] limit_reason reason() const noexcept { return m_reason; }
    /// How many updates changed it.
    [[nodiscard]] std::uint64_t changes() const noexcept { return m_changes; }
    /// What a call costs uncongested: zero until an interval had
    /// min_samples finished calls.
    [[nodiscard]] std::chrono::nanoseconds baseline() const noexcept {
        return std::chrono::nanoseconds(static_cast<std::int64_t>(m_baseline_ns));
    }
    [[nodiscard]] int floor() const noexcept { return m_options.floor; }
    [[nodiscard]] int ceiling() const noexcept { return m_ceiling; }
    [[nodiscard]] const adaptive_options& options() const noexcept { return m_options; }

private:
    limit_reason decide(const interval_sample& sample) noexcept {
        const auto finished = static_cast<double>(std::max<std::int64_t>(sample.calls, 0));
        if (sample.saturated > 0) {
            return cut_to(m_limit / 2, limit_reason::saturated);
        }
        const auto troubled = static_cast<double>(sample.timeouts + sample.conflicts);
        if (troubled > 0.0 && troubled >= m_options.error_rate * finished) {
            return cut_to(m_limit * 3 / 4, limit_reason::errors);
        }
        const auto length = static_cast<double>(sample.length.count());
        if (m_baseline_ns > 0.0 && sample.calls == 0 && sample.inside > 0 &&
            length > m_options.tolerance * m_baseline_ns) {
            return cut_to(m_limit / 2, limit_reason::stalled);
        }
        if (sample.calls < m_options.min_samples) {
            return m_reason;
        }
        const double mean = static_cast<double>(sample.held.count()) / finished;
        if (m_baseline_ns <= 0.0) {
            m_baseline_ns = std::max(1.0, mean);
            return m_reason;
        }
        const double ratio = mean / m_baseline_ns;
        // One interval's mean can jump several-fold when a neighbour's burst
        // takes the CPU: rule 4 cuts on a ratio that lasted two intervals.
        const double sustained = std::min(ratio, m_last_ratio);
        m_last_ratio = ratio;
        follow_baseline(mean, ratio, sample.limited);
        // Little's law: the calls in flight on average, and the queue inside
        // the database their latency implies.
        const double in_flight = length > 0.0 ? static_cast<double>(sample.held.count()) / length : 0.0;
        const double allowance = m_options.queue_allowance * std::log10(static_cast<double>(std::max(m_limit, 1)));
        const double uncongested = in_flight / sustained;
        if (sustained > m_options.tolerance && in_flight - uncongested > allowance && m_limit > m_options.floor) {
            const auto by_ratio = static_cast<int>(
                std::floor(static_cast<double>(m_limit) * std::clamp(m_options.tolerance / sustained, 0.5, 0.9)));
            const int by_queue = std::min(m_limit - 1, static_cast<int>(std::floor(uncongested + allowance)));
            return cut_to(std::max(by_ratio, by_queue), limit_reason::latency);
        }
        if (ratio <= m_options.headroom && sample.limited && m_limit < m_ceiling &&
            in_flight >= 0.5 * static_cast<double>(m_limit)) {
            set(m_slow_start ? m_limit * 2 : m_limit + std::max(1, m_limit / 4));
            return limit_reason::recovered;
        }
        return m_reason;
    }

    void follow_baseline(double mean, double ratio, bool limited) noexcept {
        if (mean < m_baseline_ns) {
            m_baseline_ns = std::max(1.0, m_baseline_ns + (mean - m_baseline_ns) / 2.0);
        } else if (!limited && ratio <= m_options.tolerance) {
            m_baseline_ns += (mean - m_baseline_ns) / 8.0;
        } else if (m_limit == m_options.floor) {
            m_baseline_ns += (mean - m_baseline_ns) / 16.0;
        }
    }

    limit_reason cut_to(int limit, limit_reason reason) noexcept {
        m_slow_start = false;
        set(limit);
        return reason;
    }

    void set(int limit) noexcept { m_limit = std::clamp(limit, m_options.floor, m_ceiling); }

    static adaptive_options checked(const adaptive_options& options, int ceiling) {
        const auto refuse = [](const std::string& what) {
            throw std::invalid_argument("bulkhead::adaptive_options: " + what);
        };
        if (ceiling < 1) {
            refuse("the ceiling (the gate's B) must be at least 1");
        }
        if (options.floor < 1 || options.floor > ceiling) {
            refuse("floor must be in [1, B] (B is " + std::to_string(ceiling) + ", floor " +
                   std::to_string(options.floor) + ")");
        }
        if (options.interval.count() < 1) {
            refuse("interval must be at least 1 ms");
        }
        if (!(options.tolerance > 1.0) || !std::isfinite(options.tolerance)) {
            refuse("tolerance must be a finite number above 1");
        }
        if (!(options.headroom >= 1.0 && options.headroom <= options.tolerance)) {
            refuse("headroom must be in [1, tolerance]");
        }
        if (!(options.error_rate > 0.0 && options.error_rate <= 1.0)) {
            refuse("error_rate must be in (0, 1]");
        }
        if (options.min_samples < 1) {
            refuse("min_samples must be at least 1");
        }
        if (!(options.queue_allowance >= 0.0) || !std::isfinite(options.queue_allowance)) {
            refuse("queue_allowance must be a finite number of at least 0");
        }
        return options;
    }

    adaptive_options m_options;  // settings
    int m_ceiling;               // settings: the gate's B
    // State.
    int m_limit;
    limit_reason m_reason = limit_reason::initial;
    std::uint64_t m_changes = 0;
    double m_baseline_ns = 0.0;  // 0: not known yet
    double m_last_ratio = 0.0;   // the last interval's mean hold over the baseline
    bool m_slow_start = true;    // no decrease yet: rule 5 doubles
};

}  // namespace bulkhead
