// bulkhead: the gate in front of a connection pool.
//
// db_bulkhead<Pool> admits database work in two stages and then owns one
// transaction on one pooled connection:
//
//   1. admission: one of B + Q slots, tried without blocking; none left means
//      admission_full at once, whatever the queue wait;
//   2. execution: one of B permits, waited for in FIFO order for at most the
//      queue wait (and never past the call's deadline), cancellable with a
//      std::stop_token;
//   3. work: a connection from the pool, BEGIN, the caller's callback, COMMIT;
//      ROLLBACK on any failure; the connection goes back to the pool;
//   4. release: the execution permit, then the admission slot, on the thread
//      that ran the work, only after all of step 3 has unwound.
//
// Nothing releases permits on a caller's behalf: a caller that stops waiting
// for a result does not shorten the work in progress, so never more than B
// callbacks run at once. Every rejection happens before the pool is touched
// and derives from bulkhead::rejected. docs/design.md draws the whole path,
// with every exception edge.
//
// Thread safety: one gate is shared by every caller of an application
// instance; all members may be called concurrently. The gate must outlive
// every permit taken from it and every call in progress.
#pragma once

#include <bulkhead/adaptive_limit.hpp>
#include <bulkhead/close_report.hpp>
#include <bulkhead/detail/clock.hpp>
#include <bulkhead/detail/gate_core.hpp>
#include <bulkhead/detail/held_gates.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/gate_stats.hpp>
#include <bulkhead/health.hpp>
#include <bulkhead/observer.hpp>
#include <bulkhead/permit.hpp>
#include <bulkhead/pool_concept.hpp>
#include <bulkhead/result.hpp>
#include <bulkhead/transaction_guard.hpp>
#include <bulkhead/workload.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace bulkhead {

namespace detail {

/// The asynchronous front end, defined by <bulkhead/asio.hpp>: calling
/// db_bulkhead::async_transaction() needs that header. An "incomplete type
/// async_frontend" error means it was not included.
template <class Token>
struct async_frontend;

/// What the asynchronous front end may use of a gate's insides; defined by
/// <bulkhead/asio.hpp>.
struct async_access;

}  // namespace detail

// ---------------------------------------------------------------------------
// db_bulkhead
// ---------------------------------------------------------------------------

/// An admission gate in front of `Pool`. See the file comment.
/// \tparam Pool     a bulkhead::transactional_pool.
/// \tparam Observer receives events (rejections, failed rollbacks); the
///                  default, null_observer, costs nothing.
template <class Pool, class Observer = null_observer>
class db_bulkhead {
    static_assert(detail::check_pool<Pool>());

public:
    /// What the callback receives: `*transaction`.
    using work_arg_t = decltype(*std::declval<typename Pool::transaction&>());

    /// The pool's transaction with BEGIN deferred (pool_defers_begin), or void.
    using deferred_arg_t = typename detail::deferred_arg<Pool>::type;

    /// True for a callback that takes the pool's deferred transaction, not
    /// `*transaction` (a generic callback takes `*transaction`): BEGIN then
    /// goes with its first statement.
    template <class Work>
    static constexpr bool defers_begin = !std::is_void_v<deferred_arg_t> && !std::is_invocable_v<Work&, work_arg_t> &&
                                         std::is_invocable_v<Work&, deferred_arg_t>;

    /// What a callback of type Work receives.
    template <class Work>
    using work_arg_for = std::conditional_t<defers_begin<Work>, deferred_arg_t, work_arg_t>;

    /// What a callback of type Work returns.
    template <class Work>
    using work_result_t = std::invoke_result_t<Work&, work_arg_for<Work>>;

    using pool_type = Pool;
    using transaction_options = typename Pool::transaction_options;
    using clock = std::chrono::steady_clock;

    /// Per-call settings. Use designated initializers:
    /// `gate.transaction({.queue_wait = 20ms, .stop = token}, work)`.
    struct options {
        /// Longest wait for an execution permit. Zero still succeeds when a
        /// permit is free and nobody is queued. Must not be negative.
        std::chrono::nanoseconds queue_wait{0};
        /// A stop request rejects the call while it waits for a permit (and
        /// before the work starts).
        std::stop_token stop{};
        /// An absolute deadline for the whole call: it caps the permit wait
        /// and the pool wait; once passed, the call is rejected with
        /// deadline_exceeded before the pool is touched. The default,
        /// time_point::max(), means none.
        clock::time_point deadline = clock::time_point::max();
        /// Settings for the transaction itself (isolation level, read-only, ...).
        transaction_options transaction{};
        /// Who is calling, for the non-reentrancy check: null (the default)
        /// means the calling thread. Callers that run independent tasks on
        /// one thread (coroutines, fibers) pass the task's identity, such as
        /// the address of its frame: a task that is inside the gate and
        /// enters again is refused, another task on the same thread is not.
        const void* task = nullptr;
        /// A call that must queue, whose deadline leaves less time than the
        /// gate's expected queue wait (expected_queue_wait()), is refused at
        /// once with deadline_exceeded instead of waiting to fail. False
        /// waits up to the deadline whatever the estimate says.
        bool reject_unreachable_deadline = true;
        /// The call's class, from workload(name), in a gate with workload
        /// classes; the default is the first class (the only one of a
        /// plain gate). An id that is not one of this gate's classes is
        /// misuse (std::logic_error).
        workload_id workload{};
        /// Where the call was made, for the pool's leak reports
        /// (pqxx_pool_options::leak_threshold): the line where these options
        /// were initialized, filled in by the compiler, or a label
        /// (`.site = "nightly rollup"`).
        call_site site{};
    };

