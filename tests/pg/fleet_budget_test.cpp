// Contract H1-H3: the connection budget of a fleet, read from the server
// (connection_budget.hpp), the pool's start-up check (budget_check), and a
// fleet of processes (tests/pg/fleet_probe.cpp), each with its own pool and
// gate, against a private cluster whose max_connections is small.
#include "pg_test_database.hpp"
#include "pqxx_compat.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include "catch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using bulkhead_test::conninfo;

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

/// A random password of 24 upper-case consonants, without S, Q, L and T.
/// Not hex digits: a four-character piece of those can be in a message by
/// chance ("5383" of port 53837 failed free_of_passwords() once in CI).
/// Without those four letters no run of four fits the upper-case words
/// connection errors carry (SQLSTATE, SSL, TLS, TCP, PGSSLMODE).
std::string random_password() {
    std::random_device entropy;
    std::string password;
    constexpr std::string_view consonants = "BCDFGHJKMNPRVWXZ";
    for (int i = 0; i < 24; ++i) {
        password += consonants[entropy() % consonants.size()];
    }
    return password;
}

/// True when no password of `conninfo_with_passwords` (nor a four-character
/// piece of one) shows in `text`.
bool free_of_passwords(std::string_view text, const std::string& conninfo_with_passwords) {
    for (const std::string& secret : bulkhead::detail::conninfo_secrets(conninfo_with_passwords)) {
        for (std::size_t at = 0; secret.size() >= 4 && at + 4 <= secret.size(); ++at) {
            if (contains(text, secret.substr(at, 4))) {
                return false;
            }
        }
    }
    return true;
}

/// A hand-filled budget: PostgreSQL 15, max_connections 200, 3 reserved.
bulkhead::connection_budget budget_of(std::size_t pool_size, bulkhead::fleet_plan plan) {
    bulkhead::connection_budget budget;
    budget.server_version = 150018;
    budget.max_connections = 200;
    budget.superuser_reserved_connections = 3;
    budget.pool_size = pool_size;
    budget.plan = std::move(plan);
    return budget;
}

/// The first column of the first row of `sql`.
template <class T>
T scalar(pqxx::connection& connection, const std::string& sql) {
    pqxx::nontransaction tx(connection);
    return bulkhead_test::exec_one_row(tx, sql)[0].as<T>();
}

void run(pqxx::connection& connection, const std::string& sql) {
    pqxx::nontransaction tx(connection);
    (void)tx.exec(sql);
}

/// A private cluster with `settings` applied by ALTER SYSTEM and a restart,
/// and a role `name` that may log in (not a superuser); returns its conninfo.
std::string restart_with(bulkhead_test::private_cluster& cluster, const std::vector<std::string>& settings) {
    {
        pqxx::connection admin(cluster.conninfo());
        for (const std::string& setting : settings) {
            run(admin, "ALTER SYSTEM SET " + setting);
        }
    }
    cluster.stop_server();
    cluster.start_server();
    return cluster.conninfo();
}

std::string add_role(const std::string& admin_conninfo, const std::string& role) {
    const std::string password = random_password();
    pqxx::connection admin(admin_conninfo);
    run(admin, "CREATE ROLE " + role + " LOGIN PASSWORD '" + password + "'");
    return admin_conninfo + " user=" + role + " password=" + password;
}

/// The server's log (pg_throwaway.sh keeps it beside the data directory).
std::filesystem::path server_log(pqxx::connection& admin) {
    return std::filesystem::path(scalar<std::string>(admin, "SELECT current_setting('data_directory')")) / ".." /
           "server.log";
}

/// Lines of the server's log after byte `from` that report SQLSTATE 53300
/// (a connection refused for want of a slot).
long refusals_logged(const std::filesystem::path& log, std::uintmax_t from) {
    std::ifstream in(log, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(from));
    long count = 0;
    for (std::string line; std::getline(in, line);) {
        if (contains(line, "too many clients already") || contains(line, "remaining connection slots are reserved")) {
            ++count;
        }
    }
    return count;
}

/// A TCP port on 127.0.0.1 where nothing listens (bound, then closed).
int closed_port() {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    // NOLINTBEGIN(cppcoreguidelines-pro-type-reinterpret-cast): the sockets API
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    // NOLINTEND(cppcoreguidelines-pro-type-reinterpret-cast)
    ::close(listener);
    return ntohs(address.sin_port);
}

