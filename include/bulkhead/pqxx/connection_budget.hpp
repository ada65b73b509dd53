// bulkhead: the connection budget of a fleet of instances, read from the server.
//
// A gate protects one application instance; a service runs many, and every
// instance's pool may open up to its max_size connections. The whole fleet
// must fit the server's max_connections, less the slots PostgreSQL keeps for
// administrators:
//
//   peak instances x pool size + other clients <= max_connections
//       - superuser_reserved_connections - reserved_connections (16+)
//
// read_connection_budget() reads the right-hand side and the sessions
// connected now (client backends, by application_name and role) from a live
// server; connection_budget does the arithmetic: whether the fleet fits, the
// headroom, and the largest pool per instance that fits. pqxx_pool runs it at
// start-up when its budget_check option asks (off, warn, refuse).
//
// Guarantees.
// - Reading sends two read-only SELECTs in one round trip on a connection of
//   its own, which it closes; every wait, the connection attempt included,
//   ends by the timeout given.
// - No message built here carries a password: the server's figures, role and
//   application names, and errors that went through scrub() with every
//   password of the conninfo (and PGPASSWORD) removed.
// - The arithmetic is exact integer arithmetic (the overlap rounds up, as
//   Kubernetes' maxSurge does); connection_budget is a plain value that can be
//   filled in by hand for a what-if.
//
// What is counted. Client backends only: since PostgreSQL 12 neither WAL
// senders, autovacuum nor background workers take max_connections slots. The
// reading session itself is not counted. A role without pg_read_all_stats
// sees other roles' sessions without their backend_type; those that belong to
// a database are counted as clients (they may include parallel and
// autovacuum workers: on the safe side), and explain() says how many.
//
// Thread safety: free functions on their arguments, and a value type.
#pragma once

#include <bulkhead/detail/socket_wait.hpp>
#include <bulkhead/pqxx/conninfo.hpp>

#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bulkhead {

/// What the fleet is, besides each instance's pool size: how many instances,
/// which sessions are theirs, how far rolling deploys overlap, and what other
/// clients may take.
struct fleet_plan {
    /// Instances that normally run (for autoscaling, its maximum). 0: count
    /// them live, as the distinct application_names that start with
    /// application_prefix among the sessions connected now, the reading
    /// session's own included; at least 1. Counting live needs every
    /// instance to set an application_name of its own that starts with the
    /// prefix (prefix + host name), and sees only instances that hold a
    /// connection (min_idle >= 1 keeps each one visible). At most 262143.
    std::size_t instances = 0;
    /// Sessions whose application_name starts with this are the fleet's
    /// (counted in instances x pool size); every other session is an other
    /// client. Empty: none is the fleet's (pqxx_pool's check uses its own
    /// application_name then).
    std::string application_prefix{};
    /// The overlap factor of rolling deploys, in percent: new instances start
    /// before old ones stop, so at the peak instances + ceil(instances x
    /// overlap_percent / 100) run at once. 25 is Kubernetes' default maxSurge;
    /// 0 when `instances` is already the peak. At most 1000.
    std::size_t overlap_percent = 25;
    /// Connections other clients may hold at their peak: batch jobs,
    /// migrations, consoles, monitoring. The larger of this and the other
    /// clients connected now is counted. At most 262143.
    std::size_t other_clients = 0;
};

/// Client sessions connected now with one application_name and role.
struct session_group {
    std::string application_name;  ///< empty when the client set none
    std::string role;              ///< the session's user
    std::size_t sessions = 0;      ///< how many
    /// The reading role could not see the session's backend_type (it lacks
    /// pg_read_all_stats): counted as a client, which it most likely is.
    bool kind_hidden = false;
};

