// Hostile input for bulkhead::pqxx_pool and a gate over it: unsatisfiable
// options, malformed connection strings, unreachable hosts (127.0.0.1 on a
// closed port only), bad per-transaction settings. Each must end in a clear
// exception that names the problem, with nothing opened or held afterwards,
// and no password, in any spelling, in any message.
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"

#include "catch.hpp"

#include <climits>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using steady = std::chrono::steady_clock;

namespace {

/// Passwords, each in the spellings that could leak: as written in the
/// conninfo and as libpq reads it.
struct secret_conninfo {
    std::string conninfo;
    std::vector<std::string> secrets;
};

/// Connection strings with passwords for a port nobody listens on
/// (127.0.0.1:1), in keyword and URI form, quoted with spaces and quotes.
std::vector<secret_conninfo> unreachable_with_passwords() {
    return {
        {"host=127.0.0.1 port=1 dbname=x user=u password=Plain-S3cret connect_timeout=2", {"Plain-S3cret"}},
        {R"(host=127.0.0.1 port=1 user=u password='sp ace\'s "quoted" S3cret' connect_timeout=2)",
         {R"(sp ace\'s "quoted" S3cret)", R"(sp ace's "quoted" S3cret)", "quoted\" S3cret", "sp ace"}},
        {"password = 'Spaced-Equals S3cret' host=127.0.0.1 port=1 user=u connect_timeout=2",
         {"Spaced-Equals S3cret", "Spaced-Equals"}},
        {"postgresql://u:Uri-S3cret@127.0.0.1:1/x?connect_timeout=2", {"Uri-S3cret"}},
        {"postgresql://u:p%20w%27d%22S3cret@127.0.0.1:1/x?connect_timeout=2",
         {"p%20w%27d%22S3cret", R"(p w'd"S3cret)", "d%22S3cret"}},
        {"postgres://u@127.0.0.1:1/x?password=Param-S3cret&connect_timeout=2", {"Param-S3cret"}},
    };
}

/// A connection string libpq refuses, and part of its complaint.
struct conninfo_complaint {
    std::string conninfo;
    std::string complaint;
};

/// Pool options that connect nowhere, fail fast, and name their sessions.
bulkhead::pqxx_pool_options nowhere(std::string conninfo) {
    return {.conninfo = std::move(conninfo),
            .max_size = 2,
            .min_idle = 0,
            .connection_timeout = 250ms,
            .validation_timeout = 250ms,
            .application_name = "bulkhead-hostile"};
}

void check_no_secret(const std::string& message, const std::vector<std::string>& secrets) {
    INFO("message: " << message);
    for (const std::string& secret : secrets) {
        CHECK_THAT(message, !Catch::Matchers::ContainsSubstring(secret));
    }
    CHECK_THAT(message, !Catch::Matchers::ContainsSubstring("S3cret"));
}

}  // namespace

TEST_CASE("hostile, unsatisfiable pool options are refused, naming the field and value, nothing opened, no password",
          "[pg][hostile][pool][C5]") {
    const std::string secret = "Opt-S3cret-" + std::to_string(::getpid());
    const std::string base = conninfo() + " password=" + secret;
    struct bad_option {
        const char* what;
        bulkhead::pqxx_pool_options options;
        const char* message;
    };
    const auto with = [&](auto change) {
        bulkhead::pqxx_pool_options options{.conninfo = base, .application_name = "bulkhead-hostile-options"};
        change(options);
        return options;
    };
    using ms = std::chrono::milliseconds;
    const std::vector<bad_option> cases{
        {"max_size 0", with([](auto& o) { o.max_size = 0; }), "max_size must be in [1, 262143], got 0"},
        {"max_size above PostgreSQL's limit", with([](auto& o) { o.max_size = 262144; }),
         "max_size must be in [1, 262143], got 262144"},
        {"max_size SIZE_MAX", with([](auto& o) { o.max_size = std::numeric_limits<std::size_t>::max(); }),
         "max_size must be in [1, 262143]"},
        {"min_idle above max_size", with([](auto& o) { o.max_size = 2, o.min_idle = 3; }),
         "min_idle must not exceed max_size (2), got 3"},
        {"connection_timeout 0", with([](auto& o) { o.connection_timeout = ms(0); }),
         "connection_timeout must be at least 250 ms, got 0 ms"},
        {"connection_timeout 249 ms", with([](auto& o) { o.connection_timeout = ms(249); }),
         "connection_timeout must be at least 250 ms, got 249 ms"},
        {"connection_timeout negative", with([](auto& o) { o.connection_timeout = ms(-1); }),
         "connection_timeout must be at least 250 ms, got -1 ms"},
        {"connection_timeout min()", with([](auto& o) { o.connection_timeout = ms::min(); }),
         "connection_timeout must be at least 250 ms"},
        {"validation_timeout 100 ms", with([](auto& o) { o.validation_timeout = ms(100); }),
         "validation_timeout must be at least 250 ms, got 100 ms"},
        {"idle_timeout negative", with([](auto& o) { o.idle_timeout = ms(-5); }),
         "idle_timeout must not be negative, got -5 ms"},
        {"max_lifetime negative", with([](auto& o) { o.max_lifetime = ms::min(); }),
         "max_lifetime must not be negative"},
        {"validate_after_idle negative", with([](auto& o) { o.validate_after_idle = ms(-1); }),
         "validate_after_idle must not be negative, got -1 ms"},
        {"keepalive_time 50 ms", with([](auto& o) { o.keepalive_time = ms(50); }),
         "keepalive_time (when not 0) must be at least 100 ms, got 50 ms"},
        {"keepalive_time negative", with([](auto& o) { o.keepalive_time = ms::min(); }),
         "keepalive_time (when not 0) must be at least 100 ms"},
        {"empty conninfo", with([](auto& o) { o.conninfo.clear(); }), "conninfo must not be empty"},
        {"NUL in conninfo", with([](auto& o) { o.conninfo += std::string(" options=a\0b", 12); }),
         "conninfo must not contain a NUL character"},
        {"NUL in application_name", with([](auto& o) { o.application_name = std::string("a\0b", 3); }),
         "application_name must not contain a NUL character"},
    };
    for (const bad_option& bad : cases) {
        INFO(bad.what);
        try {
            bulkhead::pqxx_pool pool(bad.options);
            FAIL("accepted: " << bad.what);
        } catch (const std::invalid_argument& refused) {
            const std::string message = refused.what();
            CHECK_THAT(message, Catch::Matchers::StartsWith("bulkhead::pqxx_pool: "));
            CHECK_THAT(message, Catch::Matchers::ContainsSubstring(bad.message));
            check_no_secret(message, {secret});
        }
    }
    auto monitor = outside_connection();
    CHECK(sessions(monitor, "bulkhead-hostile-options") == 0);  // nothing was ever opened
}

TEST_CASE("hostile, unreachable hosts end in pool_timeout naming the connection error, without any password",
          "[pg][hostile][pool][C8]") {
    for (const secret_conninfo& target : unreachable_with_passwords()) {
        INFO("conninfo (redacted): " << bulkhead::redact_conninfo(target.conninfo));
        CHECK_THAT(bulkhead::redact_conninfo(target.conninfo), !Catch::Matchers::ContainsSubstring("S3cret"));
        bulkhead::pqxx_pool pool(nowhere(target.conninfo));
        gate_t gate(pool, 1, 1);
        // The pool directly.
        try {
            (void)pool.acquire();
            FAIL("connected to 127.0.0.1:1");
        } catch (const bulkhead::pool_timeout& timeout) {
            const std::string message = timeout.what();
            CHECK_THAT(message, Catch::Matchers::StartsWith("db pool: no connection within 250 ms"));
            CHECK_THAT(message, Catch::Matchers::ContainsSubstring("last connection error:"));
            CHECK_THAT(message, Catch::Matchers::ContainsSubstring("127.0.0.1"));
            check_no_secret(message, target.secrets);
        }
        // Through the gate: a rejection, permits back.
        try {
            (void)gate.transaction(1s,
                                   [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 1")[0].as<int>(); });
            FAIL("the gate's call connected to 127.0.0.1:1");
        } catch (const bulkhead::pool_timeout& timeout) {
            check_no_secret(timeout.what(), target.secrets);
        }
        const auto answer = gate.try_transaction(1s, [](pqxx::dbtransaction&) {});
        REQUIRE_FALSE(answer);
        CHECK(answer.error() == bulkhead::reject_reason::pool_timeout);
        CHECK(gate.available() == 1);
        CHECK(gate.available_slots() == 2);
        CHECK(pool.in_use() == 0);
        CHECK(pool.waiting() == 0);
        // size() counts a connection being opened: an attempt in flight when
        // the wait ended keeps its slot until it fails too.
        await([&] { return pool.size() == 0; });
    }
}

TEST_CASE("hostile, malformed connection strings are refused by the constructor at once, naming conninfo, no password",
          "[pg][hostile][pool]") {
    // Each names a port nobody listens on or none at all: nothing may connect.
    const std::vector<conninfo_complaint> cases{
        {"host=localhost port", R"(missing "=" after "port")"},
        {"host=localhost port password=s3cret", R"(missing "=" after "port")"},
        {"password=s3cret port=1 =", "invalid connection option \"\""},
        {"port=1 host=127.0.0.1 =value password='s3cret'", "invalid connection option \"\""},
        // An unterminated quote: before, it ran on into the application_name
        // the pool appends, and libpq complained about the pool's text.
        {"port=1 host='unterminated password=s3cret", "unterminated quoted string"},
        {"port=1 password='s3cret", "unterminated quoted string"},
        {"port=1 nonsense_keyword=1 password=s3cret", "invalid connection option \"nonsense_keyword\""},
        {"postgresql://[::1", "IPv6 host address"},
        {"postgresql://[garbage:1/x", "IPv6 host address"},
        // libpq quotes the whole URI in its message: the password must be scrubbed.
        {"postgresql://u:s3cret@[::1", "IPv6 host address"},
        {"postgresql://u:s3cret@[garbage:1/x?connect_timeout=2", "IPv6 host address"},
        {"postgresql://u@127.0.0.1:1/x?password=s3cret&nonsense=1", "invalid URI query parameter: \"nonsense\""},
    };
    for (const conninfo_complaint& bad : cases) {
        INFO("conninfo (redacted): " << bulkhead::redact_conninfo(bad.conninfo));
        const auto start = steady::now();
        try {
            bulkhead::pqxx_pool pool(nowhere(bad.conninfo));
            FAIL("a malformed conninfo was accepted");
        } catch (const std::invalid_argument& refused) {
            const std::string message = refused.what();
            INFO("message: " << message);
            CHECK_THAT(message, Catch::Matchers::StartsWith("bulkhead::pqxx_pool: conninfo is malformed: "));
            CHECK_THAT(message, Catch::Matchers::ContainsSubstring(bad.complaint));
            CHECK_THAT(message, !Catch::Matchers::ContainsSubstring("s3cret"));
        }
        CHECK(steady::now() - start < 1s);
    }
}

TEST_CASE("[I3] host and port lists that differ, an unknown target_session_attrs: refused naming the field",
          "[pg][hostile][pool][I3]") {
    // libpq would refuse each only when it connects, on every attempt.
    const std::vector<conninfo_complaint> cases{
        {"host=127.0.0.1,127.0.0.1 port=1,2,3 password=L1st-S3cret", "lists 3 ports for 2 hosts"},
        {"postgresql://u:L1st-S3cret@127.0.0.1:1,127.0.0.1:2/x?port=1,2,3", "lists 3 ports for 2 hosts"},
        {"host=a,b hostaddr=127.0.0.1 port=1 password=L1st-S3cret", "lists 2 hosts but 1 hostaddr values"},
        {"host=127.0.0.1 port=1 target_session_attrs=master password=L1st-S3cret",
         "target_session_attrs is \"master\"; libpq takes any, read-write, read-only, primary, standby or "
         "prefer-standby"},
    };
    for (const conninfo_complaint& bad : cases) {
        INFO("conninfo (redacted): " << bulkhead::redact_conninfo(bad.conninfo));
        try {
            bulkhead::pqxx_pool pool(nowhere(bad.conninfo));
            FAIL("the conninfo was accepted");
        } catch (const std::invalid_argument& refused) {
            const std::string message = refused.what();
            INFO("message: " << message);
            CHECK_THAT(message, Catch::Matchers::StartsWith("bulkhead::pqxx_pool: conninfo"));
            CHECK_THAT(message, Catch::Matchers::ContainsSubstring(bad.complaint));
            CHECK_THAT(message, !Catch::Matchers::ContainsSubstring("S3cret"));
        }
    }
    // One port for every host, and every value libpq knows, pass.
    for (const char* fine : {"host=127.0.0.1,127.0.0.1 port=1", "host=127.0.0.1 port=1 target_session_attrs=any",
                             "host=127.0.0.1 port=1 target_session_attrs=prefer-standby"}) {
        INFO(fine);
        CHECK_NOTHROW(bulkhead::pqxx_pool(nowhere(fine)));
    }
}

TEST_CASE("hostile, connection strings libpq refuses only when connecting end in pool_timeout with its complaint",
          "[pg][hostile][pool]") {
    // libpq parses these (PQconninfoParse checks keywords and syntax), and
    // refuses their values when it connects. Each names a port nobody
    // listens on, so that a string libpq does accept can never reach a server.
    const std::vector<conninfo_complaint> cases{
        {"port=1 host=127.0.0.1 sslmode=maybe", "sslmode"},
        {"postgresql://u:Uri-S3cret@127.0.0.1:99999999/x", "invalid"},
        {"host=127.0.0.1 port=notaport password=Port-S3cret", "invalid"},
        {"port=1 host= connect_timeout=2", ""},  // empty host: libpq's default socket, on port 1: nothing there
    };
    for (const conninfo_complaint& bad : cases) {
        INFO("conninfo (redacted): " << bulkhead::redact_conninfo(bad.conninfo));
        bulkhead::pqxx_pool pool(nowhere(bad.conninfo));
        const auto start = steady::now();
        try {
            (void)pool.acquire();
            FAIL("connected with a conninfo libpq refuses");
        } catch (const bulkhead::pool_timeout& timeout) {
            const std::string message = timeout.what();
            INFO("message: " << message);
            CHECK_THAT(message, Catch::Matchers::ContainsSubstring("last connection error:"));
            CHECK_THAT(message, Catch::Matchers::ContainsSubstring(bad.complaint));
            check_no_secret(message, {"Uri-S3cret", "Port-S3cret"});
        }
        CHECK(steady::now() - start < 3s);
        CHECK(pool.in_use() == 0);
        await([&] { return pool.size() == 0; });  // an attempt in flight at the timeout fails too
    }
}

TEST_CASE("hostile, transaction settings out of range are refused by name, permits and connection come back",
          "[pg][hostile][pool]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-hostile-tx", 1));
    gate_t gate(pool, 1, 0);
    using ms = std::chrono::milliseconds;
    const auto refused = [&](bulkhead::pqxx_pool::transaction_options settings, const std::string& message) {
        INFO(message);
        int ran = 0;
        CHECK_THROWS_MATCHES(
            gate.transaction({.queue_wait = 1s, .transaction = settings}, [&](pqxx::dbtransaction&) { return ++ran; }),
            std::invalid_argument, Catch::Matchers::Message(message));
        CHECK(ran == 0);
        CHECK(gate.available() == 1);
        CHECK(gate.available_slots() == 1);
        CHECK(pool.in_use() == 0);
    };
    refused({.statement_timeout = ms(-1)},
            "bulkhead::pqxx_pool: statement_timeout must be in [0, 2147483647] ms, got -1 ms");
    refused({.statement_timeout = ms(std::int64_t{INT_MAX} + 1)},
            "bulkhead::pqxx_pool: statement_timeout must be in [0, 2147483647] ms, got 2147483648 ms");
    refused({.lock_timeout = ms::min()}, "bulkhead::pqxx_pool: lock_timeout must be in [0, 2147483647] ms, got " +
                                             std::to_string(ms::min().count()) + " ms");
    refused({.isolation_level = static_cast<bulkhead::isolation>(99)},
            "bulkhead::pqxx_pool: isolation_level is not a bulkhead::isolation");
    // The pool is healthy afterwards: same connection, no transaction left open.
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 3")[0].as<int>(); }) == 3);
    auto monitor = outside_connection();
    CHECK(sessions(monitor, "bulkhead-hostile-tx", "idle in transaction") == 0);
    CHECK(pool.size() == 1);
}

TEST_CASE("hostile, deadlines in the past never reach the server, an enormous queue wait takes a free permit at once",
          "[pg][hostile][deadline]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-hostile-deadline", 1));
    gate_t gate(pool, 1, 1);
    for (const steady::time_point past : {steady::time_point{}, steady::now() - 1h, steady::now()}) {
        CHECK_THROWS_AS(gate.transaction({.queue_wait = 1s, .deadline = past}, [](pqxx::dbtransaction&) { return 1; }),
                        bulkhead::deadline_exceeded);
    }
    CHECK(pool.size() == 0);  // not even a connection was opened
    const auto start = steady::now();
    CHECK(gate.transaction(std::chrono::nanoseconds::max(),
                           [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 4")[0].as<int>(); }) == 4);
    CHECK(steady::now() - start < 5s);  // generous: a loaded 2-core machine
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 2);
}

// A deadline more than INT_MAX ms (24.8 days) away cannot be a statement_timeout
// (PostgreSQL's range); it must not bound the work, nor be refused.
TEST_CASE("hostile, a deadline 30 days away does not bound the work and is not refused", "[pg][hostile][deadline]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-hostile-far-deadline", 1));
    gate_t gate(pool, 1, 0);
    const auto far = steady::now() + std::chrono::hours(24 * 30);
    int value = 0;
    CHECK_NOTHROW(value = gate.transaction({.queue_wait = 1s, .deadline = far}, [](pqxx::dbtransaction& tx) {
        return exec_one_row(tx, "SELECT 5")[0].as<int>();
    }));
    CHECK(value == 5);
}
