// bulkhead: the settings of a pqxx_pool, and their validation.
//
// pqxx_pool_options is what a user fills in (designated initializers);
// check_options() refuses anything out of range before a pool is built,
// with a std::invalid_argument that names the field and never a password.
// isolation names the transaction isolation levels the pool spells out in
// BEGIN; pqxx_transaction_options are the settings of one gate transaction.
#pragma once

#include <bulkhead/pool_stats.hpp>
#include <bulkhead/pqxx/connection_budget.hpp>
#include <bulkhead/pqxx/conninfo.hpp>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace bulkhead {

/// A lease held past pqxx_pool_options::leak_threshold (on_leak).
struct lease_leak {
    std::chrono::milliseconds held{0};  ///< how long it had been out when it was reported
    std::string where;                  ///< call_site::describe(): the caller's label, or "file:line (function)"
    int backend_pid = 0;                ///< its connection's backend
};

/// Settings of a pqxx_pool. Use designated initializers:
/// `bulkhead::pqxx_pool pool({.conninfo = "host=db dbname=app", .max_size = 8});`
/// A duration of zero for idle_timeout or max_lifetime means "never".
struct pqxx_pool_options {
    /// libpq connection string: keyword/value ("host=db user=app") or URI
    /// ("postgresql://app@db/app"). Must not be empty.
    std::string conninfo;
    /// Most connections open (or being opened) at once. In [1, 262143]
    /// (PostgreSQL's own limit for max_connections).
    std::size_t max_size = 10;
    /// Connections opened by the constructor and kept open: the pool's
    /// housekeeping thread opens new ones after closes and failures (within
    /// the connection back-off), and idle_timeout retires none below it. At
    /// most max_size.
    std::size_t min_idle = 0;
    /// Longest wait in acquire() for a connection. At least 250 ms.
    std::chrono::milliseconds connection_timeout{30000};
    /// Longest wait for the answer to the pool's own check of a connection.
    /// At least 250 ms.
    std::chrono::milliseconds validation_timeout{5000};
    /// An idle connection idle for longer than this is closed (above
    /// min_idle). Zero: never.
    std::chrono::milliseconds idle_timeout{600000};
    /// A connection older than this, less a random part of up to 2.5 % of
    /// it drawn when it opens (so that connections opened together do not
    /// retire together), is closed when next seen by the pool. Zero: never.
    std::chrono::milliseconds max_lifetime{1800000};
    /// With target_session_attrs=prefer-standby (reads on standbys, the
    /// primary as the fallback: docs/cluster.md): a connection opened on the
    /// primary because no standby answered is closed when the pool next
    /// sees it after this long, so that the pool tries the standbys again
    /// within about this time of one returning, not at max_lifetime. Zero:
    /// such a connection lives max_lifetime.
    std::chrono::milliseconds fallback_lifetime{5000};
    /// An idle connection idle this long is pinged by the pool's
    /// housekeeping thread (one round trip, bounded by validation_timeout),
    /// so that firewalls and servers that drop quiet connections do not, and
    /// a dead one is found and replaced before a caller borrows it. Never a
    /// connection in use. Zero: off. Otherwise at least 100 ms.
    std::chrono::milliseconds keepalive_time{0};
    /// An idle connection idle for longer than this is checked (one round
    /// trip) before it is handed out. Zero: every time.
    std::chrono::milliseconds validate_after_idle{500};
    /// Sent as libpq's application_name (it overrides one in conninfo); shows
    /// in pg_stat_activity. Empty: leave it to conninfo and the environment.
    std::string application_name = "bulkhead";
    /// Called once for every connection the pool closes, with the reason
    /// (discarded, broken, lifetime, idle, validation_failed, shutdown,
    /// read_only): an
    /// observer hook for logging or tracing. Must not throw and must not call
    /// acquire(); it may run with the pool's mutex held. Not called any more
    /// once the pool object is gone (for leases returned later, say). Empty:
    /// nothing is called.
    std::function<void(close_reason)> on_close{};
    /// Called once for every new connection, on the thread that opens it,
    /// before anyone uses it: per-connection setup (SET search_path, SET
    /// TIME ZONE, PREPARE). What it sets for the session survives the reset
    /// that follows every gate transaction (it is read back once, with one
    /// round trip, and set again as part of the reset); its prepared
    /// statements survive too. A LISTEN does not (the reset ends it). An
    /// exception from it fails that connection attempt (its message, passwords
    /// removed, is the pool's last connection error). Empty: nothing is called.
    std::function<void(pqxx::connection&)> on_connect{};
    /// Put every session back as the pool opened it after each gate
    /// transaction and each lease used directly: settings, role, session
    /// advisory locks, cursors, LISTEN, temporary tables (docs/pqxx_pool.md,
    /// "Session state"). It rides in the same simple query as COMMIT or
    /// ROLLBACK, so it costs no round trip, but six short statements of server
    /// time per transaction. Turn it off only when no callback leaves session
    /// state behind.
    bool reset_session = true;
    /// A borrower gets back the idle connection it borrowed last when that
    /// one came back less than 100 ms ago (and is among the 16 most recently
    /// returned); otherwise, and with false, the most recently returned one.
    /// A thread that keeps talking to one backend keeps their wake-ups on
    /// warm caches (docs/performance.md, "The default path"). Waiters are
    /// served in arrival order either way.
    bool connection_affinity = true;
    /// How long after a call's deadline the pool cuts a connection off when
    /// the server has not answered by then (a frozen server, a silent
    /// network): the socket is shut down, the waiting statement fails at
    /// once, the connection is discarded. The server's statement_timeout,
    /// set from the deadline, normally ends the statement first. At least
    /// 10 ms.
    std::chrono::milliseconds deadline_slack{250};
    /// The start-up check of the fleet's connection budget
    /// (connection_budget.hpp, docs/tuning.md): before anything else, the
    /// constructor reads the budget on a connection of its own (bounded by
    /// connection_timeout) for a fleet of `fleet` whose instances each hold a
    /// pool of max_size. off: nothing is read. warn: on_budget_warning is
    /// called when the fleet does not fit or the budget cannot be read, and
    /// the pool starts. refuse: the constructor throws
    /// connection_budget_exceeded (the message shows the arithmetic) or
    /// connection_budget_unavailable (the server could not be asked: the
    /// check cannot vouch for the fleet). No password in either.
    budget_check_mode budget_check = budget_check_mode::off;
    /// The fleet for budget_check. An empty application_prefix means this
    /// pool's application_name: sessions that carry it (or start with it)
    /// are the fleet's.
    fleet_plan fleet{};
    /// Called by budget_check = warn, on the constructor's thread, with the
    /// budget and its arithmetic; required for warn. May throw: the
    /// constructor then throws it.
    std::function<void(const budget_warning&)> on_budget_warning{};
    /// A lease out longer than this is reported once, by the housekeeping
    /// thread, through on_leak: how long, and where it was taken (the
    /// acquire() call's source location or label; for a gate's call, its
    /// options' call_site). It keeps its connection: a lease held long may
    /// be a long transaction, not a leak. HikariCP's leakDetectionThreshold.
    /// Zero: off (nothing is recorded). Otherwise at least 100 ms.
    std::chrono::milliseconds leak_threshold{0};
    /// Receives each report of leak_threshold, on the housekeeping thread,
    /// without the pool's mutex held; must not throw. Empty: one line on
    /// standard error.
    std::function<void(const lease_leak&)> on_leak{};
};

