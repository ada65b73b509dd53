// [F10] examples/http_service under load: wrk drives it at about four times
// what its gate can serve; rejected calls are answered 503 with a
// Retry-After, admitted ones 200, nothing else; afterwards every permit and
// slot is free again and SIGTERM ends it with status 0. The test only runs
// programs (the example and /usr/bin/wrk): it needs no Asio of its own.
#include "http_get.hpp"
#include "pg_test_database.hpp"
#include "run_program.hpp"

#include "catch.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#ifndef BULKHEAD_HTTP_SERVICE_PATH
#define BULKHEAD_HTTP_SERVICE_PATH ""
#endif

extern char** environ;  // NOLINT(readability-redundant-declaration): for posix_spawn

using namespace std::chrono_literals;

namespace {

using bulkhead_test::http_answer;
using bulkhead_test::http_get;

constexpr const char* wrk_path = "/usr/bin/wrk";

/// A program with its standard output on a pipe and its standard error in a
/// file. Killed (SIGKILL) and reaped if the test ends while it still runs.
class child_process {
public:
    child_process(const std::string& program, const std::vector<std::string>& arguments,
                  const std::filesystem::path& error_file) {
        std::array<int, 2> out{-1, -1};
        REQUIRE(::pipe2(out.data(), O_CLOEXEC) == 0);
        posix_spawn_file_actions_t actions;
        REQUIRE(::posix_spawn_file_actions_init(&actions) == 0);
        ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
        ::posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, error_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                           0600);
        std::vector<std::string> words{program};
        words.insert(words.end(), arguments.begin(), arguments.end());
        std::vector<char*> argv;
        argv.reserve(words.size() + 1);
        for (std::string& word : words) {
            argv.push_back(word.data());
        }
        argv.push_back(nullptr);
        const int spawned = ::posix_spawn(&m_pid, program.c_str(), &actions, nullptr, argv.data(), environ);
        ::posix_spawn_file_actions_destroy(&actions);
        ::close(out[1]);
        m_out = out[0];
        if (spawned != 0) {
            ::close(m_out);
            FAIL("cannot start " << program << ": " << std::error_code(spawned, std::generic_category()).message());
        }
    }
    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;
    ~child_process() {
        if (!m_status) {
            ::kill(m_pid, SIGKILL);
            int status = 0;
            ::waitpid(m_pid, &status, 0);
        }
        ::close(m_out);
    }

    /// The next line of its standard output (without the newline), or
    /// nothing at its end or after `timeout`.
    std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
        const auto until = std::chrono::steady_clock::now() + timeout;
        while (true) {
            const auto newline = m_pending.find('\n');
            if (newline != std::string::npos) {
                std::string line = m_pending.substr(0, newline);
                m_pending.erase(0, newline + 1);
                return line;
            }
            if (!read_some(until)) {
                return std::nullopt;
            }
        }
    }

    /// Everything left on its standard output, up to its end or `timeout`.
    std::string read_rest(std::chrono::milliseconds timeout) {
        const auto until = std::chrono::steady_clock::now() + timeout;
        while (read_some(until)) {
        }
        return std::exchange(m_pending, {});
    }

    void send_signal(int number) const { ::kill(m_pid, number); }

    /// Its waitpid status once it ended, or nothing after `timeout` (polled).
    std::optional<int> wait_for(std::chrono::milliseconds timeout) {
        const auto until = std::chrono::steady_clock::now() + timeout;
        while (!m_status) {
            int status = 0;
            const pid_t ended = ::waitpid(m_pid, &status, WNOHANG);
            if (ended == m_pid) {
                m_status = status;
            } else if (std::chrono::steady_clock::now() >= until) {
                break;
            } else {
                std::this_thread::sleep_for(10ms);  // polling the child's state: there is nothing to wait on
            }
        }
        return m_status;
    }

private:
    /// Appends what arrives before `until`; false at the end of the output or
    /// on timeout.
    bool read_some(std::chrono::steady_clock::time_point until) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (left <= 0ms) {
            return false;
        }
        pollfd ready{m_out, POLLIN, 0};
        if (::poll(&ready, 1, static_cast<int>(left.count())) <= 0) {
            return false;
        }
        std::array<char, 1024> buffer{};
        const ssize_t got = ::read(m_out, buffer.data(), buffer.size());
        if (got <= 0) {
            return false;
        }
        m_pending.append(buffer.data(), static_cast<std::size_t>(got));
        return true;
    }

    pid_t m_pid = -1;
    int m_out = -1;
    std::string m_pending;
    std::optional<int> m_status;
};

