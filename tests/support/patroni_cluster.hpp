// patroni_cluster.hpp: a Patroni cluster of the test's own, for the tests
// under a real HA manager (contract I6, tests/pg/patroni_test.cpp).
//
// `patroni_cluster` runs tests/support/patroni_throwaway.sh: one etcd and two
// PostgreSQL members (node1, node2) managed by Patroni, on free loopback
// ports in a fresh temporary directory, as the `postgres` user when root,
// with synchronous replication (Patroni's synchronous_mode) and DCS timings
// short enough that a lost leader fails over in seconds (ttl(); Patroni 3.1
// and later take no ttl below 20 s). It offers what the tests need: the
// libpq host list naming both members, which member leads, a switchover
// (patronictl), a node lost (its Patroni, postmaster and backends
// SIGKILLed), a node frozen (the same SIGSTOPped: a partitioned leader
// whose clients' connections go silent and whose DCS lease runs out) and
// thawed, and a member's Patroni started again (it rejoins, with pg_rewind
// when needed).
//
// Time: starting takes 5-15 s, stopping about 4 s; every wait is bounded
// (the script's own, 60 s at most). Teardown: the destructor stops every
// process the script started (a frozen one is thawed first) and deletes the
// directory, on any exit of the test; should the test process end without
// unwinding (an abort, a CTest timeout), a process the script left behind
// does the same once it is gone. A failed step FAILs with the end of
// every log (etcd, Patroni, PostgreSQL), so that a CI failure can be read.
//
// Not thread-safe: use it from the test's thread.
#pragma once

#include "pg_test_database.hpp"

#include "catch.hpp"

#include <unistd.h>
#include <cstdlib>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <string_view>

namespace bulkhead_test {

class patroni_cluster {
public:
    /// Starts etcd and both members and returns once a leader takes writes
    /// and a synchronous standby streams.
    /// \throws Catch2's test failure (FAIL) when Patroni or etcd is not
    ///         installed (naming the packages) or the cluster does not start.
    patroni_cluster() {
        m_script = find_script();
        const std::filesystem::path temp = std::filesystem::temp_directory_path();
        std::string pattern = (temp / "bulkhead-patroni.XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) {
            FAIL("cannot make a temporary directory under " << temp.string());
        }
        m_state_dir = pattern;
        if (std::string failure = run("start"); !failure.empty()) {
            stop_quietly();
            FAIL(failure);
        }
        m_conninfo = detail::trim(detail::read_file(m_state_dir / "conninfo"));
        std::istringstream settings(detail::read_file(m_state_dir / "settings"));
        for (std::string line; std::getline(settings, line);) {
            if (const auto equals = line.find('='); equals != std::string::npos) {
                m_settings[line.substr(0, equals)] = line.substr(equals + 1);
            }
        }
        if (m_conninfo.empty() || !m_settings.contains("ttl")) {
            stop_quietly();
            FAIL("the Patroni cluster started but wrote no conninfo or settings into " << m_state_dir.string());
        }
    }

    patroni_cluster(const patroni_cluster&) = delete;
    patroni_cluster& operator=(const patroni_cluster&) = delete;

    /// Stops everything and deletes the directory. Never throws: a failure
    /// is written to stderr.
    ~patroni_cluster() noexcept { stop_quietly(); }

    /// `host=127.0.0.1,127.0.0.1 port=P1,P2 dbname=bulkhead user=bulkhead
    /// password=...`: both members, node1 first, as a user's host list.
    [[nodiscard]] const std::string& conninfo() const noexcept { return m_conninfo; }

    /// One member's own conninfo (node1 or node2), with connect_timeout=5.
    [[nodiscard]] std::string member_conninfo(const std::string& member) const {
        return detail::trim(detail::read_file(m_state_dir / (member + ".conninfo")));
    }

    /// Patroni's leader lock ttl in seconds: how long a silent leader keeps it.
    [[nodiscard]] int ttl() const { return std::stoi(m_settings.at("ttl")); }

    /// The installed Patroni's version, and the etcd API it uses (etcd, etcd3).
    [[nodiscard]] std::string patroni_version() const { return m_settings.at("patroni"); }
    [[nodiscard]] std::string dcs() const { return m_settings.at("dcs"); }

    /// The member whose Patroni says it is the primary now.
    /// \throws Catch2's test failure (FAIL) when none does.
    [[nodiscard]] std::string leader() const { return detail::trim(run_or_fail("leader")); }

    /// The other member.
    [[nodiscard]] static std::string other(const std::string& member) { return member == "node1" ? "node2" : "node1"; }

