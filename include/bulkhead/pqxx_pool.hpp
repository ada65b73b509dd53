// bulkhead: a thread-safe pool of libpqxx connections, ready for the gate.
//
// pqxx_pool lends out pqxx::connection objects through move-only leases and
// runs the gate's transactions on them; it satisfies bulkhead::transactional_pool,
// so `db_bulkhead<pqxx_pool>` works as is. This header is what users include;
// it and its parts under bulkhead/pqxx/ are the only headers of the library
// that include libpqxx (and libpq's libpq-fe.h: link libpq, as the CMake
// target bulkhead::pqxx does). The parts, each with its own guarantees:
//   pqxx/conninfo.hpp          connection strings and redaction (no libpq)
//   pqxx/options.hpp           pqxx_pool_options and their validation
//   pqxx/pool_config.hpp       pqxx_pool_options from text or the environment
//   pqxx/connection_budget.hpp the fleet's connection budget, read from the server
//   pqxx/compat.hpp            every libpqxx 6 / 7 difference
//   pqxx/protocol.hpp          the transaction protocol on libpq's PGconn*
//   pqxx/transaction.hpp       the gate's transaction on a libpqxx connection
//   pqxx/pooled_connection.hpp one pooled connection
//   pqxx/pool_core.hpp         the state shared by the pool and its leases
//
// Guarantees.
// - Never more than max_size connections are open or being opened, also when
//   many threads ask at once: a thread reserves a slot under the mutex and
//   opens the connection outside it, so opening never holds up callers that
//   could take an idle connection. A failed attempt gives its slot back.
// - acquire() waits at most connection_timeout, and never past the caller's
//   deadline; then it throws bulkhead::pool_timeout, whose message carries the
//   last connection error (if one happened during the wait) with every
//   password removed.
// - A connection that is broken, discarded, retired, or that may still be
//   inside a transaction is closed, never handed out again.
// - A stop (cancel()) ends the transaction on the lease within deadline_slack
//   even when its cancel request is never answered: the watchdog then cuts
//   the connection off, and it is discarded (pqxx/watchdog.hpp).
//
// Fairness. Waiting callers are served in arrival order: a returned connection
// is handed directly to the oldest waiter, and a newcomer never takes an idle
// connection or a free slot while anyone waits. One exception, on purpose: a
// caller whose connection attempt failed goes back to the front of the line,
// not the back, since it was first. Callers that find an idle connection do
// not wait at all.
//
// Validation and retirement, inside acquire() and when a lease is returned:
// - on borrow, a connection idle for longer than validate_after_idle is
//   checked with one round trip bounded by validation_timeout; a dead one is
//   closed and replaced without the caller seeing an error;
// - on borrow and on return, a connection older than its max_lifetime (less
//   up to 2.5 % of jitter) is closed;
// - on borrow and on return, idle connections idle for longer than
//   idle_timeout are closed, as long as more than min_idle stay open;
// - min_idle connections are opened by the constructor, best effort.
// Housekeeping: with keepalive_time set or min_idle above zero, one thread
// per pool (started by the constructor, joined by the destructor) wakes
// every quarter of keepalive_time (at most every second): it closes idle
// connections the server has closed and those past their lifetime, pings
// those idle for keepalive_time (taken out of the idle list first, so never
// one in use), and opens connections until min_idle are open, within the
// back-off after a failed attempt. A thread of its own, not a timer of the
// caller's: the pool has no event loop to borrow, and the work blocks on the
// network (a ping, a connect) for up to validation_timeout or
// connection_timeout. Without either option there is no such thread.
//
// What a returned connection is checked for: a discard() mark; a broken
// connection (`!is_open()`); a gate transaction that was begun and not ended
// by a successful commit or rollback; and, only for leases whose connection()
// was used directly, whether the session is still inside a transaction block
// (a raw "BEGIN", or a failed transaction) or busy. That last check reads
// libpq's transaction status (PQtransactionStatus, libpq's record of the
// server's last answer: no round trip); libpqxx 6 hides the PGconn* it needs,
// which pqxx/compat.hpp reaches through largeobject's protected
// raw_connection, once per connection when it is opened. Only when that
// handle could not be read does the check cost one round trip (bounded by
// validation_timeout). Transaction-control SQL sent through the gate's
// transaction object itself (tx.exec("COMMIT")) is not detected.
//
// Commit. COMMIT of a transaction in which a statement failed rolls back and
// reports success; the pool reads PQtransactionStatus first and, in that state
// (PQTRANS_INERROR), sends nothing and throws pqxx::sql_error with SQLSTATE
// 25P02. Otherwise it sends a plain COMMIT.
//
// Lifetime. The pool's state is shared with its leases: destroying the pool
// while leases are out is safe; each such lease keeps working, and closes its
// connection when it is returned. Destroying the pool while a thread waits
// in acquire() ends the process with a message; calling a member of a
// destroyed pool is undefined behaviour (as for any object). close(deadline)
// drains it first. A gate transaction must end before its lease
// is returned (the gate's transaction_guard does this).
//
// Thread safety. All pool members may be called concurrently. Everything a
// thread did with a connection before returning it happens-before everything
// the next borrower does with it: the hand-over goes through m_mutex (into the
// idle list or into the waiter's node under the mutex, out of it under the
// mutex). A lease and the connection in it belong to one thread at a time, as
// libpqxx requires; the pool touches a leased connection only in the calls
// that are given that lease. Observers read counters that are written under
// the mutex; they are snapshots, stale as soon as they return.
#pragma once

