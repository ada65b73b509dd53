// bulkhead: a gate's admission, whatever pool it fronts.
//
// gate_core decides admission and keeps the figures it decides with:
//
// - the admission slots (B + Q, or each class's ceiling + queue), tried
//   without blocking, and the execution permits (B, FIFO): a fifo_semaphore
//   and an admission_counter for a plain gate, a workload_scheduler for a
//   gate with workload classes;
// - the adaptive limits (the gate's, and any class's ceiling);
// - the counters and distributions behind gate_stats, and the estimates made
//   from them: expected queue wait and suggested retry delay;
// - the reentrancy check (detail/held_gates.hpp) and the work threads of
//   asynchronous callers.
//
// db_bulkhead<Pool> adds the pool: lease, BEGIN, the callback, COMMIT, and
// the release that comes after all of it. The asynchronous front end
// (asio.hpp) uses the same members. gate_core is not a template: what does
// not depend on the pool is the same code for every gate type (its admission
// members are templates on the call's options alone).
//
// Every refusal is counted in one place, refuse(): the gate's counter, the
// class's, and the observer's hook.
//
// Thread safety: all members may be called concurrently, except the
// constructors and set_reject_hook().
#pragma once

#include <bulkhead/adaptive_limit.hpp>
#include <bulkhead/admission_counter.hpp>
#include <bulkhead/detail/adaptive_gate.hpp>
#include <bulkhead/detail/held_gates.hpp>
#include <bulkhead/detail/work_threads.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/fifo_semaphore.hpp>
#include <bulkhead/gate_stats.hpp>
#include <bulkhead/result.hpp>
#include <bulkhead/workload.hpp>
#include <bulkhead/workload_scheduler.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

namespace bulkhead {

/// What a gate is made of. Use designated initializers:
/// `{.concurrent = 16, .extra_slots = 64}`,
/// `{.concurrent = 10, .workloads = plan}`,
/// `{.concurrent = 16, .extra_slots = 64, .adaptive = adaptive_options{.floor = 2}}`.
struct gate_settings {
    /// B: the most calls in progress at once (at least 1), and the ceiling
    /// of an adaptive limit.
    int concurrent = 0;
    /// Q: admission slots beyond B, for calls that queue for a permit. A
    /// gate with workload classes has each class's instead (ceiling +
    /// queue), and must leave this 0.
    int extra_slots = 0;
    /// Workload classes sharing B (workload.hpp, docs/workloads.md):
    /// reserved permits, ceilings, queues and priorities. None: one class,
    /// "default".
    std::optional<workload_plan> workloads{};
    /// A limit that adapts between `adaptive->floor` and B to the
    /// database's signals (adaptive_limit.hpp, docs/adaptive.md). None: B,
    /// fixed.
    std::optional<adaptive_options> adaptive{};
};

}  // namespace bulkhead

namespace bulkhead::detail {

/// When a transaction was admitted (it had a slot) and when it got its
/// execution permit: the same clock read when no wait was needed.
struct admission_times {
    std::chrono::steady_clock::time_point admitted{};
    std::chrono::steady_clock::time_point permitted{};
};

/// How long a call that has its admission slot may wait for a permit, and
/// for which class (a gate with workload classes; -1 for a plain gate).
struct permit_wait_limit {
    std::chrono::nanoseconds wait{0};
    bool deadline_binds = false;  // the deadline, not the queue wait, sets `wait`
    int workload = -1;
};

/// See the file comment.
class gate_core {
public:
    using clock = std::chrono::steady_clock;

    /// \throws as db_bulkhead's constructor says.
    explicit gate_core(const gate_settings& settings)
        : m_concurrent(checked_concurrent(settings)),
          m_extra_slots(settings.extra_slots),
          m_slots(static_cast<std::int64_t>(settings.concurrent) + settings.extra_slots),
          m_running(settings.concurrent),
          m_adaptive(settings.adaptive ? std::make_unique<adaptive_gate>(*settings.adaptive, settings.concurrent)
                                       : nullptr) {
        if (m_adaptive) {
            m_running.shrink(m_concurrent - m_adaptive->start());
        }
        if (settings.workloads) {
            use_classes(*settings.workloads);
        }
    }