/// Transaction isolation levels (PostgreSQL's; READ UNCOMMITTED behaves as
/// READ COMMITTED there and is left out).
enum class isolation : std::uint8_t {
    read_committed,   ///< READ COMMITTED, PostgreSQL's default
    repeatable_read,  ///< REPEATABLE READ
    serializable,     ///< SERIALIZABLE
};

/// Settings of one gate transaction of a pqxx_pool (db_bulkhead's
/// `options::transaction`; pqxx_pool::transaction_options).
struct pqxx_transaction_options {
    using clock = std::chrono::steady_clock;

    /// The transaction's isolation level (spelled out in BEGIN, so a
    /// server default does not apply).
    isolation isolation_level = isolation::read_committed;
    /// BEGIN ... READ ONLY instead of READ WRITE.
    bool read_only = false;
    /// SET LOCAL statement_timeout, in whole milliseconds (0 disables the
    /// server's timeout for this transaction). A statement that runs
    /// longer fails with SQLSTATE 57014. In [0, INT_MAX].
    std::optional<std::chrono::milliseconds> statement_timeout{};
    /// SET LOCAL lock_timeout, in whole milliseconds; a lock wait that
    /// lasts longer fails with SQLSTATE 55P03. In [0, INT_MAX].
    std::optional<std::chrono::milliseconds> lock_timeout{};
    /// The call's deadline (db_bulkhead sets it from its options). When
    /// set, statement_timeout becomes the time left when the transaction
    /// begins, if that is shorter; a statement the server cuts short for
    /// it reaches the caller as bulkhead::work_deadline_exceeded.
    clock::time_point deadline = clock::time_point::max();
    /// With a deadline, bound lock waits by the time left as well
    /// (lock_timeout), not only statements.
    bool deadline_sets_lock_timeout = false;
    /// Read-write transactions ask for their transaction id, if one was
    /// assigned, in the COMMIT's own round trip, so that a COMMIT whose
    /// connection is lost can be settled afterwards with
    /// pg_xact_status(): the caller then gets the value (it committed),
    /// the failure (it was rolled back, or no id was assigned: nothing was
    /// written), or bulkhead::commit_unknown (the outcome, or the id
    /// itself, could not be had). After a statement that reported a write
    /// (its command tag: INSERT, UPDATE, ...) the question goes in
    /// pipeline mode, where the server sends its answer before it
    /// commits; otherwise ahead of COMMIT in the same simple query, which
    /// costs one short SELECT, and a write no tag showed (a function
    /// called by a SELECT) is then settled only when the id's answer
    /// arrived. Asking assigns no id. Off: COMMIT and the reset as one
    /// simple query, and a lost COMMIT is commit_unknown; so also with
    /// libpq before 14.5 (no usable pipeline mode).
    bool resolve_commit_outcome = true;
};