/// The server's connection budget and the fleet's demand on it. The first
/// fields are read from the server (read_connection_budget) or filled in by
/// hand; the member functions derive the rest from them.
struct connection_budget {
    /// server_version_num (150018 for 15.18); 0 when unknown.
    int server_version = 0;
    /// max_connections.
    std::size_t max_connections = 0;
    /// superuser_reserved_connections: slots only superusers may take.
    std::size_t superuser_reserved_connections = 0;
    /// reserved_connections (PostgreSQL 16+; 0 before): slots only roles with
    /// pg_use_reserved_connections (and superusers) may take.
    std::size_t reserved_connections = 0;
    /// Client backends connected now, but the reading session, by
    /// application_name and role, largest group first.
    std::vector<session_group> sessions{};
    /// The reading session's application_name.
    std::string own_application_name{};
    /// The reading role is a superuser (it may also take the reserved slots).
    bool role_is_superuser = false;
    /// The reading role has pg_use_reserved_connections (16+).
    bool role_uses_reserved_connections = false;
    /// Connections each instance's pool may open (its max_size).
    std::size_t pool_size = 0;
    /// The fleet.
    fleet_plan plan{};

    /// Connections ordinary roles may open: max_connections less both kinds
    /// of reserved slots (0 when those take everything). The budget leaves
    /// the reserved slots to administrators, also for a role that may use them.
    [[nodiscard]] std::size_t available() const noexcept {
        const std::size_t reserved = superuser_reserved_connections + reserved_connections;
        return max_connections > reserved ? max_connections - reserved : 0;
    }

    /// True when `group` is the fleet's: its application_name starts with the
    /// plan's (non-empty) prefix.
    [[nodiscard]] bool is_fleet(const session_group& group) const noexcept {
        return !plan.application_prefix.empty() &&
               std::string_view(group.application_name).starts_with(plan.application_prefix);
    }

    /// Sessions connected now that are the fleet's.
    [[nodiscard]] std::size_t fleet_sessions_now() const noexcept { return count_sessions(true); }
    /// Sessions connected now that are not the fleet's.
    [[nodiscard]] std::size_t other_sessions_now() const noexcept { return count_sessions(false); }
    /// Sessions whose backend_type the reading role could not see.
    [[nodiscard]] std::size_t hidden_sessions_now() const noexcept {
        std::size_t hidden = 0;
        for (const session_group& group : sessions) {
            hidden += group.kind_hidden ? group.sessions : 0;
        }
        return hidden;
    }

    /// Instances counted live: the distinct application_names of the fleet's
    /// sessions, with the reading session's own when it starts with the
    /// prefix; at least 1.
    [[nodiscard]] std::size_t live_instances() const {
        std::set<std::string_view> names;
        for (const session_group& group : sessions) {
            if (is_fleet(group)) {
                names.insert(group.application_name);
            }
        }
        if (!plan.application_prefix.empty() &&
            std::string_view(own_application_name).starts_with(plan.application_prefix)) {
            names.insert(own_application_name);
        }
        return std::max<std::size_t>(names.size(), 1);
    }

    /// True when the plan leaves the instance count to the live count.
    [[nodiscard]] bool instances_counted_live() const noexcept { return plan.instances == 0; }

    /// Instances that normally run: the plan's, or the live count.
    [[nodiscard]] std::size_t instances() const { return instances_counted_live() ? live_instances() : plan.instances; }

    /// Instances at the peak of a rolling deploy: instances + ceil(instances
    /// x overlap_percent / 100).
    [[nodiscard]] std::size_t peak_instances() const {
        const std::size_t usual = instances();
        return usual + (usual * plan.overlap_percent + 99) / 100;
    }

    /// Other clients counted: the larger of the plan's allowance and those
    /// connected now.
    [[nodiscard]] std::size_t other_clients() const noexcept {
        return std::max(plan.other_clients, other_sessions_now());
    }

    /// Connections the fleet may hold at its peak, other clients included:
    /// peak_instances() x pool_size + other_clients().
    [[nodiscard]] std::size_t demand() const { return peak_instances() * pool_size + other_clients(); }

    /// True when demand() <= available().
    [[nodiscard]] bool fits() const { return demand() <= available(); }

    /// available() - demand(): what is left at the peak, or (negative) how
    /// many connections are missing.
    [[nodiscard]] std::int64_t headroom() const {
        return static_cast<std::int64_t>(available()) - static_cast<std::int64_t>(demand());
    }