    /// Creates a gate with `concurrent` (B) execution permits and
    /// `extra_slots` (Q) further admission slots over `pool`.
    /// \throws std::invalid_argument when B < 1 or Q < 0;
    ///         std::overflow_error when B + Q does not fit an int.
    db_bulkhead(Pool& pool, int concurrent, int extra_slots)
        : db_bulkhead(pool, gate_settings{.concurrent = concurrent, .extra_slots = extra_slots}) {}

    /// Creates a gate as `settings` say (gate_settings: B, and Q or a
    /// workload plan, and optionally an adaptive limit):
    /// `db_bulkhead gate(pool, {.concurrent = 16, .extra_slots = 64})`.
    /// \throws std::invalid_argument naming the setting that is wrong (B <
    ///         1, Q < 0, Q with a plan, a plan whose reservations do not fit
    ///         in B (G10), an adaptive setting out of range);
    ///         std::overflow_error when B + Q does not fit an int.
    db_bulkhead(Pool& pool, const gate_settings& settings) : m_pool(&pool), m_core(settings) { hook_observer(); }

    /// As above, with an observer that receives the gate's events.
    db_bulkhead(Pool& pool, const gate_settings& settings, Observer observer)
        : m_pool(&pool), m_core(settings), m_observer(std::move(observer)) {
        hook_observer();
    }

    db_bulkhead(const db_bulkhead&) = delete;
    db_bulkhead& operator=(const db_bulkhead&) = delete;

    /// A gate must be empty when destroyed: a call still inside would
    /// release its permit into freed memory. One that is not ends the
    /// process with a message saying so (close() first, and destroy the
    /// gate only once close() reports it drained).
    ~db_bulkhead() {
        if (const int inside = m_core.in_flight(); inside > 0) [[unlikely]] {
            detail::die_with_calls_inside("bulkhead::db_bulkhead", inside);
        }
    }

    /// The class named `name`, for options::workload.
    /// \throws std::invalid_argument when the gate has no such class (a
    ///         plain gate has one, named "default").
    [[nodiscard]] workload_id workload(std::string_view name) const { return m_core.find(name); }

    /// The names of the gate's classes, in id order ("default" for a
    /// plain gate).
    [[nodiscard]] std::vector<std::string> workload_names() const { return m_core.names(); }

    /// True when the gate serves workload classes.
    [[nodiscard]] bool has_workloads() const noexcept { return m_core.has_workloads(); }

    /// Runs `work` inside one transaction on one pooled connection and returns
    /// its value after commit and after the connection went back to the pool.
    /// \throws admission_full, admission_timeout, admission_cancelled,
    ///         deadline_exceeded, pool_timeout (all bulkhead::rejected: the
    ///         work never started); whatever `work`, begin or commit threw
    ///         (the transaction was rolled back); std::invalid_argument for a
    ///         negative queue wait or an empty callable; std::logic_error when
    ///         this thread is already inside this gate.
    template <class Work>
    auto transaction(const options& call, Work&& work) {
        check_callable(work);
        admission_times times;
        permit held = admit_or_throw(call, &times);
        return run(held, call, std::forward<Work>(work), times);
    }

    /// One statement as a whole transaction, in one round trip where the
    /// pool offers it (pool_commits_statements; pqxx_pool: BEGIN, the
    /// statement, COMMIT and the session reset in one write). Parameters
    /// bind to $1, $2, ... Returns the statement's result once committed
    /// (pqxx_pool: bulkhead::statement_result). Same as transaction() with a
    /// callback that returns `tx.exec_with_commit(sql, params...)`.
    /// \throws as transaction().
    template <class... Params>
    requires pool_commits_statements<Pool>
    auto execute(const options& call, std::string_view sql, Params&&... params) {
        return transaction(call, [&](deferred_arg_t tx) { return tx.exec_with_commit(sql, params...); });
    }

    /// Same as transaction({.queue_wait = queue_wait}, work).
    template <class Work>
    auto transaction(std::chrono::nanoseconds queue_wait, Work&& work, call_site site = {}) {
        return transaction(options{.queue_wait = queue_wait, .site = site}, std::forward<Work>(work));
    }