    gate_core(const gate_core&) = delete;
    gate_core& operator=(const gate_core&) = delete;

    /// Where refusals are reported (the gate's observer), besides the
    /// counters. Set once, before the first call.
    void set_reject_hook(void* context, void (*report)(void*, reject_reason) noexcept) noexcept {
        m_reject_context = context;
        m_reject_report = report;
    }

    // --- admission -----------------------------------------------------------

    /// Stage 1 and the checks before it: the queue wait, reentrancy, a stop
    /// or a deadline already there, then one admission slot (of the call's
    /// class), tried without blocking. Returns how long the permit may be
    /// waited for, or why the call is refused (counted; no slot is held).
    /// \throws std::invalid_argument for a negative queue wait;
    ///         std::logic_error for a reentry or a workload not of this gate.
    template <class Call>
    result<permit_wait_limit> take_slot(const Call& call) {
        return m_classes ? take_slot_in<true>(call) : take_slot_in<false>(call);
    }

    /// Both admission stages: a slot, then a permit (now, or after a wait).
    /// On success the permit and the slot are held for the returned limit's
    /// class; count_admitted() has not run yet. With `times` (the
    /// transaction path) the admission and permit times are read and the
    /// permit wait recorded; without (enter()) the clock is read only for a
    /// deadline.
    template <class Call>
    result<permit_wait_limit> admit(const Call& call, admission_times* times) {
        return m_classes ? admit_in<true>(call, times) : admit_in<false>(call, times);
    }

    /// A permit now, for a call of `limit`'s class, if one is free to take.
    [[nodiscard]] bool try_acquire(const permit_wait_limit& limit) noexcept {
        return limit.workload >= 0 ? m_classes->try_acquire(limit.workload) : m_running.try_acquire();
    }

    /// A permit now, or `node` queued for one (with its class's waiters).
    [[nodiscard]] bool acquire_or_enqueue(const permit_wait_limit& limit, fifo_semaphore::async_node& node) noexcept {
        return limit.workload >= 0 ? m_classes->acquire_or_enqueue(limit.workload, node)
                                   : m_running.acquire_or_enqueue(node);
    }

    /// Takes a queued `node` out, unless a grant has reached it.
    [[nodiscard]] bool cancel(const permit_wait_limit& limit, fifo_semaphore::async_node& node) noexcept {
        return limit.workload >= 0 ? m_classes->cancel(limit.workload, node) : m_running.cancel(node);
    }

    /// Gives back the admission slot that `limit` was taken with.
    void release_slot(const permit_wait_limit& limit) noexcept {
        if (limit.workload >= 0) {
            m_classes->release_slot(limit.workload);
        } else {
            m_slots.release();
        }
    }

    /// Counts a refusal of a call of class `workload` (-1: a plain gate's)
    /// and reports it; returns its reason. The one place a refusal is
    /// counted. Always inlined: called from a dozen places, it is not
    /// otherwise, and the call cost the plain rejection path a sixth of its
    /// instructions (callgrind, bench/micro reject/gate_try_enter).
    [[gnu::always_inline]] reject_reason refuse(reject_reason reason, int workload) noexcept {
        m_metrics.rejected(reason);
        if (workload >= 0 || m_reject_report != nullptr) {
            refuse_further(reason, workload);
        }
        return reason;
    }

    /// A permit wait that ended without a permit: gives the slot back and
    /// says why, counted.
    reject_reason refuse_after_slot(wait_status waited, const permit_wait_limit& limit) noexcept {
        release_slot(limit);
        if (waited == wait_status::timed_out) {
            return refuse(limit.deadline_binds ? reject_reason::deadline_exceeded : reject_reason::admission_timeout,
                          limit.workload);
        }
        return refuse(reject_reason::admission_cancelled, limit.workload);
    }

    /// For a call that found no permit free: true when its deadline, the
    /// bound of its wait, leaves less time than the expected queue wait plus
    /// what a committed call holds its permit for, so that it would wait,
    /// or start work, only to fail (and the caller opted in).
    template <class Call>
    [[nodiscard]] bool deadline_unreachable(const Call& call, const permit_wait_limit& limit) const noexcept {
        if (!call.reject_unreachable_deadline || !limit.deadline_binds) {
            return false;
        }
        const std::chrono::nanoseconds wait = queue_wait_estimate(limit.workload);
        return wait.count() > 0 && wait + work_estimate(limit.workload) > limit.wait;
    }

