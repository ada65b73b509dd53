// bulkhead: the state a pqxx_pool shares with its leases.
//
// pool_core holds the idle connections, the FIFO of waiting threads and the
// counters; pqxx_pool and every lease hold it by std::shared_ptr. See
// pqxx_pool.hpp for the guarantees, fairness, validation and retirement
// policy and lifetime; this header implements them.
//
// Thread safety. Every member may be called concurrently; m_mutex guards
// the idle list, the queue and the bookkeeping, and is never held while
// connecting, validating or closing a connection (retired_connections
// carries them out of the critical section). The state under the mutex is
// the truth, and every decision reads it there: the idle list, the queue and
// its length, the connections in use and those being opened; the size is
// their sum. Observers read four atomic gauges instead, lock-free: a
// state_lock publishes them from that state when it lets go of the mutex
// (publish_locked, the only place that writes them), and every critical
// section that changes that state holds one. Snapshots, stale at once.
#pragma once

#include <bulkhead/close_report.hpp>
#include <bulkhead/detail/clock.hpp>
#include <bulkhead/detail/detached_threads.hpp>
#include <bulkhead/detail/wait_queue.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/health.hpp>
#include <bulkhead/pool_stats.hpp>
#include <bulkhead/pqxx/compat.hpp>
#include <bulkhead/pqxx/conninfo.hpp>
#include <bulkhead/pqxx/options.hpp>
#include <bulkhead/pqxx/pooled_connection.hpp>
#include <bulkhead/pqxx/protocol.hpp>
#include <bulkhead/pqxx/watchdog.hpp>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bulkhead::detail {

/// One thread waiting in acquire(). Lives on the waiting thread's stack.
/// Linked into an intrusive_fifo (detail/wait_queue.hpp) guarded by the
/// pool's mutex; a failed opener rejoins at the front.
struct pool_waiter {
    pool_waiter* prev = nullptr;                // guarded by the pool's mutex
    pool_waiter* next = nullptr;                // guarded by the pool's mutex
    bool queued = false;                        // guarded by the pool's mutex
    std::unique_ptr<pooled_connection> handed;  // guarded by the pool's mutex; set by give_back()
    std::condition_variable wake;               // notified under the pool's mutex
};

/// A few connections to close after the mutex is released: retirement never
/// allocates, and closes at most this many per call (the rest next time).
class retired_connections {
public:
    retired_connections() = default;
    retired_connections(const retired_connections&) = delete;
    retired_connections& operator=(const retired_connections&) = delete;
    ~retired_connections() = default;  // closes them (pqxx's destructors do not throw)

    [[nodiscard]] bool full() const noexcept { return m_count == capacity; }
    void add(std::unique_ptr<pooled_connection> connection) noexcept {
        assert(!full());
        m_slots[m_count++] = std::move(connection);
    }

private:
    static constexpr std::size_t capacity = 4;
    std::unique_ptr<pooled_connection> m_slots[capacity];
    std::size_t m_count = 0;
};

/// `restore` (a `SELECT set_config(...), ...` or empty, see
/// session_settings_query) that also sets application_name to `name`,
/// quoted by libpq for `connection`.
/// \throws std::runtime_error when libpq cannot quote it (out of memory).
[[nodiscard]] inline std::string with_application_name(PGconn* connection, const std::string& restore,
                                                       const std::string& name) {
    char* quoted = PQescapeLiteral(connection, name.c_str(), name.size());
    if (quoted == nullptr) {
        throw std::runtime_error("bulkhead::pqxx_pool: libpq could not quote the application_name");
    }
    std::string setting = std::string("set_config('application_name', ").append(quoted).append(", false)");
    PQfreemem(quoted);
    return restore.empty() ? "SELECT " + setting : restore + ", " + setting;
}

/// One round trip: true when the connection answers and its session is
/// outside any transaction block. The query starts a transaction of its own
/// exactly when none is open, and then its transaction and statement start
/// times are the same value. The wait for the answer to start arriving is
/// bounded by `deadline` (a server that is gone, stopped or cut off by the
/// network); on a timeout the connection is closed, since the answer may
/// still come and nobody may read it. libpqxx offers no non-blocking way to
/// finish reading an answer that has started to arrive.
inline bool check_idle_session(pqxx::connection& connection, std::chrono::steady_clock::time_point deadline) noexcept {
    try {
        if (!connection.is_open()) {
            return false;
        }
        pqxx::nontransaction check(connection);
        pqxx::pipeline pipe(check);
        const auto query = pipe.insert("SELECT transaction_timestamp() = statement_timestamp()");
        if (!wait_readable(connection.sock(), deadline)) {
            pqxx_compat::close_connection(connection);
            return false;
        }
        const pqxx::result answer = pipe.retrieve(query);
        return answer.size() == 1 && answer[0][0].as<bool>();
    } catch (...) {
        return false;
    }
}

/// True when the server of `connection` said, in the parameters it reports
/// to every session (PostgreSQL 14 and later), that it no longer is what
/// `need` asks: in recovery (a standby, or a demoted primary behind the
/// same address), or, for read-write, default_transaction_read_only on.
/// The pool closes such a connection on its return, and libpq's
/// target_session_attrs then moves the next connect on through the host
/// list.
inline bool session_unwanted(PGconn* connection, session_need need) noexcept {
    const auto on = [connection](const char* name) {
        const char* value = PQparameterStatus(connection, name);
        return value != nullptr && std::string_view(value) == "on";
    };
    if (need == session_need::any || need == session_need::prefer_standby || connection == nullptr) {
        return false;
    }
    return on("in_hot_standby") || (need == session_need::read_write && on("default_transaction_read_only"));
}

/// True when the session of a connection returned from raw use is outside
/// any transaction block. Without a round trip when the pool holds the
/// connection's PGconn* (read when it was opened) and the session is still
/// the one it was read for: libpq's record of the server's last answer
/// (PQtransactionStatus) must say idle; a transaction block left open, a
/// failed one, a command still in progress or a connection libpq knows is
/// bad all say otherwise. Otherwise check_idle_session's round trip.
inline bool session_idle(pooled_connection& pooled, std::chrono::steady_clock::time_point deadline) noexcept {
    pqxx::connection& connection = *pooled.connection;
    if (pooled.handle != nullptr && connection.is_open() && connection.backendpid() == pooled.backend_pid) {
        return PQtransactionStatus(pooled.handle) == PQTRANS_IDLE;
    }
    return check_idle_session(connection, deadline);
}