#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/detail/clock.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/pool_stats.hpp>
#include <bulkhead/pqxx/connection_budget.hpp>
#include <bulkhead/pqxx/conninfo.hpp>
#include <bulkhead/pqxx/options.hpp>
#include <bulkhead/pqxx/pool_config.hpp>
#include <bulkhead/pqxx/pool_core.hpp>
#include <bulkhead/pqxx/protocol.hpp>
#include <bulkhead/pqxx/statement_result.hpp>
#include <bulkhead/pqxx/transaction.hpp>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <atomic>
#include <chrono>
#include <climits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace bulkhead {

class pqxx_transaction;

/// A thread-safe pool of pqxx::connection, and a bulkhead::transactional_pool
/// for db_bulkhead. See the file comment for guarantees, fairness, the
/// validation and retirement policy, and lifetime.
class pqxx_pool {
public:
    using clock = std::chrono::steady_clock;

    /// Settings of one gate transaction (db_bulkhead's `options::transaction`).
    using transaction_options = pqxx_transaction_options;

    /// The gate's transaction handle; `*tx` is what the callback receives,
    /// usable as a pqxx::dbtransaction&.
    using transaction = std::unique_ptr<detail::gate_transaction>;

    /// What a callback that takes `bulkhead::pqxx_transaction&` receives: the
    /// transaction with BEGIN sent with its first statement.
    using deferred_transaction = pqxx_transaction;

    /// One borrowed connection. Returns it to the pool when destroyed.
    /// \note Move-only; used by one thread at a time. Any pqxx transaction
    /// object opened on its connection must be gone before it is returned.
    class [[nodiscard]] lease {
    public:
        /// An empty lease, holding nothing.
        lease() noexcept = default;

        /// Takes over `other`'s connection. Not while cancel() may run on
        /// `other` (nor on this lease, for the assignment below).
        lease(lease&& other) noexcept : m_core(std::move(other.m_core)), m_connection(std::move(other.m_connection)) {}

        /// Returns what this lease held, then takes over `other`'s connection.
        lease& operator=(lease&& other) noexcept {
            if (this != &other) {
                release();
                m_core = std::move(other.m_core);
                m_connection = std::move(other.m_connection);
            }
            return *this;
        }

        lease(const lease&) = delete;
        lease& operator=(const lease&) = delete;

        ~lease() { release(); }

        /// Returns the connection to the pool (or closes it: see the file
        /// comment for what is checked). Idempotent.
        /// \note If connection() was used, the session is checked through
        /// libpq's transaction status, without a round trip; only when the
        /// pool could not read the connection's libpq handle with one round
        /// trip (bounded by validation_timeout).
        void release() noexcept {
            if (m_connection) {
                std::shared_ptr<detail::pool_core> core = std::move(m_core);
                end_stop_cut(*core, *m_connection);
                core->give_back(std::move(m_connection));
            }
            m_core.reset();
        }

        /// True while it holds a connection.
        explicit operator bool() const noexcept { return m_connection != nullptr; }

        /// The connection itself, for work outside the gate. Using it makes
        /// the pool check the session when the lease is returned.
        /// \throws std::logic_error on an empty lease.
        [[nodiscard]] pqxx::connection& connection() {
            if (!m_connection) {
                throw std::logic_error("bulkhead::pqxx_pool::lease: the lease is empty");
            }
            m_connection->raw_access = true;
            return *m_connection->connection;
        }

        /// `lease->exec(...)`-style access to connection().
        /// \throws std::logic_error on an empty lease.
        pqxx::connection* operator->() { return &connection(); }

    private:
        friend class pqxx_pool;

        lease(std::shared_ptr<detail::pool_core> core, std::unique_ptr<detail::pooled_connection> connection) noexcept
            : m_core(std::move(core)), m_connection(std::move(connection)) {}

        /// Before the connection goes back: disarms a cut that a stop armed
        /// (cancel()) and that the transaction's end did not (a stop with no
        /// transaction running, or one racing the transaction's end); a
        /// connection cut off is discarded. The watchdog never touches a
        /// connection in the pool. Nothing, and no lock, when no stop came.
        static void end_stop_cut(detail::pool_core& core, detail::pooled_connection& connection) noexcept {
            if (!connection.cut_for_stop.load(std::memory_order_acquire)) {
                return;
            }
            core.watchdog().disarm(connection.watch_socket);
            // relaxed: no cancel() runs now, and the next borrower gets the
            // connection through the pool's mutex.
            connection.cut_for_stop.store(false, std::memory_order_relaxed);
            if (connection.cut_by_watchdog.load(std::memory_order_acquire)) {
                connection.discard = true;
            }
        }

        std::shared_ptr<detail::pool_core> m_core;                // keeps the pool's state alive
        std::unique_ptr<detail::pooled_connection> m_connection;  // null when empty
        // cancel() from another thread against begin()'s retry, which swaps
        // the connection: cancel() counts itself in m_cancelling, then reads
        // m_connection only while m_swapping is false; the retry sets
        // m_swapping, then waits for m_cancelling to reach 0 before it
        // touches m_connection (sequentially consistent, both sides).
        // m_stopped: a cancel() came (for the lease's life: a lease that
        // was stopped never has a BEGIN retried on another connection).
        std::atomic<int> m_cancelling{0};
        std::atomic<bool> m_swapping{false};
        std::atomic<bool> m_stopped{false};
    };