/// What one probe process printed, and how it ended.
struct probe_run {
    std::string output;
    int status = -1;
    [[nodiscard]] int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
    [[nodiscard]] std::string line(std::string_view prefix) const {
        const std::size_t at = output.find(std::string(prefix));
        if (at == std::string::npos) {
            return {};
        }
        return output.substr(at, output.find('\n', at) - at);
    }
};

/// Starts `count` probes at once (names prefix + 1, 2, ...), each with
/// `arguments`, connecting with `probe_conninfo`; once every one has said
/// "ready" (or ended), lets them all start their load together and waits
/// for them. `during` runs while the probes load.
template <class During>
std::vector<probe_run> run_fleet(int count, const std::string& prefix, const std::string& arguments,
                                 const std::string& probe_conninfo, During during) {
    const std::filesystem::path go =
        std::filesystem::temp_directory_path() / ("bulkhead-fleet-go-" + std::to_string(::getpid()));
    std::filesystem::remove(go);
    // concurrency-mt-unsafe: only this thread runs now; the probes inherit it.
    ::setenv("BULKHEAD_FLEET_CONNINFO", probe_conninfo.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
    std::vector<std::FILE*> pipes;
    for (int i = 1; i <= count; ++i) {
        std::string command = std::string("'") + BULKHEAD_FLEET_PROBE_PATH + "' name=";
        command.append(prefix).append(std::to_string(i)).append(" prefix=").append(prefix);
        command.append(" go=").append(go.string()).append(" ").append(arguments);
        pipes.push_back(::popen(command.c_str(), "r"));
        REQUIRE(pipes.back() != nullptr);
    }
    ::unsetenv("BULKHEAD_FLEET_CONNINFO");  // NOLINT(concurrency-mt-unsafe)
    std::vector<probe_run> runs(pipes.size());
    std::array<char, 4096> buffer{};
    for (std::size_t i = 0; i < pipes.size(); ++i) {
        while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipes[i]) != nullptr) {
            runs[i].output += buffer.data();
            if (std::string_view(buffer.data()) == "ready\n") {
                break;
            }
        }
    }
    { std::ofstream(go).put('\n'); }
    during();
    for (std::size_t i = 0; i < pipes.size(); ++i) {
        while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipes[i]) != nullptr) {
            runs[i].output += buffer.data();
        }
        runs[i].status = ::pclose(pipes[i]);
    }
    std::filesystem::remove(go);
    return runs;
}

/// The number after `key=` in `line`, or -1.
long field(const std::string& line, const std::string& key) {
    const std::size_t at = line.find(" " + key + "=");
    if (at == std::string::npos) {
        return -1;
    }
    return std::stol(line.substr(at + key.size() + 2));
}

}  // namespace

