#pragma once

#include "catch.hpp"

#include <sys/wait.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

// pg_test_database.hpp: how a [pg] test reaches PostgreSQL.
//
// `conninfo()` names the suite's shared server: $BULKHEAD_TEST_DATABASE when
// set, otherwise the throwaway server that the `postgres` CTest fixture
// started (its conninfo file under $BULKHEAD_PG_STATE_DIR). Without either
// the test fails, and says how to get one; a [pg] test never skips.
//
// In the pgbouncer pass, $BULKHEAD_PG_STATE_DIR names the `pgbouncer`
// fixture's directory instead: conninfo() then names PgBouncer (whatever
// BULKHEAD_TEST_DATABASE says), `through_pgbouncer()` is true, and
// `server_conninfo()` names the server behind it.
//
// `private_cluster` is a second server of the test's own, for tests that stop
// and start the server under a pool, kill it, or make a streaming standby of
// it and promote that (tests/support/pg_replication.hpp builds a replicated
// cluster from them). It is always a new throwaway cluster,
// even when BULKHEAD_TEST_DATABASE names a server: stopping a server that
// someone else gave us is not ours to do.
//
// Not thread-safe beyond what Catch2 allows: call these from the test's thread.

namespace bulkhead_test {

namespace detail {

/// Quotes `text` as one word for /bin/sh.
inline std::string shell_quote(std::string_view text) {
    std::string quoted = "'";
    for (const char c : text) {
        if (c == '\'') {
            quoted += "'\\''";
        } else {
            quoted += c;
        }
    }
    quoted += '\'';
    return quoted;
}

/// `text` without leading and trailing whitespace.
inline std::string trim(std::string_view text) {
    constexpr std::string_view whitespace = " \t\r\n";
    const auto first = text.find_first_not_of(whitespace);
    if (first == std::string_view::npos) {
        return {};
    }
    const auto last = text.find_last_not_of(whitespace);
    return std::string(text.substr(first, last - first + 1));
}

/// The whole file, or an empty string when it cannot be read.
inline std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        return {};
    }
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The last `count` lines of `text`.
inline std::string last_lines(const std::string& text, std::size_t count) {
    std::size_t start = text.size();
    std::size_t seen = 0;
    // Skip a final newline so that it does not count as an empty last line.
    if (start > 0 && text[start - 1] == '\n') {
        --start;
    }
    while (start > 0) {
        if (text[start - 1] == '\n' && ++seen == count) {
            break;
        }
        --start;
    }
    return text.substr(start);
}

/// The environment variable's value, or an empty string when it is unset.
inline std::string environment(const char* name) {
    // concurrency-mt-unsafe: the tests write the environment only from the
    // main thread while no other thread runs (the examples' tests).
    const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
    return value == nullptr ? std::string() : std::string(value);
}

struct command_result {
    int exit_status;     ///< the command's exit status; -1 if it did not exit normally
    std::string output;  ///< its stdout and stderr, interleaved
};

/// Runs `command` through /bin/sh, with stderr folded into stdout.
inline command_result run_command(const std::string& command) {
    command_result result{-1, {}};
    FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
    if (pipe == nullptr) {
        result.output = "popen failed for: " + command;
        return result;
    }
    std::vector<char> buffer(4096);
    std::size_t got = 0;
    while ((got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
        result.output.append(buffer.data(), got);
    }
    const int status = ::pclose(pipe);
    if (status != -1 && WIFEXITED(status)) {
        result.exit_status = WEXITSTATUS(status);
    }
    return result;
}

/// The state directory of the `pgbouncer` fixture, when $BULKHEAD_PG_STATE_DIR
/// names one (it holds a file `pgbouncer`, PgBouncer's version), else empty.
inline std::filesystem::path pgbouncer_state_dir() {
    const std::string state_dir = environment("BULKHEAD_PG_STATE_DIR");
    if (state_dir.empty() || !std::filesystem::exists(std::filesystem::path(state_dir) / "pgbouncer")) {
        return {};
    }
    return state_dir;
}

/// The conninfo of the shared server, or an empty string and why not.
inline std::string find_conninfo(std::string& why_not) {
    // The pgbouncer pass goes through PgBouncer even when BULKHEAD_TEST_DATABASE
    // names the server (PgBouncer then stands in front of that one).
    if (const std::filesystem::path bouncer = pgbouncer_state_dir(); !bouncer.empty()) {
        return trim(read_file(bouncer / "conninfo"));
    }
    if (std::string from_environment = environment("BULKHEAD_TEST_DATABASE"); !from_environment.empty()) {
        return from_environment;
    }
    const std::string state_dir = environment("BULKHEAD_PG_STATE_DIR");
    if (state_dir.empty()) {
        why_not = "neither BULKHEAD_TEST_DATABASE nor BULKHEAD_PG_STATE_DIR is set";
        return {};
    }
    const std::filesystem::path file = std::filesystem::path(state_dir) / "conninfo";
    std::string from_file = trim(read_file(file));
    if (from_file.empty()) {
        why_not = "there is no conninfo in " + file.string() +
                  " (did the test 'postgres: start throwaway server' run and pass?)";
    }
    return from_file;
}

/// The path of pg_throwaway.sh: $BULKHEAD_PG_SCRIPT, else the one that
/// started the fixture's server (it writes its path into the state dir).
inline std::string find_script() {
    if (std::string from_environment = environment("BULKHEAD_PG_SCRIPT"); !from_environment.empty()) {
        return from_environment;
    }
    const std::string state_dir = environment("BULKHEAD_PG_STATE_DIR");
    if (state_dir.empty()) {
        return {};
    }
    return trim(read_file(std::filesystem::path(state_dir) / "script"));
}

}  // namespace detail

/// The libpq connection string of the suite's PostgreSQL server.
///
/// $BULKHEAD_TEST_DATABASE if set and not empty, else the conninfo file that
/// the `postgres` CTest fixture wrote into $BULKHEAD_PG_STATE_DIR. Found once,
/// then cached.
/// \throws Catch2's test failure (FAIL) when there is neither; never skips.
[[nodiscard]] inline std::string conninfo() {
    // A FAIL inside the initializer leaves the static uninitialized: the next
    // call looks again.
    static const std::string cached = [] {
        std::string why_not;
        std::string found = detail::find_conninfo(why_not);
        if (found.empty()) {
            FAIL("no PostgreSQL for the [pg] tests: "
                 << why_not
                 << ". Run them through ctest, which starts a throwaway server "
                    "(tests/support/pg_throwaway.sh), or set BULKHEAD_TEST_DATABASE to a libpq "
                    "connection string, e.g. 'host=127.0.0.1 port=5432 dbname=bulkhead user=bulkhead "
                    "password=...'. See docs/testing.md.");
        }
        return found;
    }();
    return cached;
}

/// True when the suite runs through PgBouncer (the `pgbouncer` CTest fixture,
/// tests/support/pgbouncer_throwaway.sh): conninfo() names PgBouncer in
/// transaction pooling mode, not the server.
[[nodiscard]] inline bool through_pgbouncer() { return !detail::pgbouncer_state_dir().empty(); }

/// PgBouncer's version as `pgbouncer --version` gives it (e.g. "1.18.0"), or
/// an empty string when the suite does not run through PgBouncer.
[[nodiscard]] inline std::string pgbouncer_version() {
    const std::filesystem::path bouncer = detail::pgbouncer_state_dir();
    return bouncer.empty() ? std::string() : detail::trim(detail::read_file(bouncer / "pgbouncer"));
}

/// The server's own conninfo: behind PgBouncer, the one PgBouncer connects
/// to (for checks that must see the backends themselves: pg_stat_activity,
/// pg_terminate_backend); otherwise conninfo().
/// \throws Catch2's test failure (FAIL) as conninfo() does.
[[nodiscard]] inline std::string server_conninfo() {
    const std::filesystem::path bouncer = detail::pgbouncer_state_dir();
    if (bouncer.empty()) {
        return conninfo();
    }
    std::string found = detail::trim(detail::read_file(bouncer / "server_conninfo"));
    if (found.empty()) {
        FAIL("the pgbouncer fixture wrote no server_conninfo into " << bouncer.string());
    }
    return found;
}

/// Through PgBouncer: conninfo() on the database that PgBouncer maps onto the
/// same one with a pool of ONE server connection, so that its clients take
/// turns on one backend.
/// \throws Catch2's test failure (FAIL) when the suite does not run through PgBouncer.
[[nodiscard]] inline std::string single_backend_conninfo() {
    const std::filesystem::path bouncer = detail::pgbouncer_state_dir();
    const std::string dbname =
        bouncer.empty() ? std::string() : detail::trim(detail::read_file(bouncer / "single_dbname"));
    if (dbname.empty()) {
        FAIL("single_backend_conninfo() needs the pgbouncer fixture (BULKHEAD_PG_STATE_DIR naming its state dir)");
    }
    // libpq takes the last value of a repeated keyword.
    return conninfo() + " dbname=" + dbname;
}

/// A throwaway PostgreSQL cluster of the test's own, in a fresh temporary
/// directory, started with pg_throwaway.sh ($BULKHEAD_PG_SCRIPT, else the
/// script that started the fixture's server) and stopped and deleted by the
/// destructor. It ignores BULKHEAD_TEST_DATABASE: this is always a private
/// server that the test may stop and start.
/// \note Starting one takes about a second; stop_server() makes every
///       connection to it fail until start_server().
class private_cluster {
public:
    /// Starts the cluster and waits until it accepts connections.
    /// \throws Catch2's test failure (FAIL) when it cannot, with the script's
    ///         output and the end of the server's log.
    private_cluster() { start("start"); }