    /// Creates a pool; opens min_idle connections (best effort: a server that
    /// is down does not make construction fail; it stops at the first failed
    /// attempt, which can take up to libpq's connect_timeout).
    /// \throws std::invalid_argument naming the field and its value when an
    ///         option is out of range (max_size < 1, min_idle > max_size,
    ///         connection_timeout or validation_timeout below 250 ms, negative
    ///         durations, empty conninfo), or naming conninfo with libpq's
    ///         complaint (passwords removed) when libpq cannot parse it
    ///         (PQconninfoParse: syntax and keywords; values such as a port
    ///         number are checked when connecting). Nothing is opened then.
    ///         With budget_check = refuse: connection_budget_exceeded when the
    ///         fleet does not fit, connection_budget_unavailable when the
    ///         budget cannot be read (messages without a password); with
    ///         warn, whatever on_budget_warning throws. The check runs before
    ///         anything else is built or opened.
    explicit pqxx_pool(pqxx_pool_options options) : m_core(make_core(std::move(options))) {
        m_core->open_min_idle();
        m_core->start_housekeeping();
    }

    pqxx_pool(const pqxx_pool&) = delete;
    pqxx_pool& operator=(const pqxx_pool&) = delete;

    /// Stops the housekeeping thread (waiting for a ping in flight, at most
    /// validation_timeout), closes the idle connections. Leases still out
    /// stay valid; their connections close when they are returned.
    /// \note No thread may be inside acquire() (or any other member) then:
    /// one found waiting there ends the process with a message saying so.
    ~pqxx_pool() { m_core->shut_down(); }

    /// Drains the pool for a shutdown: from now on acquire() throws
    /// bulkhead::closed, for the threads waiting in it too; then close()
    /// waits until every lease is back or `deadline`, and closes the idle
    /// connections and the housekeeping thread. Leases still out stay
    /// valid, and their connections close when returned. It cancels nothing
    /// itself: close the gate in front first (db_bulkhead::close()), which
    /// stops its calls. close_report::in_flight counts the leases out and
    /// the threads waiting at the start.
    close_report close(clock::time_point deadline) { return m_core->close(deadline); }

    /// A connection, waiting at most connection_timeout.
    /// \throws bulkhead::pool_timeout when none is available in time; its
    ///         message says how long, max_size and how many are in use, and
    ///         the last connection error (password removed), if any.
    /// \note FIFO among waiters; see the file comment.
    /// `site` is where the lease was taken, for leak_threshold's reports:
    /// the line of the call, unless a label is given.
    [[nodiscard]] lease acquire(call_site site = {}) { return acquire(clock::time_point::max(), {}, site); }

    /// A connection, waiting at most connection_timeout and never past
    /// `deadline` (time_point::max(): none). A connection attempt is bounded
    /// by the remaining wait where libpq allows (connect_timeout, whole
    /// seconds, at least 2, added only when the conninfo sets none).
    /// \throws bulkhead::pool_timeout as acquire().
    [[nodiscard]] lease acquire(clock::time_point deadline, call_site site = {}) {
        return acquire(deadline, std::stop_token{}, site);
    }

    /// As acquire(deadline), and a stop request on `stop` ends the wait at
    /// once (also the wait for a connection being opened, which then
    /// finishes on its own and goes to the pool). Everything inside, the
    /// check of an idle connection and the opening of a new one included,
    /// ends by min(deadline, now + connection_timeout).
    /// \throws bulkhead::pool_timeout as acquire(); bulkhead::admission_cancelled
    ///         on a stop request; bulkhead::closed once close() began.
    [[nodiscard]] lease acquire(clock::time_point deadline, const std::stop_token& stop, call_site site = {}) {
        return lease(m_core, m_core->acquire(deadline, stop, site));
    }

    /// Starts a transaction on the leased connection: BEGIN with the options'
    /// isolation level and access mode, and SET LOCAL for their timeouts, in
    /// one round trip. With a deadline, the pool's watchdog cuts the
    /// connection off at the deadline plus deadline_slack if the server has
    /// not answered by then. A BEGIN that fails because the connection broke
    /// (nothing of the caller's work has started) is tried once more on
    /// another connection, which `held` then holds, within the deadline and
    /// connection_timeout; not after a stop (cancel() on this lease), which
    /// may come from another thread meanwhile, even during the swap.
    /// \throws std::logic_error for an empty lease or one of another pool;
    ///         std::invalid_argument for a timeout out of range;
    ///         bulkhead::deadline_exceeded when the deadline left no whole
    ///         millisecond, or when the watchdog cut off a BEGIN that went
    ///         unanswered by the deadline plus the slack (one it cut off for a
    ///         stop, cancel(), is libpqxx's lost connection, never tried
    ///         again); bulkhead::pool_timeout
    ///         when no other connection came for the retry; whatever libpqxx
    ///         throws (the connection is then marked for discard).
    [[nodiscard]] transaction begin(lease& held, const transaction_options& options) {
        (void)leased(held);
        try {
            return begin_on(held, options);
        } catch (const pqxx::broken_connection&) {
            // Not when the deadline has passed (the watchdog may be why), nor
            // after a stop (cancel()): the caller asked for the work to end.
            if ((options.deadline != clock::time_point::max() && clock::now() >= options.deadline) ||
                leased(held).cut_by_watchdog.load(std::memory_order_acquire) || held.m_stopped.load()) {
                throw;
            }
            const call_site site = leased(held).leased_by;  // the replacement is the same caller's
            // No cancel() may read the connection while it is swapped.
            held.m_swapping.store(true);
            while (held.m_cancelling.load() != 0) {
                std::this_thread::yield();  // a cancel() takes microseconds
            }
            if (held.m_stopped.load()) {
                held.m_swapping.store(false);
                throw;
            }
            try {
                held.release();  // closed: begin_on marked it for discard
                held = acquire(options.deadline, site);
            } catch (...) {
                held.m_swapping.store(false);
                throw;
            }
            held.m_swapping.store(false);
            if (held.m_stopped.load()) {
                cancel(held);  // a stop that came while the connection was swapped
            }
            return begin_on(held, options);
        }
    }