TEST_CASE("[H1] the budget arithmetic gives fit, headroom and the largest pool per instance", "[pg][budget]") {
    SECTION("the tuning guide's example: 10 instances with a 25 % overlap, 40 other clients") {
        const bulkhead::connection_budget budget =
            budget_of(12, {.instances = 10, .application_prefix = "api-", .overlap_percent = 25, .other_clients = 40});
        CHECK(budget.available() == 197);
        CHECK(budget.peak_instances() == 13);
        CHECK(budget.demand() == 13 * 12 + 40);
        CHECK(budget.fits());
        CHECK(budget.headroom() == 1);
        CHECK(budget.largest_pool_size() == 12);
        const std::string text = budget.explain();
        CHECK(contains(text, "max_connections 200 - superuser_reserved_connections 3 = 197"));
        CHECK(contains(text, "13 instances x pool 12 = 156"));
        CHECK(contains(text, "fits: 196 <= 197, headroom 1"));
        CHECK(contains(text, "(197 - 40) / 13 = 12"));
        CHECK_FALSE(contains(text, "reserved_connections 0"));  // PostgreSQL 15 has none
    }
    SECTION("one more connection per instance does not fit, and says how many are missing") {
        const bulkhead::connection_budget budget =
            budget_of(13, {.instances = 10, .application_prefix = "api-", .overlap_percent = 25, .other_clients = 40});
        CHECK_FALSE(budget.fits());
        CHECK(budget.headroom() == 197 - (13 * 13 + 40));
        CHECK(budget.largest_pool_size() == 12);
        CHECK(contains(budget.explain(), "does not fit: 209 > 197, 12 connections short"));
    }
    SECTION("the overlap rounds up, as maxSurge does") {
        CHECK(budget_of(1, {.instances = 3, .application_prefix = "a", .overlap_percent = 25}).peak_instances() == 4);
        CHECK(budget_of(1, {.instances = 10, .application_prefix = "a", .overlap_percent = 10}).peak_instances() == 11);
        CHECK(budget_of(1, {.instances = 4, .application_prefix = "a", .overlap_percent = 0}).peak_instances() == 4);
    }
    SECTION("instances counted live are the fleet's distinct application names, the reader's own included") {
        bulkhead::connection_budget budget =
            budget_of(5, {.instances = 0, .application_prefix = "api-", .overlap_percent = 0, .other_clients = 2});
        budget.sessions = {{"api-1", "app", 3, false}, {"api-2", "app", 2, false}, {"psql", "dba", 1, false}};
        budget.own_application_name = "api-3";
        CHECK(budget.live_instances() == 3);
        CHECK(budget.instances() == 3);
        CHECK(budget.fleet_sessions_now() == 5);
        CHECK(budget.other_sessions_now() == 1);
        CHECK(budget.other_clients() == 2);     // the allowance is larger
        budget.own_application_name = "api-1";  // a restart: its old sessions are still there
        CHECK(budget.live_instances() == 2);
        budget.own_application_name = "migration-tool";  // not an instance
        CHECK(budget.live_instances() == 2);
    }
    SECTION("other clients connected now count when they exceed the allowance") {
        bulkhead::connection_budget budget =
            budget_of(20, {.instances = 2, .application_prefix = "api-", .overlap_percent = 0, .other_clients = 5});
        budget.sessions = {{"batch", "etl", 150, false}, {"", "postgres", 10, true}};
        CHECK(budget.other_clients() == 160);
        CHECK(budget.hidden_sessions_now() == 10);
        CHECK_FALSE(budget.fits());
        CHECK(budget.largest_pool_size() == (197 - 160) / 2);
        CHECK(contains(budget.explain(), "10 of them of roles whose backend_type the reading role may not see"));
        budget.sessions = {{"batch", "etl", 197, false}};
        CHECK(budget.largest_pool_size() == 0);
        CHECK(contains(budget.explain(), "no pool fits"));
    }
    SECTION("PostgreSQL 16 and later: reserved_connections is subtracted and shown") {
        bulkhead::connection_budget budget = budget_of(4, {.instances = 2, .application_prefix = "api-"});
        budget.server_version = 170002;
        budget.reserved_connections = 5;
        CHECK(budget.available() == 192);
        CHECK(contains(budget.explain(),
                       "PostgreSQL 17.2: max_connections 200 - superuser_reserved_connections 3 - "
                       "reserved_connections 5 = 192"));
    }
    SECTION("a plan out of range is refused, naming the field") {
        CHECK_THROWS_WITH(bulkhead::read_connection_budget(conninfo(), 4, {.instances = 0}),
                          Catch::Matchers::ContainsSubstring("needs an application_prefix"));
        CHECK_THROWS_WITH(bulkhead::read_connection_budget(conninfo(), 4, {.instances = 2, .overlap_percent = 5000}),
                          Catch::Matchers::ContainsSubstring("overlap_percent must be at most 1000, got 5000"));
        CHECK_THROWS_WITH(bulkhead::read_connection_budget(conninfo(), 0, {.instances = 2}),
                          Catch::Matchers::ContainsSubstring("pool size must be in [1, 262143], got 0"));
    }
}