/// Everything a pool and its leases share. Owned by std::shared_ptr: the pool
/// holds one reference, every lease another.
class pool_core : public std::enable_shared_from_this<pool_core> {
public:
    using clock = std::chrono::steady_clock;

    explicit pool_core(pqxx_pool_options options)
        : m_options(std::move(options)),
          m_target(make_target(m_options)),
          m_secrets(collect_secrets(m_options.conninfo)),
          m_watchdog(m_options.max_size) {
        m_idle.reserve(m_options.max_size);
        initialize_libpq_crypto();  // before any thread of detached_threads: see there
    }

    pool_core(const pool_core&) = delete;
    pool_core& operator=(const pool_core&) = delete;

    ~pool_core() = default;  // only idle connections can be left: closed with m_idle

    /// How a pool with `options` connects (conninfo.hpp's connect_target,
    /// with the pool's target_session_attrs).
    [[nodiscard]] static connect_target make_target(const pqxx_pool_options& options) {
        const std::optional<std::string> attrs = session_attrs_of(options.conninfo);
        return make_connect_target(options.conninfo, options.application_name,
                                   attrs ? std::optional<std::string_view>(*attrs) : std::nullopt);
    }

    [[nodiscard]] const pqxx_pool_options& options() const noexcept { return m_options; }
    [[nodiscard]] const connect_target& target() const noexcept { return m_target; }
    [[nodiscard]] socket_watchdog& watchdog() noexcept { return m_watchdog; }

    /// Opens up to min_idle connections; stops at the first failure.
    void open_min_idle() {
        const auto until = saturating_add(clock::now(), m_options.connection_timeout);
        for (std::size_t opened = 0; opened < m_options.min_idle; ++opened) {
            {
                const state_lock lock(*this);
                if (size_locked() >= m_options.max_size) {
                    return;
                }
                reserve_slot_locked();
            }
            std::unique_ptr<pooled_connection> connection = open(until, {});
            if (!connection) {
                return;
            }
            give_back(std::move(connection));
        }
    }

    /// Starts the housekeeping thread when there is housekeeping to do
    /// (keepalive_time, or min_idle to keep up); see housekeep().
    /// \throws std::system_error when no thread can be started.
    void start_housekeeping() {
        if (m_options.keepalive_time.count() > 0 || m_options.min_idle > 0 || tracks_leases()) {
            m_due.reserve(m_options.max_size);  // once: a tick allocates nothing
            m_leased.reserve(m_options.max_size);
            m_housekeeper = std::jthread([this](const std::stop_token& stop) { housekeep(stop); });
        }
    }

    /// A connection for a lease; see pqxx_pool::acquire. Everything in it,
    /// the wait, the check of an idle connection and the opening of a new
    /// one, ends by min(deadline, now + connection_timeout), or at once when
    /// `stop` is requested.
    /// \throws pool_timeout; admission_cancelled on a stop request.
    std::unique_ptr<pooled_connection> acquire(clock::time_point deadline, const std::stop_token& stop,
                                               const call_site& site) {
        const auto start = clock::now();
        const auto until = std::min(deadline, saturating_add(start, m_options.connection_timeout));
        bool rejoin_at_front = false;
        for (;;) {
            std::unique_ptr<pooled_connection> connection = take(start, until, rejoin_at_front, stop);
            if (connection) {
                bool no_time_to_check = false;
                const std::optional<close_reason> unusable = unusable_on_borrow(*connection, until, no_time_to_check);
                if (no_time_to_check) {
                    // Too little of the caller's time is left for the round
                    // trip: a check cut short would close a healthy
                    // connection. It goes back untested; the caller times out.
                    give_back(std::move(connection));
                    const std::lock_guard lock(m_mutex);
                    bump(m_acquire_timeouts);
                    throw pool_timeout(timeout_message_locked(start, until));
                }
                if (!unusable) {
                    connection->discard = false;
                    connection->raw_access = false;
                    connection->last_borrower = std::this_thread::get_id();
                    lend(*connection, site);
                    return connection;
                }
                // Dead or too old: close it; its slot is ours to open a
                // replacement in, at once.
                connection.reset();
                count_close(*unusable);
                const state_lock lock(*this);
                --m_in_use;
                ++m_opening;  // the slot open() below connects in
            }
            if (std::unique_ptr<pooled_connection> opened = open(until, stop)) {
                opened->last_borrower = std::this_thread::get_id();
                lend(*opened, site);
                return opened;
            }
            rejoin_at_front = true;  // take() ends it when the time is up or a stop came
        }
    }

    /// Takes a connection back from a lease: keeps it (for the oldest waiter,
    /// or idle) or closes it.
    void give_back(std::unique_ptr<pooled_connection> connection) noexcept {
        if (tracks_leases()) {
            const std::lock_guard lock(m_mutex);
            forget_lease_locked(*connection);
        }
        const auto now = clock::now();
        if (const std::optional<close_reason> unusable = unusable_on_return(*connection, now)) {
            connection.reset();  // closed outside the mutex
            count_close(*unusable);
        }
        retired_connections retired;
        const state_lock lock(*this);
        if (connection && !m_closed) {
            connection->idle_since = now;
            if (!m_queue.empty()) {
                // Straight to the oldest waiter: it owns the connection from
                // here; in_use does not change. Notified under the mutex, so
                // the waiter cannot return (and free its node) before we let go.
                pool_waiter& oldest = *m_queue.front();
                oldest.handed = std::move(connection);
                oldest.wake.notify_one();
                leave_queue_locked(oldest);  // the next in line may be able to act now (open after a back-off)
            } else {
                m_idle.push_back(std::move(connection));  // capacity is max_size: no allocation
                --m_in_use;
            }
        } else {
            if (connection) {  // the pool object is gone: close it
                retired.add(std::move(connection));
                count_close(close_reason::shutdown);
            }
            --m_in_use;
            wake_oldest_locked();  // a slot is free
        }
        retire_expired_locked(now, retired);
    }

