// bulkhead: what a pool must provide to sit behind a gate.
//
// db_bulkhead<Pool> needs a pool that hands out move-only leases, begins,
// commits and rolls back transactions on them, and can discard a broken
// connection (transactional_pool). The optional concepts below let a pool
// take part in more of the gate's promises: call deadlines, cancellation of
// work in progress, a stop during the pool wait, and telling the adaptive
// limit which failures mean overload. pqxx_pool fits all of them;
// docs/design.md has the whole list with what each one buys.
#pragma once

#include <bulkhead/adaptive_limit.hpp>
#include <bulkhead/call_site.hpp>
#include <bulkhead/health.hpp>

#include <chrono>
#include <concepts>
#include <exception>
#include <stop_token>
#include <string_view>

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

/// `pool.health()`: what the pool knows of its server without asking it
/// (health.hpp); db_bulkhead::health() includes it.
template <class Pool>
concept pool_reports_health = requires(const Pool& pool) {
    { pool.health() } -> std::same_as<pool_health>;
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

/// `pool.acquire(deadline, stop, site)`: as above, recording where the call
/// was made (call_site.hpp) for the pool's leak reports.
template <class Pool>
concept pool_acquires_at = requires(Pool& pool, std::chrono::steady_clock::time_point deadline,
                                    const std::stop_token& stop, const call_site& site) {
    { pool.acquire(deadline, stop, site) } -> std::same_as<typename Pool::lease>;
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

/// `Pool::deferred_transaction`, `pool.begin_deferred(lease, options)` and
/// `pool.deferred(tx, options)`: a transaction whose BEGIN waits for the
/// callback's first statement and travels with it. The gate uses them for a
/// callback that takes `Pool::deferred_transaction&` (and not `*tx`):
/// begin_deferred() instead of begin(), then the callback gets
/// `pool.deferred(tx, options)`; commit and rollback as for any transaction.
template <class Pool>
concept pool_defers_begin = requires(Pool& pool, typename Pool::lease& lease, typename Pool::transaction& tx,
                                     const typename Pool::transaction_options& options) {
    typename Pool::deferred_transaction;
    { pool.begin_deferred(lease, options) } -> std::same_as<typename Pool::transaction>;
    { pool.deferred(tx, options) } -> std::same_as<typename Pool::deferred_transaction>;
};

/// `tx.exec_with_commit(sql, params...)` on a `Pool::deferred_transaction`:
/// the statement waits for COMMIT and travels with BEGIN and COMMIT, so that a
/// one-statement transaction costs one round trip; what it returns, returned
/// by the callback, holds the statement's result once the gate committed.
/// db_bulkhead::execute() needs it.
template <class Pool>
concept pool_commits_statements = pool_defers_begin<Pool> && requires(typename Pool::deferred_transaction& tx) {
    tx.exec_with_commit(std::string_view{});
};

namespace detail {
/// `Pool::deferred_transaction&` for a pool_defers_begin, else void.
template <class Pool>
struct deferred_arg {
    using type = void;
};
template <class Pool>
requires pool_defers_begin<Pool>
struct deferred_arg<Pool> {
    using type = typename Pool::deferred_transaction&;
};

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

}  // namespace bulkhead