    /// begin() without sending BEGIN: the first statement of deferred(tx)
    /// carries it. Never retried on another connection (the statement may
    /// have run when a connection breaks under it).
    /// \throws std::logic_error for an empty lease or one of another pool;
    ///         std::invalid_argument for a timeout out of range.
    [[nodiscard]] transaction begin_deferred(lease& held, const transaction_options& options) {
        (void)leased(held);
        return begin_on(held, options, false);
    }

    /// The callback's view of a transaction from begin_deferred(), begun with
    /// `options`. Defined below, with pqxx_transaction.
    [[nodiscard]] pqxx_transaction deferred(transaction& tx, const transaction_options& options);

    /// Asks the server to cancel the statement running on the leased
    /// connection, from any thread, without waiting: the request is sent on
    /// a thread of its own (libpq's cancel connects to the server), so this
    /// returns in microseconds; the statement then fails with SQLSTATE
    /// 57014. It also arms the pool's watchdog (the deadline's, watchdog.hpp)
    /// at now + deadline_slack, or brings the deadline's cut forward to then:
    /// when the transaction on the lease has not ended by that time (the
    /// cancel was dropped or never answered, by a proxy or a pooler, or the
    /// backend does not react), the connection's socket is shut down, the
    /// statement fails at once with a lost connection, and the connection
    /// is discarded. The transaction's end, or the lease's return, disarms
    /// that cut, so a statement that ends in time keeps its connection. A
    /// connection whose cancel is still on its way when the lease is
    /// returned is closed, never handed to another borrower. Never throws:
    /// a cancel that cannot be sent leaves the work to the cut.
    /// \note Call it while a transaction runs on the lease (the gate's stop
    /// callbacks do), never while the lease is being returned or moved: its
    /// cut lasts until the transaction ends, and without one until the lease
    /// is returned, so it hits a transaction begun on the lease meanwhile.
    void cancel(lease& held) noexcept {
        held.m_cancelling.fetch_add(1);
        held.m_stopped.store(true);
        if (!held.m_swapping.load() && held.m_connection) {
            cancel_connection(*held.m_connection);
        }
        held.m_cancelling.fetch_sub(1);
    }

    /// True when a statement of the callback ended the transaction block
    /// itself (COMMIT, ROLLBACK, ...): the connection has stopped sending and
    /// will be discarded; the gate reports the call as misuse.
    [[nodiscard]] bool transaction_block_ended(transaction& tx) noexcept {
        return tx && tx->control().ended_by_callback();
    }

    /// Inside a catch handler for the callback's failure: true when the
    /// call's deadline caused it: the watchdog cut the connection off, or the
    /// server cut a statement short (57014) under the statement_timeout, or a
    /// lock wait (55P03) under the lock_timeout, that came from the deadline,
    /// once the deadline has passed. A 57014 before that (a DBA's
    /// pg_cancel_backend, the callback's own SET LOCAL statement_timeout) is
    /// not the deadline's.
    [[nodiscard]] bool failed_by_deadline(transaction& tx) noexcept {
        if (!tx) {
            return false;
        }
        const detail::transaction_control& control = tx->control();
        return caused_by_deadline(control.cut_by_deadline(), control.timeout_from_deadline,
                                  control.lock_timeout_from_deadline, control.deadline);
    }

    /// What a failure says of the server's load, for an adaptive gate
    /// (adaptive_limit.hpp): SQLSTATE class 53 (53300 too many connections,
    /// 53200 out of memory, 53100 disk full) is `saturated`; 57014 (a
    /// statement timeout or cancel) and 55P03 (a lock timeout) are
    /// `timeout`; 40001 and 40P01 (serialization failure, deadlock) are
    /// `conflict`; anything else, `none`. libpqxx throws 53300 as
    /// pqxx::too_many_connections, a broken_connection without a SQLSTATE:
    /// `saturated` too; and libpqxx 6 throws 40001 and 40P01 as
    /// serialization_failure and deadlock_detected, which are not
    /// sql_errors there (they are in libpqxx 7): known by their types. A server that refuses new connections (53300 at
    /// connect) shows as pool_timeout rejections, which the gate counts as
    /// timeouts itself.
    [[nodiscard]] overload_kind classify_overload(const std::exception_ptr& failure) const noexcept {
        if (!failure) {
            return overload_kind::none;
        }
        try {
            std::rethrow_exception(failure);
        } catch (const pqxx::serialization_failure&) {
            return overload_kind::conflict;
        } catch (const pqxx::deadlock_detected&) {
            return overload_kind::conflict;
        } catch (const pqxx::sql_error& error) {
            const auto& state = error.sqlstate();
            if (state.size() == 5 && state.compare(0, 2, "53") == 0) {
                return overload_kind::saturated;
            }
            if (state == "57014" || state == "55P03") {
                return overload_kind::timeout;
            }
            if (state == "40001" || state == "40P01") {
                return overload_kind::conflict;
            }
        } catch (const pqxx::too_many_connections&) {
            return overload_kind::saturated;
        } catch (...) {
            return overload_kind::none;
        }
        return overload_kind::none;
    }