    /// Like transaction(), but a rejection comes back as a result instead of
    /// an exception. The callback's own exceptions, and errors from begin and
    /// commit, still propagate; so does misuse.
    template <class Work>
    auto try_transaction(const options& call, Work&& work) -> result<work_result_t<Work>> {
        check_callable(work);
        admission_times times;
        result<permit> held = admit(call, &times);
        if (!held) {
            return held.error();
        }
        bool started = false;
        try {
            if constexpr (std::is_void_v<work_result_t<Work>>) {
                run(*held, call, std::forward<Work>(work), times, &started);
                return {};
            } else {
                return run(*held, call, std::forward<Work>(work), times, &started);
            }
        } catch (const rejected& rejection) {
            if (started) {
                throw;  // from the callback itself (another gate, say): not ours to report
            }
            // The stages before the callback (the pool wait, a stop or a
            // deadline seen after the permit) said no.
            return rejection.reason();
        }
    }

    /// Same as try_transaction({.queue_wait = queue_wait}, work).
    template <class Work>
    auto try_transaction(std::chrono::nanoseconds queue_wait, Work&& work, call_site site = {}) {
        return try_transaction(options{.queue_wait = queue_wait, .site = site}, std::forward<Work>(work));
    }

    /// Runs `work` as transaction() does, for a caller that must not block
    /// its thread: a coroutine on an event loop, or any Asio completion
    /// token (`use_awaitable`, `deferred`, `use_future`, a callback).
    /// Completes with `void(std::error_code, T)` (`void(std::error_code)`
    /// for a callback returning void): a rejection is its reject_reason as
    /// an error code, a failure of the started work a work_error. The work
    /// runs on one of the gate's B work threads, never on the caller's; the
    /// completion runs on the handler's associated executor. Needs
    /// <bulkhead/asio.hpp>; docs/async.md describes it.
    /// \throws std::invalid_argument, std::logic_error at once, for the same
    ///         misuse as transaction(); std::system_error when the work
    ///         threads cannot be started. Nothing is held then.
    template <class Work, class Token>
    auto async_transaction(const options& call, Work&& work, Token&& token) {
        return detail::async_frontend<std::decay_t<Token>>::initiate(*this, call, std::forward<Work>(work), nullptr,
                                                                     std::forward<Token>(token));
    }

    /// As above; when the call completes with a work_error, `failure` holds
    /// the exception behind it (the callback's own, the database's), and
    /// when it completes with a rejection, the `rejected` that transaction()
    /// would have thrown, with its retry_after() (G9). It must stay valid
    /// until the completion runs.
    template <class Work, class Token>
    auto async_transaction(const options& call, Work&& work, std::exception_ptr& failure, Token&& token) {
        return detail::async_frontend<std::decay_t<Token>>::initiate(*this, call, std::forward<Work>(work), &failure,
                                                                     std::forward<Token>(token));
    }

    /// Takes an admission slot and an execution permit, for callers that run
    /// their own transaction inside the admitted scope. `call.transaction` is
    /// ignored.
    /// \throws as transaction() does for admission.
    [[nodiscard]] permit enter(const options& call = {}) { return admit_or_throw(call); }

    /// Like enter(), reporting a rejection as a result.
    [[nodiscard]] result<permit> try_enter(const options& call = {}) { return admit(call); }

    /// Free execution permits (of B). An observation, never needed to decide
    /// admission: it is stale as soon as it returns.
    [[nodiscard]] int available() const noexcept { return m_core.available(); }

    /// Free admission slots (of B + Q; with classes, the sum of each
    /// class's ceiling + queue). An observation, like available().
    [[nodiscard]] int available_slots() const noexcept { return m_core.available_slots(); }

    /// Callers queued for an execution permit right now.
    [[nodiscard]] int waiting() const noexcept { return m_core.waiting(); }

    /// Calls holding an execution permit right now (an observation). It may
    /// exceed limit() for a while after an adaptive limit shrank.
    [[nodiscard]] int running() const noexcept { return m_core.running(); }

    /// How long a call arriving now would wait for its execution permit, by
    /// the gate's own figures: zero when a permit is free or nothing is
    /// known yet (no transaction has finished); otherwise
    /// (waiting() + 1) x mean permit hold / limit(). A mean, not a bound: it
    /// assumes the calls ahead hold their permits as long as recent ones did.
    [[nodiscard]] std::chrono::nanoseconds expected_queue_wait() const noexcept { return m_core.expected_queue_wait(); }