    /// Refuses such a call: the slot goes back, deadline_exceeded, counted
    /// as a rejection and as an early one.
    reject_reason refuse_unreachable_deadline(const permit_wait_limit& limit) noexcept {
        m_metrics.deadline_rejected_early();
        return refuse_after_slot(wait_status::timed_out, limit);
    }

    /// A call (of class `workload`, -1 for none) found no permit free: an
    /// adaptive limit counts it, and may use the moment to reconsider
    /// itself; so does the class's adaptive ceiling.
    void no_permit_free(int workload) noexcept {
        if (m_adaptive || workload >= 0) {
            adapt_to_no_permit_free(workload);
        }
    }

    /// Records a permit wait (for its class too).
    void record_permit_wait(const permit_wait_limit& limit, std::chrono::nanoseconds waited) noexcept {
        m_metrics.permit_wait.record(waited);
        if (limit.workload >= 0) {
            m_classes->permit_wait(limit.workload).record(waited);
        }
    }

    /// Counts an admission (of class `workload`).
    void count_admitted(int workload) noexcept {
        m_metrics.admitted();
        if (workload >= 0) {
            m_classes->admitted(workload);
        }
    }

    /// Releases one execution permit, then one admission slot (of class
    /// `workload` in a gate with classes).
    void leave(int workload) noexcept {
        if (workload < 0) {
            m_running.release();
            m_slots.release();
        } else {
            leave_class(workload);
        }
    }

    /// Notes a permit of this gate released on another thread than the one
    /// that entered (detail/held_gates.hpp).
    [[gnu::cold]] void released_elsewhere(const held_gates* record, std::uint64_t serial) noexcept {
        m_remote.note(record, serial);
    }

    /// A call that held its permit since `permitted` is about to release
    /// it, committed or not: its hold feeds the means and the adaptive
    /// limits.
    void finishing(clock::time_point now, clock::time_point permitted, bool committed, int workload) noexcept {
        const std::chrono::nanoseconds held = now - permitted;
        m_metrics.permit_held(held);
        if (committed) {
            m_metrics.committed_hold(held);
        }
        if (m_adaptive) {
            m_adaptive->finished(held);
            update_limit(now);
        }
        if (workload >= 0) [[unlikely]] {
            m_classes->held(workload, held);
            if (committed) {
                m_classes->committed(workload, held);
            }
            class_finishing(now, held, workload);
        }
    }

    /// True when a limit that could weigh a failure of class `workload`
    /// adapts.
    [[nodiscard]] bool adapts(int workload) const noexcept {
        return m_adaptive != nullptr || class_adaptive(workload) != nullptr;
    }

    /// A call failed in a way that bears on the database's load.
    void overloaded(overload_kind kind, int workload) noexcept {
        if (m_adaptive) {
            m_adaptive->overloaded(kind);
        }
        if (adaptive_gate* adapting = class_adaptive(workload)) {
            adapting->overloaded(kind);
        }
    }

    /// The counters and distributions the pool path records into.
    [[nodiscard]] gate_metrics& metrics() noexcept { return m_metrics; }

    /// The work threads of asynchronous callers (started on first use).
    [[nodiscard]] work_threads& workers() noexcept { return m_workers; }

    // --- classes -------------------------------------------------------------

    /// \throws std::invalid_argument when a call's queue wait is negative.
    static void check_queue_wait(std::chrono::nanoseconds queue_wait) {
        if (queue_wait < queue_wait.zero()) {
            throw std::invalid_argument("bulkhead::db_bulkhead: queue_wait must not be negative");
        }
    }

    /// The class index of `workload` in this gate: -1 for a plain gate's
    /// one class.
    /// \throws std::logic_error when it is not one of the gate's classes.
    [[nodiscard]] int checked_workload(workload_id workload) const {
        const int classes = m_classes ? m_classes->classes() : 1;
        if (workload.index < 0 || workload.index >= classes) {
            throw std::logic_error("bulkhead::db_bulkhead: workload id " + std::to_string(workload.index) +
                                   " is not a class of this gate (it has " + std::to_string(classes) +
                                   "); take ids from gate.workload(name)");
        }
        return class_of(workload);
    }