TEST_CASE("[H1] the budget read from the server has its settings and the sessions by application name and role",
          "[pg][budget]") {
    bulkhead_test::private_cluster cluster;
    const bool sixteen = [&] {
        pqxx::connection admin(cluster.conninfo());
        return scalar<int>(admin, "SHOW server_version_num") >= 160000;
    }();
    std::vector<std::string> settings = {"max_connections = 25", "superuser_reserved_connections = 2"};
    if (sixteen) {
        settings.emplace_back("reserved_connections = 3");
    }
    const std::string admin_conninfo = restart_with(cluster, settings);
    const std::string app = add_role(admin_conninfo, "app");
    const std::string other = add_role(admin_conninfo, "other");
    std::vector<std::unique_ptr<pqxx::connection>> open;
    for (const std::string_view name : {"h1-a", "h1-a", "h1-b"}) {
        open.push_back(std::make_unique<pqxx::connection>(app + " application_name=" + std::string(name)));
    }
    for (int i = 0; i < 2; ++i) {
        open.push_back(std::make_unique<pqxx::connection>(other + " application_name=batch"));
    }
    const std::size_t available = sixteen ? 25 - 2 - 3 : 25 - 2;
    const bulkhead::fleet_plan plan{
        .instances = 0, .application_prefix = "h1-", .overlap_percent = 0, .other_clients = 1};

    SECTION("read by a superuser: every session's kind is visible") {
        const bulkhead::connection_budget budget =
            bulkhead::read_connection_budget(admin_conninfo + " application_name=h1-c", 4, plan);
        CHECK(budget.max_connections == 25);
        CHECK(budget.superuser_reserved_connections == 2);
        CHECK(budget.reserved_connections == (sixteen ? 3U : 0U));
        CHECK(budget.available() == available);
        CHECK(budget.role_is_superuser);
        CHECK(budget.own_application_name == "h1-c");
        const auto has = [&](const std::string& name, const std::string& role, std::size_t count) {
            return std::any_of(budget.sessions.begin(), budget.sessions.end(), [&](const bulkhead::session_group& g) {
                return g.application_name == name && g.role == role && g.sessions == count && !g.kind_hidden;
            });
        };
        CHECK(has("h1-a", "app", 2));
        CHECK(has("h1-b", "app", 1));
        CHECK(has("batch", "other", 2));
        CHECK(budget.sessions.size() == 3);
        CHECK(budget.fleet_sessions_now() == 3);
        CHECK(budget.other_sessions_now() == 2);
        CHECK(budget.live_instances() == 3);  // h1-a, h1-b and the reader, h1-c
        CHECK(budget.demand() == 3 * 4 + 2);
        CHECK(budget.fits());
        CHECK(budget.headroom() == static_cast<std::int64_t>(available) - 14);
        CHECK(budget.largest_pool_size() == (available - 2) / 3);
        const std::string text = budget.explain();
        UNSCOPED_INFO(text);
        CHECK(contains(text, "2 x application_name \"h1-a\" role \"app\" (fleet)"));
        CHECK(contains(text, "2 x application_name \"batch\" role \"other\" (other)"));
        CHECK(contains(text, "is a superuser"));
        CHECK(contains(text, "3 counted live"));
        CHECK(contains(text, sixteen ? "reserved_connections 3 = 20" : "superuser_reserved_connections 2 = 23"));
        CHECK(free_of_passwords(text, app + " " + other + " " + admin_conninfo));
    }
    SECTION("read by an ordinary role: other roles' sessions count, their kind hidden") {
        const bulkhead::connection_budget budget =
            bulkhead::read_connection_budget(app + " application_name=h1-c", 4, plan);
        CHECK_FALSE(budget.role_is_superuser);
        CHECK(budget.available() == available);
        CHECK(budget.fleet_sessions_now() == 3);
        CHECK(budget.other_sessions_now() >= 2);
        CHECK(budget.hidden_sessions_now() >= 2);
        CHECK(budget.live_instances() == 3);
        CHECK(contains(budget.explain(), "backend_type the reading role may not see"));
    }
    SECTION("a configured instance count with an overlap") {
        const bulkhead::connection_budget budget = bulkhead::read_connection_budget(
            admin_conninfo + " application_name=h1-c", 4,
            {.instances = 4, .application_prefix = "h1-", .overlap_percent = 50, .other_clients = 0});
        CHECK(budget.instances() == 4);
        CHECK(budget.peak_instances() == 6);
        CHECK(budget.demand() == 6 * 4 + 2);
        CHECK(budget.fits() == (26 <= available));
        CHECK(contains(budget.explain(), "4 (configured; 3 connected now) + 50 % overlap for rolling deploys = 6"));
    }
}

TEST_CASE(
    "[H2] budget_check = refuse stops a pool whose fleet does not fit, its message the arithmetic without a "
    "password",
    "[pg][budget][pool]") {
    bulkhead::pqxx_pool_options options{.conninfo = conninfo(), .max_size = 50, .application_name = "h2-refuse"};
    options.budget_check = bulkhead::budget_check_mode::refuse;
    options.fleet = {.instances = 10, .overlap_percent = 25};
    try {
        bulkhead::pqxx_pool pool(options);
        FAIL("the pool started");
    } catch (const bulkhead::connection_budget_exceeded& refusal) {
        const bulkhead::connection_budget& budget = refusal.budget();
        const std::string text = refusal.what();
        INFO(text);
        CHECK_FALSE(budget.fits());
        CHECK(budget.peak_instances() == 13);
        CHECK(contains(text, "max_connections " + std::to_string(budget.max_connections)));
        CHECK(contains(text, "13 instances x pool 50 = 650"));
        CHECK(contains(
            text, "does not fit: " + std::to_string(budget.demand()) + " > " + std::to_string(budget.available())));
        CHECK(contains(text, "largest pool per instance that fits: (" + std::to_string(budget.available()) + " - " +
                                 std::to_string(budget.other_clients()) +
                                 ") / 13 = " + std::to_string(budget.largest_pool_size())));
        CHECK(free_of_passwords(text, conninfo()));
    }
}