    /// pqxx_pool::close(): refuses every acquire from now on, those waiting
    /// included (`closed`), stops the housekeeping, waits until every lease
    /// is back or `deadline`, then shuts down. Leases still out stay valid.
    close_report close(clock::time_point deadline) {
        close_report report;
        {
            const state_lock lock(*this);
            m_closing = true;
            report.in_flight = busy_locked();
            wake_oldest_locked();  // it leaves with `closed` and wakes the next
        }
        stop_housekeeping();
        report.still_running = wait_until_idle(deadline, [this] { return busy(); });
        shut_down();
        return report;
    }

    /// The pool object is gone: stop the housekeeping thread (a ping it is
    /// waiting for ends by validation_timeout), close the idle connections;
    /// later returns close theirs. A thread still waiting in acquire()
    /// would wake into freed memory: the process ends, saying so.
    void shut_down() noexcept {
        stop_housekeeping();
        std::vector<std::unique_ptr<pooled_connection>> idle;
        {
            const state_lock lock(*this);
            if (!m_queue.empty()) [[unlikely]] {
                die_with_calls_inside("bulkhead::pqxx_pool (threads waiting in acquire())",
                                      static_cast<int>(m_waiting));
            }
            m_closed = true;
            idle.swap(m_idle);
            for (std::size_t i = 0; i < idle.size(); ++i) {
                count_close(close_reason::shutdown);
            }
            // From here on, a connection attempt still running on its own
            // thread, or a lease still out, must not call the user's hooks:
            // what they capture may be gone with the pool.
            m_hooks_off.store(true, std::memory_order_release);
        }
    }

    /// pqxx_pool::health(). Under the mutex; sends nothing.
    [[nodiscard]] pool_health health() const {
        pool_health health;
        const std::lock_guard lock(m_mutex);
        if (m_last_error_at > m_last_opened_at) {
            health.last_error = m_last_error;
            health.can_connect = !(m_idle.empty() && m_in_use == 0);
        }
        health.budget_excess = m_budget_excess;
        return health;
    }

    /// The last connection budget read: `excess` is its explanation when the
    /// fleet did not fit, empty when it did.
    void note_budget(std::string excess) {
        const std::lock_guard lock(m_mutex);
        m_budget_excess = std::move(excess);
    }

    /// Leases out, connections being opened for a caller, and waiters.
    [[nodiscard]] int busy() const {
        const std::lock_guard lock(m_mutex);
        return busy_locked();
    }

    // The gauges, lock-free: relaxed, since only publish_locked() writes them
    // (under m_mutex) and nothing is decided on them; a snapshot each.
    [[nodiscard]] std::size_t size() const noexcept { return m_size_gauge.load(std::memory_order_relaxed); }
    [[nodiscard]] std::size_t idle() const noexcept { return m_idle_gauge.load(std::memory_order_relaxed); }
    [[nodiscard]] std::size_t in_use() const noexcept { return m_in_use_gauge.load(std::memory_order_relaxed); }
    [[nodiscard]] std::size_t waiting() const noexcept { return m_waiting_gauge.load(std::memory_order_relaxed); }

private:
    /// m_mutex, held for a critical section that may change what the gauges
    /// show: publishes them on the way out (before the mutex is let go), and
    /// before a wait lets go of it. A section that changes none of it may
    /// take a plain lock.
    class state_lock {
    public:
        explicit state_lock(pool_core& core) : m_core(core), m_lock(core.m_mutex) {}
        state_lock(const state_lock&) = delete;
        state_lock& operator=(const state_lock&) = delete;
        ~state_lock() { m_core.publish_locked(); }  // the members, m_lock too, are destroyed after this

        /// Waits on `wake` until it is notified or `at`, publishing first:
        /// the mutex is let go meanwhile.
        void wait_until(std::condition_variable& wake, clock::time_point at) {
            m_core.publish_locked();
            wake.wait_until(m_lock, at);
        }

    private:
        pool_core& m_core;
        std::unique_lock<std::mutex> m_lock;
    };

    /// Open or being opened: idle + in use + opening; at most max_size.
    [[nodiscard]] std::size_t size_locked() const noexcept { return m_idle.size() + m_in_use + m_opening; }

    [[nodiscard]] int busy_locked() const noexcept { return static_cast<int>(m_in_use + m_opening + m_waiting); }

    void stop_housekeeping() noexcept {
        if (m_housekeeper.joinable()) {
            m_housekeeper.request_stop();
            m_housekeeper.join();
        }
    }

    /// Copies the state under the mutex to the gauges the observers read;
    /// the only writer of them (state_lock calls it).
    void publish_locked() noexcept {
        m_size_gauge.store(size_locked(), std::memory_order_relaxed);
        m_idle_gauge.store(m_idle.size(), std::memory_order_relaxed);
        m_in_use_gauge.store(m_in_use, std::memory_order_relaxed);
        m_waiting_gauge.store(m_waiting, std::memory_order_relaxed);
    }

    static std::vector<std::string> collect_secrets(const std::string& conninfo) {
        std::vector<std::string> secrets = conninfo_secrets(conninfo);
        // concurrency-mt-unsafe: read once, when the pool is built; libpq itself
        // reads PGPASSWORD with getenv on every connection attempt.
        if (const char* from_environment = std::getenv("PGPASSWORD")) {  // NOLINT(concurrency-mt-unsafe)
            secrets.emplace_back(from_environment);
        }
        return longest_first(std::move(secrets));
    }

    /// A slot for the caller to open a connection in (connect_in_slot).
    void reserve_slot_locked() noexcept { ++m_opening; }

    [[nodiscard]] bool can_open_locked(clock::time_point now) const noexcept {
        return size_locked() < m_options.max_size && now >= m_retry_at;
    }