    /// The same for a call of class `workload`: zero when it could take a
    /// permit now; otherwise (its class's waiters + 1) x the class's mean
    /// permit hold / the permits the class can use (its ceiling, or its
    /// reservation plus the shared permits if fewer). The gate's figures
    /// stand in for a class that has finished nothing yet.
    /// \throws std::logic_error when `workload` is not one of its classes.
    [[nodiscard]] std::chrono::nanoseconds expected_queue_wait(workload_id workload) const {
        return m_core.expected_queue_wait(m_core.checked_workload(workload));
    }

    /// A delay after which a call turned away now may be admitted: the work
    /// inside the gate and one more call, spread over the permits in
    /// circulation (B, or an adaptive gate's limit() now),
    /// (running + waiting() + 1) x mean permit hold / limit(), in whole
    /// milliseconds rounded up, at least 1 ms. Zero when nothing is known
    /// yet (no transaction has finished). Every rejection thrown by
    /// transaction() or enter() carries it (rejected::retry_after()), and so
    /// does the one async_transaction() hands a caller that asks for the
    /// exception; try_transaction() and try_enter() callers read it here.
    [[nodiscard]] std::chrono::milliseconds suggested_retry_delay() const noexcept { return m_core.retry_delay(); }

    /// The same for a call of class `workload`: its class's running and
    /// waiting calls and one more, x the class's mean permit hold, over the
    /// permits the class can use. Rejections of its calls carry this.
    /// \throws std::logic_error when `workload` is not one of its classes.
    [[nodiscard]] std::chrono::milliseconds suggested_retry_delay(workload_id workload) const {
        return m_core.retry_delay(m_core.checked_workload(workload));
    }

    /// B, as constructed: the most execution permits, and the ceiling of
    /// an adaptive limit.
    [[nodiscard]] int concurrent() const noexcept { return m_core.concurrent(); }

    /// The execution permits in circulation now: B for a fixed gate, the
    /// current adaptive limit otherwise (in [floor, B]).
    [[nodiscard]] int limit() const noexcept { return m_core.limit(); }

    /// True when the gate's limit adapts.
    [[nodiscard]] bool adaptive() const noexcept { return m_core.adaptive(); }

    /// Q, as constructed.
    [[nodiscard]] int extra_slots() const noexcept { return m_core.extra_slots(); }

    /// The pool this gate fronts.
    [[nodiscard]] Pool& pool() const noexcept { return *m_pool; }

    /// The observer, for reading what it collected.
    [[nodiscard]] Observer& observer() noexcept { return m_observer; }

    /// Drains the gate for a shutdown. From now on every call is refused
    /// with `closed` (a rejection: counted, and for a coroutine the error
    /// code reject_reason::closed), except one that finds every admission
    /// slot taken, refused with admission_full as before. The calls already inside, queued and
    /// running, threads and coroutines, may finish until `deadline`; then
    /// whatever is left is stopped as the caller's own stop would stop it (a
    /// queued call is refused with `closed`; running work has its statement
    /// cancelled on the server and ends with work_cancelled, rolled back),
    /// and close() waits up to `cancel_wait` more for those calls to unwind.
    /// Returns what it saw; drained() says whether the gate may now be
    /// destroyed. Calling it again waits again. Permits taken with enter()
    /// count as calls inside but have no stop to hear. The pool is not
    /// closed: close it after the gate (pqxx_pool::close()).
    close_report close(clock::time_point deadline, std::chrono::milliseconds cancel_wait = std::chrono::seconds(5)) {
        // Counted before the gate closes: once it is closed, a call being
        // refused holds a slot for an instant (gate_core::take_slot()) and
        // would be counted as inside. One admitted in between is waited
        // for, and counted once it is still there at the deadline.
        close_report report;
        report.in_flight = m_core.in_flight();
        m_core.stop_admitting();
        const auto inside = [this] { return m_core.in_flight(); };
        report.cancelled = detail::wait_until_idle(deadline, inside);
        report.still_running = report.cancelled;
        if (report.cancelled > 0) {
            m_core.cancel_all();
            report.still_running = detail::wait_until_idle(detail::saturating_add(clock::now(), cancel_wait), inside);
        }
        report.in_flight = std::max(report.in_flight, report.cancelled);
        return report;
    }

    /// Whether the gate can serve now, and why not (health.hpp): closed;
    /// the pool has no connection and cannot open one (its last error,
    /// scrubbed); or serving, with a warning: the adaptive limit at its
    /// floor, the fleet over the server's connection budget. Reads what the
    /// gate and the pool already know; sends nothing to the server.
    [[nodiscard]] gate_health health() const {
        if (m_core.closed()) {
            return {false, health_reason::closed, "the gate was closed"};
        }
        pool_health pool;
        if constexpr (pool_reports_health<Pool>) {
            pool = m_pool->health();
            if (!pool.can_connect) {
                return {false, health_reason::cannot_connect, std::move(pool.last_error)};
            }
        }
        if (m_core.at_floor()) {
            return {true, health_reason::limit_at_floor,
                    "the adaptive limit is at its floor, " + std::to_string(m_core.limit()) + " of " +
                        std::to_string(m_core.concurrent()) + " permits"};
        }
        if (!pool.budget_excess.empty()) {
            return {true, health_reason::budget_exceeded, std::move(pool.budget_excess)};
        }
        return {};
    }

