// bulkhead: a gate's admission, whatever pool it fronts.
//
// gate_core decides admission and keeps the figures it decides with:
//
// - the admission slots (B + Q, or each class's ceiling + queue), tried
//   without blocking, and the execution permits (B, FIFO), by class:
//   detail/permit_engine.hpp (a gate without a plan has one class,
//   "default");
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
// class's, and the observer's hook. A call's class is an index into the
// gate's classes, 0 in a gate without a plan; what a class has of its own
// (figures, an adaptive ceiling) only a plan gives it.
//
// Thread safety: all members may be called concurrently, except the
// constructors and set_reject_hook().
#pragma once

#include <bulkhead/adaptive_limit.hpp>
#include <bulkhead/detail/adaptive_gate.hpp>
#include <bulkhead/detail/held_gates.hpp>
#include <bulkhead/detail/permit_engine.hpp>
#include <bulkhead/detail/work_threads.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/fifo_semaphore.hpp>
#include <bulkhead/gate_stats.hpp>
#include <bulkhead/result.hpp>
#include <bulkhead/workload.hpp>

#include <algorithm>
#include <atomic>
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
/// for which class.
struct permit_wait_limit {
    std::chrono::nanoseconds wait{0};
    bool deadline_binds = false;  // the deadline, not the queue wait, sets `wait`
    int workload = 0;
};

/// A call's stop token joined with the gate's cancellation at close: the
/// gate's own token when the caller has none (nothing allocated), else a
/// stop source of the call's that either one stops.
class joined_stop {
public:
    joined_stop(const std::stop_token& caller, const std::stop_source& gate) {
        if (!caller.stop_possible()) {
            m_token = gate.get_token();
            return;
        }
        m_joined = std::stop_source();
        m_token = m_joined.get_token();
        m_from_caller.emplace(caller, forward{&m_joined});
        m_from_gate.emplace(gate.get_token(), forward{&m_joined});
    }
    joined_stop(const joined_stop&) = delete;
    joined_stop& operator=(const joined_stop&) = delete;
    ~joined_stop() = default;

    [[nodiscard]] const std::stop_token& token() const noexcept { return m_token; }

    /// The token, moved out (for a call that keeps it while this lives).
    [[nodiscard]] std::stop_token take() noexcept { return std::move(m_token); }

private:
    struct forward {
        std::stop_source* target;
        void operator()() const noexcept { target->request_stop(); }
    };
    // Not an optional: g++ 14 warns (maybe-uninitialized) in an empty
    // optional<stop_source>'s emplace(). Without a stop state it allocates
    // nothing.
    std::stop_source m_joined{std::nostopstate};
    std::optional<std::stop_callback<forward>> m_from_caller;
    std::optional<std::stop_callback<forward>> m_from_gate;
    std::stop_token m_token;
};

/// See the file comment.
class gate_core {
public:
    using clock = std::chrono::steady_clock;

    /// \throws as db_bulkhead's constructor says.
    explicit gate_core(const gate_settings& settings)
        : m_concurrent(checked_concurrent(settings)),
          m_extra_slots(settings.extra_slots),
          m_adaptive(settings.adaptive ? std::make_unique<adaptive_gate>(*settings.adaptive, settings.concurrent)
                                       : nullptr),
          m_permits(m_concurrent, m_extra_slots, checked_plan(settings, m_adaptive.get()), limit()),
          m_class_adaptive(class_limits(m_permits)),
          m_adapts(m_adaptive != nullptr || !m_class_adaptive.empty()),
          m_refusals_go_further(m_permits.has_plan() || m_adapts) {}

    gate_core(const gate_core&) = delete;
    gate_core& operator=(const gate_core&) = delete;

    /// Where refusals are reported (the gate's observer), besides the
    /// counters. Set once, before the first call.
    void set_reject_hook(void* context, void (*report)(void*, reject_reason) noexcept) noexcept {
        m_reject_context = context;
        m_reject_report = report;
        m_refusals_go_further = m_permits.has_plan() || m_adapts || report != nullptr;
    }

    // --- admission -----------------------------------------------------------