    /// The largest pool size per instance that fits: (available() -
    /// other_clients()) / peak_instances(), rounded down; 0 when the other
    /// clients alone take every slot.
    [[nodiscard]] std::size_t largest_pool_size() const {
        const std::size_t left = available() > other_clients() ? available() - other_clients() : 0;
        return left / peak_instances();
    }

    /// The arithmetic in words, several lines: the server's figures, the
    /// sessions connected now by application_name and role (the ten largest
    /// groups), the fleet's demand, whether it fits, the headroom and the
    /// largest pool per instance. Names no password (it has none to name).
    [[nodiscard]] std::string explain() const;

private:
    [[nodiscard]] std::size_t count_sessions(bool fleet) const noexcept {
        std::size_t count = 0;
        for (const session_group& group : sessions) {
            if (is_fleet(group) == fleet) {
                count += group.sessions;
            }
        }
        return count;
    }
};

/// The fleet does not fit the server's connection budget: pqxx_pool's
/// start-up check with budget_check_mode::refuse. The message is the
/// arithmetic (connection_budget::explain()), without a password.
class connection_budget_exceeded : public std::runtime_error {
public:
    connection_budget_exceeded(connection_budget budget, const std::string& what)
        : std::runtime_error(what), m_budget(std::make_shared<const connection_budget>(std::move(budget))) {}

    /// What was read and computed.
    [[nodiscard]] const connection_budget& budget() const noexcept { return *m_budget; }

private:
    std::shared_ptr<const connection_budget> m_budget;  // shared: copying an exception must not throw
};

/// The connection budget could not be read: the server could not be reached
/// in time, or refused the connection or the query. The message carries the
/// server's or libpq's words with every password removed.
class connection_budget_unavailable : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// What pqxx_pool's start-up check does (pqxx_pool_options::budget_check).
enum class budget_check_mode : std::uint8_t {
    off,     ///< nothing is read (the default)
    warn,    ///< on_budget_warning is called when the fleet does not fit or the budget cannot be read
    refuse,  ///< the constructor throws connection_budget_exceeded or connection_budget_unavailable
};

/// What pqxx_pool's check hands to on_budget_warning.
struct budget_warning {
    /// What was read; empty when the budget could not be read.
    std::optional<connection_budget> budget;
    /// The arithmetic, or why the budget could not be read; no password.
    std::string message;
};

namespace detail {

/// Throws std::invalid_argument naming the field unless `pool_size` and
/// `plan` are in range (their products then fit in 64 bits).
inline void check_fleet_plan(std::size_t pool_size, const fleet_plan& plan) {
    constexpr std::size_t most = 262143;  // PostgreSQL's own limit for max_connections
    const auto fail = [](const std::string& what) { throw std::invalid_argument("bulkhead: fleet_plan: " + what); };
    if (pool_size < 1 || pool_size > most) {
        fail("the pool size must be in [1, 262143], got " + std::to_string(pool_size));
    }
    if (plan.instances > most) {
        fail("instances must be at most 262143, got " + std::to_string(plan.instances));
    }
    if (plan.overlap_percent > 1000) {
        fail("overlap_percent must be at most 1000, got " + std::to_string(plan.overlap_percent));
    }
    if (plan.other_clients > most) {
        fail("other_clients must be at most 262143, got " + std::to_string(plan.other_clients));
    }
    if (plan.instances == 0 && plan.application_prefix.empty()) {
        fail("counting instances live (instances = 0) needs an application_prefix");
    }
}

/// `text` in double quotes, with quotes, backslashes and control characters
/// escaped: names in explain() stay on their line.
[[nodiscard]] inline std::string quoted_name(std::string_view text) {
    std::string quoted = "\"";
    for (const char c : text) {
        if (c == '"' || c == '\\') {
            quoted += '\\';
            quoted += c;
        } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
            quoted += '?';
        } else {
            quoted += c;
        }
    }
    quoted += '"';
    return quoted;
}

/// "15.18" for 150018 (PostgreSQL 10 and later); empty for 0.
[[nodiscard]] inline std::string version_text(int version) {
    if (version <= 0) {
        return {};
    }
    return std::to_string(version / 10000) + "." + std::to_string(version % 100);
}