    /// Commits. A COMMIT that fails on the server leaves nothing committed.
    /// \throws std::logic_error when the callback had called commit() or
    ///         abort() itself (refused: nothing is committed); pqxx::in_doubt_error
    ///         when the connection was lost during COMMIT; pqxx::sql_error from
    ///         the server (a failed COMMIT ends the transaction), or with
    ///         SQLSTATE 25P02 when a statement of the transaction had failed
    ///         and its error was caught (COMMIT is then not sent; rollback()
    ///         ends the transaction).
    void commit(lease& held, transaction& tx) {
        (void)leased(held);
        detail::gate_transaction& gate = checked(tx);
        if (const auto& work = gate.control().at_commit) {
            work->begin = begin_steps_now(gate.control(), work->options);
        }
        detail::transaction_control::commit(gate);
    }

    /// Rolls back. Safe after a commit() that threw; a no-op when the server's
    /// transaction already ended.
    /// \throws whatever ROLLBACK failed with (then discard the lease).
    void rollback(lease& held, transaction& tx) {
        (void)leased(held);
        detail::transaction_control::rollback(checked(tx));
    }

    /// Marks the leased connection untrustworthy: it is closed when the lease
    /// is returned, never handed out again. A no-op for an empty lease.
    void discard(lease& held) noexcept {
        if (held.m_connection) {
            held.m_connection->discard = true;
        }
    }

    /// Connections open or being opened (idle + in use + opening); at most max_size.
    [[nodiscard]] std::size_t size() const noexcept { return m_core->size(); }
    /// Open connections waiting in the pool.
    [[nodiscard]] std::size_t idle() const noexcept { return m_core->idle(); }
    /// Connections in leases.
    [[nodiscard]] std::size_t in_use() const noexcept { return m_core->in_use(); }
    /// Threads waiting in acquire().
    [[nodiscard]] std::size_t waiting() const noexcept { return m_core->waiting(); }
    /// The options, as constructed.
    [[nodiscard]] const pqxx_pool_options& options() const noexcept { return m_core->options(); }
    /// Gauges and counters: connections opened, closed by reason, connection
    /// failures, acquire timeouts.
    [[nodiscard]] pool_stats stats() const noexcept { return m_core->stats(); }

    /// The connection budget now, for this pool's fleet (options().fleet,
    /// its application_prefix defaulting to application_name) and max_size,
    /// read on a connection of its own within connection_timeout; whatever
    /// budget_check says. For a health endpoint or a log line.
    /// 	hrows connection_budget_unavailable as read_connection_budget();
    ///         std::invalid_argument when the fleet plan is out of range.
    /// health() reports from then on whether it fit.
    [[nodiscard]] connection_budget read_budget() const {
        connection_budget budget = read_fleet_budget(m_core->options());
        m_core->note_budget(budget.fits() ? std::string() : excess_message(budget, m_core->options()));
        return budget;
    }

    /// What the pool knows of its server without asking it (health.hpp):
    /// whether it can connect (no connection open and the last attempt
    /// failed: it cannot, with that attempt's error, scrubbed), and whether
    /// the last connection budget it read fit. db_bulkhead::health()
    /// includes it.
    [[nodiscard]] pool_health health() const { return m_core->health(); }

private:
    friend class pqxx_transaction;

    /// Sends the deferred BEGIN of `tx` (begin_deferred() with `options`),
    /// and `first` (a statement, or nothing) after it in the same query;
    /// returns the last statement's result. The timeouts from the deadline
    /// are bounded by what is left of it now.
    /// \throws bulkhead::work_deadline_exceeded when less than a millisecond
    ///         of the deadline is left (nothing is sent; the callback has
    ///         run, so it is no rejection); std::invalid_argument for a NUL
    ///         in `first`; what the query failed with (the transaction is
    ///         then over: rolled back, or its connection marked for discard).
    static pqxx::result send_begin(detail::gate_transaction& tx, const transaction_options& options,
                                   const std::string& first) {
        detail::transaction_control& control = tx.control();
        if (first.find('\0') != std::string::npos) {
            throw std::invalid_argument("bulkhead::pqxx_transaction: a statement must not contain a NUL character");
        }
        control.begin_statement = detail::one_query(begin_steps_now(control, options));
        if (!first.empty()) {
            control.begin_carries_work = true;
            control.begin_statement.append("; ").append(first);
        }
        control.begin_pending = false;
        tx.begin();
        return tx.begin_result();
    }

    /// BEGIN and its SET LOCALs for a deferred BEGIN sent now, the timeouts
    /// from the deadline bounded by what is left of it.
    /// \throws bulkhead::work_deadline_exceeded when less than a millisecond
    ///         is left (the callback has run, so it is no rejection).
    static std::vector<std::string> begin_steps_now(detail::transaction_control& control,
                                                    const transaction_options& options) {
        transaction_options bounded = options;
        if (options.deadline != clock::time_point::max()) {
            try {
                std::tie(control.timeout_from_deadline, control.lock_timeout_from_deadline) =
                    bound_by_deadline(bounded);
            } catch (const deadline_exceeded&) {
                std::throw_with_nested(work_deadline_exceeded());
            }
        }
        return detail::begin_steps(bounded);
    }

