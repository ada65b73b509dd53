// bulkhead: an adaptive concurrency limit driven by the database's own signals.
//
// A gate built with adaptive_options moves its effective limit L (the
// execution permits in circulation) between a floor and B, the ceiling,
// from what its calls see of the database. Once per interval (250 ms by
// default) the controller reads one interval_sample: how many calls
// finished, how long each held its permit (pool wait, BEGIN, the callback,
// COMMIT: the time the database spent on it, or made it wait), whether any
// call found no permit free, how many calls are still inside, and how many
// failed with an SQLSTATE that means the server is saturated (class 53),
// timed out (57014, 55P03) or conflicted (40001, 40P01). docs/adaptive.md
// describes the rules and why their constants are what they are.
//
// The rules, in order (first match wins):
//   1. a saturation error (class 53) in the interval: L x 1/2;
//   2. timeouts or conflicts above error_rate of the finished calls: L x 3/4;
//   3. calls inside and none finished for an interval longer than
//      tolerance x the baseline: stalled, L x 1/2;
//   4. the mean permit hold over throughput_tolerance x the baseline, or
//      over tolerance x the baseline at a limit that rule 5b has not
//      vouched for, in this interval and the one before (the lower of the
//      two ratios counts: one interval's spike is noise), and the calls
//      that this implies are queued inside the database (the calls in
//      flight x (1 - 1 / ratio)) more than queue_allowance x log10(L)
//      (the shape of TCP Vegas's beta: 5.4 at L = 8): L x tolerance /
//      ratio, kept within [1/2, 9/10] (the further off, the faster down),
//      or, if higher, the calls in flight / ratio + the allowance (where
//      the queue would be within it at the same throughput), one permit
//      less at least; a rule-5b step still being judged goes back to
//      where it started instead;
//   5. the mean hold within headroom x the baseline, the limit was
//      reached (a call found no permit free) and at least half of it was
//      in use on average: L x 2 until the first decrease (a slow start
//      from the floor, where the gate begins, so that the baseline is
//      learnt uncongested), L + max(1, L/4) after;
//   5b. (throughput) the mean hold above headroom x the baseline and
//      rule 4 did not cut (the hold within throughput_tolerance, or the
//      queue within the allowance): a step up is judged on the
//      mean of the two intervals after it, against the calls finished per
//      second at the limit before it:
//      - at the same calls per second, the time a call spends in the gate
//        (its wait for a permit plus its hold) fell by the gain asked
//        below, and the fall came from the wait: a gain (an open loop,
//        whose arrivals are fixed, can only gain this way);
//      - the extra permits went unused (the calls in flight on average,
//        the permit holds over the interval's length, rose by less than
//        half the added permits, or no call found a permit lacking): no
//        conclusion; a rule-5b step is undone, a rule-5 step kept;
//      - they bought at least 1/4 x the step's proportion more calls per
//        second (but no less than 5 % and no more than 10 % is asked):
//        the new limit is vouched for (rule 4's tolerance does not apply
//        to it, nor to a limit below it that rule 4 cuts to; every 16
//        intervals without a new gain the vouch steps down by a fifth),
//        and rule 5b steps on;
//      - they were used and bought less: no_gain; a rule-5b step goes
//        back (a rule-5 step stays: the latency rules allowed it), and
//        rule 5b waits 8 intervals before it steps again;
//      with no step pending, limited and at least 3/4 of the permits busy
//      on average (or the calls waiting for a permit at least a fifth of
//      their time in the gate), rule 5b steps up by max(1, L/4), but not beyond
//      L x throughput_tolerance / ratio (where the hold would reach the
//      bound if it grew in proportion, as it does once throughput is
//      flat) or, if higher, the calls in flight / ratio + the queue
//      allowance (where the queue would reach it), one permit at least;
//      at the floor, where rule 4 has nothing to cut, it may step with
//      the hold above the tolerance;
//   6. otherwise L stays.
// L is always rounded and clamped to [floor, ceiling] (G6).
//
// Rule 5b exists for a CPU-bound server shared by callers, backends and
// neighbours: every call in flight lengthens every call while throughput
// still grows, so the hold passes the headroom long before the server is
// saturated, and the latency rules alone stop early. In an open loop
// (arrivals at a rate of their own) the same hold stops them where the
// permits are nearly all busy and calls queue for them; a step up there
// buys no calls per second, only a shorter wait, and rule 5b takes that
// as a gain too. Rule 5b accepts a
// rise in latency that buys throughput, up to throughput_tolerance (2x:
// the calls' latency stays within about twice what they cost uncongested)
// or the queue allowance, and backs off when a larger limit bought none.
// It never stands in the way of the latency rules: rule 5's growth comes
// first, a verdict concludes only from permits that were used, and only
// rule 5b's own steps are taken back.
//
// The queue allowance exists for the same server at small limits: there a
// few calls in flight can make each take three to five times what one
// costs alone, yet only a few calls are queued, and a bound on the ratio
// alone cut such a gate to its floor and lost a quarter to two fifths of
// its throughput (docs/adaptive.md, "The queue allowance"). A ratio says
// how much slower; the implied queue says how many of the gate's own calls
// are waiting inside the database, which is what a limit can change.
//
// The baseline is what a call costs when the database is not congested.
// It follows a lower mean fast (half-way per interval), and a higher one
// only from intervals that are not limited (the gate had spare permits:
// the load is light, the figure is clean), by 1/8 per interval, or, at the
// floor, by 1/16 per interval (the floor is the least concurrency the gate
// can offer; what a call costs there is the best the database can do now).
// It never rises from a limited interval above the floor: that is what
// stops the upward drift of limiters whose baseline is a long-term mean of
// the latency under load (G5).
//
// Thread safety: limit_controller is a plain value, not synchronized; the
// gate calls it under its own mutex (db_bulkhead.hpp). adaptive_options and
// interval_sample are plain data.
#pragma once