struct pgconn_closer {
    void operator()(PGconn* connection) const noexcept { PQfinish(connection); }
};
struct pgresult_clearer {
    void operator()(PGresult* result) const noexcept { PQclear(result); }
};
using budget_connection = std::unique_ptr<PGconn, pgconn_closer>;
using budget_result = std::unique_ptr<PGresult, pgresult_clearer>;

/// The server's figures and the reading role's standing, in one row:
/// server_version_num, max_connections, superuser_reserved_connections,
/// reserved_connections (NULL before 16: '0'), application_name, is_superuser,
/// pg_use_reserved_connections (NULL before 16: false).
inline constexpr const char* budget_settings_query =
    "SELECT current_setting('server_version_num'), current_setting('max_connections'), "
    "current_setting('superuser_reserved_connections'), coalesce(current_setting('reserved_connections', true), "
    "'0'), current_setting('application_name'), current_setting('is_superuser') = 'on', "
    "coalesce(pg_has_role(to_regrole('pg_use_reserved_connections'), 'USAGE'), false)";

/// The client backends connected now but this one, by application_name and
/// role. A row whose backend_type the role may not read (NULL) counts when
/// it belongs to a database (background processes of the server have none).
inline constexpr const char* budget_sessions_query =
    "SELECT coalesce(application_name, ''), coalesce(usename::text, ''), backend_type IS NULL, count(*) "
    "FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND (backend_type = 'client backend' OR "
    "(backend_type IS NULL AND datid IS NOT NULL)) GROUP BY 1, 2, 3 ORDER BY 4 DESC, 1, 2, 3";

/// A whole number the server sent as text.
[[nodiscard]] inline std::size_t budget_number(const PGresult* result, int row, int column) {
    const char* text = PQgetvalue(result, row, column);
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end == text || *end != '\0') {
        throw connection_budget_unavailable("bulkhead: the connection budget query returned a value that is no number");
    }
    return static_cast<std::size_t>(value);
}

/// Connects to `conninfo` without waiting past `deadline`.
/// \throws connection_budget_unavailable with libpq's words, scrubbed of `secrets`.
[[nodiscard]] inline budget_connection budget_connect(const std::string& conninfo,
                                                      std::chrono::steady_clock::time_point deadline,
                                                      const std::vector<std::string>& secrets) {
    budget_connection connection(PQconnectStart(conninfo.c_str()));
    if (!connection) {
        throw connection_budget_unavailable("bulkhead: the connection budget could not be read: out of memory");
    }
    const auto failed = [&](std::string_view why) {
        std::string said = why.empty() ? std::string(PQerrorMessage(connection.get())) : std::string(why);
        throw connection_budget_unavailable("bulkhead: the connection budget could not be read: " +
                                            one_line(scrub(said, secrets)));
    };
    if (PQstatus(connection.get()) == CONNECTION_BAD) {
        failed({});
    }
    for (PostgresPollingStatusType state = PGRES_POLLING_WRITING;;) {
        if (state == PGRES_POLLING_OK) {
            return connection;
        }
        if (state == PGRES_POLLING_FAILED) {
            failed({});
        }
        if (!wait_socket(PQsocket(connection.get()), state == PGRES_POLLING_WRITING, deadline)) {
            failed("no connection to the server within the timeout");
        }
        state = PQconnectPoll(connection.get());
    }
}

