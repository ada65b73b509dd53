// Faults as test tools, for the [pg] tests: the suite's server behind a
// loopback proxy (tests/support/tcp_proxy.hpp: cut at COMMIT or at the next
// query, go silent, hold new connections unanswered), and a backend that
// stops answering (SIGSTOP of its process: the kernel still acknowledges
// every byte, so nothing but the client's own deadline notices).
#pragma once

#include "pg_helpers.hpp"
#include "tcp_proxy.hpp"

#include "catch.hpp"

#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <future>
#include <random>
#include <regex>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>

#include <sys/types.h>

namespace bulkhead_test {

/// The suite's server as host and port (the proxy needs a TCP address).
inline std::pair<std::string, int> server_address() {
    const std::string info = conninfo();
    std::smatch host;
    std::smatch port;
    const bool found = std::regex_search(info, host, std::regex(R"(host=([0-9.]+))")) &&
                       std::regex_search(info, port, std::regex(R"(port=([0-9]+))"));
    if (!found) {
        FAIL("these tests need a TCP server given as host=<IPv4> port=<n>; got another form");
    }
    return {host[1].str(), std::stoi(port[1].str())};
}

/// The suite's conninfo, redirected through `proxy` (libpq takes the last
/// value of a repeated keyword).
inline std::string through(const tcp_proxy& proxy) {
    return conninfo() + " host=127.0.0.1 port=" + std::to_string(proxy.port());
}

/// A proxy in front of the suite's server.
inline tcp_proxy proxy_to_server() {
    const auto [host, port] = server_address();
    return tcp_proxy(host, port);
}

/// Options for a pool of one connection that reaches the server through `proxy`.
inline bulkhead::pqxx_pool_options proxied_options(const tcp_proxy& proxy, const std::string& application_name) {
    auto options = pool_options(application_name, 1);
    options.conninfo = through(proxy);
    return options;
}

/// Requests the stop and checks that `call` then ends within a second, with
/// bulkhead::work_cancelled over the server's 57014.
inline void check_cancelled_at_once(std::stop_source& source, std::future<void>& call) {
    const auto stop_at = std::chrono::steady_clock::now();
    source.request_stop();
    try {
        call.get();
        FAIL("no exception");
    } catch (const bulkhead::work_cancelled& cancelled) {
        CHECK(sqlstate_of([&] { std::rethrow_if_nested(cancelled); }) == "57014");
    }
    CHECK(std::chrono::steady_clock::now() - stop_at < std::chrono::seconds(1));
}

/// A gate of one permit over a pool of one connection that reaches the
/// server through its own proxy; `deadline_slack` as given.
struct proxied_gate {
    explicit proxied_gate(const std::string& application_name,
                          std::chrono::milliseconds deadline_slack = std::chrono::milliseconds(250))
        : pool(with_slack(proxied_options(proxy, application_name), deadline_slack)), gate(pool, 1, 0) {}
    tcp_proxy proxy = proxy_to_server();
    bulkhead::pqxx_pool pool;
    bulkhead::db_bulkhead<bulkhead::pqxx_pool> gate;

private:
    static bulkhead::pqxx_pool_options with_slack(bulkhead::pqxx_pool_options options,
                                                  std::chrono::milliseconds slack) {
        options.deadline_slack = slack;
        return options;
    }
};

/// What stop_at_random_moments counted.
struct random_stops {
    int cancelled = 0;  ///< calls that ended with work_cancelled or admission_cancelled
    int completed = 0;  ///< calls that finished before their stop
    int hit_next = 0;   ///< next statements that failed with 57014: a cancel that arrived late
};

/// [E6]: `rounds` calls of `gate`, each a pg_sleep(0.001) whose stop is
/// requested at a random moment in its first 3 ms, each followed by the next
/// client's statement, `next_sqlstate()` (its SQLSTATE, empty when it ran).
template <class Gate, class Next>
random_stops stop_at_random_moments(Gate& gate, unsigned seed, int rounds, Next next_sqlstate) {
    std::mt19937 random(seed);
    std::uniform_int_distribution<int> delay_us(0, 3000);
    random_stops counted;
    for (int round = 0; round < rounds; ++round) {
        std::stop_source stop;
        std::thread stopper([&, wait = std::chrono::microseconds(delay_us(random))] {
            std::this_thread::sleep_for(wait);  // a random moment: the race itself is the point
            stop.request_stop();
        });
        try {
            gate.transaction({.stop = stop.get_token()},
                             [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(0.001)"); });
            ++counted.completed;
        } catch (const bulkhead::work_cancelled&) {
            ++counted.cancelled;
        } catch (const bulkhead::admission_cancelled&) {
            ++counted.cancelled;
        }
        stopper.join();
        counted.hit_next += next_sqlstate() == "57014" ? 1 : 0;
    }
    return counted;
}

/// A backend process stopped with SIGSTOP while this lives, continued with
/// SIGCONT when it goes (or by thaw()). The test process must be allowed to
/// signal it: the server runs as the same user, or the tests run as root
/// (CI does).
class frozen_backend {
public:
    explicit frozen_backend(int pid) : m_pid(pid) {
        // A pid that is not a backend's (PgBouncer hands its clients made-up
        // ones) must never be signalled: it may be any process, or a group.
        if (m_pid <= 1 || !detail::read_file("/proc/" + std::to_string(m_pid) + "/comm").starts_with("postgres")) {
            m_pid = 0;
            FAIL("pid " << pid
                        << " is not a PostgreSQL backend on this machine (through a pooler, the backend is not "
                           "the client's to see)");
        }
        if (::kill(static_cast<pid_t>(m_pid), SIGSTOP) != 0) {
            FAIL("cannot SIGSTOP backend " << m_pid << ": run the [pg] tests as the server's user or as root");
        }
    }
    frozen_backend(const frozen_backend&) = delete;
    frozen_backend& operator=(const frozen_backend&) = delete;
    ~frozen_backend() { thaw(); }
    void thaw() noexcept {
        if (m_pid != 0) {
            (void)::kill(static_cast<pid_t>(std::exchange(m_pid, 0)), SIGCONT);
        }
    }

private:
    int m_pid;
};

/// Where the proxy cuts a one-row INSERT's COMMIT in check_lost_commit.
enum class commit_cut : std::uint8_t {
    after_the_server_committed,  ///< the COMMIT reached the server, its answer is lost
    before_the_server_got_it,    ///< the COMMIT never reached the server
};

/// A lost COMMIT, resolved ([pg][commit], and [H7] through PgBouncer): a
/// one-row INSERT into `table` through `gate`, whose connection runs through
/// `proxy`, which cuts it at COMMIT. After the server committed: the call
/// returns its value (settled by the transaction's status), the row is
/// there, the lost connection was not kept. Before: the call fails with
/// broken_connection once the rollback is confirmed, and no row is there.
template <class Gate>
void check_lost_commit(Gate& gate, const bulkhead::pqxx_pool& pool, tcp_proxy& proxy, const scratch_table& table,
                       commit_cut where) {
    const auto insert = [&](pqxx::dbtransaction& tx) {
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
        return 42;
    };
    if (where == commit_cut::after_the_server_committed) {
        proxy.arm(tcp_proxy::cut::drop_after_commit);
        CHECK(gate.transaction(std::chrono::seconds(1), insert) == 42);
        CHECK(proxy.cuts() == 1);  // the answer to COMMIT really was lost
        CHECK(table.rows() == 1);
        CHECK(pool.size() == 0);  // the lost connection was not kept
        return;
    }
    proxy.arm(tcp_proxy::cut::drop_before_commit);
    try {
        (void)gate.transaction(std::chrono::seconds(1), insert);
        FAIL("no exception");
    } catch (const pqxx::broken_connection& lost) {
        CHECK_THAT(lost.what(), Catch::Matchers::ContainsSubstring("confirms the transaction was rolled back"));
    }
    CHECK(proxy.cuts() == 1);
    CHECK(table.rows() == 0);
}

}  // namespace bulkhead_test