TEST_CASE("[H2] budget_check = refuse lets a fleet that fits start, and opens no pool connection for the check",
          "[pg][budget][pool]") {
    bulkhead::pqxx_pool_options options{.conninfo = conninfo(), .max_size = 4, .application_name = "h2-fits"};
    options.budget_check = bulkhead::budget_check_mode::refuse;
    options.fleet = {.instances = 2, .overlap_percent = 50};
    bulkhead::pqxx_pool pool(options);
    CHECK(pool.stats().opened == 0);
    CHECK(pool.read_budget().fits());
    auto lease = pool.acquire();
    pqxx::nontransaction tx(lease.connection());
    CHECK(bulkhead_test::exec_one_row(tx, "SELECT 1")[0].as<int>() == 1);
}

TEST_CASE("[H2] budget_check = warn calls its hook with the budget and the pool starts, off does not call it",
          "[pg][budget][pool]") {
    bulkhead::pqxx_pool_options options{.conninfo = conninfo(), .max_size = 50, .application_name = "h2-warn"};
    options.fleet = {.instances = 10};
    std::vector<bulkhead::budget_warning> warnings;
    options.on_budget_warning = [&](const bulkhead::budget_warning& warning) { warnings.push_back(warning); };
    SECTION("warn") {
        options.budget_check = bulkhead::budget_check_mode::warn;
        bulkhead::pqxx_pool pool(options);
        REQUIRE(warnings.size() == 1);
        REQUIRE(warnings[0].budget.has_value());
        CHECK_FALSE(warnings[0].budget->fits());
        CHECK(contains(warnings[0].message, "does not fit"));
        CHECK(free_of_passwords(warnings[0].message, conninfo()));
        auto lease = pool.acquire();
        CHECK(lease);
    }
    SECTION("off") {
        options.budget_check = bulkhead::budget_check_mode::off;
        bulkhead::pqxx_pool pool(options);
        CHECK(warnings.empty());
    }
    SECTION("warn needs a hook") {
        options.budget_check = bulkhead::budget_check_mode::warn;
        options.on_budget_warning = nullptr;
        CHECK_THROWS_WITH(bulkhead::pqxx_pool(options),
                          Catch::Matchers::ContainsSubstring("needs an on_budget_warning hook"));
    }
}

TEST_CASE("[H2] a budget that cannot be read refuses under refuse and warns under warn, naming no password",
          "[pg][budget][pool]") {
    const std::string wrong_password = "h2-Wrong-" + random_password();
    const std::string unreachable =
        "host=127.0.0.1 port=" + std::to_string(closed_port()) + " dbname=x user=x password=" + wrong_password;
    const std::string refused = conninfo() + " password=" + wrong_password;  // the later keyword wins
    const std::string target = GENERATE_COPY(unreachable, refused);
    bulkhead::pqxx_pool_options options{.conninfo = target, .max_size = 4, .connection_timeout = 2s};
    options.fleet = {.instances = 2};
    SECTION("refuse") {
        options.budget_check = bulkhead::budget_check_mode::refuse;
        try {
            bulkhead::pqxx_pool pool(options);
            FAIL("the pool started");
        } catch (const bulkhead::connection_budget_unavailable& failure) {
            INFO(failure.what());
            CHECK(contains(failure.what(), "the connection budget could not be read"));
            CHECK_FALSE(contains(failure.what(), wrong_password.substr(9)));
            CHECK(free_of_passwords(failure.what(), target));
        }
    }
    SECTION("warn") {
        options.budget_check = bulkhead::budget_check_mode::warn;
        std::vector<bulkhead::budget_warning> warnings;
        options.on_budget_warning = [&](const bulkhead::budget_warning& warning) { warnings.push_back(warning); };
        const bulkhead::pqxx_pool pool(options);
        REQUIRE(warnings.size() == 1);
        CHECK_FALSE(warnings[0].budget.has_value());
        CHECK(free_of_passwords(warnings[0].message, target));
    }
}