    /// The class index of a call already admitted (-1 for a plain gate).
    [[nodiscard]] int class_of(workload_id workload) const noexcept { return m_classes ? workload.index : -1; }

    /// The class named `name`.
    /// \throws std::invalid_argument when the gate has no such class.
    [[nodiscard]] workload_id find(std::string_view name) const {
        const int found = m_classes ? m_classes->find(name) : (name == "default" ? 0 : -1);
        if (found < 0) {
            std::string message = "bulkhead::db_bulkhead: no workload class named \"";
            message.append(name.substr(0, 40));
            message += "\"; this gate has:";
            for (const std::string& known : names()) {
                message += ' ';
                message += known;
            }
            throw std::invalid_argument(message);
        }
        return workload_id{found};
    }

    /// The names of the gate's classes, in id order ("default" for a
    /// plain gate).
    [[nodiscard]] std::vector<std::string> names() const {
        std::vector<std::string> out;
        if (!m_classes) {
            out.emplace_back("default");
            return out;
        }
        for (int c = 0; c < m_classes->classes(); ++c) {
            out.push_back(m_classes->config(c).name);
        }
        return out;
    }

    [[nodiscard]] bool has_workloads() const noexcept { return m_classes != nullptr; }

    // --- observations (stale as soon as they return) -------------------------

    [[nodiscard]] int concurrent() const noexcept { return m_concurrent; }
    [[nodiscard]] int extra_slots() const noexcept { return m_extra_slots; }
    [[nodiscard]] bool adaptive() const noexcept { return m_adaptive != nullptr; }

    /// The permits in circulation: B, or the adaptive limit.
    [[nodiscard]] int limit() const noexcept { return m_adaptive ? m_adaptive->limit() : m_concurrent; }

    [[nodiscard]] int available() const noexcept {
        if (m_classes) {
            return std::max(limit() - m_classes->total().running, 0);
        }
        return static_cast<int>(m_running.available());
    }

    [[nodiscard]] int available_slots() const noexcept {
        if (m_classes) {
            int free = 0;
            for (int c = 0; c < m_classes->classes(); ++c) {
                free += m_classes->free_slots(c);
            }
            return free;
        }
        return static_cast<int>(m_slots.available());
    }

    [[nodiscard]] int waiting() const noexcept {
        return m_classes ? m_classes->total().queued : static_cast<int>(m_running.waiting());
    }

    [[nodiscard]] int running() const noexcept {
        if (m_classes) {
            return m_classes->total().running;
        }
        return std::max(limit() - static_cast<int>(m_running.balance()), 0);
    }

    /// db_bulkhead::expected_queue_wait() for class `workload` (-1: the
    /// whole gate).
    [[nodiscard]] std::chrono::nanoseconds expected_queue_wait(int workload) const noexcept {
        if (workload < 0) {
            return available() > 0 ? std::chrono::nanoseconds(0) : queue_wait_estimate(-1);
        }
        if (m_classes->of(workload).queued == 0 && m_classes->free_for(workload) > 0) {
            return std::chrono::nanoseconds(0);
        }
        return queue_wait_estimate(workload);
    }

    /// db_bulkhead::suggested_retry_delay() for class `workload` (-1: the
    /// whole gate).
    [[nodiscard]] std::chrono::milliseconds retry_delay(int workload) const noexcept {
        int inside = 0;
        if (workload >= 0) {
            const workload_scheduler::figures now = m_classes->of(workload);
            inside = now.running + now.queued;
        } else {
            inside = running() + waiting();
        }
        const std::chrono::nanoseconds delay = spread_over_permits(inside + 1, workload);
        if (delay.count() == 0) {
            return std::chrono::milliseconds(0);
        }
        return std::max(std::chrono::ceil<std::chrono::milliseconds>(delay), std::chrono::milliseconds(1));
    }