    /// Waits until a leader other than `not_this` (any, when empty) takes
    /// writes, and returns it.
    /// \throws Catch2's test failure (FAIL) after 60 s.
    [[nodiscard]] std::string wait_for_leader(const std::string& not_this = {}) const {
        return detail::trim(run_or_fail("wait-leader", not_this));
    }

    /// Waits until the leader has a synchronous standby that streams.
    /// \throws Catch2's test failure (FAIL) after 60 s.
    void wait_for_sync_standby() const { (void)run_or_fail("wait-sync"); }

    /// `patronictl switchover --force` from the leader to the other member;
    /// returns when patronictl does (the new leader is then promoted).
    void switchover() const { (void)run_or_fail("switchover"); }

    /// The member's node is lost: its Patroni, postmaster and backends
    /// SIGKILLed (the kernel still resets their connections).
    void kill(const std::string& member) const { (void)run_or_fail("kill", member); }

    /// The member's node stops answering: its Patroni, postmaster and
    /// backends SIGSTOPped. Connections to it stay open and silent, new ones
    /// are accepted by the kernel and never answered, and its DCS lease runs
    /// out after ttl().
    void freeze(const std::string& member) const { (void)run_or_fail("freeze", member); }

    /// SIGCONT to what freeze() stopped.
    void thaw(const std::string& member) const { (void)run_or_fail("thaw", member); }

    /// Starts the member's Patroni again after kill(): it rejoins as a
    /// standby of the leader (pg_rewind when its timeline diverged).
    void restart(const std::string& member) const { (void)run_or_fail("restart", member); }

    /// The end of every log, for a failure message.
    [[nodiscard]] std::string logs() const { return run_command("logs", {}).output; }

private:
    /// $BULKHEAD_PATRONI_SCRIPT, else the one in the source tree.
    static std::string find_script() {
        if (std::string from_environment = detail::environment("BULKHEAD_PATRONI_SCRIPT"); !from_environment.empty()) {
            return from_environment;
        }
        return std::string(BULKHEAD_SOURCE_DIR) + "/tests/support/patroni_throwaway.sh";
    }

    [[nodiscard]] std::string command(std::string_view subcommand, const std::string& argument) const {
        std::string text = "BULKHEAD_PATRONI_OWNER=" + std::to_string(::getpid()) + " bash " +
                           detail::shell_quote(m_script) + " " + std::string(subcommand) + " " +
                           detail::shell_quote(m_state_dir.string());
        if (!argument.empty()) {
            text += " " + detail::shell_quote(argument);
        }
        return text;
    }

    [[nodiscard]] detail::command_result run_command(std::string_view subcommand, const std::string& argument) const {
        return detail::run_command(command(subcommand, argument));
    }

    /// Runs a subcommand; returns an empty string on success, else what went
    /// wrong (the script prints the end of every log on a failed wait).
    [[nodiscard]] std::string run(std::string_view subcommand, const std::string& argument = {}) const {
        const detail::command_result result = run_command(subcommand, argument);
        if (result.exit_status == 0) {
            return {};
        }
        return "Patroni cluster: '" + command(subcommand, argument) + "' failed (exit status " +
               std::to_string(result.exit_status) + ")\n" + result.output;
    }

    /// Runs a subcommand and returns its output.
    /// \throws Catch2's test failure (FAIL) with what went wrong.
    [[nodiscard]] std::string run_or_fail(std::string_view subcommand, const std::string& argument = {}) const {
        const detail::command_result result = run_command(subcommand, argument);
        if (result.exit_status != 0) {
            FAIL("Patroni cluster: '" << command(subcommand, argument) << "' failed (exit status " << result.exit_status
                                      << ")\n"
                                      << result.output);
        }
        return result.output;
    }

    void stop_quietly() noexcept {
        if (m_state_dir.empty()) {
            return;
        }
        try {
            const detail::command_result result = run_command("stop", {});
            if (result.exit_status != 0) {
                std::fprintf(stderr, "bulkhead_test::patroni_cluster: stopping %s failed:\n%s\n", m_state_dir.c_str(),
                             result.output.c_str());
            }
        } catch (...) {
            std::fprintf(stderr, "bulkhead_test::patroni_cluster: stopping %s threw\n", m_state_dir.c_str());
        }
        std::error_code ignored;
        std::filesystem::remove_all(m_state_dir, ignored);
        m_state_dir.clear();
    }

    std::string m_script;                                        // absolute path of patroni_throwaway.sh
    std::filesystem::path m_state_dir;                           // the script's STATE_DIR; empty once stopped
    std::string m_conninfo;                                      // the host list, with the password
    std::map<std::string, std::string, std::less<>> m_settings;  // the script's `settings` file
};

}  // namespace bulkhead_test