    /// Starts a streaming standby of `primary` (pg_basebackup -R: the same
    /// cluster, role and password, a port of its own) that receives its WAL
    /// from 127.0.0.1:`upstream_port`, the primary's port or a proxy's in
    /// front of it, and waits until it accepts connections.
    /// \throws Catch2's test failure (FAIL) when it cannot.
    private_cluster(const private_cluster& primary, int upstream_port) {
        start("start-standby",
              " " + detail::shell_quote(primary.m_state_dir.string()) + " " + std::to_string(upstream_port));
    }

    private_cluster(const private_cluster&) = delete;
    private_cluster& operator=(const private_cluster&) = delete;

    /// Stops the server and deletes its directory. Never throws: a failure is
    /// written to stderr.
    ~private_cluster() noexcept { stop_quietly(); }

    /// The libpq connection string of this cluster; it stays the same across
    /// stop_server() and start_server().
    [[nodiscard]] const std::string& conninfo() const noexcept { return m_conninfo; }

    /// Stops the server (fast shutdown: open sessions are terminated), keeping
    /// its data, port and password.
    /// \throws Catch2's test failure (FAIL) when it cannot.
    void stop_server() { run_or_fail("stop-server"); }

    /// Starts the server again on the same port and waits until it accepts
    /// connections.
    /// \throws Catch2's test failure (FAIL) when it cannot.
    void start_server() { run_or_fail("start-server"); }