    /// The idle connection for the calling thread at `now`: the one it
    /// borrowed last if that is among the affinity_window most recently
    /// returned and came back less than affinity_horizon ago, otherwise the
    /// most recently returned. A thread that keeps talking to one backend
    /// keeps the pair's wake-ups on warm caches: with connections passed
    /// around among threads, the gate's closed-loop throughput on a write
    /// transaction was lower (the figures: docs/performance.md, "The default
    /// path"). The horizon keeps light load on the few most recently used
    /// connections, as before, so that idle_timeout still retires the rest.
    /// The others keep their order (oldest first, for retirement).
    std::unique_ptr<pooled_connection> take_idle_locked(clock::time_point now) noexcept {
        if (m_idle.empty()) {
            return nullptr;
        }
        const std::thread::id me = std::this_thread::get_id();
        const std::size_t window = m_options.connection_affinity ? std::min(m_idle.size(), affinity_window) : 0;
        for (std::size_t back = 0; back < window; ++back) {
            const auto at = m_idle.end() - static_cast<std::ptrdiff_t>(back) - 1;
            if (now - (*at)->idle_since >= affinity_horizon) {
                break;  // it and every one before it came back too long ago
            }
            if ((*at)->last_borrower == me) {
                std::rotate(at, at + 1, m_idle.end());
                break;
            }
        }
        std::unique_ptr<pooled_connection> connection = std::move(m_idle.back());
        m_idle.pop_back();
        ++m_in_use;
        return connection;
    }

    void wake_oldest_locked() noexcept {
        if (!m_queue.empty()) {
            m_queue.front()->wake.notify_one();
        }
    }

    /// Links `node` into the queue: as the oldest when it keeps its turn.
    void join_queue_locked(pool_waiter& node, bool at_front) noexcept {
        if (at_front) {
            m_queue.push_front(node);
        } else {
            m_queue.push_back(node);
        }
        ++m_waiting;
    }

    void leave_queue_locked(pool_waiter& node) noexcept {
        m_queue.remove(node);
        --m_waiting;
        wake_oldest_locked();  // the new oldest waiter may be able to act now
    }

    /// Leaves the queue on any way out of take() (an exception included),
    /// under the mutex: declared after the lock, so destroyed before it.
    class queue_exit {
    public:
        queue_exit(pool_core& core, pool_waiter& node) noexcept : m_core(core), m_node(node) {}
        queue_exit(const queue_exit&) = delete;
        queue_exit& operator=(const queue_exit&) = delete;
        ~queue_exit() {
            if (m_node.queued) {
                m_core.leave_queue_locked(m_node);
            }
        }

    private:
        pool_core& m_core;
        pool_waiter& m_node;
    };

    // --- housekeeping (K1, K2) ---------------------------------------------------

    /// The housekeeping thread, one per pool, only when keepalive_time is set
    /// or min_idle is above zero. Every period (a quarter of keepalive_time,
    /// at most a second): closes idle connections the server has closed
    /// (its farewell is unread input: no round trip) and those past their
    /// lifetime, pings those idle for keepalive_time, then opens connections
    /// until min_idle are open, unless callers are waiting (they open their
    /// own) or the back-off after a failed attempt holds. It never touches a
    /// connection in use: what it checks it takes out of the idle list first.
    void housekeep(const std::stop_token& stop) noexcept {
        clock::duration period = std::chrono::seconds(1);
        if (m_options.keepalive_time.count() > 0) {
            period = std::min<clock::duration>(period, m_options.keepalive_time / 4);
        }
        if (tracks_leases()) {
            period = std::min<clock::duration>(period, m_options.leak_threshold / 4);
        }
        std::condition_variable_any tick;
        while (!stop.stop_requested()) {
            {
                std::unique_lock lock(m_mutex);
                (void)tick.wait_for(lock, stop, period, [] { return false; });
            }
            if (stop.stop_requested()) {
                return;
            }
            check_idle(stop);
            keep_min_idle(stop);
            report_leaks();
        }
    }

    /// With a leak_threshold: records a lease about to be handed out.
    void lend(pooled_connection& connection, const call_site& site) {
        if (tracks_leases()) {
            const std::lock_guard lock(m_mutex);
            connection.leased_at = clock::now();
            connection.leased_by = site;
            connection.leak_reported = false;
            m_leased.push_back(&connection);  // capacity max_size: no allocation
        }
    }

    [[nodiscard]] bool tracks_leases() const noexcept { return m_options.leak_threshold.count() > 0; }

    void forget_lease_locked(const pooled_connection& connection) noexcept {
        const auto found = std::find(m_leased.begin(), m_leased.end(), &connection);
        if (found != m_leased.end()) {
            *found = m_leased.back();
            m_leased.pop_back();
        }
    }

    /// The housekeeping thread's leak check: each lease out longer than
    /// leak_threshold is reported once, outside the mutex.
    void report_leaks() noexcept {
        if (!tracks_leases()) {
            return;
        }
        try {
            std::vector<lease_leak> found;
            {
                const std::lock_guard lock(m_mutex);
                const auto now = clock::now();
                for (pooled_connection* leased : m_leased) {
                    if (!leased->leak_reported && now - leased->leased_at >= m_options.leak_threshold) {
                        leased->leak_reported = true;
                        found.push_back({std::chrono::duration_cast<std::chrono::milliseconds>(now - leased->leased_at),
                                         leased->leased_by.describe(), leased->backend_pid});
                    }
                }
            }
            for (const lease_leak& leak : found) {
                if (m_options.on_leak) {
                    m_options.on_leak(leak);
                } else {
                    std::fprintf(stderr,
                                 "bulkhead::pqxx_pool: a lease has been out for %lld ms (backend %d), taken at %s\n",
                                 static_cast<long long>(leak.held.count()), leak.backend_pid, leak.where.c_str());
                }
            }
        } catch (...) {
            // No memory for a report, or a hook that threw: the next tick
            // does not repeat what it marked; nothing else is at stake.
        }
    }