namespace detail {

/// The most connections a pool may hold: PostgreSQL's own upper limit for
/// max_connections.
inline constexpr std::size_t max_pool_size = 262143;

/// The number of entries in a comma-separated libpq list (0 for none).
[[nodiscard]] inline std::size_t list_length(const char* list) noexcept {
    if (list == nullptr || *list == '\0') {
        return 0;
    }
    return 1 + static_cast<std::size_t>(std::count(list, list + std::strlen(list), ','));
}

/// Throws std::invalid_argument naming the keyword when the values libpq
/// parsed from a conninfo cannot work: a port list whose length is neither
/// 1 nor the host list's, or a target_session_attrs libpq does not know
/// (libpq would say so only when it connects, on every attempt).
inline void check_conninfo_values(const PQconninfoOption* parsed) {
    const char* host = nullptr;
    const char* hostaddr = nullptr;
    const char* port = nullptr;
    const char* attrs = nullptr;
    for (const PQconninfoOption* option = parsed; option->keyword != nullptr; ++option) {
        const std::string_view keyword = option->keyword;
        if (keyword == "host") {
            host = option->val;
        } else if (keyword == "hostaddr") {
            hostaddr = option->val;
        } else if (keyword == "port") {
            port = option->val;
        } else if (keyword == "target_session_attrs") {
            attrs = option->val;
        }
    }
    const std::size_t hosts = std::max(list_length(host), list_length(hostaddr));
    if (list_length(host) > 0 && list_length(hostaddr) > 0 && list_length(host) != list_length(hostaddr)) {
        throw std::invalid_argument("bulkhead::pqxx_pool: conninfo lists " + std::to_string(list_length(host)) +
                                    " hosts but " + std::to_string(list_length(hostaddr)) + " hostaddr values");
    }
    // Without hosts here they come from PGHOST or a service file.
    if (const std::size_t ports = list_length(port); hosts > 0 && ports > 1 && ports != hosts) {
        throw std::invalid_argument("bulkhead::pqxx_pool: conninfo lists " + std::to_string(ports) + " ports for " +
                                    std::to_string(hosts) + " hosts (port takes one value, or one per host)");
    }
    if (attrs != nullptr && *attrs != '\0') {
        const std::string_view value = attrs;
        if (std::find(std::begin(known_session_attrs), std::end(known_session_attrs), value) ==
            std::end(known_session_attrs)) {
            throw std::invalid_argument("bulkhead::pqxx_pool: conninfo's target_session_attrs is \"" + one_line(value) +
                                        "\"; libpq takes any, read-write, read-only, primary, standby or "
                                        "prefer-standby");
        }
    }
}

/// The target_session_attrs `conninfo` sets, else the environment's
/// PGTARGETSESSIONATTRS, else empty; nothing when the pool must leave it to
/// libpq: a service is named (`service`, PGSERVICE: its file may set one)
/// or libpq is older than 14 (no `primary`). Uses libpq's PQconninfoParse.
[[nodiscard]] inline std::optional<std::string> session_attrs_of(const std::string& conninfo) {
    if (PQlibVersion() < 140000) {
        return std::nullopt;
    }
    std::string attrs;
    bool service = false;
    if (PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), nullptr); parsed != nullptr) {
        const std::unique_ptr<PQconninfoOption, void (*)(PQconninfoOption*)> owned(parsed, PQconninfoFree);
        for (const PQconninfoOption* option = parsed; option->keyword != nullptr; ++option) {
            const std::string_view keyword = option->keyword;
            if (option->val != nullptr && *option->val != '\0') {
                if (keyword == "target_session_attrs") {
                    attrs = option->val;
                } else if (keyword == "service") {
                    service = true;
                }
            }
        }
    }
    // concurrency-mt-unsafe: read once, when the pool is built, as libpq
    // reads them on every connection attempt.
    const auto environment = [](const char* name) -> std::string {
        const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
        return value != nullptr ? value : "";
    };
    if (attrs.empty()) {
        attrs = environment("PGTARGETSESSIONATTRS");
    }
    if (attrs.empty() && (service || !environment("PGSERVICE").empty())) {
        return std::nullopt;
    }
    return attrs;
}