    /// cancel()'s work on the leased connection.
    void cancel_connection(detail::pooled_connection& connection) noexcept {
        (void)detail::cancel_request::send(connection.cancel);
        // Before arm(): the lease's thread, seeing the cut, sees why.
        connection.cut_for_stop.store(true, std::memory_order_release);
        try {
            (void)m_core->watchdog().arm(connection.watch_socket,
                                         detail::saturating_add(clock::now(), m_core->options().deadline_slack),
                                         connection.cut_by_watchdog);
        } catch (...) {  // no watchdog thread could be started: the cancel alone stops the work
        }
    }

    /// One attempt of begin() (with `begin_now` false: BEGIN deferred).
    transaction begin_on(lease& held, const transaction_options& options, bool begin_now = true) {
        detail::pooled_connection& connection = leased(held);
        detail::transaction_control control;
        control.owner = &connection;
        control.target = &m_core->target();
        control.read_only = options.read_only;
        control.track_txid = options.resolve_commit_outcome && !options.read_only && detail::pipeline_usable();
        control.deadline = options.deadline;
        const pqxx_pool_options& settings = m_core->options();
        const clock::time_point now = clock::now();
        control.settle_until = detail::saturating_add(now, settings.connection_timeout);
        if (options.deadline == clock::time_point::max()) {
            control.begin_statement = detail::begin_statement(options);
        } else {
            transaction_options bounded = options;
            std::tie(control.timeout_from_deadline, control.lock_timeout_from_deadline) = bound_by_deadline(bounded);
            control.begin_statement = detail::begin_statement(bounded);
            // Past the deadline nothing waits longer than the slack, the
            // lookup of a lost COMMIT's outcome included.
            const clock::time_point cut_at =
                options.deadline + std::chrono::duration_cast<clock::duration>(settings.deadline_slack);
            control.settle_until = std::min(control.settle_until, cut_at);
        }
        // Always set (a pointer): a stop arms the watchdog for calls without
        // a deadline too (cancel()), and the transaction's end disarms it.
        control.watchdog = &m_core->watchdog();
        if (options.deadline != clock::time_point::max()) {
            // Last: nothing but the transaction's construction may throw after it.
            control.watched = control.watchdog->arm(
                connection.watch_socket,
                options.deadline + std::chrono::duration_cast<clock::duration>(settings.deadline_slack),
                connection.cut_by_watchdog);
        }
        control.begin_pending = !begin_now;
        try {
            return std::make_unique<detail::gate_transaction>(*connection.connection, std::move(control), begin_now);
        } catch (const std::bad_alloc&) {
            connection.discard = true;
            m_core->watchdog().disarm(connection.watch_socket);
            throw;
        } catch (...) {
            // The transaction's constructor has marked the connection, and
            // disarmed the watchdog; again here, for a stop that armed it
            // meanwhile (the lease's return disarms it in any case).
            m_core->watchdog().disarm(connection.watch_socket);
            if (connection.cut_by_watchdog.load(std::memory_order_acquire)) {
                connection.discard = true;
            }
            // A BEGIN that the watchdog cut off for the deadline: none of the
            // caller's work ran, so it is refused as a deadline that passes
            // before the work starts, not left as libpqxx's lost connection.
            // One cut off for a stop stays libpqxx's lost connection, which
            // the gate reports as work_cancelled.
            if (options.deadline != clock::time_point::max() &&
                connection.cut_by_watchdog.load(std::memory_order_acquire) &&
                !connection.cut_for_stop.load(std::memory_order_acquire)) {
                std::throw_with_nested(deadline_exceeded(
                    "db deadline exceeded before the work started: BEGIN was not answered by the deadline plus "
                    "deadline_slack, and the connection was cut off"));
            }
            throw;
        }
    }

    /// Inside a catch handler for a failure of a transaction with a
    /// deadline: true when the deadline caused it: the watchdog cut the
    /// connection off (`cut`), or, once the deadline has passed, a
    /// statement_timeout (57014) or lock_timeout (55P03) that came from it.
    static bool caused_by_deadline(bool cut, bool timeout_from_deadline, bool lock_timeout_from_deadline,
                                   clock::time_point deadline) noexcept {
        if (cut) {
            return true;
        }
        // The timeout is set in whole milliseconds, rounded down, from the
        // time left at BEGIN: the server may fire up to that much early.
        if (clock::now() + std::chrono::milliseconds(2) < deadline) {
            return false;
        }
        try {
            throw;
        } catch (const pqxx::sql_error& failure) {
            return (timeout_from_deadline && failure.sqlstate() == "57014") ||
                   (lock_timeout_from_deadline && failure.sqlstate() == "55P03");
        } catch (...) {
            return false;
        }
    }

    detail::pooled_connection& leased(lease& held) const {
        if (!held.m_connection) {
            throw std::logic_error("bulkhead::pqxx_pool: the lease is empty");
        }
        if (held.m_core != m_core) {
            throw std::logic_error("bulkhead::pqxx_pool: the lease belongs to another pool");
        }
        return *held.m_connection;
    }

