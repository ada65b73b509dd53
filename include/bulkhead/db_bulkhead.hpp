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
#include <bulkhead/admission_counter.hpp>
#include <bulkhead/detail/held_gates.hpp>
#include <bulkhead/detail/work_threads.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/fifo_semaphore.hpp>
#include <bulkhead/gate_stats.hpp>
#include <bulkhead/result.hpp>
#include <bulkhead/workload.hpp>
#include <bulkhead/workload_scheduler.hpp>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace bulkhead {

// ---------------------------------------------------------------------------
// The Pool concept
// ---------------------------------------------------------------------------

/// A pool names its handle types: a move-only `lease` (an RAII connection
/// handle that returns the connection to the pool when destroyed), a
/// `transaction` handle that dereferences to what the callback receives, and
/// `transaction_options` (per-call settings such as isolation level; must be
/// default-constructible).
template <class Pool>
concept pool_names_its_types = requires {
    typename Pool::lease;
    typename Pool::transaction;
    typename Pool::transaction_options;
}
&&std::move_constructible<typename Pool::lease> && !std::copy_constructible<typename Pool::lease> &&
    std::default_initializable<typename Pool::transaction_options>;

/// `pool.acquire(deadline)` returns a lease, waiting at most the pool's own
/// connection timeout and never past `deadline` (a steady_clock time point;
/// time_point::max() means "no deadline"). On expiry it throws
/// bulkhead::pool_timeout. A rejection a pool throws must be a new object
/// for each call (not a stored exception_ptr rethrown to many): the gate
/// gives it its retry delay before letting it through.
template <class Pool>
concept pool_acquires_leases = requires(Pool& pool, std::chrono::steady_clock::time_point deadline) {
    { pool.acquire(deadline) } -> std::same_as<typename Pool::lease>;
};

/// `pool.begin(lease, options)` starts a transaction on the leased connection;
/// `*tx` is what the callback receives; `pool.commit(lease, tx)` and
/// `pool.rollback(lease, tx)` end it. rollback() must be safe after a commit()
/// that threw. The transaction object must refuse commit and rollback
/// requested by the callback itself.
template <class Pool>
concept pool_runs_transactions = requires(Pool& pool, typename Pool::lease& lease, typename Pool::transaction& tx,
                                          const typename Pool::transaction_options& options) {
    { pool.begin(lease, options) } -> std::same_as<typename Pool::transaction>;
    *tx;
    pool.commit(lease, tx);
    pool.rollback(lease, tx);
};

/// `pool.discard(lease)` marks the leased connection untrustworthy: it is
/// closed instead of being handed out again. It cannot fail.
template <class Pool>
concept pool_discards_connections = requires(Pool& pool, typename Pool::lease& lease) {
    { pool.discard(lease) }
    noexcept;
};

/// What db_bulkhead needs from a connection pool: see the four concepts above.
template <class Pool>
concept transactional_pool = pool_names_its_types<Pool> && pool_acquires_leases<Pool> && pool_runs_transactions<Pool> &&
    pool_discards_connections<Pool>;

// Optional extensions. A pool that offers them gets more from the gate; one
// that does not still works.

/// `transaction_options::deadline` (a steady_clock time point): the gate sets
/// it to the call's deadline, so the pool can bound the work itself (the
/// libpqxx pool sets statement_timeout to the time left).
template <class Pool>
concept pool_takes_deadlines = requires(typename Pool::transaction_options& options) {
    options.deadline = std::chrono::steady_clock::time_point{};
};

/// `pool.cancel(lease)`: asks the server to cancel the statement running on
/// the leased connection. Called from the thread that requests a stop, while
/// another thread works on the connection; must be safe for that, and noexcept.
template <class Pool>
concept pool_cancels_work = requires(Pool& pool, typename Pool::lease& lease) {
    { pool.cancel(lease) }
    noexcept;
};

/// `pool.failed_by_deadline(tx)`: called inside a catch handler for a failure
/// of the callback; true when the current exception is the server cutting
/// the work short because of the deadline passed in transaction_options.
template <class Pool>
concept pool_reports_deadlines = requires(Pool& pool, typename Pool::transaction& tx) {
    { pool.failed_by_deadline(tx) }
    noexcept->std::same_as<bool>;
};

/// `pool.acquire(deadline, stop)`: as acquire(deadline), and a stop request
/// on `stop` ends the wait at once with bulkhead::admission_cancelled. A pool
/// without it still works; a stop then takes effect once the lease is had.
template <class Pool>
concept pool_acquires_with_stop = requires(Pool& pool, std::chrono::steady_clock::time_point deadline,
                                           const std::stop_token& stop) {
    { pool.acquire(deadline, stop) } -> std::same_as<typename Pool::lease>;
};

/// `pool.transaction_block_ended(tx)`: true when a statement of the callback
/// ended the transaction block itself (COMMIT, ROLLBACK, ...). The gate then
/// reports the call as misuse (std::logic_error), whatever the callback
/// threw.
template <class Pool>
concept pool_reports_block_end = requires(Pool& pool, typename Pool::transaction& tx) {
    { pool.transaction_block_ended(tx) }
    noexcept->std::same_as<bool>;
};

/// `pool.classify_overload(failure)`: what the exception that ended a call
/// says of the database's load (an SQLSTATE of saturation, a timeout, a
/// conflict, or nothing). An adaptive gate (adaptive_limit.hpp) counts it.
template <class Pool>
concept pool_classifies_overload = requires(const Pool& pool, const std::exception_ptr& failure) {
    { pool.classify_overload(failure) }
    noexcept->std::same_as<overload_kind>;
};