#include <bulkhead/fifo_semaphore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

namespace bulkhead {

/// Why the adaptive limit last changed.
enum class limit_reason : std::uint8_t {
    initial,     ///< not changed since the gate was built: L is the floor
    saturated,   ///< the server reported a saturation error (SQLSTATE class 53)
    errors,      ///< timeouts (57014, 55P03) or conflicts (40001, 40P01) above the error rate
    stalled,     ///< calls inside and none finished for longer than tolerance x the baseline
    latency,     ///< the mean permit hold rose above tolerance x the baseline
    recovered,   ///< the mean permit hold is back near the baseline and the limit was reached
    throughput,  ///< the last step up bought throughput: the limit grows on, past the headroom
    no_gain,     ///< a step up whose extra permits were used bought no throughput: back to the limit before it
};

/// The number of limit_reason values.
inline constexpr std::size_t limit_reason_count = 8;

/// A short, stable, lower-case name for `reason` ("latency", ...), for
/// metric labels and logs.
[[nodiscard]] constexpr std::string_view to_string(limit_reason reason) noexcept {
    switch (reason) {
        case limit_reason::initial:
            return "initial";
        case limit_reason::saturated:
            return "saturated";
        case limit_reason::errors:
            return "errors";
        case limit_reason::stalled:
            return "stalled";
        case limit_reason::latency:
            return "latency";
        case limit_reason::recovered:
            return "recovered";
        case limit_reason::throughput:
            return "throughput";
        case limit_reason::no_gain:
            return "no_gain";
    }
    return "unknown";
}

/// How a failed call bears on the limit: what a pool's classify_overload()
/// says of the exception that ended it.
enum class overload_kind : std::uint8_t {
    none,       ///< says nothing about the database's load
    saturated,  ///< the server is out of a resource (SQLSTATE class 53: 53300 too many connections, 53200 out of
                ///< memory)
    timeout,    ///< a statement or lock timed out (57014, 55P03)
    conflict,   ///< a serialization failure or deadlock (40001, 40P01)
};

/// The settings of an adaptive limit. The defaults are the ones
/// docs/adaptive.md explains.
struct adaptive_options {
    /// The least limit: never fewer permits in circulation. At least 1, at
    /// most the gate's B. The slow start begins here and the first
    /// baseline is learnt here: set it to the concurrency the steady load
    /// needs when the database is healthy (calls per second x their quiet
    /// hold), docs/adaptive.md ("A floor at the concurrency the load needs").
    int floor = 1;
    /// How often the limit is reconsidered. The gate looks at the clock when
    /// a call finishes or must queue, so a gate nobody calls does not adapt.
    std::chrono::milliseconds interval{250};
    /// A mean permit hold above tolerance x the baseline means the database
    /// is congested. Above 1.
    double tolerance = 1.5;
    /// A mean permit hold within headroom x the baseline, with the limit
    /// reached, lets the limit grow. In [1, tolerance].
    double headroom = 1.25;
    /// Timeouts and conflicts above this share of the finished calls lower
    /// the limit. In (0, 1].
    double error_rate = 0.05;
    /// Fewer finished calls than this in an interval say nothing about the
    /// latency (the stall and error rules still apply). At least 1.
    int min_samples = 3;
    /// A mean permit hold up to throughput_tolerance x the baseline is
    /// accepted while each step up of the limit buys throughput (rule 5b of
    /// the file comment); above it the latency rule cuts, unless the queue
    /// it implies is within queue_allowance. At least headroom (equal to
    /// it: no throughput rule, the latency rules alone); 2 by default.
    double throughput_tolerance = 2.0;
    /// The calls the latency rule lets queue inside the database, per
    /// decade of the limit: at limit L it cuts only when the calls in
    /// flight x (1 - baseline / hold) pass queue_allowance x log10(L) (the
    /// shape of TCP Vegas's beta), and then only as far as that queue
    /// needs. 6 by default: 5.4 calls at L = 8, 7.2 at 16, 10.8 at
    /// 64. 0 switches it off: the hold ratio alone decides. Finite, at
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
    /// The sum of the permit waits that ended in the interval, with a
    /// permit or without (a call that found one free waited nothing).
    /// Zero where the waits are not timed (enter()).
    std::chrono::nanoseconds waited{0};
    std::int64_t saturated = 0;  ///< of `calls`: failed with SQLSTATE class 53
    std::int64_t timeouts = 0;   ///< of `calls`: statement or lock timeouts, pool timeouts
    std::int64_t conflicts = 0;  ///< of `calls`: serialization failures and deadlocks
};

/// The rules of the file comment, as a plain value: feed it one
/// interval_sample per interval, read the limit it decides.
class limit_controller {
public:
    /// \throws std::invalid_argument naming the setting that is out of
    ///         range (floor, interval, tolerance, headroom, error_rate,
    ///         min_samples, throughput_tolerance, queue_allowance) or a
    ///         ceiling below 1.
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
    /// What a call costs when the database is not congested: zero until
    /// an interval had min_samples finished calls.
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
            return scale(0.5, limit_reason::saturated);
        }
        const auto troubled = static_cast<double>(sample.timeouts + sample.conflicts);
        if (troubled > 0.0 && troubled >= m_options.error_rate * finished) {
            return scale(0.75, limit_reason::errors);
        }
        if (m_baseline_ns <= 0.0) {
            learn_first_baseline(sample);
            return m_reason;
        }
        if (sample.calls == 0) {
            const auto length = static_cast<double>(sample.length.count());
            if (sample.inside > 0 && length > m_options.tolerance * m_baseline_ns) {
                return scale(0.5, limit_reason::stalled);
            }
            return m_reason;
        }
        if (sample.calls < m_options.min_samples) {
            return m_reason;
        }
        const double mean = static_cast<double>(sample.held.count()) / finished;
        const double ratio = mean / m_baseline_ns;
        // Rule 4 cuts on a latency that lasted: the lower of this
        // interval's ratio and the last one's. One interval's mean can jump
        // several-fold when a neighbour's burst takes the CPU.
        const double sustained = std::min(ratio, m_last_ratio);
        m_last_ratio = ratio;
        follow_baseline(mean, ratio, sample.limited);
        const interval_figures now = figures(sample);
        // throughput_tolerance == headroom: the latency rules alone, no
        // step judged, no limit vouched for.
        const bool throughput_rule = m_options.throughput_tolerance > m_options.headroom;
        const verdict said = throughput_rule ? judge_probe() : verdict::none;
        if (m_cooldown > 0) {
            --m_cooldown;
        }
        if (m_vouch_left > 0 && --m_vouch_left == 0) {
            // A step down, to be earned again: one lucky interval must not
            // hold a limit for good, nor one lapse undo every step.
            m_vouched = m_vouched * 4 / 5;
            m_vouch_left = m_vouched > 0 ? vouch_intervals : 0;
        }
        if (said == verdict::gain) {
            m_vouched = m_limit;
            m_vouch_left = vouch_intervals;
        } else if (said == verdict::no_gain) {
            m_cooldown = probe_pause;  // whichever rule acts now: no rule-5b step for a while
        }
        // A rule-5b step is judged before the tolerance applies to it, and
        // at the floor, where rule 4 has nothing to cut, rule 5b may try a
        // step; the throughput tolerance always applies.
        const bool judging = said == verdict::pending && m_probe_was_5b;
        // The calls queued inside the database, as the latency implies:
        // of those in flight, the share beyond what the baseline's cost
        // would need for the same throughput.
        const double in_flight = occupancy(sample);
        const double allowance = allowed_queue(m_limit);
        const double uncongested = in_flight / sustained;
        const bool queueing = in_flight - uncongested > allowance;
        if (queueing &&
            ((throughput_rule && sustained > m_options.throughput_tolerance) ||
             (sustained > m_options.tolerance && m_limit > m_vouched && !judging && m_limit > m_options.floor))) {
            if (said != verdict::none && said != verdict::gain && m_probe_was_5b) {
                // Rule 5b's step went too far, or bought nothing: back to
                // where it started.
                m_slow_start = false;
                m_cooldown = probe_pause;
                set(m_probe_back);
                return said == verdict::no_gain ? limit_reason::no_gain : limit_reason::latency;
            }
            // Down by the ratio (the further off, the faster), or only to
            // where the queue would be within its allowance at the same
            // throughput, if that is higher: one permit at least.
            const int vouched = m_vouched;
            const auto by_ratio = static_cast<int>(
                std::floor(static_cast<double>(m_limit) * std::clamp(m_options.tolerance / sustained, 0.5, 0.9)));
            const int by_queue = std::min(m_limit - 1, static_cast<int>(std::floor(uncongested + allowance)));
            const limit_reason reason = cut_to(std::max(by_ratio, by_queue), limit_reason::latency);
            // Below the limit that was too slow, what bought throughput still did.
            m_vouched = std::min(vouched, m_limit);
            return reason;
        }
        if (ratio <= m_options.headroom) {
            // The latency rules' growth: never held back by the throughput rule.
            if (sample.limited && m_limit < m_ceiling && in_flight >= used_to_grow * m_limit) {
                // Doubling until the first sign of congestion, then by a quarter.
                grow(m_slow_start ? m_limit * 2 : m_limit + std::max(1, m_limit / 4), now, false);
                return limit_reason::recovered;
            }
            return m_reason;
        }
        // Rule 5b: ratio > headroom and rule 4 did not cut (the ratio is
        // within the tolerances, or the queue within its allowance).
        if (!throughput_rule) {
            return m_reason;
        }
        if (said == verdict::no_gain && m_probe_was_5b) {
            m_slow_start = false;
            set(m_probe_back);
            return limit_reason::no_gain;
        }
        if (said == verdict::unused && m_probe_was_5b) {
            set(m_probe_back);  // rule 5b's step said nothing: undone, not judged
            return m_reason;
        }
        if (said == verdict::pending) {
            return m_reason;
        }
        // A step of a quarter, but no further than where the hold would
        // reach throughput_tolerance x the baseline if it grew in proportion
        // (as it does once throughput is flat), or the queue the allowance
        // (the same calls uncongested, plus the allowance), whichever is
        // higher; one permit at least (a step that goes too far is back
        // after the two intervals that judge it).
        const auto bound = static_cast<int>(std::floor(std::max(
            static_cast<double>(m_limit) * m_options.throughput_tolerance / ratio, in_flight / ratio + allowance)));
        const int next = std::max(m_limit + 1, std::min(m_limit + std::max(1, m_limit / 4), bound));
        const bool waiting = now.wait >= waiting_share * now.in_gate;
        if (sample.limited && next > m_limit && m_cooldown == 0 && (now.occupancy >= busy * m_limit || waiting)) {
            grow(next, now, true);
            return limit_reason::throughput;
        }
        return m_reason;
    }

    /// Rule 5b's figures of one interval.
    struct interval_figures {
        double rate = 0.0;       // calls finished per second
        double occupancy = 0.0;  // calls in flight on average: the permit holds over the interval's length
        double wait = 0.0;       // seconds waited for a permit, per finished call
        double in_gate = 0.0;    // wait plus hold, per finished call (seconds)
        bool limited = false;
    };

    /// What the step up taken at the last update says, judged in the
    /// interval after it.
    enum class verdict : std::uint8_t {
        none,     // no step pending
        pending,  // too few intervals at the new limit yet
        unused,   // the extra permits were not used: no conclusion
        gain,     // they bought throughput
        no_gain,  // they were used and bought none
    };

    /// This interval's figures, folded into those of the current limit:
    /// the mean of its first intervals, then a moving average over about
    /// the last averaged_intervals (one interval's rate is too noisy to
    /// judge a step by).
    interval_figures figures(const interval_sample& sample) noexcept {
        interval_figures result;
        const auto seconds = std::chrono::duration<double>(sample.length).count();
        if (seconds > 0.0) {
            result.rate = static_cast<double>(std::max<std::int64_t>(sample.calls, 0)) / seconds;
            result.occupancy = occupancy(sample);
        }
        if (sample.calls > 0) {
            const auto calls = static_cast<double>(sample.calls);
            result.wait = std::chrono::duration<double>(sample.waited).count() / calls;
            result.in_gate = result.wait + std::chrono::duration<double>(sample.held).count() / calls;
        }
        result.limited = sample.limited;
        if (m_figures_limit != m_limit) {
            m_figures_limit = m_limit;
            m_figures_count = 0;
            m_figures = interval_figures{.limited = true};
        }
        m_figures_count = std::min(m_figures_count + 1, averaged_intervals);
        const auto weight = 1.0 / static_cast<double>(m_figures_count);
        m_figures.rate += (result.rate - m_figures.rate) * weight;
        m_figures.occupancy += (result.occupancy - m_figures.occupancy) * weight;
        m_figures.wait += (result.wait - m_figures.wait) * weight;
        m_figures.in_gate += (result.in_gate - m_figures.in_gate) * weight;
        m_figures.limited = m_figures.limited && result.limited;
        return m_figures;
    }

    /// Judges the step from m_probe_back to m_limit taken at the last
    /// update, once, and forgets it.
    verdict judge_probe() noexcept {
        const int from = m_probe_back;
        const int to = m_probe_to;
        if (to != m_limit || from >= to || m_probe_rate <= 0.0) {
            m_probe_to = 0;
            return verdict::none;
        }
        const interval_figures& now = m_figures;
        if (m_figures_count < judged_intervals) {
            return verdict::pending;
        }
        m_probe_to = 0;
        const double step = static_cast<double>(to) / static_cast<double>(from) - 1.0;
        const double needed = std::clamp(gain_share * step, min_gain, max_gain);
        // A shorter wait: at the same calls per second, the calls spent
        // `needed` less time in the gate, saved on their wait for a permit.
        // Where the arrivals are fixed (an open loop) a step cannot buy
        // calls per second, only this; in a closed loop the time in the
        // gate is the callers over the calls per second, so this is a gain
        // in throughput by another name.
        const double saved = m_probe_in_gate * needed;
        if (m_probe_wait > 0.0 && now.rate >= m_probe_rate * (1.0 - min_gain) && m_probe_wait - now.wait >= saved &&
            m_probe_in_gate - now.in_gate >= saved) {
            return verdict::gain;
        }
        // Used: the calls in flight rose by at least half the added permits,
        // and calls still found none free.
        const auto added = static_cast<double>(to - from);
        if (!now.limited || now.occupancy < m_probe_occupancy + added / 2.0) {
            return verdict::unused;
        }
        return now.rate >= m_probe_rate * (1.0 + needed) ? verdict::gain : verdict::no_gain;
    }

    /// Raises the limit to `limit`, remembering where it came from and the
    /// throughput there, for judge_probe() in the next interval.
    void grow(int limit, const interval_figures& now, bool by_5b) noexcept {
        m_probe_was_5b = by_5b;
        m_probe_back = m_limit;
        m_probe_rate = now.rate;
        m_probe_occupancy = now.occupancy;
        m_probe_wait = now.wait;
        m_probe_in_gate = now.in_gate;
        set(limit);
        m_probe_to = m_limit;
    }

    void learn_first_baseline(const interval_sample& sample) noexcept {
        if (sample.calls >= m_options.min_samples) {
            m_baseline_ns = std::max(1.0, static_cast<double>(sample.held.count()) / static_cast<double>(sample.calls));
        }
    }

    /// See the file comment: down fast, up only from clean intervals.
    void follow_baseline(double mean, double ratio, bool limited) noexcept {
        if (mean < m_baseline_ns) {
            m_baseline_ns = std::max(1.0, m_baseline_ns + (mean - m_baseline_ns) / 2.0);
        } else if (!limited && ratio <= m_options.tolerance) {
            m_baseline_ns += (mean - m_baseline_ns) / 8.0;
        } else if (m_limit == m_options.floor) {
            m_baseline_ns += (mean - m_baseline_ns) / 16.0;
        }
    }

    limit_reason scale(double factor, limit_reason reason) noexcept {
        return cut_to(static_cast<int>(std::floor(static_cast<double>(m_limit) * factor)), reason);
    }

    limit_reason cut_to(int limit, limit_reason reason) noexcept {
        m_slow_start = false;
        m_vouched = 0;
        set(limit);
        return reason;
    }

    void set(int limit) noexcept { m_limit = std::clamp(limit, m_options.floor, m_ceiling); }

    /// The calls in flight on average over an interval: its permit holds
    /// over its length (Little's law); 0 for an empty interval.
    static double occupancy(const interval_sample& sample) noexcept {
        return sample.length.count() > 0
                   ? static_cast<double>(sample.held.count()) / static_cast<double>(sample.length.count())
                   : 0.0;
    }

    /// The calls the database may queue at limit L before rule 4 cuts:
    /// queue_allowance x log10(L), as TCP Vegas's beta.
    [[nodiscard]] double allowed_queue(int limit) const noexcept {
        return m_options.queue_allowance * std::log10(static_cast<double>(std::max(limit, 1)));
    }

    static adaptive_options checked(const adaptive_options& options, int ceiling) {
        const auto refuse = [](const char* what) {
            throw std::invalid_argument(std::string("bulkhead::adaptive_options: ") + what);
        };
        if (ceiling < 1) {
            refuse("the ceiling (the gate's B) must be at least 1");
        }
        if (options.floor < 1 || options.floor > ceiling) {
            refuse(("floor must be in [1, B] (B is " + std::to_string(ceiling) + ", floor " +
                    std::to_string(options.floor) + ")")
                       .c_str());
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
        if (!(options.throughput_tolerance >= options.headroom) || !std::isfinite(options.throughput_tolerance)) {
            refuse("throughput_tolerance must be a finite number of at least headroom");
        }
        if (!(options.queue_allowance >= 0.0) || !std::isfinite(options.queue_allowance)) {
            refuse("queue_allowance must be a finite number of at least 0");
        }
        return options;
    }

    adaptive_options m_options;
    int m_ceiling;
    int m_limit;
    limit_reason m_reason = limit_reason::initial;
    std::uint64_t m_changes = 0;
    double m_baseline_ns = 0.0;  // 0: not known yet
    double m_last_ratio = 0.0;   // the last interval's mean hold over the baseline
    bool m_slow_start = true;    // no sign of congestion yet: the limit doubles
    // Rule 5b. The step up taken at the last update: from m_probe_back to
    // m_probe_to (0: none pending), and the throughput and occupancy
    // measured at m_probe_back.
    int m_probe_back = 0;
    int m_probe_to = 0;
    double m_probe_rate = 0.0;
    double m_probe_occupancy = 0.0;
    double m_probe_wait = 0.0;     // seconds waited for a permit per call, at m_probe_back
    double m_probe_in_gate = 0.0;  // that wait plus the hold
    bool m_probe_was_5b = false;   // the step was rule 5b's (else rule 5's)
    int m_vouched = 0;             // the highest limit a step up to which bought throughput, since the last cut
    int m_vouch_left = 0;          // intervals until m_vouched lapses
    int m_cooldown = 0;            // intervals until rule 5b may step up again after a step that bought nothing
    // The figures at the current limit (interval_figures), averaged.
    int m_figures_limit = 0;
    int m_figures_count = 0;
    interval_figures m_figures;

    /// A step up of the limit by s (to/from - 1) must raise the calls
    /// finished per second by gain_share x s, within [min_gain, max_gain].
    static constexpr double gain_share = 0.25;
    static constexpr double min_gain = 0.05;
    static constexpr double max_gain = 0.10;
    /// Rule 5b steps up only when the permits are busy: on average at least
    /// this share of them held over the interval.
    static constexpr double busy = 0.75;
    /// ... or when the calls spent at least this share of their time in
    /// the gate waiting for a permit (an open loop below its capacity,
    /// where the permits are not all busy but the queue is long).
    static constexpr double waiting_share = 0.2;
    /// Rule 5 grows the limit only when at least this share of it was in
    /// use on average: a limit that nobody fills proves nothing.
    static constexpr double used_to_grow = 0.5;
    /// Intervals without a rule-5b step after one that bought nothing.
    static constexpr int probe_pause = 8;
    /// Intervals a step's gain vouches for its limit (above the
    /// tolerance, the limit must then earn it again).
    static constexpr int vouch_intervals = 16;
    /// A step is judged on the mean of this many intervals at the new limit.
    static constexpr int judged_intervals = 2;
    /// The figures of a limit average about this many intervals.
    static constexpr int averaged_intervals = 4;
};

namespace detail {

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

    /// The limit it starts at (the floor): a gate of B permits takes
    /// B - start() out of circulation when it is built.
    [[nodiscard]] int start() const noexcept { return m_controller.limit(); }

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

    /// A call's wait for a permit ended after `how_long`, with a permit or
    /// without.
    void waited(std::chrono::nanoseconds how_long) noexcept {
        if (how_long.count() > 0) {
            m_waited_ns.fetch_add(how_long.count(), std::memory_order_relaxed);
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
        sample.waited = std::chrono::nanoseconds(m_waited_ns.exchange(0, std::memory_order_relaxed));
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
    std::atomic<std::int64_t> m_waited_ns{0};
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

}  // namespace detail

}  // namespace bulkhead