    /// True once close() has begun: the gate admits nothing more.
    [[nodiscard]] bool closed() const noexcept { return m_core.closed(); }

    /// Calls inside the gate now, queued or running (each holds an
    /// admission slot). An observation.
    [[nodiscard]] int in_flight() const noexcept { return m_core.in_flight(); }

    /// A copy of the gate's counters, gauges and latency distributions
    /// (see gate_stats.hpp). Costs a few kilobytes of copying; never blocks
    /// callers.
    [[nodiscard]] gate_stats stats() const {
        gate_stats stats;
        m_core.fill(stats);
        return stats;
    }

private:
    friend struct detail::async_access;

    class call_timer;

    template <class Work>
    static void check_callable(const Work& work) {
        static_assert(std::is_invocable_v<Work&, work_arg_t> || defers_begin<Work>,
                      "bulkhead: the callback must be callable with the pool's transaction object (or, where the "
                      "pool defers BEGIN, its deferred transaction: bulkhead::pqxx_transaction&)");
        static_assert(!std::is_reference_v<work_result_t<Work>>,
                      "bulkhead: the callback must return a value (materialized), not a reference into the "
                      "transaction");
        using plain = std::remove_cvref_t<Work>;
        if constexpr (std::is_pointer_v<plain> || std::is_member_pointer_v<plain>) {
            if (work == nullptr) {
                throw std::invalid_argument("bulkhead::db_bulkhead: the callback is a null function pointer");
            }
        } else if constexpr (requires { work.operator bool(); }) {
            if (!static_cast<bool>(work)) {
                throw std::invalid_argument("bulkhead::db_bulkhead: the callback is empty");
            }
        }
    }

    using admission_times = detail::admission_times;
    using permit_wait_limit = detail::permit_wait_limit;

    /// Both admission stages (detail::gate_core::admit), then the permit.
    result<permit> admit(const options& call, admission_times* times = nullptr) {
        result<permit_wait_limit> held = m_core.admit(call, times);
        if (!held) {
            return held.error();
        }
        return admitted(call, held->workload);
    }

    /// Counts an admission and makes the permit, recorded as this thread's.
    permit admitted(const options& call, int workload) noexcept {
        m_core.count_admitted(workload);
        detail::held_gates& held = detail::this_thread_gates;
        return permit(m_core, &held, held.add(&m_core, call.task), workload);
    }

    /// admit(), with a refusal thrown as its rejected exception, carrying
    /// the suggested retry delay (of the call's class).
    /// The permit is made in the caller's frame, not moved out of a
    /// result: that move cost the uncontended enter/leave path a fifth of
    /// its time (a stalled copy, bench/micro gate/enter_leave).
    permit admit_or_throw(const options& call, admission_times* times = nullptr) {
        const result<detail::permit_wait_limit> held = m_core.admit_out_of_line(call, times);
        if (!held) {
            throw_rejection(held.error(), m_core.retry_delay(class_of(call)), outage_cause(held.error()));
        }
        return admitted(call, class_of(call));
    }

    /// The class index of a call that admission has checked.
    [[nodiscard]] static int class_of(const options& call) noexcept { return call.workload.index; }

    /// Sends the core's refusals to the observer, when it takes them
    /// (null_observer's do nothing: no hook, no call).
    void hook_observer() noexcept {
        if constexpr (!std::is_same_v<Observer, null_observer> &&
                      requires(Observer & observer, reject_reason reason) { observer.on_rejected(reason); }) {
            m_core.set_reject_hook(this, [](void* self, reject_reason reason) noexcept {
                detail::notify_rejected(static_cast<db_bulkhead*>(self)->m_observer, reason);
            });
        }
    }

    /// For an asynchronous front end: stages 3 and 4 on this thread for a
    /// call whose slot and permit were taken elsewhere (by the caller's
    /// thread, or granted by a release). The permit is recorded as this
    /// thread's, so the callback cannot reenter the gate, and is released
    /// after everything here has unwound, as for transaction().
    /// `call.stop` already hears close(): the front end joined it.
    template <class Work>
    work_result_t<Work> run_adopted(const options& call, Work&& work, const admission_times& times, bool* started) {
        permit adopted = admitted(call, class_of(call));
        return run_joined(adopted, call, std::forward<Work>(work), times, started);
    }

    /// Stages 3 and 4 for a call that holds `held`. The permit is released
    /// by the caller's frame, after every local here has been destroyed.
    /// From here on the call's stop token is joined with the gate's
    /// cancellation, so that close() stops it as the caller's stop would.
    template <class Work>
    work_result_t<Work> run(permit& held, const options& call, Work&& work, const admission_times& times,
                            bool* started = nullptr) {
        detail::joined_stop stop(call.stop, m_core.cancellation());
        options joined = call;
        joined.stop = stop.take();
        return run_joined(held, joined, std::forward<Work>(work), times, started);
    }