    /// Stage 1 and the checks before it: the queue wait, reentrancy, a stop
    /// or a deadline already there, then one admission slot (of the call's
    /// class), tried without blocking. Returns how long the permit may be
    /// waited for, or why the call is refused (counted; no slot is held).
    /// \throws std::invalid_argument for a negative queue wait;
    ///         std::logic_error for a reentry or a workload not of this gate.
    template <class Call>
    [[gnu::always_inline]] result<permit_wait_limit> take_slot(const Call& call) {
        check_queue_wait(call.queue_wait);
        const int workload = checked_workload(call.workload);
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
        permit_wait_limit limit{std::min(call.queue_wait, m_permits.queue_wait(workload)), false, workload};
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
        if (!m_permits.try_take_slot(workload)) {
            // An adaptive limit hears of it through refuse(): no branch of
            // its own on this path. Nor has a closed gate: a call that finds
            // no slot is refused with admission_full, closed or not.
            return refuse(reject_reason::admission_full, workload);
        }
        // Checked once a slot is held, not before: the rejection path stays
        // as it was (bench/micro reject/gate_try_enter: checked before the
        // slot, a rejection took 11 % longer).
        if (m_closed.load(std::memory_order_relaxed)) [[unlikely]] {
            m_permits.release_slot(workload);
            return refuse(reject_reason::closed, workload);
        }
        return limit;
    }

    /// Both admission stages: a slot, then a permit (now, or after a wait).
    /// On success the permit and the slot are held for the returned limit's
    /// class; count_admitted() has not run yet. With `times` (the
    /// transaction path) the admission and permit times are read and the
    /// permit wait recorded; without (enter()) the clock is read only for a
    /// deadline.
    ///
    /// Inlined where a result is returned (try_enter(), try_transaction():
    /// out of line, the result's copy stalled and a rejection took 3.4
    /// times as long), and called out of line, admit_out_of_line(), where a
    /// rejection is thrown: the thrower then stays small enough to inline
    /// into its caller, and the unwinder walks one frame fewer (inlined, a
    /// thrown rejection took 1.4 times as long). Release flags, g++ 12,
    /// bench/micro reject/*.
    template <class Call>
    [[gnu::always_inline]] result<permit_wait_limit> admit(const Call& call, admission_times* times) {
        result<permit_wait_limit> slot = take_slot(call);
        if (!slot) {
            return slot;
        }
        if (times != nullptr) {
            // After admission: a rejection reads no clock.
            times->admitted = times->permitted = clock::now();
        }
        if (m_permits.try_acquire(slot->workload)) {
            if (times != nullptr) {
                record_permit_wait(*slot, std::chrono::nanoseconds(0));
            }
            return slot;
        }
        return wait_for_permit(call, *slot, times);
    }

    /// admit(), out of line: see there.
    template <class Call>
    [[gnu::noinline]] result<permit_wait_limit> admit_out_of_line(const Call& call, admission_times* times) {
        return admit(call, times);
    }

    /// A permit now, for a call of `limit`'s class, if one is free to take.
    [[nodiscard]] bool try_acquire(const permit_wait_limit& limit) noexcept {
        return m_permits.try_acquire(limit.workload);
    }

    /// A permit now, or `node` queued for one (with its class's waiters).
    [[nodiscard]] bool acquire_or_enqueue(const permit_wait_limit& limit, fifo_semaphore::async_node& node) noexcept {
        return m_permits.acquire_or_enqueue(limit.workload, node);
    }

    /// Takes a queued `node` out, unless a grant has reached it.
    [[nodiscard]] bool cancel(const permit_wait_limit& limit, fifo_semaphore::async_node& node) noexcept {
        return m_permits.cancel(limit.workload, node);
    }

    /// Gives back the admission slot that `limit` was taken with.
    void release_slot(const permit_wait_limit& limit) noexcept { m_permits.release_slot(limit.workload); }