/// Sends both queries in one simple query and collects their two results,
/// without waiting past `deadline`.
/// \throws connection_budget_unavailable with the server's words, scrubbed of `secrets`.
[[nodiscard]] inline std::vector<budget_result> budget_query(PGconn* connection,
                                                             std::chrono::steady_clock::time_point deadline,
                                                             const std::vector<std::string>& secrets) {
    const auto failed = [&](const std::string& said) {
        throw connection_budget_unavailable("bulkhead: the connection budget could not be read: " +
                                            one_line(scrub(said, secrets)));
    };
    const std::string sql = std::string(budget_settings_query) + "; " + budget_sessions_query;
    if (PQsendQuery(connection, sql.c_str()) == 0) {
        failed(PQerrorMessage(connection));
    }
    std::vector<budget_result> results;
    std::string error;
    for (;;) {
        while (PQisBusy(connection) != 0) {
            if (!wait_socket(PQsocket(connection), false, deadline)) {
                failed("no answer from the server within the timeout");
            }
            if (PQconsumeInput(connection) == 0) {
                failed(PQerrorMessage(connection));
            }
        }
        budget_result result(PQgetResult(connection));
        if (!result) {
            break;
        }
        if (PQresultStatus(result.get()) != PGRES_TUPLES_OK && error.empty()) {
            error = PQresultErrorMessage(result.get());
        }
        results.push_back(std::move(result));
    }
    if (!error.empty()) {
        failed(error);
    }
    if (results.size() != 2 || PQntuples(results[0].get()) != 1 || PQnfields(results[0].get()) != 7 ||
        PQnfields(results[1].get()) != 4) {
        failed("the server's answer has an unexpected shape");
    }
    return results;
}

/// The passwords of `conninfo` and of PGPASSWORD, longest first.
[[nodiscard]] inline std::vector<std::string> budget_secrets(const std::string& conninfo) {
    std::vector<std::string> secrets = conninfo_secrets(conninfo);
    // concurrency-mt-unsafe: read once per call; libpq reads it the same way.
    if (const char* from_environment = std::getenv("PGPASSWORD")) {  // NOLINT(concurrency-mt-unsafe)
        secrets.emplace_back(from_environment);
    }
    return longest_first(std::move(secrets));
}

}  // namespace detail