    template <class Work>
    work_result_t<Work> run_joined(permit& held, const options& call, Work&& work, const admission_times& times,
                                   bool* started) {
        (void)held;
        // Seen after the permit was granted, but before the pool is touched:
        // still "the work never started".
        if (call.stop.stop_requested()) {
            throw_refusal(m_core.stopped_reason(), call);
        }
        if (call.deadline != clock::time_point::max() && call.deadline <= times.permitted) {
            throw_refusal(reject_reason::deadline_exceeded, call);
        }
        // Declared before the lease, so it is destroyed after it: it records
        // how long the connection was held, and the whole call.
        call_timer timer(m_core, times, class_of(call));
        typename Pool::lease lease = acquire_lease(call);
        timer.connection_acquired();
        m_core.metrics().pool_wait.record(timer.leased_at() - times.permitted);
        // A stop during the pool wait (seen here when the pool cannot end
        // that wait itself): nothing has been sent, the lease goes back.
        if (call.stop.stop_requested()) {
            throw_refusal(m_core.stopped_reason(), call);
        }
        if constexpr (pool_takes_deadlines<Pool>) {
            if (call.deadline != clock::time_point::max()) {
                transaction_options settings = call.transaction;
                settings.deadline = call.deadline;
                return work_on(lease, settings, call, std::forward<Work>(work), started, timer);
            }
        }
        return work_on(lease, call.transaction, call, std::forward<Work>(work), started, timer);
    }

    /// Stage 4 on a leased connection. Destroyed in reverse order on every
    /// exit: the guard rolls back (unless committed), then, in run()'s frame,
    /// the lease returns the connection, then the caller's permit is released.
    template <class Work>
    work_result_t<Work> work_on(typename Pool::lease& lease, const transaction_options& settings, const options& call,
                                Work&& work, bool* started, call_timer& timer) {
        bool began = false;
        try {
            transaction_guard<Pool> guard = begin_transaction<defers_begin<Work>>(lease, settings, call);
            began = true;
            if (started != nullptr) {
                *started = true;
            }
            cancel_if_stopped(call);  // a stop that came while BEGIN ran: the callback does not start
            if constexpr (std::is_void_v<work_result_t<Work>>) {
                run_callback(lease, guard, settings, call, std::forward<Work>(work));
                cancel_if_stopped(call);
                refuse_commit_past_deadline(call);
                commit_work(lease, guard, call);
                timer.committed();
                m_core.metrics().completed();
            } else {
                work_result_t<Work> value = run_callback(lease, guard, settings, call, std::forward<Work>(work));
                cancel_if_stopped(call);
                refuse_commit_past_deadline(call);
                commit_work(lease, guard, call);
                timer.committed();
                m_core.metrics().completed();
                return value;
            }
        } catch (rejected& rejection) {
            if (!began) {
                // The pool's own rejection before anything began (BEGIN saw the deadline pass).
                detail::suggest_retry(rejection, m_core.retry_delay(class_of(call)));
            }
            count_failure(began, class_of(call));
            throw;
        } catch (...) {
            count_failure(began, class_of(call));
            throw;
        }
    }

    /// Stage 4's BEGIN (with `Deferred`, the transaction only: its BEGIN
    /// goes with the callback's first statement). While it runs, a stop
    /// request asks the pool to cancel it on the server, as for the
    /// callback's statements and COMMIT: from BEGIN to COMMIT a stop reaches
    /// the server; a BEGIN that fails once a stop was requested is
    /// work_cancelled.
    template <bool Deferred>
    transaction_guard<Pool> begin_transaction(typename Pool::lease& lease, const transaction_options& settings,
                                              const options& call) {
        if constexpr (Deferred) {
            return transaction_guard<Pool>(defer_begin, *m_pool, lease, settings, rollback_hook());
        } else if constexpr (pool_cancels_work<Pool>) {
            try {
                const std::stop_callback cancel_on_stop(call.stop,
                                                        [this, &lease]() noexcept { m_pool->cancel(lease); });
                return transaction_guard<Pool>(*m_pool, lease, settings, rollback_hook());
            } catch (const rejected&) {
                throw;  // nothing began (the deadline, no connection for a retry): a rejection stays one
            } catch (...) {
                if (call.stop.stop_requested()) {
                    std::throw_with_nested(work_cancelled());
                }
                throw;
            }
        } else {
            return transaction_guard<Pool>(*m_pool, lease, settings, rollback_hook());
        }
    }