    /// Takes out of the idle list the connections the server has closed,
    /// those past their lifetime and, with keepalive_time, those idle that
    /// long; closes the first two kinds and pings the third, returning the
    /// live ones.
    void check_idle(const std::stop_token& stop) noexcept {
        std::vector<std::unique_ptr<pooled_connection>>& due = m_due;  // capacity max_size: no allocation
        retired_connections retired;
        {
            const state_lock lock(*this);
            const clock::time_point now = clock::now();
            retire_expired_locked(now, retired);
            for (std::size_t index = 0; index < m_idle.size();) {
                pooled_connection& candidate = *m_idle[index];
                const bool told = has_unread_input(candidate.handle);
                if (told ||
                    (m_options.keepalive_time.count() > 0 && now - candidate.idle_since >= m_options.keepalive_time)) {
                    due.push_back(std::move(m_idle[index]));
                    m_idle.erase(m_idle.begin() + static_cast<std::ptrdiff_t>(index));
                    ++m_in_use;  // checked, as on borrow: no caller can take it meanwhile
                } else {
                    ++index;
                }
            }
        }
        for (std::unique_ptr<pooled_connection>& connection : due) {
            const std::optional<close_reason> unusable = stop.stop_requested() ? std::nullopt : ping(*connection);
            if (!unusable) {
                give_back(std::move(connection));
                continue;
            }
            connection.reset();  // closed outside the mutex
            count_close(*unusable);
            const state_lock lock(*this);
            --m_in_use;
            wake_oldest_locked();  // a slot is free
        }
        due.clear();
    }

    /// Outside the mutex, for an idle connection taken out of the list: why
    /// it must be closed, or nothing. Closed by the server (its farewell
    /// read without waiting): broken; else one round trip, bounded by
    /// validation_timeout.
    std::optional<close_reason> ping(pooled_connection& connection) const noexcept {
        if (has_unread_input(connection.handle) &&
            (PQconsumeInput(connection.handle) == 0 || PQstatus(connection.handle) == CONNECTION_BAD)) {
            return close_reason::broken;
        }
        if (!check_idle_session(*connection.connection, saturating_add(clock::now(), m_options.validation_timeout))) {
            return close_reason::validation_failed;
        }
        return std::nullopt;
    }

    /// Opens connections until min_idle are open (see housekeep()).
    void keep_min_idle(const std::stop_token& stop) noexcept {
        while (!stop.stop_requested()) {
            {
                const state_lock lock(*this);
                if (m_closed || size_locked() >= m_options.min_idle || !m_queue.empty() ||
                    !can_open_locked(clock::now())) {
                    return;
                }
                reserve_slot_locked();
            }
            std::unique_ptr<pooled_connection> connection;
            try {
                connection = open(saturating_add(clock::now(), m_options.connection_timeout), stop);
            } catch (...) {  // admission_cancelled on the stop: the attempt finishes on its own
                return;
            }
            if (!connection) {
                return;  // failed: the back-off holds the next attempt
            }
            give_back(std::move(connection));
        }
    }

    /// Under the mutex: closes idle connections past max_lifetime, and those
    /// past idle_timeout while more than min_idle are open. Oldest first.
    void retire_expired_locked(clock::time_point now, retired_connections& retired) noexcept {
        bool freed = false;
        for (std::size_t index = 0; index < m_idle.size() && !retired.full();) {
            const pooled_connection& candidate = *m_idle[index];
            const bool too_old = now >= candidate.retire_at;
            const bool idle_too_long = m_options.idle_timeout.count() > 0 &&
                                       elapsed_ms(candidate.idle_since, now) >= m_options.idle_timeout &&
                                       size_locked() > m_options.min_idle;
            if (too_old || idle_too_long) {
                count_close(too_old ? close_reason::lifetime : close_reason::idle);
                retired.add(std::move(m_idle[index]));
                m_idle.erase(m_idle.begin() + static_cast<std::ptrdiff_t>(index));
                freed = true;
            } else {
                ++index;
            }
        }
        if (freed) {
            wake_oldest_locked();
        }
    }

    /// An idle connection, or an empty pointer meaning "a slot is reserved
    /// for you: open one"; waits in line for either.
    /// \throws pool_timeout at `until`.
    std::unique_ptr<pooled_connection> take(clock::time_point start, clock::time_point until, bool at_front,
                                            const std::stop_token& stop) {
        retired_connections retired;  // destroyed after the lock: closes outside the mutex
        pool_waiter node;
        // Declared before the lock, so destroyed after it is released: the
        // callback takes the mutex, and a running one is waited for.
        const std::stop_callback wake_on_stop(stop, [this, &node]() noexcept {
            const std::lock_guard lock(m_mutex);
            node.wake.notify_one();
        });
        state_lock lock(*this);
        if (stop.stop_requested()) {
            throw admission_cancelled();
        }
        if (m_closing) {
            throw closed("bulkhead::pqxx_pool: closed");
        }
        if (clock::now() >= until) {  // an attempt gave up at `until`: no new slot, no new attempt
            bump(m_acquire_timeouts);
            throw pool_timeout(timeout_message_locked(start, until));
        }
        auto now = clock::now();
        retire_expired_locked(now, retired);
        if (m_queue.empty()) {
            if (std::unique_ptr<pooled_connection> connection = take_idle_locked(now)) {
                return connection;
            }
            if (can_open_locked(now)) {
                reserve_slot_locked();
                return nullptr;
            }
        }
        join_queue_locked(node, at_front);
        const queue_exit exit(*this, node);
        for (;;) {
            // A hand-over is checked first: it wins over a timeout that raced
            // with it. The giver unlinked the node and counted the connection
            // in use; if the deadline passed meanwhile, the caller still gets
            // the connection (never lost, never given twice).
            if (node.handed) {
                return std::move(node.handed);
            }
            if (stop.stop_requested()) {
                leave_queue_locked(node);
                throw admission_cancelled();
            }
            if (m_closing) {
                leave_queue_locked(node);  // wakes the next, which leaves as well
                throw closed("bulkhead::pqxx_pool: closed");
            }
            now = clock::now();
            const bool oldest = m_queue.front() == &node;
            if (oldest) {
                if (std::unique_ptr<pooled_connection> connection = take_idle_locked(now)) {
                    leave_queue_locked(node);
                    return connection;
                }
                if (can_open_locked(now)) {
                    leave_queue_locked(node);
                    reserve_slot_locked();
                    return nullptr;
                }
            }
            if (now >= until) {
                leave_queue_locked(node);
                bump(m_acquire_timeouts);
                throw pool_timeout(timeout_message_locked(start, until));
            }
            auto wake_at = until;
            if (oldest && size_locked() < m_options.max_size && m_retry_at < wake_at) {
                wake_at = m_retry_at;  // the oldest waiter retries after the back-off
            }
            lock.wait_until(node.wake, wake_at);
        }
    }