    /// Fills everything of `stats` that admission knows.
    void fill(gate_stats& stats) const {
        stats.concurrent = m_concurrent;
        stats.extra_slots = m_extra_slots;
        stats.available = available();
        stats.available_slots = available_slots();
        stats.limit = limit();
        stats.running = running();
        stats.queued = waiting();
        if (const adaptive_gate* adapting = m_adaptive.get()) {
            stats.adaptive = true;
            stats.limit_floor = adapting->floor();
            stats.limit_reason = adapting->reason();
            stats.limit_changes = adapting->changes();
            stats.latency_baseline = adapting->baseline();
        } else {
            stats.limit_floor = stats.concurrent;
        }
        m_metrics.copy_to(stats);
        stats.expected_queue_wait = expected_queue_wait(-1);
        stats.suggested_retry_delay = retry_delay(-1);
        if (m_classes) {
            for (int c = 0; c < m_classes->classes(); ++c) {
                workload_stats& one = stats.workloads.emplace_back(m_classes->stats(c));
                one.expected_queue_wait = expected_queue_wait(c);
                if (const adaptive_gate* adapting = class_adaptive(c)) {
                    one.adaptive = true;
                    one.limit_reason = adapting->reason();
                    one.limit_changes = adapting->changes();
                }
            }
        }
    }

private:
    template <bool Classed, class Call>
    result<permit_wait_limit> take_slot_in(const Call& call) {
        check_queue_wait(call.queue_wait);
        const int workload = Classed ? checked_workload(call.workload) : -1;
        if constexpr (!Classed) {
            if (call.workload.index != 0) [[unlikely]] {
                (void)checked_workload(call.workload);  // throws
            }
        }
        held_gates& held = this_thread_gates;
        while (const std::uint64_t serial = held.holds(this, call.task)) {
            // Rare: a real reentry, or a permit of ours released elsewhere.
            if (!m_remote.take(&held, serial)) {
                throw std::logic_error(
                    "bulkhead::db_bulkhead: this caller is already inside this gate (the gate is not reentrant)");
            }
            held.remove(serial);
        }
        if (call.stop.stop_requested()) {
            return refuse(reject_reason::admission_cancelled, workload);
        }
        permit_wait_limit limit{call.queue_wait, false, workload};
        if constexpr (Classed) {
            limit.wait = std::min(limit.wait, m_classes->config(workload).queue_wait);
        }
        // The deadline is read only when the call carries one: no clock read
        // on the common path.
        if (call.deadline != clock::time_point::max()) {
            const clock::time_point now = clock::now();
            if (call.deadline <= now) {  // compared before subtracting: time_point::min() cannot overflow
                return refuse(reject_reason::deadline_exceeded, workload);
            }
            const auto left = call.deadline - now;
            if (left < limit.wait) {
                limit.wait = std::chrono::duration_cast<std::chrono::nanoseconds>(left);
                limit.deadline_binds = true;
            }
        }
        const bool slot = Classed ? m_classes->try_take_slot(workload) : m_slots.try_acquire();
        if (!slot) {
            no_permit_free(workload);
            return refuse(reject_reason::admission_full, workload);
        }
        return limit;
    }

    template <bool Classed, class Call>
    result<permit_wait_limit> admit_in(const Call& call, admission_times* times) {
        result<permit_wait_limit> slot = take_slot_in<Classed>(call);
        if (!slot) {
            return slot;
        }
        if (times != nullptr) {
            // After admission: a rejection reads no clock.
            times->admitted = times->permitted = clock::now();
        }
        const int workload = Classed ? slot->workload : -1;  // a constant for the plain gate
        if (Classed ? m_classes->try_acquire(workload) : m_running.try_acquire()) {
            if (times != nullptr) {
                m_metrics.permit_wait.record(0U);
                if constexpr (Classed) {
                    m_classes->permit_wait(workload).record(0U);
                }
            }
            return slot;
        }
        return wait_for_permit<Classed>(call, *slot, times);
    }

    /// admit()'s second stage when no permit was free: the wait.
    template <bool Classed, class Call>
    result<permit_wait_limit> wait_for_permit(const Call& call, const permit_wait_limit& slot, admission_times* times) {
        no_permit_free(slot.workload);
        if (deadline_unreachable(call, slot)) {
            return refuse_unreachable_deadline(slot);
        }
        const wait_status waited = Classed ? m_classes->try_acquire_for(slot.workload, slot.wait, call.stop)
                                           : m_running.try_acquire_for(slot.wait, call.stop);
        if (times != nullptr) {
            times->permitted = clock::now();
            record_permit_wait(slot, times->permitted - times->admitted);
        }
        if (waited != wait_status::acquired) {
            return refuse_after_slot(waited, slot);
        }
        return slot;
    }