    /// Stage 4's COMMIT. While it runs, a stop request asks the pool to
    /// cancel it on the server, as for the callback's statements (a pool's
    /// COMMIT may carry the caller's statement: pqxx_pool's exec_with_commit),
    /// and a failure is reported as the callback's are (a stop, the
    /// deadline). A COMMIT whose outcome is unknown stays commit_unknown.
    void commit_work(typename Pool::lease& lease, transaction_guard<Pool>& guard, const options& call) {
        try {
            if constexpr (pool_cancels_work<Pool>) {
                const std::stop_callback cancel_on_stop(call.stop,
                                                        [this, &lease]() noexcept { m_pool->cancel(lease); });
                guard.commit();
            } else {
                guard.commit();
            }
        } catch (const commit_unknown&) {
            throw;
        } catch (...) {
            explain_failure(guard, call);
            throw;
        }
    }

    /// Inside a catch handler: counts how a call that reached the pool ended.
    /// A rejection before BEGIN (the deadline) is a rejection, not a failure.
    void count_failure(bool began, int workload) noexcept {
        detail::gate_metrics& metrics = m_core.metrics();
        try {
            throw;
        } catch (const rejected& rejection) {
            if (!began) {
                (void)m_core.refuse(rejection.reason(), workload);
                return;
            }
            metrics.failed();
        } catch (const work_cancelled&) {
            metrics.failed();
            metrics.work_cancelled();
        } catch (const work_deadline_exceeded&) {
            metrics.failed();
            metrics.work_deadline_exceeded();
            m_core.overloaded(overload_kind::timeout, workload);
        } catch (const commit_unknown&) {
            metrics.failed();
            metrics.commit_unknown();
        } catch (...) {
            metrics.failed();
            note_overload(workload);
        }
    }

    /// Inside a catch handler, for an adaptive gate: what the pool says the
    /// failure means for the database's load.
    void note_overload(int workload) noexcept {
        if constexpr (pool_classifies_overload<Pool>) {
            if (m_core.adapts(workload)) {
                m_core.overloaded(m_pool->classify_overload(std::current_exception()), workload);
            }
        }
    }

    /// Records the connection hold time and the whole call's duration when
    /// the call's connection has gone back to the pool.
    class call_timer {
    public:
        call_timer(detail::gate_core& core, const admission_times& times, int workload) noexcept
            : m_core(core), m_start(times.admitted), m_permitted(times.permitted), m_workload(workload) {}
        call_timer(const call_timer&) = delete;
        call_timer& operator=(const call_timer&) = delete;
        ~call_timer() {
            const clock::time_point now = clock::now();
            detail::gate_metrics& metrics = m_core.metrics();
            if (m_leased) {
                metrics.connection_hold.record(now - m_leased_at);
            }
            metrics.call.record(now - m_start);
            m_core.finishing(now, m_permitted, m_committed, m_workload);
        }
        void connection_acquired() noexcept {
            m_leased_at = clock::now();
            m_leased = true;
        }
        [[nodiscard]] clock::time_point leased_at() const noexcept { return m_leased_at; }
        /// The transaction committed: its hold counts as what a call needs.
        void committed() noexcept { m_committed = true; }

    private:
        detail::gate_core& m_core;
        clock::time_point m_start;
        clock::time_point m_permitted;
        clock::time_point m_leased_at{};
        int m_workload;  // the call's class
        bool m_leased = false;
        bool m_committed = false;
    };

    /// Runs the callback. While it runs, a stop request asks the pool to
    /// cancel the statement in progress on the server (when the pool can);
    /// the permits stay with this thread until everything has unwound.
    template <class Work>
    work_result_t<Work> run_callback(typename Pool::lease& lease, transaction_guard<Pool>& guard,
                                     const transaction_options& settings, const options& call, Work&& work) {
        struct work_timer {
            log_linear_histogram& histogram;
            clock::time_point began = clock::now();
            ~work_timer() { histogram.record(clock::now() - began); }
        } timed{m_core.metrics().work};
        try {
            if constexpr (pool_cancels_work<Pool>) {
                // Deregistered (waiting for a cancel in flight) before the
                // transaction is committed or rolled back.
                const std::stop_callback cancel_on_stop(call.stop,
                                                        [this, &lease]() noexcept { m_pool->cancel(lease); });
                return invoke_work(guard, settings, std::forward<Work>(work));
            } else {
                return invoke_work(guard, settings, std::forward<Work>(work));
            }
        } catch (...) {
            explain_failure(guard, call);
            throw;
        }
    }

    /// Calls the callback with what it takes: `*transaction`, or the pool's
    /// deferred transaction.
    template <class Work>
    work_result_t<Work> invoke_work(transaction_guard<Pool>& guard, const transaction_options& settings, Work&& work) {
        if constexpr (defers_begin<Work>) {
            auto deferred = m_pool->deferred(guard.handle(), settings);
            return std::invoke(std::forward<Work>(work), deferred);
        } else {
            (void)settings;
            return std::invoke(std::forward<Work>(work), guard.work());
        }
    }