/// Throws std::invalid_argument unless libpq can parse `conninfo` (keywords
/// and syntax only: libpq checks values such as a port number when it
/// connects). Uses libpq's PQconninfoParse; sends nothing.
inline void check_conninfo_syntax(const std::string& conninfo) {
    char* complaint = nullptr;
    if (PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &complaint); parsed != nullptr) {
        const std::unique_ptr<PQconninfoOption, void (*)(PQconninfoOption*)> owned(parsed, PQconninfoFree);
        check_conninfo_values(parsed);
        return;
    }
    const std::string said = complaint != nullptr ? complaint : "libpq could not parse it (out of memory?)";
    PQfreemem(complaint);
    // libpq's complaint quotes the text it stumbled on. After a password
    // that was not quoted as libpq expects (a space, a quote inside), that
    // text is the rest of the password: the complaint is then withheld.
    if (password_may_spill(conninfo)) {
        throw std::invalid_argument(
            "bulkhead::pqxx_pool: conninfo is malformed after a password value (libpq's complaint is withheld: it "
            "would quote part of the password); a value with spaces, quotes or backslashes must be single-quoted, "
            "with \\' and \\\\ inside");
    }
    throw std::invalid_argument("bulkhead::pqxx_pool: conninfo is malformed: " +
                                one_line(scrub(said, longest_first(conninfo_secrets(conninfo)))));
}

/// Throws std::invalid_argument naming the field, unless the options are valid.
inline void check_options(const pqxx_pool_options& options) {
    const auto fail = [](const std::string& what) { throw std::invalid_argument("bulkhead::pqxx_pool: " + what); };
    if (options.conninfo.empty()) {
        fail("conninfo must not be empty");
    }
    if (options.conninfo.find('\0') != std::string::npos) {
        fail("conninfo must not contain a NUL character");
    }
    check_uri_user_information(options.conninfo);
    check_conninfo_syntax(options.conninfo);
    if (options.max_size < 1 || options.max_size > max_pool_size) {
        fail("max_size must be in [1, " + std::to_string(max_pool_size) + "], got " + std::to_string(options.max_size));
    }
    if (options.min_idle > options.max_size) {
        fail("min_idle must not exceed max_size (" + std::to_string(options.max_size) + "), got " +
             std::to_string(options.min_idle));
    }
    const auto at_least = [&](std::string_view field, std::chrono::milliseconds value, std::int64_t minimum) {
        if (value.count() < minimum) {
            fail(std::string(field) +
                 (minimum == 0 ? " must not be negative" : " must be at least " + std::to_string(minimum) + " ms") +
                 ", got " + std::to_string(value.count()) + " ms");
        }
    };
    at_least("connection_timeout", options.connection_timeout, 250);
    at_least("validation_timeout", options.validation_timeout, 250);
    at_least("idle_timeout", options.idle_timeout, 0);
    at_least("max_lifetime", options.max_lifetime, 0);
    at_least("fallback_lifetime", options.fallback_lifetime, 0);
    at_least("validate_after_idle", options.validate_after_idle, 0);
    if (options.keepalive_time.count() != 0) {
        at_least("keepalive_time (when not 0)", options.keepalive_time, 100);
    }
    at_least("deadline_slack", options.deadline_slack, 10);
    if (options.leak_threshold.count() != 0) {
        at_least("leak_threshold (when not 0)", options.leak_threshold, 100);
    }
    if (options.application_name.find('\0') != std::string::npos) {
        fail("application_name must not contain a NUL character");
    }
    if (options.budget_check != budget_check_mode::off) {
        if (options.budget_check == budget_check_mode::warn && !options.on_budget_warning) {
            fail("budget_check = warn needs an on_budget_warning hook");
        }
        fleet_plan plan = options.fleet;
        if (plan.application_prefix.empty()) {
            plan.application_prefix = options.application_name;
        }
        if (plan.instances == 0 && plan.application_prefix.empty()) {
            fail(
                "budget_check with fleet.instances = 0 (counted live) needs fleet.application_prefix or an "
                "application_name");
        }
        check_fleet_plan(options.max_size, plan);
    }
}

}  // namespace detail

}  // namespace bulkhead