    /// Counts a refusal of a call of class `workload` and reports it;
    /// returns its reason. The one place a refusal is counted. Always
    /// inlined: called from a dozen places, it is not otherwise, and the
    /// call cost the rejection path a sixth of its instructions (callgrind,
    /// bench/micro reject/gate_try_enter).
    [[gnu::always_inline]] reject_reason refuse(reject_reason reason, int workload) noexcept {
        m_metrics.rejected(reason);
        if (m_refusals_go_further) [[unlikely]] {
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
        return refuse(stopped_reason(), limit.workload);
    }

    /// Why a call stopped before its work started: `closed` once close()
    /// has cancelled what was left, admission_cancelled otherwise.
    [[nodiscard]] reject_reason stopped_reason() const noexcept {
        return m_cancel.stop_requested() ? reject_reason::closed : reject_reason::admission_cancelled;
    }

    // --- closing (db_bulkhead::close) ----------------------------------------

    /// From now on every call that takes a slot is refused with `closed`
    /// (one that finds none is refused with admission_full, as before).
    void stop_admitting() noexcept { m_closed.store(true, std::memory_order_relaxed); }
    [[nodiscard]] bool closed() const noexcept { return m_closed.load(std::memory_order_relaxed); }

    /// Stops every call in the gate, queued or running, through the stop
    /// token it waits and works with (joined_stop).
    void cancel_all() noexcept { m_cancel.request_stop(); }
    [[nodiscard]] const std::stop_source& cancellation() const noexcept { return m_cancel; }

    /// The calls in the gate (each holds an admission slot), queued or
    /// running.
    [[nodiscard]] int in_flight() const noexcept { return m_permits.slots_held(); }

    /// For a call that found no permit free: true when its deadline, the
    /// bound of its wait, leaves less time than the expected queue wait plus
    /// what a committed call holds its permit for, so that it would wait,
    /// or start work, only to fail (and the caller opted in).
    template <class Call>
    [[nodiscard]] bool deadline_unreachable(const Call& call, const permit_wait_limit& limit) const noexcept {
        if (!call.reject_unreachable_deadline || !limit.deadline_binds) {
            return false;
        }
        const class_view of = view(limit.workload);
        const std::chrono::nanoseconds wait = queue_wait_estimate(of);
        const std::chrono::nanoseconds work =
            of.committed_hold.count() > 0 ? of.committed_hold : m_metrics.mean_committed_hold();
        return wait.count() > 0 && wait + work > limit.wait;
    }

    /// Refuses such a call: the slot goes back, deadline_exceeded, counted
    /// as a rejection and as an early one.
    reject_reason refuse_unreachable_deadline(const permit_wait_limit& limit) noexcept {
        m_metrics.deadline_rejected_early();
        return refuse_after_slot(wait_status::timed_out, limit);
    }

    /// A call of class `workload` found no permit free: an adaptive limit
    /// counts it, and may use the moment to reconsider itself; so does the
    /// class's adaptive ceiling.
    void no_permit_free(int workload) noexcept {
        if (m_adapts) [[unlikely]] {
            adapt_to_no_permit_free(workload);
        }
    }

    /// Records a permit wait (for its class too).
    void record_permit_wait(const permit_wait_limit& limit, std::chrono::nanoseconds waited) noexcept {
        m_metrics.permit_wait.record(waited);
        m_permits.permit_waited(limit.workload, waited);
    }

    /// Counts an admission (of class `workload`).
    void count_admitted(int workload) noexcept {
        m_metrics.admitted();
        m_permits.admitted(workload);
    }

    /// Releases one execution permit, then one admission slot, of class
    /// `workload`.
    void leave(int workload) noexcept { m_permits.leave(workload); }

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
        m_permits.held(workload, held, committed);
        if (adaptive_gate* adapting = class_adaptive(workload)) [[unlikely]] {
            adapting->finished(held);
            update_class_limit(*adapting, workload, now);
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

    /// The class index of `workload` in this gate.
    /// \throws std::logic_error when it is not one of the gate's classes.
    [[nodiscard]] int checked_workload(workload_id workload) const {
        // One unsigned comparison: a negative index is a huge one.
        if (static_cast<unsigned>(workload.index) >= static_cast<unsigned>(m_permits.classes())) [[unlikely]] {
            throw_not_a_class(workload);
        }
        return workload.index;
    }

    /// The class named `name`.
    /// \throws std::invalid_argument when the gate has no such class.
    [[nodiscard]] workload_id find(std::string_view name) const {
        const std::optional<int> found = m_permits.find(name);
        if (!found) {
            std::string message = "bulkhead::db_bulkhead: no workload class named \"";
            message.append(name.substr(0, 40));
            message += "\"; this gate has:";
            for (const std::string& known : names()) {
                message += ' ';
                message += known;
            }
            throw std::invalid_argument(message);
        }
        return workload_id{*found};
    }

    /// The names of the gate's classes, in id order ("default" for a
    /// plain gate).
    [[nodiscard]] std::vector<std::string> names() const { return m_permits.names(); }

    [[nodiscard]] bool has_workloads() const noexcept { return m_permits.has_plan(); }

    // --- observations (stale as soon as they return) -------------------------

    [[nodiscard]] int concurrent() const noexcept { return m_concurrent; }
    [[nodiscard]] int extra_slots() const noexcept { return m_extra_slots; }
    [[nodiscard]] bool adaptive() const noexcept { return m_adaptive != nullptr; }

    /// An adaptive limit below B, at its floor.
    [[nodiscard]] bool at_floor() const noexcept {
        return m_adaptive && m_adaptive->floor() < m_concurrent && m_adaptive->limit() <= m_adaptive->floor();
    }

    /// The permits in circulation: B, or the adaptive limit.
    [[nodiscard]] int limit() const noexcept { return m_adaptive ? m_adaptive->limit() : m_concurrent; }

    [[nodiscard]] int available() const noexcept { return m_permits.available(limit()); }
    [[nodiscard]] int available_slots() const noexcept { return m_permits.available_slots(); }
    [[nodiscard]] int waiting() const noexcept { return m_permits.waiting(); }
    [[nodiscard]] int running() const noexcept { return m_permits.running(limit()); }

    /// db_bulkhead::expected_queue_wait(): for the whole gate.
    [[nodiscard]] std::chrono::nanoseconds expected_queue_wait() const noexcept {
        return available() > 0 ? std::chrono::nanoseconds(0) : queue_wait_estimate(gate_view());
    }

    /// The same for class `workload`.
    [[nodiscard]] std::chrono::nanoseconds expected_queue_wait(int workload) const noexcept {
        const class_view of = view(workload);
        if (of.queued == 0 && m_permits.free_for(workload, limit()) > 0) {
            return std::chrono::nanoseconds(0);
        }
        return queue_wait_estimate(of);
    }

    /// db_bulkhead::suggested_retry_delay(): for the whole gate.
    [[nodiscard]] std::chrono::milliseconds retry_delay() const noexcept { return retry_delay_of(gate_view()); }

    /// The same for class `workload`.
    [[nodiscard]] std::chrono::milliseconds retry_delay(int workload) const noexcept {
        return retry_delay_of(view(workload));
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
        stats.expected_queue_wait = expected_queue_wait();
        stats.suggested_retry_delay = retry_delay();
        if (m_permits.has_plan()) {
            for (int c = 0; c < m_permits.classes(); ++c) {
                workload_stats& one = stats.workloads.emplace_back(m_permits.stats(c));
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
    /// admit()'s second stage when no permit was free: the wait.
    template <class Call>
    [[gnu::noinline]] result<permit_wait_limit> wait_for_permit(const Call& call, const permit_wait_limit& slot,
                                                                admission_times* times) {
        no_permit_free(slot.workload);
        if (deadline_unreachable(call, slot)) {
            return refuse_unreachable_deadline(slot);
        }
        const joined_stop stop(call.stop, m_cancel);  // close() ends the wait too
        const wait_status waited = m_permits.try_acquire_for(slot.workload, slot.wait, stop.token());
        if (times != nullptr) {
            times->permitted = clock::now();
            record_permit_wait(slot, times->permitted - times->admitted);
        }
        if (waited != wait_status::acquired) {
            return refuse_after_slot(waited, slot);
        }
        return slot;
    }

    /// What the estimates read of the whole gate, or of one class: the calls
    /// holding and awaiting permits, the permits they can use, and their
    /// mean holds (zero: none yet, or the gate's serve).
    struct class_view {
        int running = 0;
        int queued = 0;
        int permits = 1;
        std::chrono::nanoseconds hold{0};
        std::chrono::nanoseconds committed_hold{0};
    };

    [[nodiscard]] class_view gate_view() const noexcept { return {running(), waiting(), limit(), {}, {}}; }

    [[nodiscard]] class_view view(int workload) const noexcept {
        const int now = limit();
        const workload_scheduler::figures of = m_permits.of(workload, now);
        return {of.running, of.queued, m_permits.usable_by(workload, now), m_permits.mean_hold(workload),
                m_permits.mean_committed_hold(workload)};
    }

    /// `calls` permit holds of the running mean (the class's, when it has
    /// one yet) spread over the permits they can use; zero before the first
    /// transaction finished. Saturates instead of overflowing.
    [[nodiscard]] std::chrono::nanoseconds spread_over_permits(int calls, const class_view& of) const noexcept {
        const std::chrono::nanoseconds hold = of.hold.count() > 0 ? of.hold : m_metrics.mean_permit_hold();
        const double spread = static_cast<double>(hold.count()) * static_cast<double>(calls) /
                              static_cast<double>(std::max(of.permits, 1));
        constexpr double most = 9.0e18;  // below INT64_MAX, exactly representable
        return std::chrono::nanoseconds(spread < most ? static_cast<std::int64_t>(spread)
                                                      : static_cast<std::int64_t>(most));
    }

    /// The expected permit wait of a call that finds no permit free.
    [[nodiscard]] std::chrono::nanoseconds queue_wait_estimate(const class_view& of) const noexcept {
        return spread_over_permits(of.queued + 1, of);
    }

    [[nodiscard]] std::chrono::milliseconds retry_delay_of(const class_view& of) const noexcept {
        const std::chrono::nanoseconds delay = spread_over_permits(of.running + of.queued + 1, of);
        if (delay.count() == 0) {
            return std::chrono::milliseconds(0);
        }
        return std::max(std::chrono::ceil<std::chrono::milliseconds>(delay), std::chrono::milliseconds(1));
    }

    [[gnu::cold, gnu::noinline, noreturn]] void throw_not_a_class(workload_id workload) const {
        throw std::logic_error("bulkhead::db_bulkhead: workload id " + std::to_string(workload.index) +
                               " is not a class of this gate (it has " + std::to_string(m_permits.classes()) +
                               "); take ids from gate.workload(name)");
    }

    /// refuse() for the class's figures, an adaptive limit and the observer,
    /// behind one test on the rejection path of a gate with none of them.
    void refuse_further(reject_reason reason, int workload) noexcept {
        if (reason == reject_reason::admission_full) {
            no_permit_free(workload);  // no slot free: no permit was either
        }
        m_permits.rejected(workload, reason);
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
        if (adaptive_gate* adapting = class_adaptive(workload)) {
            adapting->limited();
            update_class_limit(*adapting, workload, clock::now());
        }
    }

    /// The plan, checked against B (G10) and against an adaptive floor.
    static std::optional<workload_plan> checked_plan(const gate_settings& settings, const adaptive_gate* adaptive) {
        if (!settings.workloads) {
            return std::nullopt;
        }
        workload_plan checked = checked_workload_plan(*settings.workloads, settings.concurrent);
        const int reserved = reserved_permits(checked);
        if (adaptive != nullptr && adaptive->floor() < reserved) {
            throw std::invalid_argument("bulkhead::db_bulkhead: the adaptive floor " +
                                        std::to_string(adaptive->floor()) +
                                        " is below the classes' reserved permits, " + std::to_string(reserved) +
                                        ": a limit that low could not honour the reservations");
        }
        return checked;
    }

    /// One adaptive ceiling per class when any class's ceiling adapts (null
    /// for a fixed one); none otherwise.
    static std::vector<std::unique_ptr<adaptive_gate>> class_limits(const permit_engine& permits) {
        std::vector<std::unique_ptr<adaptive_gate>> out;
        bool any_adapts = false;
        for (int c = 0; c < permits.classes() && permits.has_plan(); ++c) {
            any_adapts = any_adapts || permits.config(c).adaptive_floor > 0;
        }
        for (int c = 0; c < permits.classes() && any_adapts; ++c) {
            const workload_class& config = permits.config(c);
            out.push_back(
                config.adaptive_floor > 0
                    ? std::make_unique<adaptive_gate>(adaptive_options{.floor = config.adaptive_floor}, config.ceiling)
                    : nullptr);
        }
        return out;
    }

    /// Class `workload`'s adaptive ceiling, or null (a fixed one).
    [[nodiscard]] adaptive_gate* class_adaptive(int workload) const noexcept {
        return m_class_adaptive.empty() ? nullptr : m_class_adaptive[static_cast<std::size_t>(workload)].get();
    }

    void update_class_limit(adaptive_gate& adapting, int workload, clock::time_point now) noexcept {
        permit_engine::ceiling ceiling = m_permits.ceiling_of(workload, adapting.limit());
        adapting.maybe_update(now, ceiling);
    }

    void update_limit(clock::time_point now) noexcept {
        permit_engine::circulation permits{m_permits, m_adaptive->limit()};
        m_adaptive->maybe_update(now, permits);
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
    std::unique_ptr<adaptive_gate> m_adaptive;  // null: a fixed limit of B
    permit_engine m_permits;
    // One per class when any class's ceiling adapts (null for a fixed one);
    // empty otherwise.
    std::vector<std::unique_ptr<adaptive_gate>> m_class_adaptive;
    bool m_adapts;                         // a limit adapts: the gate's or a class's
    bool m_refusals_go_further;            // refuse_further() has work: a plan, an adaptive limit, an observer
    work_threads m_workers{m_concurrent};  // B threads for asynchronous callers' work, started on first use
    remote_releases m_remote;              // permits released on another thread than the entering one
    gate_metrics m_metrics;
    std::atomic<bool> m_closed{false};  // close() began: every call is refused
    std::stop_source m_cancel;          // close() reached its deadline: what is left is stopped
    void* m_reject_context = nullptr;
    void (*m_reject_report)(void*, reject_reason) noexcept = nullptr;
};

}  // namespace bulkhead::detail