    /// `calls` permit holds of the running mean (of class `workload`, when
    /// it has one yet) spread over the permits they can use; zero before
    /// the first transaction finished. Saturates instead of overflowing.
    [[nodiscard]] std::chrono::nanoseconds spread_over_permits(int calls, int workload) const noexcept {
        std::chrono::nanoseconds hold = m_metrics.mean_permit_hold();
        int permits = limit();
        if (workload >= 0) {
            const std::chrono::nanoseconds own = m_classes->mean_hold(workload);
            hold = own.count() > 0 ? own : hold;
            permits = m_classes->usable_by(workload);
        }
        const double spread =
            static_cast<double>(hold.count()) * static_cast<double>(calls) / static_cast<double>(std::max(permits, 1));
        constexpr double most = 9.0e18;  // below INT64_MAX, exactly representable
        return std::chrono::nanoseconds(spread < most ? static_cast<std::int64_t>(spread)
                                                      : static_cast<std::int64_t>(most));
    }

    /// The expected permit wait of a call (of class `workload`) that finds
    /// no permit free.
    [[nodiscard]] std::chrono::nanoseconds queue_wait_estimate(int workload) const noexcept {
        const int ahead = workload >= 0 ? m_classes->of(workload).queued : waiting();
        return spread_over_permits(ahead + 1, workload);
    }

    /// How long a call of class `workload` (-1: the gate) holds its permit
    /// when it commits: the class's mean once it has one, else the gate's.
    [[nodiscard]] std::chrono::nanoseconds work_estimate(int workload) const noexcept {
        if (workload >= 0) {
            const std::chrono::nanoseconds own = m_classes->mean_committed_hold(workload);
            if (own.count() > 0) {
                return own;
            }
        }
        return m_metrics.mean_committed_hold();
    }

    /// leave() for a gate with classes; out of line, as it is larger than
    /// the plain gate's path it sits beside (callgrind: 8 instructions more
    /// on every plain release when inlined).
    [[gnu::noinline]] void leave_class(int workload) noexcept {
        m_classes->release(workload);
        m_classes->release_slot(workload);
    }

    /// refuse() for a class, and for the observer.
    void refuse_further(reject_reason reason, int workload) noexcept {
        if (workload >= 0) {
            m_classes->rejected(workload, reason);
        }
        if (m_reject_report != nullptr) {
            m_reject_report(m_reject_context, reason);
        }
    }

    /// no_permit_free() for the adaptive limits.
    void adapt_to_no_permit_free(int workload) noexcept {
        if (m_adaptive) {
            m_adaptive->limited();
            update_limit(clock::now());
        }
        if (workload >= 0) {
            class_no_permit_free(workload);
        }
    }

    /// A gate with workload classes: `plan` checked against B (G10); the
    /// classes' admission slots (ceiling + queue each) replace B + Q.
    void use_classes(const workload_plan& plan) {
        const workload_plan checked = checked_workload_plan(plan, m_concurrent);
        const int reserved = reserved_permits(checked);
        if (m_adaptive && m_adaptive->floor() < reserved) {
            throw std::invalid_argument("bulkhead::db_bulkhead: the adaptive floor " +
                                        std::to_string(m_adaptive->floor()) +
                                        " is below the classes' reserved permits, " + std::to_string(reserved) +
                                        ": a limit that low could not honour the reservations");
        }
        m_classes = std::make_unique<workload_scheduler>(checked, limit());
        const bool any_adapts = std::any_of(checked.classes.begin(), checked.classes.end(),
                                            [](const workload_class& c) { return c.adaptive_floor > 0; });
        if (any_adapts) {
            for (const workload_class& c : checked.classes) {
                m_class_adaptive.push_back(
                    c.adaptive_floor > 0
                        ? std::make_unique<adaptive_gate>(adaptive_options{.floor = c.adaptive_floor}, c.ceiling)
                        : nullptr);
            }
        }
    }