namespace detail {

/// Checks the Pool concept one part at a time, so that a type that does not
/// fit gets one readable message naming the missing part.
template <class Pool>
constexpr bool check_pool() {
    static_assert(pool_names_its_types<Pool>,
                  "bulkhead: Pool must define a move-only `lease`, a `transaction` handle and a "
                  "default-constructible `transaction_options` (see bulkhead::pool_names_its_types)");
    if constexpr (pool_names_its_types<Pool>) {
        static_assert(pool_acquires_leases<Pool>,
                      "bulkhead: Pool must provide `lease acquire(std::chrono::steady_clock::time_point deadline)` "
                      "(see bulkhead::pool_acquires_leases)");
        static_assert(pool_runs_transactions<Pool>,
                      "bulkhead: Pool must provide `transaction begin(lease&, const transaction_options&)`, "
                      "`commit(lease&, transaction&)` and `rollback(lease&, transaction&)`, and `*transaction` "
                      "(see bulkhead::pool_runs_transactions)");
        static_assert(pool_discards_connections<Pool>,
                      "bulkhead: Pool must provide `void discard(lease&) noexcept` "
                      "(see bulkhead::pool_discards_connections)");
    }
    return transactional_pool<Pool>;
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Observer
// ---------------------------------------------------------------------------

/// The default observer: every event compiles to nothing. An observer type is
/// any class with some of these member functions (all noexcept); events it
/// does not declare are not delivered, at no cost.
struct null_observer {
    /// A call was turned away before its work started.
    void on_rejected(reject_reason /*reason*/) noexcept {}
    /// A rollback failed; the connection has been marked for discard. The
    /// original exception, if any, still reaches the caller.
    void on_rollback_failed(std::exception_ptr /*failure*/) noexcept {}
};

namespace detail {

template <class Observer>
void notify_rejected(Observer& observer, reject_reason reason) noexcept {
    if constexpr (requires { observer.on_rejected(reason); }) {
        static_assert(noexcept(observer.on_rejected(reason)), "bulkhead: Observer::on_rejected must be noexcept");
        observer.on_rejected(reason);
    }
}

template <class Observer>
void notify_rollback_failed(Observer& observer, std::exception_ptr failure) noexcept {
    if constexpr (requires { observer.on_rollback_failed(failure); }) {
        static_assert(noexcept(observer.on_rollback_failed(failure)),
                      "bulkhead: Observer::on_rollback_failed must be noexcept");
        observer.on_rollback_failed(std::move(failure));
    }
}

}  // namespace detail

// ---------------------------------------------------------------------------
// transaction_guard
// ---------------------------------------------------------------------------

/// Where a transaction_guard reports a rollback that failed: a context pointer
/// and a function, so reporting needs no allocation. An empty hook drops the
/// report (the connection is still discarded).
struct rollback_failure_hook {
    void* context = nullptr;
    void (*report)(void* context, std::exception_ptr failure) noexcept = nullptr;

    void operator()(std::exception_ptr failure) const noexcept {
        if (report != nullptr) {
            report(context, std::move(failure));
        }
    }
};

/// Begins a transaction on construction; commits only when told; rolls back
/// in its destructor otherwise. A failed rollback never throws and is never
/// swallowed: the connection is marked for discard and the failure goes to
/// the hook.
/// \note Scoped like std::lock_guard: neither copyable nor movable. The pool
/// and the lease must outlive it.
template <class Pool>
requires transactional_pool<Pool>
class transaction_guard {
public:
    using lease_type = typename Pool::lease;
    using transaction_type = typename Pool::transaction;
    using options_type = typename Pool::transaction_options;

    /// Begins a transaction on `lease`.
    /// \throws whatever the pool's begin() throws; nothing is held then.
    transaction_guard(Pool& pool, lease_type& lease, const options_type& options = {},
                      rollback_failure_hook on_rollback_failure = {})
        : m_pool(&pool),
          m_lease(&lease),
          m_on_rollback_failure(on_rollback_failure),
          m_transaction(pool.begin(lease, options)) {}

    transaction_guard(const transaction_guard&) = delete;
    transaction_guard& operator=(const transaction_guard&) = delete;

    /// Rolls back unless commit() succeeded.
    ~transaction_guard() { rollback(); }

    /// What the callback works with (`*transaction`).
    [[nodiscard]] decltype(auto) work() noexcept(noexcept(*std::declval<transaction_type&>())) {
        return *m_transaction;
    }

    /// Commits. If the commit throws, the transaction still counts as open and
    /// is rolled back by rollback() or the destructor.
    /// \throws std::logic_error when the transaction already ended.
    void commit() {
        if (!m_open) {
            throw std::logic_error("bulkhead::transaction_guard: commit after the transaction ended");
        }
        m_pool->commit(*m_lease, m_transaction);
        m_open = false;
    }

    /// Rolls back if still open. Idempotent; never throws: a failure marks the
    /// connection for discard and goes to the hook.
    void rollback() noexcept {
        if (!m_open) {
            return;
        }
        m_open = false;
        try {
            m_pool->rollback(*m_lease, m_transaction);
        } catch (...) {
            m_pool->discard(*m_lease);
            m_on_rollback_failure(std::current_exception());
        }
    }

    /// The pool's transaction handle.
    [[nodiscard]] transaction_type& handle() noexcept { return m_transaction; }

    /// True until commit() succeeded or rollback() ran.
    [[nodiscard]] bool open() const noexcept { return m_open; }

private:
    Pool* m_pool;
    lease_type* m_lease;
    rollback_failure_hook m_on_rollback_failure;
    transaction_type m_transaction;
    bool m_open = true;
};

// ---------------------------------------------------------------------------
// permit
// ---------------------------------------------------------------------------

template <class Pool, class Observer>
class db_bulkhead;

namespace detail {

/// The asynchronous front end, defined by <bulkhead/asio.hpp>: calling
/// db_bulkhead::async_transaction() needs that header. An "incomplete type
/// async_frontend" error means it was not included.
template <class Token>
struct async_frontend;

/// What the asynchronous front end may use of a gate's insides; defined by
/// <bulkhead/asio.hpp>.
struct async_access;

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

/// The permit logic of a gate, independent of the pool type.
class gate_core {
public:
    gate_core(int concurrent, int extra_slots, const adaptive_options* adaptive = nullptr)
        : m_concurrent(checked_concurrent(concurrent, extra_slots)),
          m_extra_slots(extra_slots),
          m_slots(static_cast<std::int64_t>(concurrent) + extra_slots),
          m_running(concurrent),
          m_adaptive(adaptive != nullptr ? std::make_unique<adaptive_gate>(*adaptive, concurrent) : nullptr) {
        if (m_adaptive) {
            m_running.shrink(concurrent - m_adaptive->start());
        }
    }

    /// A gate with workload classes: `plan` checked against B (G10); the
    /// classes' admission slots (ceiling + queue each) replace B + Q.
    gate_core(int concurrent, const workload_plan& plan, const adaptive_options* adaptive)
        : gate_core(concurrent, 0, adaptive) {
        const workload_plan checked = checked_workload_plan(plan, concurrent);
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

    gate_core(const gate_core&) = delete;
    gate_core& operator=(const gate_core&) = delete;

    /// Releases one execution permit, then one admission slot (of class
    /// `workload` in a gate with classes).
    void leave(int workload) noexcept {
        if (workload < 0) {
            m_running.release();
            m_slots.release();
        } else {
            m_classes->release(workload);
            m_classes->release_slot(workload);
        }
    }

    /// The permits in circulation: B, or the adaptive limit.
    [[nodiscard]] int limit() const noexcept { return m_adaptive ? m_adaptive->limit() : m_concurrent; }

    /// A call (of class `workload`, -1 for none) found no permit free: an
    /// adaptive limit counts it, and may use the moment to reconsider
    /// itself; so does the class's adaptive ceiling.
    void no_permit_free(int workload = -1) noexcept {
        if (m_adaptive) {
            m_adaptive->limited();
            update_limit(std::chrono::steady_clock::now());
        }
        if (workload >= 0) [[unlikely]] {  // kept out of the plain gate's path, which inlines the rest
            class_no_permit_free(workload);
        }
    }

    /// A call that held its permit for `held` is about to release it.
    void finishing(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds held,
                   int workload = -1) noexcept {
        if (m_adaptive) {
            m_adaptive->finished(held);
            update_limit(now);
        }
        if (workload >= 0) [[unlikely]] {
            class_finishing(now, held, workload);
        }
    }

    /// A call's wait for a permit ended after `how_long` (with a permit or
    /// without): an adaptive limit weighs it when it judges a step up.
    void waited(std::chrono::nanoseconds how_long, int workload) noexcept {
        if (m_adaptive) {
            m_adaptive->waited(how_long);
        }
        if (workload >= 0) [[unlikely]] {
            if (adaptive_gate* adapting = class_adaptive(workload)) {
                adapting->waited(how_long);
            }
        }
    }

    /// A call failed in a way that bears on the database's load.
    void overloaded(overload_kind kind, int workload = -1) noexcept {
        if (m_adaptive) {
            m_adaptive->overloaded(kind);
        }
        if (adaptive_gate* adapting = class_adaptive(workload)) {
            adapting->overloaded(kind);
        }
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

private:
    /// no_permit_free() for a class's adaptive ceiling.
    void class_no_permit_free(int workload) noexcept {
        if (adaptive_gate* adapting = class_adaptive(workload)) {
            adapting->limited();
            update_class_limit(*adapting, workload, std::chrono::steady_clock::now());
        }
    }

    /// finishing() for a class's adaptive ceiling.
    void class_finishing(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds held,
                         int workload) noexcept {
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

    void update_class_limit(adaptive_gate& adapting, int workload, std::chrono::steady_clock::time_point now) noexcept {
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

    void update_limit(std::chrono::steady_clock::time_point now) noexcept {
        if (m_classes) {
            class_permits permits{*m_classes, m_adaptive->limit()};
            m_adaptive->maybe_update(now, permits);
        } else {
            m_adaptive->maybe_update(now, m_running);
        }
    }

    static int checked_concurrent(int concurrent, int extra_slots) {
        if (concurrent < 1) {
            throw std::invalid_argument("bulkhead::db_bulkhead: concurrent (B) must be at least 1");
        }
        if (extra_slots < 0) {
            throw std::invalid_argument("bulkhead::db_bulkhead: extra_slots (Q) must not be negative");
        }
        if (extra_slots > std::numeric_limits<int>::max() - concurrent) {
            throw std::overflow_error("bulkhead::db_bulkhead: concurrent + extra_slots (B + Q) overflows int");
        }
        return concurrent;
    }
};

}  // namespace detail

/// One execution permit and one admission slot of a gate, held until
/// destroyed or released. From db_bulkhead::enter(), for callers that run
/// their own transaction manager inside the admitted scope.
/// \note Move-only. It may move to, and be released on, another thread:
/// the entering thread is then no longer counted as inside the gate
/// (detail/held_gates.hpp says how), and the releasing thread's own
/// standing is untouched.
class [[nodiscard]] permit {
public:
    /// An empty permit, holding nothing.
    permit() noexcept = default;

    permit(permit&& other) noexcept
        : m_core(std::exchange(other.m_core, nullptr)),
          m_record(std::exchange(other.m_record, nullptr)),
          m_serial(std::exchange(other.m_serial, 0)),
          m_workload(other.m_workload) {}

    /// Gives back what this permit held, then takes over `other`'s.
    permit& operator=(permit&& other) noexcept {
        if (this != &other) {
            release();
            m_core = std::exchange(other.m_core, nullptr);
            m_record = std::exchange(other.m_record, nullptr);
            m_serial = std::exchange(other.m_serial, 0);
            m_workload = other.m_workload;
        }
        return *this;
    }

    permit(const permit&) = delete;
    permit& operator=(const permit&) = delete;

    ~permit() { release(); }

    /// Returns the execution permit and the admission slot. Idempotent.
    void release() noexcept {
        if (detail::gate_core* core = std::exchange(m_core, nullptr)) {
            if (detail::held_gates* record = std::exchange(m_record, nullptr)) {
                if (record == &detail::this_thread_gates) {
                    record->remove(m_serial);
                } else {
                    core->m_remote.note(record, m_serial);  // entered on another thread
                }
            }
            core->leave(m_workload);
        }
    }

    /// True while it holds a permit.
    explicit operator bool() const noexcept { return m_core != nullptr; }

private:
    template <class Pool, class Observer>
    friend class db_bulkhead;

    permit(detail::gate_core& core, detail::held_gates* record, std::uint64_t serial, int workload) noexcept
        : m_core(&core), m_record(serial != 0 ? record : nullptr), m_serial(serial), m_workload(workload) {}

    detail::gate_core* m_core = nullptr;
    detail::held_gates* m_record = nullptr;  // the entering thread's record, when tracked there; only compared
                                             // unless it is the releasing thread's own
    std::uint64_t m_serial = 0;              // the entry in that record
    int m_workload = -1;                     // its class, in a gate with classes
};

static_assert(std::is_nothrow_move_constructible_v<permit> && !std::is_copy_constructible_v<permit>);

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

    /// What the callback receives: `*transaction`.
    using work_arg_t = decltype(*std::declval<typename Pool::transaction&>());

    /// What a callback of type Work returns.
    template <class Work>
    using work_result_t = std::invoke_result_t<Work&, work_arg_t>;

public:
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
    };

    /// Creates a gate with `concurrent` (B) execution permits and
    /// `extra_slots` (Q) further admission slots over `pool`.
    /// \throws std::invalid_argument when B < 1 or Q < 0;
    ///         std::overflow_error when B + Q does not fit an int.
    db_bulkhead(Pool& pool, int concurrent, int extra_slots) : m_pool(&pool), m_core(concurrent, extra_slots) {}

    /// As above, with an observer that receives the gate's events.
    db_bulkhead(Pool& pool, int concurrent, int extra_slots, Observer observer)
        : m_pool(&pool), m_core(concurrent, extra_slots), m_observer(std::move(observer)) {}

    /// A gate whose limit adapts between `adaptive.floor` and B (the
    /// ceiling) to the database's signals; see adaptive_limit.hpp and
    /// docs/adaptive.md. It starts at the floor and doubles while calls
    /// find no permit free and the database keeps up.
    /// \throws as above; std::invalid_argument naming an adaptive setting
    ///         out of range (a floor above B, ...).
    db_bulkhead(Pool& pool, int concurrent, int extra_slots, const adaptive_options& adaptive)
        : m_pool(&pool), m_core(concurrent, extra_slots, &adaptive) {}

    /// As above, with an observer.
    db_bulkhead(Pool& pool, int concurrent, int extra_slots, const adaptive_options& adaptive, Observer observer)
        : m_pool(&pool), m_core(concurrent, extra_slots, &adaptive), m_observer(std::move(observer)) {}

    /// A gate of `concurrent` (B) permits shared by the classes of `plan`
    /// (workload.hpp): reserved permits, ceilings, queues and priorities.
    /// Each class's admission slots (ceiling + queue) replace Q.
    /// \throws std::invalid_argument naming what is wrong in the plan:
    ///         reservations that do not fit inside B show the sum (G10).
    db_bulkhead(Pool& pool, int concurrent, const workload_plan& plan)
        : m_pool(&pool), m_core(concurrent, plan, nullptr) {}

    /// As above, with an observer.
    db_bulkhead(Pool& pool, int concurrent, const workload_plan& plan, Observer observer)
        : m_pool(&pool), m_core(concurrent, plan, nullptr), m_observer(std::move(observer)) {}

    /// As above, with a limit that adapts between `adaptive.floor` (at least
    /// the reserved sum: reservations are never shrunk) and B; the classes
    /// share what the limit leaves beyond their reservations.
    db_bulkhead(Pool& pool, int concurrent, const workload_plan& plan, const adaptive_options& adaptive)
        : m_pool(&pool), m_core(concurrent, plan, &adaptive) {}

    /// As above, with an observer.
    db_bulkhead(Pool& pool, int concurrent, const workload_plan& plan, const adaptive_options& adaptive,
                Observer observer)
        : m_pool(&pool), m_core(concurrent, plan, &adaptive), m_observer(std::move(observer)) {}

    db_bulkhead(const db_bulkhead&) = delete;
    db_bulkhead& operator=(const db_bulkhead&) = delete;

    /// The class named `name`, for options::workload.
    /// \throws std::invalid_argument when the gate has no such class (a
    ///         plain gate has one, named "default").
    [[nodiscard]] workload_id workload(std::string_view name) const {
        const int found = m_core.m_classes ? m_core.m_classes->find(name) : (name == "default" ? 0 : -1);
        if (found < 0) {
            std::string message = "bulkhead::db_bulkhead: no workload class named \"";
            message.append(name.substr(0, 40));
            message += "\"; this gate has:";
            for (const std::string& known : workload_names()) {
                message += ' ';
                message += known;
            }
            throw std::invalid_argument(message);
        }
        return workload_id{found};
    }

    /// The names of the gate's classes, in id order ("default" for a
    /// plain gate).
    [[nodiscard]] std::vector<std::string> workload_names() const {
        std::vector<std::string> names;
        if (!m_core.m_classes) {
            names.emplace_back("default");
            return names;
        }
        for (int c = 0; c < m_core.m_classes->classes(); ++c) {
            names.push_back(m_core.m_classes->config(c).name);
        }
        return names;
    }

    /// True when the gate serves workload classes.
    [[nodiscard]] bool has_workloads() const noexcept { return m_core.m_classes != nullptr; }

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

    /// Same as transaction({.queue_wait = queue_wait}, work).
    template <class Work>
    auto transaction(std::chrono::nanoseconds queue_wait, Work&& work) {
        return transaction(options{.queue_wait = queue_wait}, std::forward<Work>(work));
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
    auto try_transaction(std::chrono::nanoseconds queue_wait, Work&& work) {
        return try_transaction(options{.queue_wait = queue_wait}, std::forward<Work>(work));
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
    [[nodiscard]] int available() const noexcept {
        if (const detail::workload_scheduler* classes = m_core.m_classes.get()) {
            return std::max(limit() - classes->total().running, 0);
        }
        return static_cast<int>(m_core.m_running.available());
    }

    /// Free admission slots (of B + Q; with classes, the sum of each
    /// class's ceiling + queue). An observation, like available().
    [[nodiscard]] int available_slots() const noexcept {
        if (const detail::workload_scheduler* classes = m_core.m_classes.get()) {
            int free = 0;
            for (int c = 0; c < classes->classes(); ++c) {
                free += classes->free_slots(c);
            }
            return free;
        }
        return static_cast<int>(m_core.m_slots.available());
    }

    /// Callers queued for an execution permit right now.
    [[nodiscard]] int waiting() const noexcept {
        if (const detail::workload_scheduler* classes = m_core.m_classes.get()) {
            return classes->total().queued;
        }
        return static_cast<int>(m_core.m_running.waiting());
    }

    /// Calls holding an execution permit right now (an observation). It may
    /// exceed limit() for a while after an adaptive limit shrank.
    [[nodiscard]] int running() const noexcept {
        if (const detail::workload_scheduler* classes = m_core.m_classes.get()) {
            return classes->total().running;
        }
        return std::max(limit() - static_cast<int>(m_core.m_running.balance()), 0);
    }

    /// How long a call arriving now would wait for its execution permit, by
    /// the gate's own figures: zero when a permit is free or nothing is
    /// known yet (no transaction has finished); otherwise
    /// (waiting() + 1) x mean permit hold / limit(). A mean, not a bound: it
    /// assumes the calls ahead hold their permits as long as recent ones did.
    [[nodiscard]] std::chrono::nanoseconds expected_queue_wait() const noexcept {
        return available() > 0 ? std::chrono::nanoseconds(0) : queue_wait_estimate(-1);
    }

    /// The same for a call of class `workload`: zero when it could take a
    /// permit now; otherwise (its class's waiters + 1) x the class's mean
    /// permit hold / the permits the class can use (its ceiling, or its
    /// reservation plus the shared permits if fewer). The gate's figures
    /// stand in for a class that has finished nothing yet.
    /// \throws std::logic_error when `workload` is not one of its classes.
    [[nodiscard]] std::chrono::nanoseconds expected_queue_wait(workload_id workload) const {
        const int w = checked_workload(workload);
        if (w < 0) {
            return expected_queue_wait();
        }
        const detail::workload_scheduler& classes = *m_core.m_classes;
        if (classes.of(w).queued == 0 && classes.free_for(w) > 0) {
            return std::chrono::nanoseconds(0);
        }
        return queue_wait_estimate(w);
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
    [[nodiscard]] std::chrono::milliseconds suggested_retry_delay() const noexcept { return retry_delay(-1); }

    /// The same for a call of class `workload`: its class's running and
    /// waiting calls and one more, x the class's mean permit hold, over the
    /// permits the class can use. Rejections of its calls carry this.
    /// \throws std::logic_error when `workload` is not one of its classes.
    [[nodiscard]] std::chrono::milliseconds suggested_retry_delay(workload_id workload) const {
        return retry_delay(checked_workload(workload));
    }

    /// B, as constructed: the most execution permits, and the ceiling of
    /// an adaptive limit.
    [[nodiscard]] int concurrent() const noexcept { return m_core.m_concurrent; }

    /// The execution permits in circulation now: B for a fixed gate, the
    /// current adaptive limit otherwise (in [floor, B]).
    [[nodiscard]] int limit() const noexcept { return m_core.limit(); }

    /// True when the gate's limit adapts.
    [[nodiscard]] bool adaptive() const noexcept { return m_core.m_adaptive != nullptr; }

    /// Q, as constructed.
    [[nodiscard]] int extra_slots() const noexcept { return m_core.m_extra_slots; }

    /// The pool this gate fronts.
    [[nodiscard]] Pool& pool() const noexcept { return *m_pool; }

    /// The observer, for reading what it collected.
    [[nodiscard]] Observer& observer() noexcept { return m_observer; }

    /// A copy of the gate's counters, gauges and latency distributions
    /// (see gate_stats.hpp). Costs a few kilobytes of copying; never blocks
    /// callers.
    [[nodiscard]] gate_stats stats() const {
        gate_stats stats;
        stats.concurrent = concurrent();
        stats.extra_slots = extra_slots();
        stats.available = available();
        stats.available_slots = available_slots();
        stats.limit = limit();
        stats.running = running();
        stats.queued = waiting();
        if (const detail::adaptive_gate* adapting = m_core.m_adaptive.get()) {
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
        stats.suggested_retry_delay = suggested_retry_delay();
        if (const detail::workload_scheduler* classes = m_core.m_classes.get()) {
            for (int c = 0; c < classes->classes(); ++c) {
                workload_stats& one = stats.workloads.emplace_back(classes->stats(c));
                one.expected_queue_wait = expected_queue_wait(workload_id{c});
                if (const detail::adaptive_gate* adapting = m_core.class_adaptive(c)) {
                    one.adaptive = true;
                    one.limit_reason = adapting->reason();
                    one.limit_changes = adapting->changes();
                }
            }
        }
        return stats;
    }

private:
    friend struct detail::async_access;

    class call_timer;

    template <class Work>
    static void check_callable(const Work& work) {
        static_assert(std::is_invocable_v<Work&, work_arg_t>,
                      "bulkhead: the callback must be callable with the pool's transaction object");
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

    /// Counts a rejection (for its class too, in a gate with classes) and
    /// tells the observer.
    void count_rejection(reject_reason reason, int workload = -1) noexcept {
        m_metrics.rejected(reason);
        if (workload >= 0) {
            m_core.m_classes->rejected(workload, reason);
        }
        detail::notify_rejected(m_observer, reason);
    }

    using admission_times = detail::admission_times;
    using permit_wait_limit = detail::permit_wait_limit;

    /// The class index of `workload` in this gate: -1 for a plain gate's
    /// one class.
    /// \throws std::logic_error when it is not one of the gate's classes.
    [[nodiscard]] int checked_workload(workload_id workload) const {
        const int classes = m_core.m_classes ? m_core.m_classes->classes() : 1;
        if (workload.index < 0 || workload.index >= classes) {
            throw std::logic_error("bulkhead::db_bulkhead: workload id " + std::to_string(workload.index) +
                                   " is not a class of this gate (it has " + std::to_string(classes) +
                                   "); take ids from gate.workload(name)");
        }
        return m_core.m_classes ? workload.index : -1;
    }

    /// Stage 1 and the checks before it: the queue wait, reentrancy, a stop
    /// or a deadline already there, then one admission slot (of the call's
    /// class, in a gate with classes: `Classed`), tried without blocking.
    /// Returns how long the permit may be waited for, or why the call is
    /// refused (counted; no slot is held then).
    template <bool Classed>
    result<permit_wait_limit> take_slot(const options& call) {
        if (call.queue_wait < call.queue_wait.zero()) {
            throw std::invalid_argument("bulkhead::db_bulkhead: queue_wait must not be negative");
        }
        const int workload = Classed ? checked_workload(call.workload) : -1;
        if constexpr (!Classed) {
            if (call.workload.index != 0) [[unlikely]] {
                (void)checked_workload(call.workload);  // throws
            }
        }
        detail::held_gates& held = detail::this_thread_gates;
        while (const std::uint64_t serial = held.holds(&m_core, call.task)) {
            // Rare: a real reentry, or a permit of ours released elsewhere.
            if (!m_core.m_remote.take(&held, serial)) {
                throw std::logic_error(
                    "bulkhead::db_bulkhead: this caller is already inside this gate (the gate is not reentrant)");
            }
            held.remove(serial);
        }
        if (call.stop.stop_requested()) {
            return refuse_reason(reject_reason::admission_cancelled, workload);
        }
        permit_wait_limit limit{call.queue_wait, false, workload};
        if constexpr (Classed) {
            limit.wait = std::min(limit.wait, m_core.m_classes->config(workload).queue_wait);
        }
        // The deadline is read only when the call carries one: no clock read
        // on the common path.
        if (call.deadline != clock::time_point::max()) {
            const clock::time_point now = clock::now();
            if (call.deadline <= now) {  // compared before subtracting: time_point::min() cannot overflow
                return refuse_reason(reject_reason::deadline_exceeded, workload);
            }
            const auto left = call.deadline - now;
            if (left < limit.wait) {
                limit.wait = std::chrono::duration_cast<std::chrono::nanoseconds>(left);
                limit.deadline_binds = true;
            }
        }
        const bool slot = Classed ? m_core.m_classes->try_take_slot(workload) : m_core.m_slots.try_acquire();
        if (!slot) {
            m_core.no_permit_free(workload);
            return refuse_reason(reject_reason::admission_full, workload);
        }
        return limit;
    }

    /// take_slot() for either kind of gate.
    result<permit_wait_limit> take_any_slot(const options& call) {
        return m_core.m_classes ? take_slot<true>(call) : take_slot<false>(call);
    }

    /// Gives back the admission slot that `limit` was taken with.
    void release_slot(const permit_wait_limit& limit) noexcept {
        if (limit.workload >= 0) {
            m_core.m_classes->release_slot(limit.workload);
        } else {
            m_core.m_slots.release();
        }
    }

    /// Counts a rejection; returns its reason (for result<T>).
    reject_reason refuse_reason(reject_reason reason, int workload = -1) noexcept {
        count_rejection(reason, workload);
        return reason;
    }

    /// A permit wait that ended without a permit: gives the slot back and
    /// says why, counted.
    reject_reason refuse_after_slot(wait_status waited, const permit_wait_limit& limit) noexcept {
        release_slot(limit);
        if (waited == wait_status::timed_out) {
            return refuse_reason(
                limit.deadline_binds ? reject_reason::deadline_exceeded : reject_reason::admission_timeout,
                limit.workload);
        }
        return refuse_reason(reject_reason::admission_cancelled, limit.workload);
    }

    /// `calls` permit holds of the running mean (of class `workload`, when
    /// it has one yet) spread over the permits they can use; zero before
    /// the first transaction finished. Saturates instead of overflowing.
    [[nodiscard]] std::chrono::nanoseconds spread_over_permits(int calls, int workload) const noexcept {
        std::chrono::nanoseconds hold = m_metrics.mean_permit_hold();
        int permits = limit();
        if (workload >= 0) {
            const std::chrono::nanoseconds own = m_core.m_classes->mean_hold(workload);
            hold = own.count() > 0 ? own : hold;
            permits = m_core.m_classes->usable_by(workload);
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
        if (workload >= 0) {
            return spread_over_permits(m_core.m_classes->of(workload).queued + 1, workload);
        }
        return spread_over_permits(waiting() + 1, -1);
    }

    /// suggested_retry_delay() for class `workload` (-1: the whole gate).
    [[nodiscard]] std::chrono::milliseconds retry_delay(int workload) const noexcept {
        int inside = 0;
        if (workload >= 0) {
            const detail::workload_scheduler::figures now = m_core.m_classes->of(workload);
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

    /// For a call that found no permit free: true when its deadline, the
    /// bound of its wait, leaves less time than the expected queue wait plus
    /// what a committed call holds its permit for, so that it would wait,
    /// or start work, only to fail (and the caller opted in).
    [[nodiscard]] bool deadline_unreachable(const options& call, const permit_wait_limit& limit) const noexcept {
        if (!call.reject_unreachable_deadline || !limit.deadline_binds) {
            return false;
        }
        const std::chrono::nanoseconds wait = queue_wait_estimate(limit.workload);
        return wait.count() > 0 && wait + work_estimate(limit.workload) > limit.wait;
    }

    /// How long a call of class `workload` (-1: the gate) holds its permit
    /// when it commits: the class's mean once it has one, else the gate's.
    [[nodiscard]] std::chrono::nanoseconds work_estimate(int workload) const noexcept {
        if (workload >= 0) {
            const std::chrono::nanoseconds own = m_core.m_classes->mean_committed_hold(workload);
            if (own.count() > 0) {
                return own;
            }
        }
        return m_metrics.mean_committed_hold();
    }

    /// Refuses such a call: the slot goes back, deadline_exceeded, counted
    /// as a rejection and as an early one.
    reject_reason refuse_unreachable_deadline(const permit_wait_limit& limit) noexcept {
        m_metrics.deadline_rejected_early();
        return refuse_after_slot(wait_status::timed_out, limit);
    }

    /// Records a permit wait (for its class too).
    void record_permit_wait(const permit_wait_limit& limit, std::chrono::nanoseconds waited) noexcept {
        m_metrics.permit_wait.record(waited);
        if (limit.workload >= 0) {
            m_core.m_classes->permit_wait(limit.workload).record(waited);
        }
        m_core.waited(waited, limit.workload);
    }

    /// Both admission stages. Returns a permit or why there is none. With
    /// `times` (the transaction path) the admission and permit times are read
    /// and the permit wait recorded (zero when there was none). enter()
    /// passes none: its calls are counted but not timed, and it reads the
    /// clock only for a deadline.
    result<permit> admit(const options& call, admission_times* times = nullptr) {
        return m_core.m_classes ? admit_in<true>(call, times) : admit_in<false>(call, times);
    }

    template <bool Classed>
    result<permit> admit_in(const options& call, admission_times* times) {
        result<permit_wait_limit> slot = take_slot<Classed>(call);
        if (!slot) {
            return slot.error();
        }
        if (times != nullptr) {
            // After admission: a rejection reads no clock.
            times->admitted = times->permitted = clock::now();
        }
        const int workload = Classed ? slot->workload : -1;  // a constant for the plain gate
        if (Classed ? m_core.m_classes->try_acquire(workload) : m_core.m_running.try_acquire()) {
            if (times != nullptr) {
                m_metrics.permit_wait.record(0U);
                if constexpr (Classed) {
                    m_core.m_classes->permit_wait(workload).record(0U);
                }
            }
        } else {
            m_core.no_permit_free(workload);
            if (deadline_unreachable(call, *slot)) {
                return refuse_unreachable_deadline(*slot);
            }
            const wait_status waited = Classed ? m_core.m_classes->try_acquire_for(workload, slot->wait, call.stop)
                                               : m_core.m_running.try_acquire_for(slot->wait, call.stop);
            if (times != nullptr) {
                times->permitted = clock::now();
                record_permit_wait(*slot, times->permitted - times->admitted);
            }
            if (waited != wait_status::acquired) {
                return refuse_after_slot(waited, *slot);
            }
        }
        return admitted(call, workload);
    }

    /// Counts an admission and makes the permit, recorded as this thread's.
    permit admitted(const options& call, int workload) noexcept {
        m_metrics.admitted();
        if (workload >= 0) {
            m_core.m_classes->admitted(workload);
        }
        detail::held_gates& held = detail::this_thread_gates;
        return permit(m_core, &held, held.add(&m_core, call.task), workload);
    }

    /// admit(), with a refusal thrown as its rejected exception, carrying
    /// the suggested retry delay (of the call's class).
    permit admit_or_throw(const options& call, admission_times* times = nullptr) {
        result<permit> held = admit(call, times);
        if (!held) {
            throw_rejection(held.error(), retry_delay(class_of(call)));
        }
        return std::move(*held);
    }

    /// The class index of a call already admitted (-1 for a plain gate).
    [[nodiscard]] int class_of(const options& call) const noexcept {
        return m_core.m_classes ? call.workload.index : -1;
    }

    /// For an asynchronous front end: stages 3 and 4 on this thread for a
    /// call whose slot and permit were taken elsewhere (by the caller's
    /// thread, or granted by a release). The permit is recorded as this
    /// thread's, so the callback cannot reenter the gate, and is released
    /// after everything here has unwound, as for transaction().
    template <class Work>
    work_result_t<Work> run_adopted(const options& call, Work&& work, const admission_times& times, bool* started) {
        permit adopted = admitted(call, class_of(call));
        return run(adopted, call, std::forward<Work>(work), times, started);
    }

    /// Stages 3 and 4 for a call that holds `held`. The permit is released
    /// by the caller's frame, after every local here has been destroyed.
    template <class Work>
    work_result_t<Work> run(permit& held, const options& call, Work&& work, const admission_times& times,
                            bool* started = nullptr) {
        (void)held;
        // Seen after the permit was granted, but before the pool is touched:
        // still "the work never started".
        if (call.stop.stop_requested()) {
            throw_refusal(reject_reason::admission_cancelled, call);
        }
        if (call.deadline != clock::time_point::max() && call.deadline <= times.permitted) {
            throw_refusal(reject_reason::deadline_exceeded, call);
        }
        // Declared before the lease, so it is destroyed after it: it records
        // how long the connection was held, and the whole call.
        call_timer timer(m_metrics, m_core, times, class_of(call));
        typename Pool::lease lease = acquire_lease(call);
        timer.connection_acquired();
        m_metrics.pool_wait.record(timer.leased_at() - times.permitted);
        // A stop during the pool wait (seen here when the pool cannot end
        // that wait itself): nothing has been sent, the lease goes back.
        if (call.stop.stop_requested()) {
            throw_refusal(reject_reason::admission_cancelled, call);
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
            transaction_guard<Pool> guard = begin_transaction(lease, settings, call);
            began = true;
            if (started != nullptr) {
                *started = true;
            }
            cancel_if_stopped(call);  // a stop that came while BEGIN ran: the callback does not start
            if constexpr (std::is_void_v<work_result_t<Work>>) {
                run_callback(lease, guard, call, std::forward<Work>(work));
                cancel_if_stopped(call);
                refuse_commit_past_deadline(call);
                guard.commit();
                timer.committed();
                m_metrics.completed();
            } else {
                work_result_t<Work> value = run_callback(lease, guard, call, std::forward<Work>(work));
                cancel_if_stopped(call);
                refuse_commit_past_deadline(call);
                guard.commit();
                timer.committed();
                m_metrics.completed();
                return value;
            }
        } catch (rejected& rejection) {
            if (!began) {
                // The pool's own rejection before anything began (BEGIN saw the deadline pass).
                detail::suggest_retry(rejection, retry_delay(class_of(call)));
            }
            count_failure(began, class_of(call));
            throw;
        } catch (...) {
            count_failure(began, class_of(call));
            throw;
        }
    }

    /// Stage 4's BEGIN. While it runs, a stop request asks the pool to cancel
    /// it on the server, as for the callback's statements (a pool's BEGIN
    /// may carry the caller's first statement: pqxx_pool's first_statement);
    /// a BEGIN that fails once a stop was requested is work_cancelled.
    transaction_guard<Pool> begin_transaction(typename Pool::lease& lease, const transaction_options& settings,
                                              const options& call) {
        if constexpr (pool_cancels_work<Pool>) {
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

    /// Inside a catch handler: counts how a call that reached the pool ended.
    /// A rejection before BEGIN (the deadline) is a rejection, not a failure.
    void count_failure(bool began, int workload) noexcept {
        try {
            throw;
        } catch (const rejected& rejection) {
            if (!began) {
                count_rejection(rejection.reason(), workload);
                return;
            }
            m_metrics.failed();
        } catch (const work_cancelled&) {
            m_metrics.failed();
            m_metrics.work_cancelled();
        } catch (const work_deadline_exceeded&) {
            m_metrics.failed();
            m_metrics.work_deadline_exceeded();
            m_core.overloaded(overload_kind::timeout, workload);
        } catch (const commit_unknown&) {
            m_metrics.failed();
            m_metrics.commit_unknown();
        } catch (...) {
            m_metrics.failed();
            note_overload(workload);
        }
    }

    /// Inside a catch handler, for an adaptive gate: what the pool says the
    /// failure means for the database's load.
    void note_overload(int workload) noexcept {
        if constexpr (pool_classifies_overload<Pool>) {
            if (m_core.m_adaptive || m_core.class_adaptive(workload) != nullptr) {
                m_core.overloaded(m_pool->classify_overload(std::current_exception()), workload);
            }
        }
    }

    /// Records the connection hold time and the whole call's duration when
    /// the call's connection has gone back to the pool.
    class call_timer {
    public:
        call_timer(detail::gate_metrics& metrics, detail::gate_core& core, const admission_times& times,
                   int workload) noexcept
            : m_metrics(metrics),
              m_core(core),
              m_start(times.admitted),
              m_permitted(times.permitted),
              m_workload(workload) {}
        call_timer(const call_timer&) = delete;
        call_timer& operator=(const call_timer&) = delete;
        ~call_timer() {
            const clock::time_point now = clock::now();
            if (m_leased) {
                m_metrics.connection_hold.record(now - m_leased_at);
            }
            m_metrics.call.record(now - m_start);
            m_metrics.permit_held(now - m_permitted);
            if (m_committed) {
                m_metrics.committed_hold(now - m_permitted);
            }
            if (m_workload >= 0) {
                m_core.m_classes->held(m_workload, now - m_permitted);
                if (m_committed) {
                    m_core.m_classes->committed(m_workload, now - m_permitted);
                }
            }
            m_core.finishing(now, now - m_permitted, m_workload);
        }
        void connection_acquired() noexcept {
            m_leased_at = clock::now();
            m_leased = true;
        }
        [[nodiscard]] clock::time_point leased_at() const noexcept { return m_leased_at; }
        /// The transaction committed: its hold counts as what a call needs.
        void committed() noexcept { m_committed = true; }

    private:
        detail::gate_metrics& m_metrics;
        detail::gate_core& m_core;
        clock::time_point m_start;
        clock::time_point m_permitted;
        clock::time_point m_leased_at{};
        int m_workload;  // the call's class, -1 in a plain gate
        bool m_leased = false;
        bool m_committed = false;
    };

    /// Runs the callback. While it runs, a stop request asks the pool to
    /// cancel the statement in progress on the server (when the pool can);
    /// the permits stay with this thread until everything has unwound.
    template <class Work>
    work_result_t<Work> run_callback(typename Pool::lease& lease, transaction_guard<Pool>& guard, const options& call,
                                     Work&& work) {
        struct work_timer {
            log_linear_histogram& histogram;
            clock::time_point began = clock::now();
            ~work_timer() { histogram.record(clock::now() - began); }
        } timed{m_metrics.work};
        try {
            if constexpr (pool_cancels_work<Pool>) {
                // Deregistered (waiting for a cancel in flight) before the
                // transaction is committed or rolled back.
                const std::stop_callback cancel_on_stop(call.stop,
                                                        [this, &lease]() noexcept { m_pool->cancel(lease); });
                return std::invoke(std::forward<Work>(work), guard.work());
            } else {
                return std::invoke(std::forward<Work>(work), guard.work());
            }
        } catch (...) {
            explain_failure(guard, call);
            throw;
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
            if constexpr (pool_acquires_with_stop<Pool>) {
                return m_pool->acquire(deadline, call.stop);
            } else {
                return m_pool->acquire(deadline);
            }
        } catch (pool_timeout& timeout) {
            if (deadline != clock::time_point::max() && clock::now() >= deadline) {
                throw_refusal(reject_reason::deadline_exceeded, call);
            }
            count_rejection(reject_reason::pool_timeout, class_of(call));
            m_core.overloaded(overload_kind::timeout, class_of(call));
            detail::suggest_retry(timeout, retry_delay(class_of(call)));
            throw;
        } catch (rejected& rejection) {
            count_rejection(rejection.reason(), class_of(call));
            detail::suggest_retry(rejection, retry_delay(class_of(call)));
            throw;
        } catch (...) {
            m_metrics.failed();  // the pool failed otherwise: still one counted outcome
            note_overload(class_of(call));
            throw;
        }
    }

    [[noreturn]] void throw_refusal(reject_reason reason, const options& call) {
        count_rejection(reason, class_of(call));
        throw_rejection(reason, retry_delay(class_of(call)));
    }

    rollback_failure_hook rollback_hook() noexcept {
        return {this, [](void* self, std::exception_ptr failure) noexcept {
                    auto& gate = *static_cast<db_bulkhead*>(self);
                    gate.m_metrics.rollback_failed();
                    detail::notify_rollback_failed(gate.m_observer, std::move(failure));
                }};
    }

    Pool* m_pool;
    detail::gate_core m_core;
    detail::gate_metrics m_metrics;
    [[no_unique_address]] Observer m_observer;
};

}  // namespace bulkhead