    [[nodiscard]] std::string timeout_message_locked(clock::time_point start, clock::time_point until) const {
        std::string message = "db pool: no connection within " + std::to_string(elapsed_ms(start, until).count()) +
                              " ms (max_size " + std::to_string(m_options.max_size) + ", in use " +
                              std::to_string(m_in_use) + ")";
        if (!m_last_error.empty() && m_last_error_at >= start) {
            message += "; last connection error: " + m_last_error;
        }
        return message;
    }

    /// What a waiter in open() and the thread that connects for it share.
    struct open_attempt {
        std::mutex mutex;
        std::condition_variable done_signal;            // notified under mutex
        bool done = false;                              // guarded by mutex
        bool abandoned = false;                         // guarded by mutex: the waiter gave up
        std::unique_ptr<pooled_connection> connection;  // guarded by mutex
    };

    /// Opens a connection in a slot the caller reserved, waiting for it at
    /// most until `until` or a stop request. libpq connects without a
    /// timeout finer than whole seconds (at least 2), so the connecting runs
    /// on a thread of its own: a caller that gives up returns at once, and
    /// the attempt finishes alone, keeping the slot until it does; a
    /// connection it opens then goes to the pool (the oldest waiter, or the
    /// idle list). Null when none could be had in time.
    std::unique_ptr<pooled_connection> open(clock::time_point until, const std::stop_token& stop) {
        std::shared_ptr<open_attempt> attempt;
        bool started = false;
        try {
            attempt = std::make_shared<open_attempt>();
            started = detached_threads::start(attempt_end(until), [self = shared_from_this(), attempt, until] {
                std::unique_ptr<pooled_connection> opened = self->connect_in_slot(until);
                std::unique_lock lock(attempt->mutex);
                if (attempt->abandoned) {
                    lock.unlock();
                    if (opened) {
                        self->give_back(std::move(opened));
                    }
                    return;
                }
                attempt->connection = std::move(opened);
                attempt->done = true;
                attempt->done_signal.notify_one();
            });
        } catch (...) {  // no memory: as without a thread
        }
        if (!started) {  // connect on this thread
            return connect_in_slot(until);
        }
        const std::stop_callback wake_on_stop(stop, [&attempt]() noexcept {
            const std::lock_guard lock(attempt->mutex);
            attempt->done_signal.notify_one();
        });
        std::unique_lock lock(attempt->mutex);
        while (!attempt->done && !stop.stop_requested() && clock::now() < until) {
            attempt->done_signal.wait_until(lock, until);
        }
        if (attempt->done) {
            return std::move(attempt->connection);
        }
        attempt->abandoned = true;
        return nullptr;
    }

    /// When a connection attempt that should end by `until` ends at the
    /// latest: libpq's connect timeout (the pool's, or connection_timeout
    /// when the conninfo or PGCONNECT_TIMEOUT sets libpq's own), a second
    /// more (libpq before 17 counts it from a time() in whole seconds, so
    /// 2 s may last from just over 1 to almost 3), and a second for what follows the connect.
    /// How long an exit waits for it.
    [[nodiscard]] clock::time_point attempt_end(clock::time_point until) const noexcept {
        const auto now = clock::now();
        const clock::duration libpq_bound = m_target.add_connect_timeout
                                                ? clock::duration(connect_timeout_for(until - now))
                                                : clock::duration(m_options.connection_timeout);
        return now + libpq_bound + std::chrono::seconds(2);
    }

    /// Connects in a slot the caller reserved, on the calling thread, and
    /// prepares the connection for the pool: on_connect, libpq's handle, the
    /// cancel key, the statement guard, the reset statements. On failure
    /// gives the slot back, records the (scrubbed) error, backs off, and
    /// returns null.
    std::unique_ptr<pooled_connection> connect_in_slot(clock::time_point until) noexcept {
        std::string error;
        try {
            auto record = std::make_unique<pooled_connection>();
            record->connection = connect(until);
            prepare_record(*record);
            build_statements(*record);
            record_opened(*record);
            return record;
        } catch (const std::exception& failure) {
            try {
                error = failure.what();
            } catch (...) {  // out of memory: reported by record_failure
            }
        } catch (...) {
            error = "unknown error";
        }
        record_failure(error);
        return nullptr;
    }

    /// A new libpq connection to the target, within `until`, and on_connect
    /// run on it, unless the pool is gone.
    /// \throws what connecting or on_connect throws; std::runtime_error when
    /// the pool is gone.
    [[nodiscard]] std::unique_ptr<pqxx::connection> connect(clock::time_point until) const {
        std::unique_ptr<pqxx::connection> connection =
            pqxx_compat::open_connection(connect_string(m_target, until - clock::now()));
        if (m_options.on_connect) {
            if (m_hooks_off.load(std::memory_order_acquire)) {
                throw std::runtime_error("bulkhead::pqxx_pool: the pool is gone");
            }
            m_options.on_connect(*connection);
        }
        return connection;
    }