    /// Class `workload`'s adaptive ceiling, or null (a fixed one, or a
    /// plain gate: -1).
    [[nodiscard]] adaptive_gate* class_adaptive(int workload) const noexcept {
        return workload >= 0 && !m_class_adaptive.empty() ? m_class_adaptive[static_cast<std::size_t>(workload)].get()
                                                          : nullptr;
    }

    /// no_permit_free() for a class's adaptive ceiling.
    void class_no_permit_free(int workload) noexcept {
        if (adaptive_gate* adapting = class_adaptive(workload)) {
            adapting->limited();
            update_class_limit(*adapting, workload, clock::now());
        }
    }

    /// finishing() for a class's adaptive ceiling.
    void class_finishing(clock::time_point now, std::chrono::nanoseconds held, int workload) noexcept {
        if (adaptive_gate* adapting = class_adaptive(workload)) {
            adapting->finished(held);
            update_class_limit(*adapting, workload, now);
        }
    }

    /// A class's ceiling, as adaptive_gate resizes it.
    struct class_ceiling {
        workload_scheduler& scheduler;
        int workload;
        int limit;
        [[nodiscard]] std::int64_t balance() const noexcept { return limit - scheduler.of(workload).running; }
        void release(std::int64_t count) const noexcept { scheduler.grow_ceiling(workload, count); }
        void shrink(std::int64_t count) const noexcept { scheduler.shrink_ceiling(workload, count); }
    };

    void update_class_limit(adaptive_gate& adapting, int workload, clock::time_point now) noexcept {
        class_ceiling ceiling{*m_classes, workload, adapting.limit()};
        adapting.maybe_update(now, ceiling);
    }

    /// The shared permits of a gate with classes, as adaptive_gate resizes
    /// them.
    struct class_permits {
        workload_scheduler& scheduler;
        int limit;
        [[nodiscard]] std::int64_t balance() const noexcept { return limit - scheduler.total().running; }
        void release(std::int64_t count) const noexcept { scheduler.grow(count); }
        void shrink(std::int64_t count) const noexcept { scheduler.shrink(count); }
    };

    void update_limit(clock::time_point now) noexcept {
        if (m_classes) {
            class_permits permits{*m_classes, m_adaptive->limit()};
            m_adaptive->maybe_update(now, permits);
        } else {
            m_adaptive->maybe_update(now, m_running);
        }
    }

    static int checked_concurrent(const gate_settings& settings) {
        if (settings.concurrent < 1) {
            throw std::invalid_argument("bulkhead::db_bulkhead: concurrent (B) must be at least 1");
        }
        if (settings.extra_slots < 0) {
            throw std::invalid_argument("bulkhead::db_bulkhead: extra_slots (Q) must not be negative");
        }
        if (settings.extra_slots > std::numeric_limits<int>::max() - settings.concurrent) {
            throw std::overflow_error("bulkhead::db_bulkhead: concurrent + extra_slots (B + Q) overflows int");
        }
        if (settings.workloads && settings.extra_slots != 0) {
            throw std::invalid_argument(
                "bulkhead::db_bulkhead: extra_slots (Q) is for a gate without workload classes; with a plan, each "
                "class's queue sets its slots (leave extra_slots 0)");
        }
        return settings.concurrent;
    }

    int m_concurrent;
    int m_extra_slots;
    // null: a plain gate (m_slots and m_running serve). Beside B and Q, on
    // the line every call reads already.
    std::unique_ptr<workload_scheduler> m_classes;
    admission_counter m_slots;                  // B + Q, never waited on
    fifo_semaphore m_running;                   // B, FIFO
    work_threads m_workers{m_concurrent};       // B threads for asynchronous callers' work, started on first use
    remote_releases m_remote;                   // permits released on another thread than the entering one
    std::unique_ptr<adaptive_gate> m_adaptive;  // null: a fixed limit of B
    // One per class when any class's ceiling adapts (null for a fixed one);
    // empty otherwise.
    std::vector<std::unique_ptr<adaptive_gate>> m_class_adaptive;
    gate_metrics m_metrics;
    void* m_reject_context = nullptr;
    void (*m_reject_report)(void*, reject_reason) noexcept = nullptr;
};

}  // namespace bulkhead::detail