TEST_CASE("[H3] processes within the budget load without SQLSTATE 53300, beyond it the check refuses before load",
          "[pg][budget][fleet]") {
    bulkhead_test::private_cluster cluster;
    // 20 - 3 superuser_reserved_connections = 17 slots for ordinary roles
    // (PostgreSQL 16 and 17 reserve no other slots by default).
    const std::string admin_conninfo = restart_with(cluster, {"max_connections = 20"});
    const std::string app = add_role(admin_conninfo, "app");
    pqxx::connection admin(admin_conninfo + " application_name=h3-monitor");  // an other client: 1 slot
    const std::filesystem::path log = server_log(admin);
    const auto peak_sessions_while = [&](std::atomic<bool>& loading, long& peak) {
        while (loading.load()) {
            peak = std::max(peak, scalar<long>(admin, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'"));
            std::this_thread::sleep_for(5ms);
        }
    };
    // Three instances, no overlap, 3 other clients allowed; 8 threads each
    // through a gate of B = pool size for 2 s.
    const std::string common = "threads=8 seconds=2 instances=3 overlap=0 others=3";

    SECTION("3 x pool 4 + 3 fits 17: no 53300, every permit back, the fleet at its full 12 connections") {
        const std::uintmax_t log_before = std::filesystem::file_size(log);
        std::atomic<bool> loading{true};
        long peak = 0;
        const auto runs = run_fleet(3, "h3-", common + " pool=4 check=refuse", app, [&] {
            std::thread sampler([&] { peak_sessions_while(loading, peak); });
            std::this_thread::sleep_for(2500ms);
            loading = false;
            sampler.join();
        });
        for (const probe_run& probe : runs) {
            INFO(probe.output);
            CHECK(probe.exit_code() == 0);
            CHECK(probe.line("budget:") == "budget: fits=1 available=17 demand=15 headroom=2 largest_pool=4");
            const std::string load = probe.line("load:");
            CHECK(field(load, "served") > 0);
            CHECK(field(load, "rejected") == 0);
            CHECK(field(load, "errors") == 0);
            CHECK(field(load, "sqlstate_53300") == 0);
            CHECK(field(load, "connect_failures") == 0);
            CHECK(field(load, "permits_back") == 1);
        }
        CHECK(refusals_logged(log, log_before) == 0);
        CHECK(peak == 12);
    }
    SECTION("3 x pool 8 + 3 does not fit 17: every process refuses before its load, naming the numbers") {
        const std::uintmax_t log_before = std::filesystem::file_size(log);
        const auto runs = run_fleet(3, "h3-", common + " pool=8 check=refuse", app, [] {});
        for (const probe_run& probe : runs) {
            INFO(probe.output);
            CHECK(probe.exit_code() == 3);
            const std::string refused = probe.line("refused:");
            CHECK(contains(refused, "max_connections 20 - superuser_reserved_connections 3"));
            CHECK(contains(refused, "= 17 connections for ordinary roles"));
            CHECK(contains(refused, "3 instances x pool 8 = 24"));
            CHECK(contains(refused, "does not fit: 27 > 17, 10 connections short"));
            CHECK(contains(refused, "largest pool per instance that fits: (17 - 3) / 3 = 4"));
            CHECK_FALSE(contains(probe.output, "ready"));
            CHECK_FALSE(contains(probe.output, "load:"));
            CHECK(free_of_passwords(probe.output, app));
        }
        CHECK(refusals_logged(log, log_before) == 0);
    }
    SECTION("the same fleet with warn loads anyway, and the server refuses connections with 53300") {
        const std::uintmax_t log_before = std::filesystem::file_size(log);
        const auto runs = run_fleet(3, "h3-", common + " pool=8 check=warn", app, [] {});
        long failures = 0;
        for (const probe_run& probe : runs) {
            INFO(probe.output);
            CHECK(probe.exit_code() == 0);
            CHECK(contains(probe.line("warning:"), "does not fit: 27 > 17"));
            const std::string load = probe.line("load:");
            failures += field(load, "connect_failures");
            CHECK(field(load, "permits_back") == 1);
        }
        CHECK(failures > 0);
        CHECK(refusals_logged(log, log_before) > 0);
    }
}