/// The value of header `name` (case-insensitive) in `head`, or nothing.
std::optional<std::string> header(const std::string& head, std::string_view name) {
    std::string lowered = head;
    for (char& c : lowered) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    std::string wanted = "\r\n";
    for (const char c : name) {
        wanted += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    wanted += ':';
    const auto at = lowered.find(wanted);
    if (at == std::string::npos) {
        return std::nullopt;
    }
    const auto start = head.find_first_not_of(' ', at + wanted.size());
    if (start == std::string::npos) {
        return std::string{};
    }
    return head.substr(start, head.find("\r\n", start) - start);
}

/// True for a Retry-After of delay-seconds form with a value of at least 1.
bool positive_seconds(const std::optional<std::string>& value) {
    return value && !value->empty() && value->size() < 10 &&
           value->find_first_not_of("0123456789") == std::string::npos && std::stoi(*value) >= 1;
}

/// key=value lines (GET /stats) as a map.
std::map<std::string, long long> key_values(const std::string& text) {
    std::map<std::string, long long> values;
    const std::regex line(R"(([a-z_0-9]+)=(-?[0-9]+))");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it) {
        values[(*it)[1].str()] = std::stoll((*it)[2].str());
    }
    return values;
}

/// The number in the first match of `pattern` (one group) in `text`, or -1.
long long figure(const std::string& text, const std::string& pattern) {
    std::smatch found;
    return std::regex_search(text, found, std::regex(pattern)) ? std::stoll(found[1].str()) : -1;
}

/// The wrk script: each connection waits about `pause` ms (its first
/// argument; uniformly from half to one and a half times it, so that the
/// connections do not arrive in step) between a response and its next
/// request; every answer is counted by
/// status, every 503's Retry-After and every 200's body checked; done()
/// prints the totals of all threads.
constexpr std::string_view wrk_script = R"lua(
local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("seed", #threads)
end
function init(args)
  pause_ms = tonumber(args[1]) or 0
  math.randomseed(seed)
  statuses = {}
  retry_after_bad = 0
  retry_after_min = 0
  retry_after_max = 0
  body_bad = 0
end
-- Uniform in [pause / 2, 3 pause / 2): connections out of step, not in bursts.
function delay() return math.floor(pause_ms * (0.5 + math.random())) end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 503 then
    local value = headers["Retry-After"]
    local seconds = value and value:match("^%d+$") and tonumber(value)
    if not seconds or seconds < 1 then
      retry_after_bad = retry_after_bad + 1
    else
      if retry_after_min == 0 or seconds < retry_after_min then retry_after_min = seconds end
      if seconds > retry_after_max then retry_after_max = seconds end
    end
  elseif status == 200 and body ~= "42\n" then
    body_bad = body_bad + 1
  end
end
function done(summary, latency, requests)
  local total, bad, low, high, bodies = {}, 0, 0, 0, 0
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do total[status] = (total[status] or 0) + count end
    bad = bad + thread:get("retry_after_bad")
    bodies = bodies + thread:get("body_bad")
    local least = thread:get("retry_after_min")
    if least > 0 and (low == 0 or least < low) then low = least end
    if thread:get("retry_after_max") > high then high = thread:get("retry_after_max") end
  end
  for status, count in pairs(total) do io.write(string.format("status %d %d\n", status, count)) end
  io.write(string.format("retry_after_bad %d\nretry_after_min %d\nretry_after_max %d\nbody_bad %d\n",
                         bad, low, high, bodies))
  local e = summary.errors
  io.write(string.format("socket_errors connect=%d read=%d write=%d timeout=%d\n",
                         e.connect, e.read, e.write, e.timeout))
  io.write(string.format("duration_us %d\n", summary.duration))
end
)lua";

}  // namespace