    static std::shared_ptr<detail::pool_core> make_core(pqxx_pool_options options) {
        detail::check_options(options);  // before anything is built
        std::string excess = check_budget(options);
        auto core = std::make_shared<detail::pool_core>(std::move(options));
        core->note_budget(std::move(excess));
        return core;
    }

    /// The budget for `options`' fleet, read as the pool connects (its
    /// application_name and TCP settings) within connection_timeout.
    static connection_budget read_fleet_budget(const pqxx_pool_options& options) {
        fleet_plan plan = options.fleet;
        if (plan.application_prefix.empty()) {
            plan.application_prefix = options.application_name;
        }
        return read_connection_budget(detail::pool_core::make_target(options).base, options.max_size, plan,
                                      options.connection_timeout);
    }

    /// Why `budget` does not fit, scrubbed: role and application names
    /// come from the server.
    static std::string excess_message(const connection_budget& budget, const pqxx_pool_options& options) {
        return detail::scrub(
            "bulkhead::pqxx_pool: the fleet does not fit the server's connection budget:\n" + budget.explain(),
            detail::budget_secrets(options.conninfo));
    }

    /// The start-up check of budget_check (pqxx_pool_options). Returns
    /// excess_message() when the fleet does not fit and the pool is made
    /// anyway (warn), empty otherwise.
    static std::string check_budget(const pqxx_pool_options& options) {
        if (options.budget_check == budget_check_mode::off) {
            return {};
        }
        const bool refuse = options.budget_check == budget_check_mode::refuse;
        std::optional<connection_budget> budget;
        try {
            budget = read_fleet_budget(options);
        } catch (const connection_budget_unavailable& failure) {
            if (refuse) {
                throw;
            }
            options.on_budget_warning(budget_warning{std::nullopt, failure.what()});
            return {};
        }
        if (budget->fits()) {
            return {};
        }
        std::string message = excess_message(*budget, options);
        if (refuse) {
            throw connection_budget_exceeded(std::move(*budget), message);
        }
        options.on_budget_warning(budget_warning{std::move(budget), message});
        return message;
    }

    /// Shortens the timeouts of `options` to the time left before its
    /// deadline; returns whether statement_timeout and lock_timeout now come
    /// from it.
    /// \throws bulkhead::deadline_exceeded when no whole millisecond is left.
    static std::pair<bool, bool> bound_by_deadline(transaction_options& options) {
        const auto left = std::chrono::floor<std::chrono::milliseconds>(options.deadline - clock::now());
        if (left < std::chrono::milliseconds(1)) {
            throw deadline_exceeded("db deadline passed before the transaction began");
        }
        const auto shorten = [&](std::optional<std::chrono::milliseconds>& timeout) {
            // A deadline further away than the server's largest timeout
            // (INT_MAX ms, about 24.8 days) cannot bind: leave the timeout be.
            if (left.count() > INT_MAX) {
                return false;
            }
            // 0 disables a timeout on the server: the deadline then applies.
            if (!timeout || timeout->count() == 0 || left < *timeout) {
                timeout = left;
                return true;
            }
            return false;
        };
        const bool statement = shorten(options.statement_timeout);
        const bool lock = options.deadline_sets_lock_timeout && shorten(options.lock_timeout);
        return {statement, lock};
    }

    static detail::gate_transaction& checked(transaction& tx) {
        if (!tx) {
            throw std::logic_error("bulkhead::pqxx_pool: no transaction");
        }
        return *tx;
    }

    std::shared_ptr<detail::pool_core> m_core;  // shared with the leases; never null
};

/// The transaction a gate's callback works in when it takes
/// `bulkhead::pqxx_transaction&` instead of `pqxx::dbtransaction&`. BEGIN is
/// not sent before the callback runs. A first statement run with exec()
/// carries it, in the same simple query: a transaction of N statements then
/// makes N + 1 round trips (BEGIN with the first, each other, COMMIT with the
/// session reset), and one that runs none makes none.
///
///     gate.transaction(call, [&](bulkhead::pqxx_transaction& tx) {
///         return tx.exec("SELECT count(*) FROM orders")[0][0].as<long>();
///     });
///
/// - exec(), exec_params() and exec_prepared() are libpqxx's. A simple query
///   carries no parameters, and the pool never writes values into SQL text:
///   a first statement with parameters (exec_params, exec_prepared) is sent
///   after BEGIN, bound as libpqxx binds it, one round trip later.
/// - pqxx() is the pqxx::dbtransaction underneath, for everything else
///   libpqxx offers (streams, COPY, pipelines, quote(), large objects). It
///   sends BEGIN first if no statement has: nothing the callback runs can
///   run outside the transaction.
/// - When the first query fails (BEGIN or the statement), nothing of it is
///   committed; the transaction is over and every later call throws
///   std::logic_error. A callback that catches that error and returns still
///   fails (25P02), as B5 says.
/// - The session's timeouts from the call's deadline are set when BEGIN is
///   sent, from what is left of the deadline then; a deadline already passed
///   then is bulkhead::work_deadline_exceeded (the callback has run).
///
/// Thread safety: as the pqxx::dbtransaction it wraps (the callback's thread).
class pqxx_transaction {
public:
    pqxx_transaction(const pqxx_transaction&) = delete;
    pqxx_transaction& operator=(const pqxx_transaction&) = delete;
    pqxx_transaction(pqxx_transaction&&) noexcept = default;
    pqxx_transaction& operator=(pqxx_transaction&&) noexcept = default;
    ~pqxx_transaction() = default;