    /// Inside a catch handler: a failure caused by a stop request or by the
    /// call's deadline is reported as such, with the original nested;
    /// anything else propagates unchanged (returns).
    void explain_failure(transaction_guard<Pool>& guard, const options& call) {
        if constexpr (pool_reports_block_end<Pool>) {
            if (m_pool->transaction_block_ended(guard.handle())) {
                std::throw_with_nested(std::logic_error(
                    "bulkhead::db_bulkhead: a statement of the callback ended the transaction block (COMMIT, ROLLBACK, "
                    "...); nothing after it reached the server and the call failed; the gate commits after the "
                    "callback returns"));
            }
        }
        if (call.stop.stop_requested()) {
            std::throw_with_nested(work_cancelled());
        }
        if constexpr (pool_reports_deadlines<Pool>) {
            if (call.deadline != clock::time_point::max() && m_pool->failed_by_deadline(guard.handle())) {
                std::throw_with_nested(work_deadline_exceeded());
            }
        }
        (void)guard;
    }

    /// A stop requested while the work ran (BEGIN or the callback) cancels
    /// the work, even when the callback finished: nothing is committed.
    static void cancel_if_stopped(const options& call) {
        if (call.stop.stop_requested()) {
            throw work_cancelled();
        }
    }

    /// A deadline that passed while the work ran: nothing is committed (the
    /// caller has given up on the result by then).
    static void refuse_commit_past_deadline(const options& call) {
        if (call.deadline != clock::time_point::max() && clock::now() >= call.deadline) {
            throw work_deadline_exceeded();
        }
    }

    /// Stage 3. A pool wait cut short by the call's deadline (rather than by
    /// the pool's own connection timeout) is reported as deadline_exceeded.
    typename Pool::lease acquire_lease(const options& call) {
        const clock::time_point deadline = call.deadline;
        try {
            if constexpr (pool_acquires_at<Pool>) {
                return m_pool->acquire(deadline, call.stop, call.site);
            } else if constexpr (pool_acquires_with_stop<Pool>) {
                return m_pool->acquire(deadline, call.stop);
            } else {
                return m_pool->acquire(deadline);
            }
        } catch (pool_timeout& timeout) {
            if (deadline != clock::time_point::max() && clock::now() >= deadline) {
                throw_refusal(reject_reason::deadline_exceeded, call);
            }
            (void)m_core.refuse(reject_reason::pool_timeout, class_of(call));
            m_core.overloaded(overload_kind::timeout, class_of(call));
            detail::suggest_retry(timeout, m_core.retry_delay(class_of(call)));
            throw;
        } catch (rejected& rejection) {
            if (rejection.reason() == reject_reason::admission_cancelled &&
                m_core.stopped_reason() == reject_reason::closed) {
                throw_refusal(reject_reason::closed, call);  // the pool wait was stopped by close()
            }
            (void)m_core.refuse(rejection.reason(), class_of(call));
            detail::suggest_retry(rejection, m_core.retry_delay(class_of(call)));
            throw;
        } catch (...) {
            m_core.metrics().failed();  // the pool failed otherwise: still one counted outcome
            note_overload(class_of(call));
            throw;
        }
    }

    [[noreturn]] void throw_refusal(reject_reason reason, const options& call) {
        (void)m_core.refuse(reason, class_of(call));
        throw_rejection(reason, m_core.retry_delay(class_of(call)), outage_cause(reason));
    }

    /// For a refusal that follows a wait (admission_timeout,
    /// deadline_exceeded, pool_timeout) while the pool's latest attempt to
    /// open a connection failed: that error (scrubbed by the pool), so that
    /// a caller and a log can tell an outage or a failover from overload.
    /// Empty otherwise; admission_full, the refusal made at once under
    /// overload, never asks the pool.
    [[nodiscard]] std::string outage_cause(reject_reason reason) const {
        if constexpr (pool_reports_health<Pool>) {
            if (reason == reject_reason::admission_timeout || reason == reject_reason::deadline_exceeded ||
                reason == reject_reason::pool_timeout) {
                std::string error = m_pool->health().last_error;
                if (!error.empty()) {
                    return "the pool's last connection error: " + error;
                }
            }
        } else {
            (void)reason;
        }
        return {};
    }

    rollback_failure_hook rollback_hook() noexcept {
        return {this, [](void* self, std::exception_ptr failure) noexcept {
                    auto& gate = *static_cast<db_bulkhead*>(self);
                    gate.m_core.metrics().rollback_failed();
                    detail::notify_rollback_failed(gate.m_observer, std::move(failure));
                }};
    }

    Pool* m_pool;
    detail::gate_core m_core;
    [[no_unique_address]] Observer m_observer;
};

}  // namespace bulkhead