    /// What the pool keeps of a new connection's libpq session: its handle
    /// and statement guard, backend pid, server version, the server it
    /// reached, its cancel key and the socket the watchdog shuts down.
    /// \throws std::runtime_error when the handle is not usable or the
    /// connection did not say which server it reached; what allocating throws.
    void prepare_record(pooled_connection& record) const {
        record.handle = pqxx_compat::native_handle(*record.connection);
        if (record.handle == nullptr || !watch_transaction_block(record.handle, record.guard)) {
            throw std::runtime_error("bulkhead::pqxx_pool: libpq's handle of the new connection is not usable");
        }
        record.backend_pid = record.connection->backendpid();
        record.server_version = PQserverVersion(record.handle);
        // Which server it reached, for a lost COMMIT's lookup
        // (commit_origin.hpp), in one round trip bounded as a validation
        // is. A server that cannot say (before PostgreSQL 10, or its
        // functions not granted) leaves it unknown: its lost COMMITs are
        // then commit_unknown. A connection that did not answer, or that
        // libpq still finds busy, is not used.
        if (std::optional<server_place> place =
                read_server_place(record.handle, saturating_add(clock::now(), m_options.validation_timeout))) {
            record.place = std::move(*place);
        } else if (PQstatus(record.handle) != CONNECTION_OK || PQtransactionStatus(record.handle) != PQTRANS_IDLE) {
            throw std::runtime_error(
                "bulkhead::pqxx_pool: the new connection did not answer which server it "
                "reached within validation_timeout: " +
                one_line(PQerrorMessage(record.handle)));
        }
        record.cancel = std::make_shared<cancel_request>(record.handle);
        record.watch_socket.watch(PQsocket(record.handle));
    }

    /// The statements that end a lease's transaction and reset its session
    /// (with reset_session), made once per connection.
    /// \throws what reading the session's settings or quoting throws.
    void build_statements(pooled_connection& record) const {
        if (m_options.reset_session) {
            const std::string restore = restore_query(record);
            record.commit_steps = reset_steps("COMMIT", restore);
            record.rollback_statement = one_query(reset_steps("ROLLBACK", restore));
            record.reset_statement = one_query(reset_steps("", restore));
        } else {
            record.commit_steps = {"COMMIT"};
            record.rollback_statement = "ROLLBACK";
            record.reset_statement.clear();
        }
        record.commit_statement = one_query(record.commit_steps);
        record.asked_commit_statement =
            std::string(xact_id_if_assigned(record.server_version)).append("; ").append(record.commit_statement);
    }

    /// With reset_session: what puts the session back after its RESET ALL,
    /// the settings on_connect made (read from the session) and the
    /// application_name; empty when there is nothing to put back.
    [[nodiscard]] std::string restore_query(const pooled_connection& record) const {
        std::string restore;
        if (m_options.on_connect) {
            pqxx::nontransaction read(*record.connection);
            restore = read.exec(session_settings_query).at(0).at(0).c_str();
        }
        if (!m_options.application_name.empty()) {
            // RESET ALL puts application_name back to the server session's
            // start-up value: the pool's on a direct connection, but behind
            // a pooler such as PgBouncer the pooler's own (empty), and the
            // pooler then keeps that for this client: set it again.
            restore = with_application_name(record.handle, restore, m_options.application_name);
        }
        return restore;
    }

    /// The new connection is ready: stamps it, counts it in use (its slot
    /// was opening) and ends any back-off.
    void record_opened(pooled_connection& record) {
        record.opened_at = clock::now();
        record.idle_since = record.opened_at;
        if (m_options.max_lifetime.count() > 0) {
            thread_local std::mt19937_64 generator{std::random_device{}()};
            record.retire_at = saturating_add(record.opened_at, jittered_lifetime(m_options.max_lifetime, generator()));
        }
        if (m_target.sessions == session_need::prefer_standby && m_options.fallback_lifetime.count() > 0) {
            // No standby answered: libpq fell back to the primary (a server
            // that says it is not in hot standby mode; PostgreSQL 14 and
            // later say so to every session).
            const char* standby = PQparameterStatus(record.handle, "in_hot_standby");
            if (standby != nullptr && std::string_view(standby) == "off") {
                record.retire_at =
                    std::min(record.retire_at, saturating_add(record.opened_at, m_options.fallback_lifetime));
            }
        }
        const state_lock lock(*this);
        --m_opening;
        ++m_in_use;
        bump(m_opened);
        m_last_opened_at = record.opened_at;
        m_backoff = clock::duration::zero();
        m_retry_at = clock::time_point::min();
    }

    /// The attempt failed with `error`: gives its slot back, records the
    /// error scrubbed of passwords, and backs off (doubling, within bounds)
    /// before the next attempt.
    void record_failure(const std::string& error) noexcept {
        std::string reported;
        try {
            reported = one_line(scrub(error, m_secrets));
        } catch (...) {
            reported = "(the error message could not be processed)";
        }
        const state_lock lock(*this);
        --m_opening;
        bump(m_connect_failures);
        const auto now = clock::now();
        m_last_error = std::move(reported);
        m_last_error_at = now;
        m_backoff = std::clamp<clock::duration>(m_backoff * 2, std::chrono::milliseconds(25), std::chrono::seconds(1));
        m_retry_at = now + m_backoff;
        wake_oldest_locked();  // it adopts the back-off (or opens, once it is over)
    }

    /// Outside the mutex, for a connection just taken from the idle list:
    /// why it must be closed instead of handed out, or nothing.
    /// Every check ends by `until`.
    std::optional<close_reason> unusable_on_borrow(pooled_connection& connection, clock::time_point until,
                                                   bool& no_time_to_check) const noexcept {
        const auto now = clock::now();
        if (!connection.connection->is_open()) {
            return close_reason::broken;
        }
        // An idle connection the server has sent something to, unasked, has
        // most likely been told that it is being closed (a terminated
        // backend, a restart): reading it without blocking says so, with no
        // round trip. Anything else it said (a notice) is checked below.
        bool told_something = false;
        if (has_unread_input(connection.handle)) {
            if (PQconsumeInput(connection.handle) == 0 || PQstatus(connection.handle) == CONNECTION_BAD) {
                return close_reason::broken;
            }
            told_something = true;
        }
        if (now >= connection.retire_at) {
            return close_reason::lifetime;
        }
        // Rounded up: with validate_after_idle = 0 every connection that was
        // idle at all is checked.
        const bool due = told_something || std::chrono::ceil<std::chrono::milliseconds>(now - connection.idle_since) >
                                               m_options.validate_after_idle;
        if (due && until - now < minimum_check_time) {
            no_time_to_check = true;
            return std::nullopt;
        }
        if (due && !check_idle_session(*connection.connection,
                                       std::min(until, saturating_add(now, m_options.validation_timeout)))) {
            return close_reason::validation_failed;
        }
        return std::nullopt;
    }