TEST_CASE(
    "[F10] the HTTP example answers 503 with Retry-After on a rejection and its permits are back after a load run",
    "[pg][F10][examples]") {
    const std::string program = BULKHEAD_HTTP_SERVICE_PATH;
    if (program.empty()) {
        FAIL(
            "examples/http_service was not built: it needs libpqxx and standalone Asio (apt-get install libasio-dev) "
            "and -DBULKHEAD_BUILD_EXAMPLES=ON");
    }
    if (!std::filesystem::exists(wrk_path)) {
        FAIL(wrk_path << " is missing: apt-get install wrk");
    }
    const std::string conninfo = bulkhead_test::conninfo();
    const auto password_at = conninfo.find("password=");
    const std::string password =
        password_at == std::string::npos
            ? ""
            : conninfo.substr(password_at + 9, conninfo.find(' ', password_at) - password_at - 9);
    // NOLINTNEXTLINE(concurrency-mt-unsafe): no other thread runs here (every test joins its threads)
    REQUIRE(::setenv("DB_URL", conninfo.c_str(), 1) == 0);

    // B = 2, Q = 2, 20 ms per call: the gate serves at most B / 20 ms = 100
    // calls a second.
    constexpr int concurrent = 2;
    constexpr int extra_slots = 2;
    constexpr int sleep_ms = 20;
    const auto temporary = std::filesystem::temp_directory_path();
    const auto error_file = temporary / ("bulkhead-f10-" + std::to_string(::getpid()) + ".stderr");
    const auto script_file = temporary / ("bulkhead-f10-" + std::to_string(::getpid()) + ".lua");
    struct remove_at_exit {
        std::vector<std::filesystem::path> paths;
        ~remove_at_exit() {
            for (const auto& path : paths) {
                std::error_code ignored;
                std::filesystem::remove(path, ignored);
            }
        }
    } const cleanup{{error_file, script_file}};
    std::ofstream(script_file) << wrk_script;
    const auto error_output = [&] { return bulkhead_test::detail::read_file(error_file); };

    child_process server(
        program,
        {"--port=0", "--concurrent=" + std::to_string(concurrent), "--extra-slots=" + std::to_string(extra_slots),
         "--queue-wait-ms=10", "--sleep-ms=" + std::to_string(sleep_ms)},
        error_file);
    const std::optional<std::string> first = server.read_line(30s);
    if (!first) {
        FAIL("http_service printed no first line within 30 s; standard error: " << error_output());
    }
    std::smatch listening;
    REQUIRE(std::regex_search(*first, listening, std::regex(R"(^listening on 127\.0\.0\.1:([0-9]+)$)")));
    const int port = std::stoi(listening[1].str());

    // One call through the gate, and a failing one: 500, and not a word of why.
    const std::optional<http_answer> value = http_get(port, "/value");
    REQUIRE(value.has_value());
    CHECK(value->status == 200);
    CHECK(value->body == "42\n");
    const std::optional<http_answer> failed = http_get(port, "/fail");
    REQUIRE(failed.has_value());
    CHECK(failed->status == 500);
    CHECK(failed->body == "internal error\n");
    const std::optional<http_answer> health = http_get(port, "/health");  // K6
    REQUIRE(health.has_value());
    CHECK(health->status == 200);
    CHECK(health->body == "serving\n");

    // The load: 32 connections, each pausing 80 ms on average between an
    // answer and its next request, offer about 32 / 80 ms = 400 requests a second, four
    // times what the gate serves. While it runs, a raw request is repeated
    // until one is turned away, and its Retry-After is read directly.
    std::atomic<bool> load_over{false};
    std::optional<http_answer> probed_503;
    int probes = 0;
    std::thread prober([&] {
        while (!load_over.load()) {
            const std::optional<http_answer> answer = http_get(port, "/value");
            ++probes;
            if (answer && answer->status == 503) {
                probed_503 = answer;
                break;
            }
        }
    });
    const bulkhead_test::program_result load =
        bulkhead_test::run_program(wrk_path, "-t 2 -c 32 -d 3s --timeout 5s -s '" + script_file.string() +
                                                 "' http://127.0.0.1:" + std::to_string(port) + "/value -- 80");
    load_over = true;
    prober.join();
    INFO("wrk: " << load.output);
    REQUIRE(load.exited_zero());

    std::map<int, long long> statuses;
    const std::regex status_line(R"(status ([0-9]+) ([0-9]+))");
    for (auto it = std::sregex_iterator(load.output.begin(), load.output.end(), status_line);
         it != std::sregex_iterator(); ++it) {
        statuses[std::stoi((*it)[1].str())] = std::stoll((*it)[2].str());
    }
    const long long ok = statuses[200];
    const long long turned_away = statuses[503];
    CHECK(ok > 0);
    CHECK(turned_away > 0);
    CHECK(statuses.size() == 2);  // 200 and 503, nothing else
    CHECK(figure(load.output, R"(retry_after_bad ([0-9]+))") == 0);
    CHECK(figure(load.output, R"(retry_after_min ([0-9]+))") >= 1);
    CHECK(figure(load.output, R"(body_bad ([0-9]+))") == 0);
    CHECK(load.output.find("socket_errors connect=0 read=0 write=0 timeout=0") != std::string::npos);
    // Never more than B calls at once, each at least 20 ms: at most B per
    // 20 ms got through, plus the B in flight when the run began.
    const long long duration_us = figure(load.output, R"(duration_us ([0-9]+))");
    REQUIRE(duration_us > 0);
    CHECK(ok <= concurrent * duration_us / (sleep_ms * 1000LL) + concurrent);

    INFO("probes: " << probes);
    REQUIRE(probed_503.has_value());
    INFO("the probe's 503: " << probed_503->head);
    CHECK(positive_seconds(header(probed_503->head, "Retry-After")));

    // After the load: every permit and slot free again, nobody queued. wrk
    // stops with calls in flight (their connections closed), so the figures
    // are polled until those have finished.
    std::map<std::string, long long> stats;
    std::string stats_text;
    const auto until = std::chrono::steady_clock::now() + 10s;
    do {
        const std::optional<http_answer> answer = http_get(port, "/stats");
        REQUIRE(answer.has_value());
        REQUIRE(answer->status == 200);
        stats_text = answer->body;
        stats = key_values(stats_text);
        if (stats["available"] == concurrent && stats["available_slots"] == concurrent + extra_slots &&
            stats["queued"] == 0) {
            break;
        }
        std::this_thread::sleep_for(10ms);  // polling the service's figures: there is nothing to wait on
    } while (std::chrono::steady_clock::now() < until);
    INFO("GET /stats: " << stats_text);
    CHECK(stats["available"] == concurrent);
    CHECK(stats["available_slots"] == concurrent + extra_slots);
    CHECK(stats["queued"] == 0);
    CHECK(stats["running"] == 0);
    CHECK(stats["concurrent"] == concurrent);
    CHECK(stats["extra_slots"] == extra_slots);
    // Every 503 was a rejection the gate counted; every 200 a committed call.
    const long long rejected = stats["rejected_admission_full"] + stats["rejected_admission_timeout"] +
                               stats["rejected_admission_cancelled"] + stats["rejected_pool_timeout"] +
                               stats["rejected_deadline_exceeded"];
    CHECK(rejected >= turned_away + 1);  // + the probe's
    CHECK(stats["answered_503"] == rejected);
    CHECK(stats["completed"] >= ok + 1);  // + the first /value
    CHECK(stats["failed"] == 1);          // /fail
    CHECK(stats["rejected_pool_timeout"] == 0);
    CHECK(stats["retry_after"] >= 1);

    std::cout << "[F10] wrk 3 s at ~4x: " << ok << " x 200, " << turned_away << " x 503 ("
              << (ok * 1000000 / duration_us) << " 200/s, " << ((ok + turned_away) * 1000000 / duration_us)
              << " answers/s), Retry-After " << figure(load.output, R"(retry_after_min ([0-9]+))") << ".."
              << figure(load.output, R"(retry_after_max ([0-9]+))") << " s\n";

    // SIGTERM: a clean exit, with the summary line.
    server.send_signal(SIGTERM);
    const std::optional<int> status = server.wait_for(15s);
    REQUIRE(status.has_value());
    CHECK(WIFEXITED(*status));
    CHECK(WEXITSTATUS(*status) == 0);
    const std::string rest = server.read_rest(5s);
    INFO("after SIGTERM: " << rest);
    CHECK(rest.find("stopped: ") != std::string::npos);

    // The failure was logged, with its reason, and nothing anywhere shows the
    // password.
    const std::string errors = error_output();
    CHECK(errors.find("division by zero") != std::string::npos);
    if (!password.empty()) {
        CHECK(errors.find(password) == std::string::npos);
        CHECK(load.output.find(password) == std::string::npos);
        CHECK(stats_text.find(password) == std::string::npos);
        CHECK(failed->head.find(password) == std::string::npos);
        CHECK(failed->body.find(password) == std::string::npos);
        CHECK(probed_503->body.find(password) == std::string::npos);
    }
}