/// Reads the connection budget from the server `conninfo` names, for a fleet
/// of `plan` whose instances each hold a pool of `pool_size`: opens one
/// connection (a connect_timeout from `timeout` is added unless conninfo or
/// PGCONNECT_TIMEOUT sets one), sends two SELECTs in one round trip, closes
/// it. Nothing of it waits past `timeout`. The reading session's
/// application_name (set it in conninfo) is one instance of a live count.
/// \throws std::invalid_argument when pool_size or plan is out of range
///         (naming the field), or conninfo holds a NUL character;
///         connection_budget_unavailable when the server cannot be reached in
///         time or refuses the connection or the query (passwords removed).
/// \note Needs nothing but the right to connect: every role may read the
///       settings and pg_stat_activity (see the file comment for what a role
///       without pg_read_all_stats sees).
[[nodiscard]] inline connection_budget read_connection_budget(
    const std::string& conninfo, std::size_t pool_size, const fleet_plan& plan,
    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    detail::check_fleet_plan(pool_size, plan);
    if (conninfo.find('\0') != std::string::npos) {
        throw std::invalid_argument("bulkhead: read_connection_budget: conninfo must not contain a NUL character");
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const std::vector<std::string> secrets = detail::budget_secrets(conninfo);
    const detail::connect_target target = detail::make_connect_target(conninfo, "");
    const detail::budget_connection connection =
        detail::budget_connect(detail::connect_string(target, timeout), deadline, secrets);
    const std::vector<detail::budget_result> results = detail::budget_query(connection.get(), deadline, secrets);

    connection_budget budget;
    const PGresult* settings = results[0].get();
    budget.server_version = static_cast<int>(detail::budget_number(settings, 0, 0));
    budget.max_connections = detail::budget_number(settings, 0, 1);
    budget.superuser_reserved_connections = detail::budget_number(settings, 0, 2);
    budget.reserved_connections = detail::budget_number(settings, 0, 3);
    budget.own_application_name = PQgetvalue(settings, 0, 4);
    budget.role_is_superuser = std::string_view(PQgetvalue(settings, 0, 5)) == "t";
    budget.role_uses_reserved_connections = std::string_view(PQgetvalue(settings, 0, 6)) == "t";
    const PGresult* sessions = results[1].get();
    const int rows = PQntuples(sessions);
    budget.sessions.reserve(static_cast<std::size_t>(rows));
    for (int row = 0; row < rows; ++row) {
        budget.sessions.push_back(session_group{PQgetvalue(sessions, row, 0), PQgetvalue(sessions, row, 1),
                                                detail::budget_number(sessions, row, 3),
                                                std::string_view(PQgetvalue(sessions, row, 2)) == "t"});
    }
    budget.pool_size = pool_size;
    budget.plan = plan;
    return budget;
}

inline std::string connection_budget::explain() const {
    const auto number = [](auto value) { return std::to_string(value); };
    std::string text;
    // The server's side.
    text += server_version > 0 ? "PostgreSQL " + detail::version_text(server_version) + ": " : std::string();
    text += "max_connections " + number(max_connections) + " - superuser_reserved_connections " +
            number(superuser_reserved_connections);
    if (server_version == 0 || server_version >= 160000 || reserved_connections > 0) {
        text += " - reserved_connections " + number(reserved_connections);
    }
    text += " = " + number(available()) + " connections for ordinary roles\n";
    if (role_is_superuser || role_uses_reserved_connections) {
        text += "  (the reading role ";
        text += role_is_superuser ? "is a superuser" : "has pg_use_reserved_connections";
        text += " and may also take reserved slots; the budget leaves them to administrators)\n";
    }
    // Who is connected.
    std::size_t total = 0;
    for (const session_group& group : sessions) {
        total += group.sessions;
    }
    text += "connected now: " + number(total) + (total == 1 ? " client session" : " client sessions") +
            " (not counting the reading one): " + number(fleet_sessions_now()) + " of the fleet";
    if (!plan.application_prefix.empty()) {
        text += " (application_name " + detail::quoted_name(plan.application_prefix + "*") + ")";
    }
    text += ", " + number(other_sessions_now()) + " other\n";
    constexpr std::size_t shown = 10;
    for (std::size_t i = 0; i < sessions.size() && i < shown; ++i) {
        const session_group& group = sessions[i];
        text += "  " + number(group.sessions) + " x application_name " + detail::quoted_name(group.application_name) +
                " role " + detail::quoted_name(group.role) + (is_fleet(group) ? " (fleet)" : " (other)") + "\n";
    }
    if (sessions.size() > shown) {
        std::size_t rest = 0;
        for (std::size_t i = shown; i < sessions.size(); ++i) {
            rest += sessions[i].sessions;
        }
        text += "  ... and " + number(rest) + " more in " + number(sessions.size() - shown) + " groups\n";
    }
    if (const std::size_t hidden = hidden_sessions_now(); hidden > 0) {
        text += "  (" + number(hidden) +
                " of them of roles whose backend_type the reading role may not see: counted as clients; "
                "pg_read_all_stats tells them apart)\n";
    }
    // The fleet's side.
    text += "instances: " + number(instances());
    if (instances_counted_live()) {
        text += " counted live (distinct application_names starting with " +
                detail::quoted_name(plan.application_prefix) + ", the reading session's included)";
    } else {
        text += " (configured; " + number(live_instances()) + " connected now)";
    }
    text += " + " + number(plan.overlap_percent) + " % overlap for rolling deploys = " + number(peak_instances()) +
            " at the peak\n";
    text += "demand: " + number(peak_instances()) + " instances x pool " + number(pool_size) + " = " +
            number(peak_instances() * pool_size) + ", + other clients " + number(other_clients()) +
            " (the larger of the allowance " + number(plan.other_clients) + " and the " + number(other_sessions_now()) +
            " connected now) = " + number(demand()) + "\n";
    if (fits()) {
        text += "fits: " + number(demand()) + " <= " + number(available()) + ", headroom " + number(headroom()) + "\n";
    } else {
        text += "does not fit: " + number(demand()) + " > " + number(available()) + ", " + number(-headroom()) +
                (headroom() == -1 ? " connection short\n" : " connections short\n");
    }
    text += "largest pool per instance that fits: (" + number(available()) + " - " + number(other_clients()) + ") / " +
            number(peak_instances()) + " = " + number(largest_pool_size());
    if (largest_pool_size() == 0) {
        text += " (no pool fits: shrink the fleet, the other clients, or put PgBouncer in front)";
    }
    return text;
}

}  // namespace bulkhead