    /// Outside the mutex, for a connection coming back from a lease: why it
    /// must be closed instead of kept, or nothing.
    std::optional<close_reason> unusable_on_return(pooled_connection& connection,
                                                   clock::time_point now) const noexcept {
        // A cancel still on its way would hit the next borrower's statement.
        if (connection.discard ||
            (connection.cancel && !connection.cancel->settled_within(std::chrono::milliseconds(100)))) {
            return close_reason::discarded;
        }
        if (!connection.connection->is_open()) {
            return close_reason::broken;
        }
        if (now >= connection.retire_at) {
            return close_reason::lifetime;
        }
        if (session_unwanted(connection.handle, m_target.sessions)) {
            return close_reason::read_only;
        }
        if (connection.raw_access) {
            connection.raw_access = false;
            const clock::time_point until = saturating_add(now, m_options.validation_timeout);
            if (!session_idle(connection, until) ||
                (m_options.reset_session &&
                 !run_before(connection.handle, connection.reset_statement.c_str(), until))) {
                return close_reason::validation_failed;
            }
        }
        return std::nullopt;
    }

    /// Counts a closed connection and tells the hook, if any.
    void count_close(close_reason reason) noexcept {
        bump(m_closed_by[static_cast<std::size_t>(reason)]);
        if (m_options.on_close && !m_hooks_off.load(std::memory_order_acquire)) {
            try {
                m_options.on_close(reason);
            } catch (...) {  // the hook must not throw; a throwing one is ignored
            }
        }
    }

    /// Less time than this left of a caller's wait: an idle connection that is
    /// due for its round-trip check is not checked (nor closed) but put back.
    static constexpr std::chrono::milliseconds minimum_check_time{5};

    // relaxed: statistics, they order nothing.
    static void bump(std::atomic<std::uint64_t>& counter) noexcept { counter.fetch_add(1, std::memory_order_relaxed); }

public:
    /// The counters and gauges.
    [[nodiscard]] pool_stats stats() const noexcept {
        pool_stats stats;
        stats.max_size = m_options.max_size;
        stats.size = size();
        stats.idle = idle();
        stats.in_use = in_use();
        stats.waiting = waiting();
        stats.opened = m_opened.load(std::memory_order_relaxed);
        stats.connect_failures = m_connect_failures.load(std::memory_order_relaxed);
        stats.acquire_timeouts = m_acquire_timeouts.load(std::memory_order_relaxed);
        for (std::size_t i = 0; i < close_reason_count; ++i) {
            stats.closed[i] = m_closed_by[i].load(std::memory_order_relaxed);
        }
        return stats;
    }

private:
    /// How many of the most recently returned idle connections a borrower
    /// looks through for the one it used last (take_idle_locked): a bound on
    /// the work under the mutex, whatever max_size is.
    static constexpr std::size_t affinity_window = 16;
    /// How recently that connection must have come back to be preferred.
    static constexpr std::chrono::milliseconds affinity_horizon{100};

    const pqxx_pool_options m_options;         // immutable after construction
    const connect_target m_target;             // immutable after construction
    const std::vector<std::string> m_secrets;  // immutable after construction: passwords to scrub
    socket_watchdog m_watchdog;                // cuts off connections past their call's deadline
    std::atomic<bool> m_hooks_off{false};      // set by shut_down(): on_connect and on_close are no longer called

    mutable std::mutex m_mutex;
    std::vector<std::unique_ptr<pooled_connection>> m_idle;         // guarded by m_mutex; most recently returned last
    intrusive_fifo<pool_waiter> m_queue;                            // guarded by m_mutex
    bool m_closed = false;                                          // guarded by m_mutex; the pool object is gone
    bool m_closing = false;                                         // guarded by m_mutex; close() began
    clock::time_point m_retry_at = clock::time_point::min();        // guarded by m_mutex; no new attempt before
    clock::duration m_backoff = clock::duration::zero();            // guarded by m_mutex; after the last failure
    std::string m_last_error;                                       // guarded by m_mutex; scrubbed
    clock::time_point m_last_error_at = clock::time_point::min();   // guarded by m_mutex
    clock::time_point m_last_opened_at = clock::time_point::min();  // guarded by m_mutex
    std::string m_budget_excess;                                    // guarded by m_mutex; scrubbed
    std::vector<pooled_connection*> m_leased;                       // guarded by m_mutex; with a leak_threshold

    std::size_t m_waiting = 0;  // guarded by m_mutex; nodes in m_queue (join_queue_locked, leave_queue_locked)
    std::size_t m_in_use = 0;   // guarded by m_mutex; in leases (or being checked on borrow)
    std::size_t m_opening = 0;  // guarded by m_mutex; slots reserved for a connection being opened

    // The gauges: written only by publish_locked(), under m_mutex; read
    // relaxed by the observers.
    std::atomic<std::size_t> m_size_gauge{0};     // size_locked()
    std::atomic<std::size_t> m_idle_gauge{0};     // m_idle.size()
    std::atomic<std::size_t> m_in_use_gauge{0};   // m_in_use
    std::atomic<std::size_t> m_waiting_gauge{0};  // m_waiting

    // Statistics: relaxed counters, written anywhere.
    std::atomic<std::uint64_t> m_opened{0};
    std::atomic<std::uint64_t> m_connect_failures{0};
    std::atomic<std::uint64_t> m_acquire_timeouts{0};
    std::array<std::atomic<std::uint64_t>, close_reason_count> m_closed_by{};

    std::vector<std::unique_ptr<pooled_connection>> m_due;  // housekeeping thread only: what check_idle() checks
    std::jthread m_housekeeper;  // housekeep(); started after construction, joined by shut_down()
};

}  // namespace bulkhead::detail