    /// Runs `sql` (libpqxx's exec); the first statement carries BEGIN.
    /// \throws what libpqxx throws; std::logic_error once the first query failed.
    pqxx::result exec(std::string_view sql) {
        if (pending()) {
            return begin_with(std::string(sql));
        }
        return m_tx->exec(std::string(sql));
    }

    /// Runs `sql` with parameters $1... (libpqxx's exec_params), bound; as a
    /// first statement after BEGIN, sent alone.
    /// \throws what libpqxx throws; std::logic_error once the first query failed.
    template <class... Args>
    pqxx::result exec_params(std::string_view sql, Args&&... args) {
        return detail::pqxx_compat::exec_params(pqxx(), std::string(sql), std::forward<Args>(args)...);
    }

    /// Runs the prepared statement `name` (libpqxx's exec_prepared); as a
    /// first statement after BEGIN, sent alone.
    /// \throws what libpqxx throws; std::logic_error once the first query failed.
    template <class... Args>
    pqxx::result exec_prepared(const std::string& name, Args&&... args) {
        return detail::pqxx_compat::exec_prepared(pqxx(), name, std::forward<Args>(args)...);
    }

    /// Sends `sql`, with its parameters ($1, ...), together with BEGIN and
    /// COMMIT when the gate commits: the whole transaction in one round trip
    /// (BEGIN, the statement, the id question, COMMIT and the reset in one
    /// write). It must be the transaction's only statement; nothing runs
    /// before the callback returns. Return what this returns from the
    /// callback: the call then returns it, holding the statement's rows once
    /// the transaction committed. Parameters go as text (pqxx::to_string);
    /// nullptr, std::nullopt and an empty std::optional are NULL. A statement
    /// that fails ends the call with its error, nothing committed; a COMMIT
    /// whose connection is lost is settled as any other. COPY ... FROM STDIN
    /// fails on the server, the connection closed after it; the rows of
    /// COPY ... TO STDOUT are dropped. A stop request cancels the statement on the server; the
    /// call's deadline bounds it as it bounds any statement.
    /// \throws std::logic_error when BEGIN was sent already or a statement is
    ///         already waiting for COMMIT, or when libpq is older than 14.5 (no
    ///         usable pipeline mode); std::invalid_argument for a NUL character
    ///         in the statement or a parameter. Nothing is sent then.
    template <class... Args>
    [[nodiscard]] statement_result exec_with_commit(std::string_view sql, Args&&... args) {
        if (!pending()) {
            throw std::logic_error(
                "bulkhead::pqxx_transaction::exec_with_commit: must be the transaction's only statement, and BEGIN "
                "was sent already");
        }
        if (!detail::pipeline_usable()) {
            throw std::logic_error(
                "bulkhead::pqxx_transaction::exec_with_commit: needs libpq 14.5 or later "
                "(pipeline mode); this process has libpq " +
                std::to_string(PQlibVersion()));
        }
        if (sql.find('\0') != std::string_view::npos) {
            throw std::invalid_argument("bulkhead::pqxx_transaction: a statement must not contain a NUL character");
        }
        auto work = std::make_shared<detail::one_trip_statement>();
        work->sql = sql;
        work->parameters.reserve(sizeof...(Args));
        (work->parameters.push_back(detail::parameter_text(args)), ...);
        work->options = m_options;
        m_tx->control().at_commit = work;
        return statement_result(std::move(work));
    }

    /// The libpqxx transaction underneath, BEGIN sent (alone, if no statement
    /// has sent it yet).
    /// \throws what BEGIN failed with; std::logic_error once the first query failed.
    pqxx::dbtransaction& pqxx() {
        if (pending()) {
            (void)begin_with({});
        }
        return *m_tx;
    }

    /// True once BEGIN has been sent.
    [[nodiscard]] bool begun() const noexcept { return !m_tx->control().begin_pending; }

private:
    friend class pqxx_pool;

    pqxx_transaction(detail::gate_transaction& tx, const pqxx_pool::transaction_options& options)
        : m_tx(&tx), m_options(options) {}

    /// True while BEGIN waits for a statement.
    /// \throws std::logic_error when the first query failed.
    [[nodiscard]] bool pending() const {
        const detail::transaction_control& control = m_tx->control();
        if (control.begin_failed) {
            throw std::logic_error(
                "bulkhead::pqxx_transaction: the transaction's first query (BEGIN and its statement) failed; "
                "nothing more runs in it");
        }
        if (control.at_commit) {
            throw std::logic_error(
                "bulkhead::pqxx_transaction: a statement waits to go with COMMIT (exec_with_commit); nothing else "
                "runs in the transaction");
        }
        return control.begin_pending;
    }

    pqxx::result begin_with(const std::string& first) { return pqxx_pool::send_begin(*m_tx, m_options, first); }

    detail::gate_transaction* m_tx;
    pqxx_pool::transaction_options m_options;
};

inline pqxx_transaction pqxx_pool::deferred(transaction& tx, const transaction_options& options) {
    return pqxx_transaction(checked(tx), options);
}

static_assert(transactional_pool<pqxx_pool>);
static_assert(pool_defers_begin<pqxx_pool>);
static_assert(pool_commits_statements<pqxx_pool>);
static_assert(std::is_nothrow_move_constructible_v<pqxx_pool::lease> &&
              !std::is_copy_constructible_v<pqxx_pool::lease>);

}  // namespace bulkhead