    /// Stops the server at once (immediate mode, as a crash would: no
    /// shutdown checkpoint, sessions cut), keeping its data.
    /// \throws Catch2's test failure (FAIL) when it cannot.
    void kill_server() { run_or_fail("kill-server"); }

    /// Promotes a standby and waits until it accepts writes.
    /// \throws Catch2's test failure (FAIL) when it cannot.
    void promote() { run_or_fail("promote"); }

    /// The server's TCP port (on 127.0.0.1).
    [[nodiscard]] int port() const {
        const std::size_t at = m_conninfo.find("port=");
        return at == std::string::npos ? 0 : std::stoi(m_conninfo.substr(at + 5));
    }

private:
    /// Makes the state directory and runs `subcommand` (start or
    /// start-standby, with `arguments` after the directory).
    void start(std::string_view subcommand, const std::string& arguments = {}) {
        m_script = detail::find_script();
        if (m_script.empty()) {
            FAIL(
                "no pg_throwaway.sh for a private cluster: run this test through ctest, or set "
                "BULKHEAD_PG_SCRIPT to the absolute path of tests/support/pg_throwaway.sh");
        }
        const std::filesystem::path temp = std::filesystem::temp_directory_path();
        std::string pattern = (temp / "bulkhead-private-pg.XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) {
            FAIL("cannot make a temporary directory under " << temp.string());
        }
        m_state_dir = pattern;

        std::string failure = run(subcommand, arguments);
        if (!failure.empty()) {
            stop_quietly();
            FAIL(failure);
        }
        m_conninfo = detail::trim(detail::read_file(m_state_dir / "conninfo"));
        if (m_conninfo.empty()) {
            stop_quietly();
            FAIL("the private cluster started but wrote no conninfo into " << m_state_dir.string());
        }
    }

    /// The shell command that runs one subcommand of the script on this cluster.
    [[nodiscard]] std::string command(std::string_view subcommand, const std::string& arguments = {}) const {
        return "env -u BULKHEAD_TEST_DATABASE bash " + detail::shell_quote(m_script) + " " + std::string(subcommand) +
               " " + detail::shell_quote(m_state_dir.string()) + arguments;
    }

    /// Runs a subcommand on this cluster.
    /// \throws Catch2's test failure (FAIL) with what went wrong.
    void run_or_fail(std::string_view subcommand) const {
        if (std::string failure = run(subcommand); !failure.empty()) {
            FAIL(failure);
        }
    }

    /// Runs a subcommand; returns an empty string on success, else what went wrong.
    [[nodiscard]] std::string run(std::string_view subcommand, const std::string& arguments = {}) const {
        const detail::command_result result = detail::run_command(command(subcommand, arguments));
        if (result.exit_status == 0) {
            return {};
        }
        std::string failure = "private PostgreSQL cluster: '" + command(subcommand, arguments) +
                              "' failed (exit status " + std::to_string(result.exit_status) + ")\n" + result.output;
        const std::string log = detail::read_file(m_state_dir / "server.log");
        if (!log.empty()) {
            failure +=
                "\n--- last lines of " + (m_state_dir / "server.log").string() + ":\n" + detail::last_lines(log, 20);
        }
        return failure;
    }

    /// Stops the server and removes the directory; reports failures on stderr.
    void stop_quietly() noexcept {
        if (m_state_dir.empty()) {
            return;
        }
        try {
            const detail::command_result result = detail::run_command(command("stop"));
            if (result.exit_status != 0) {
                std::fprintf(stderr, "bulkhead_test::private_cluster: stopping %s failed:\n%s\n", m_state_dir.c_str(),
                             result.output.c_str());
            }
        } catch (...) {
            std::fprintf(stderr, "bulkhead_test::private_cluster: stopping %s threw\n", m_state_dir.c_str());
        }
        std::error_code ignored;
        std::filesystem::remove_all(m_state_dir, ignored);
        m_state_dir.clear();
    }

    std::string m_script;               // absolute path of pg_throwaway.sh
    std::filesystem::path m_state_dir;  // the script's STATE_DIR; empty once stopped
    std::string m_conninfo;             // libpq keyword string with the password
};

}  // namespace bulkhead_test
