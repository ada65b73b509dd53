// An HTTP/1.1 service whose handlers are C++20 coroutines on standalone Asio,
// each running its transaction through one gate (db_bulkhead::async_transaction).
//
//   export DB_URL='host=127.0.0.1 port=5432 dbname=app user=app'
//   build/dev/examples/http_service --port=8080 --concurrent=2 --extra-slots=2 --queue-wait-ms=10 --sleep-ms=20
//   curl -i http://127.0.0.1:8080/value
//
// Endpoints (GET only; HTTP/1.1 keep-alive, or HTTP/1.0 with
// "Connection: keep-alive"):
//   /value  SELECT 42 FROM pg_sleep(sleep-ms) through the gate: 200 "42\n";
//           503 with Retry-After when the gate turns the call away; 500 when
//           the transaction fails.
//   /fail   SELECT 1/0 through the gate: shows the 500 answer (a generic body;
//           the reason goes to standard error, passwords removed).
//   /stats  the gate's figures as key=value lines: permits, slots, queue,
//           counters, the per-call time and the Retry-After it gives now.
//   /health 200 "serving" or 503 "not serving", then the reason and its
//           detail when there is one (db_bulkhead::health(): closed, the
//           pool cannot connect, the limit at its floor, the budget).
//
// Threads. One event-loop thread (main's) accepts, parses and answers every
// connection; libpqxx blocks, so the transactions run on the gate's B work
// threads, never on the event loop, and the queue-wait timers on the process's
// timer thread (bulkhead/asio.hpp). A coroutine waiting in the gate's queue
// holds no thread.
//
// Retry-After. A rejected call is told when the calls the gate holds now
// should be done, by the gate's own figures, in whole seconds, at least 1:
//
//   Retry-After = max(1, ceil(gate.suggested_retry_delay()))
//               = max(1, ceil((running + queued + 1) * mean permit hold / B))
//
// running = B - available() (calls holding a permit), queued = waiting()
// (calls queued for one), +1 for the rejected call itself, and the mean
// permit hold the gate's running mean of how long a transaction held its
// permit (each finished one weighs 1/16). The gate drains B calls per mean
// hold, so that is how long the present backlog and the retry take. When no
// call has finished yet the gate suggests nothing and the answer is 1 s. A
// database that stops answering altogether finishes no call, so the mean
// stays at its last value until calls finish again. Capped at one hour.
// docs/http_service.md works an example.
//
// The connection string comes from DB_URL (a libpq keyword string or URI),
// as for the other examples: not on the command line, where `ps` would show
// its password. With --port=0 a free port is picked; the first line on
// standard output is always "listening on 127.0.0.1:PORT". SIGINT or SIGTERM
// stops it: no new connections, idle connections closed, requests in progress
// answered (with "Connection: close"), then a summary line and exit status 0.
#include <bulkhead/asio.hpp>
#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/version.hpp>
#include <asio/write.hpp>
#if ASIO_VERSION >= 102400
#include <asio/as_tuple.hpp>
#else
#include <asio/experimental/as_tuple.hpp>
#endif

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

using namespace std::chrono_literals;
using asio::ip::tcp;

namespace {

#if ASIO_VERSION >= 102400
constexpr auto nothrow_awaitable = asio::as_tuple(asio::use_awaitable);
#else
constexpr auto nothrow_awaitable = asio::experimental::as_tuple(asio::use_awaitable);
#endif

using gate_type = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using clock_type = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

struct settings {
    int port = 8080;
    int concurrent = 2;   // B
    int extra_slots = 2;  // Q
    std::chrono::milliseconds queue_wait{10};
    std::chrono::milliseconds sleep{20};
};

constexpr std::string_view usage =
    "usage: http_service [--port=N] [--concurrent=B] [--extra-slots=Q] [--queue-wait-ms=MS] [--sleep-ms=MS]\n"
    "  DB_URL: the libpq connection string (keyword string or postgresql:// URI)\n"
    "  defaults: --port=8080 --concurrent=2 --extra-slots=2 --queue-wait-ms=10 --sleep-ms=20; --port=0 picks one\n";

/// `text` as an int in [low, high], or nothing.
std::optional<int> parse_int(std::string_view text, int low, int high) {
    int value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc{} || end != text.data() + text.size() || value < low || value > high) {
        return std::nullopt;
    }
    return value;
}

/// The command line, or nothing (with the reason on standard error).
std::optional<settings> parse_arguments(int argc, char** argv) {
    settings parsed;
    for (int i = 1; i < argc; ++i) {
        const std::string_view argument(argv[i]);
        const auto equals = argument.find('=');
        const std::string_view name = argument.substr(0, equals);
        const std::string_view value = equals == std::string_view::npos ? "" : argument.substr(equals + 1);
        std::optional<int> number;
        if (name == "--port" && (number = parse_int(value, 0, 65535))) {
            parsed.port = *number;
        } else if (name == "--concurrent" && (number = parse_int(value, 1, 1000))) {
            parsed.concurrent = *number;
        } else if (name == "--extra-slots" && (number = parse_int(value, 0, 100000))) {
            parsed.extra_slots = *number;
        } else if (name == "--queue-wait-ms" && (number = parse_int(value, 0, 600000))) {
            parsed.queue_wait = std::chrono::milliseconds(*number);
        } else if (name == "--sleep-ms" && (number = parse_int(value, 0, 600000))) {
            parsed.sleep = std::chrono::milliseconds(*number);
        } else {
            std::cerr << "http_service: bad argument '" << argument << "'\n" << usage;
            return std::nullopt;
        }
    }
    return parsed;
}

/// The statement behind GET /value: a real round trip that takes `sleep`.
std::string value_statement(std::chrono::milliseconds sleep) {
    const auto ms = sleep.count();
    std::string fraction = std::to_string(ms % 1000);
    fraction.insert(0, 3 - fraction.size(), '0');
    return "SELECT 42 FROM pg_sleep(" + std::to_string(ms / 1000) + "." + fraction + ")";
}

// ---------------------------------------------------------------------------
// Retry-After from the gate's own figures
// ---------------------------------------------------------------------------

/// Retry-After in whole seconds: the gate's suggested retry delay
/// (gate.suggested_retry_delay()), rounded up, at least 1, at most an hour.
/// See the file comment.
long retry_after_seconds(const gate_type& gate) {
    const auto delay = std::chrono::ceil<std::chrono::seconds>(gate.suggested_retry_delay());
    return static_cast<long>(std::clamp<std::chrono::seconds::rep>(delay.count(), 1, 3600));
}

// ---------------------------------------------------------------------------
// HTTP: a small parser for GET requests, and the answers
// ---------------------------------------------------------------------------

/// One parsed request head.
struct request {
    bool valid = false;  // a request line and headers we could read
    bool http10 = false;
    bool keep_alive = false;
    bool has_body = false;  // Content-Length > 0 or Transfer-Encoding: not for a GET here
    std::string method;
    std::string path;  // the target without its query
};

/// One answer.
struct response {
    int status = 200;
    std::string body{};
    std::string extra_headers{};  // each "Name: value\r\n"
    bool close = false;           // close the connection after it
};

std::string lower(std::string_view text) {
    std::string lowered(text);
    for (char& c : lowered) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return lowered;
}

std::string_view trim(std::string_view text) {
    const auto first = text.find_first_not_of(" \t");
    if (first == std::string_view::npos) {
        return {};
    }
    return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

/// True when the comma-separated header value `list` holds `token`
/// (lower-case).
bool has_token(std::string_view list, std::string_view token) {
    const std::string lowered = lower(list);
    std::string_view rest(lowered);
    while (!rest.empty()) {
        const auto comma = rest.find(',');
        if (trim(rest.substr(0, comma)) == token) {
            return true;
        }
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    return false;
}

/// Parses a request head: everything up to and including the blank line.
request parse_request(std::string_view head) {
    request parsed;
    auto line_end = head.find("\r\n");
    const std::string_view line = head.substr(0, line_end);
    const auto first_space = line.find(' ');
    const auto second_space = line.find(' ', first_space == std::string_view::npos ? line.size() : first_space + 1);
    if (first_space == std::string_view::npos || second_space == std::string_view::npos) {
        return parsed;
    }
    const std::string_view version = line.substr(second_space + 1);
    if (version != "HTTP/1.1" && version != "HTTP/1.0") {
        return parsed;
    }
    parsed.http10 = version == "HTTP/1.0";
    parsed.method = std::string(line.substr(0, first_space));
    const std::string_view target = line.substr(first_space + 1, second_space - first_space - 1);
    parsed.path = std::string(target.substr(0, target.find('?')));
    std::optional<bool> connection_close;
    std::optional<bool> connection_keep_alive;
    while (line_end != std::string_view::npos && line_end + 2 < head.size()) {
        const auto start = line_end + 2;
        line_end = head.find("\r\n", start);
        const std::string_view header = head.substr(start, line_end - start);
        if (header.empty()) {
            break;  // the blank line
        }
        const auto colon = header.find(':');
        if (colon == std::string_view::npos || colon == 0) {
            return parsed;
        }
        const std::string name = lower(header.substr(0, colon));
        const std::string_view value = trim(header.substr(colon + 1));
        if (name == "connection") {
            connection_close = has_token(value, "close");
            connection_keep_alive = has_token(value, "keep-alive");
        } else if (name == "content-length") {
            parsed.has_body = parsed.has_body || value != "0";
        } else if (name == "transfer-encoding") {
            parsed.has_body = true;
        }
    }
    parsed.keep_alive = parsed.http10 ? connection_keep_alive.value_or(false) : !connection_close.value_or(false);
    parsed.valid = true;
    return parsed;
}

std::string_view reason_phrase(int status) {
    switch (status) {
        case 200:
            return "OK";
        case 400:
            return "Bad Request";
        case 404:
            return "Not Found";
        case 405:
            return "Method Not Allowed";
        case 431:
            return "Request Header Fields Too Large";
        case 500:
            return "Internal Server Error";
        case 503:
            return "Service Unavailable";
        default:
            return "Unknown";
    }
}

/// The bytes of `answer`; `keep_alive` says whether the connection stays open.
std::string render(const response& answer, const request& asked, bool keep_alive) {
    std::string bytes = "HTTP/1.1 " + std::to_string(answer.status) + " ";
    bytes += reason_phrase(answer.status);
    bytes += "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " + std::to_string(answer.body.size());
    bytes += "\r\n";
    if (!keep_alive) {
        bytes += "Connection: close\r\n";
    } else if (asked.http10) {
        bytes += "Connection: keep-alive\r\n";
    }
    bytes += answer.extra_headers;
    bytes += "\r\n";
    bytes += answer.body;
    return bytes;
}

// ---------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------

/// Logs a failed call to standard error, at most once a second (with how many
/// failed since), passwords removed. Event-loop thread only.
class failure_log {
public:
    void report(std::string_view what, const std::string& reason) {
        ++m_since;
        const auto now = clock_type::now();
        if (!m_last || now - *m_last >= 1s) {
            std::cerr << "http_service: " << m_since << " call(s) failed, last: GET " << what << ": "
                      << bulkhead::redact_conninfo(reason) << '\n';
            m_last = now;
            m_since = 0;
        }
    }

private:
    std::optional<clock_type::time_point> m_last;
    long m_since = 0;
};

/// The reason behind a work_error, for the log.
std::string failure_reason(const std::error_code& code, const std::exception_ptr& failure) {
    std::string reason = code.message();
    if (failure) {
        try {
            std::rethrow_exception(failure);
        } catch (const std::exception& exception) {
            reason += ": ";
            reason += exception.what();
        } catch (...) {
            reason += ": (not a std::exception)";
        }
    }
    return reason;
}

/// Everything the coroutines share. Used on the event-loop thread only, so
/// nothing here is locked.
class service {
public:
    service(gate_type& gate, const settings& configured, tcp::acceptor& acceptor)
        : m_gate(gate), m_settings(configured), m_acceptor(acceptor), m_value_sql(value_statement(configured.sleep)) {}

    /// Accepts connections until stop().
    asio::awaitable<void> accept_connections() {
        asio::steady_timer pause(m_acceptor.get_executor());
        while (!m_stopping) {
            auto [error, socket] = co_await m_acceptor.async_accept(nothrow_awaitable);
            if (m_stopping) {
                break;
            }
            if (error) {
                // Out of descriptors, say: wait a little instead of spinning.
                std::cerr << "http_service: accept failed: " << error.message() << '\n';
                pause.expires_after(100ms);
                (void)co_await pause.async_wait(nothrow_awaitable);
                continue;
            }
            std::error_code ignored;
            socket.set_option(tcp::no_delay(true), ignored);
            asio::co_spawn(m_acceptor.get_executor(), serve(std::move(socket)),
                           [](const std::exception_ptr& escaped) { report_escape(escaped); });
        }
    }

    /// Stops accepting, closes idle connections; busy ones close after their
    /// answer.
    void stop() {
        m_stopping = true;
        std::error_code ignored;
        m_acceptor.close(ignored);
        for (connection& open : m_connections) {
            if (!open.busy) {
                open.socket->close(ignored);
            }
        }
    }

    /// The closing summary.
    void print_summary(std::ostream& out) const {
        const bulkhead::gate_stats stats = m_gate.stats();
        out << "stopped: answered_200=" << m_answered_200 << " answered_503=" << m_answered_503
            << " answered_500=" << m_answered_500 << " completed=" << stats.completed << " failed=" << stats.failed
            << " available=" << stats.available << '\n';
    }

private:
    struct connection {
        tcp::socket* socket;
        bool busy;  // between a complete request head and the end of its answer
    };

    /// Keeps one connection in m_connections for as long as it is served.
    class tracked {
    public:
        tracked(std::list<connection>& list, tcp::socket& socket)
            : m_list(list), m_entry(list.insert(list.end(), connection{&socket, false})) {}
        tracked(const tracked&) = delete;
        tracked& operator=(const tracked&) = delete;
        ~tracked() { m_list.erase(m_entry); }
        [[nodiscard]] connection& operator*() const noexcept { return *m_entry; }

    private:
        std::list<connection>& m_list;
        std::list<connection>::iterator m_entry;
    };

    /// A coroutine that ended with an exception (out of memory, say): said,
    /// not swallowed.
    static void report_escape(const std::exception_ptr& escaped) {
        if (!escaped) {
            return;
        }
        try {
            std::rethrow_exception(escaped);
        } catch (const std::exception& exception) {
            std::cerr << "http_service: a connection ended with an error: "
                      << bulkhead::redact_conninfo(exception.what()) << '\n';
        } catch (...) {
            std::cerr << "http_service: a connection ended with an unknown error\n";
        }
    }

    /// Serves one connection: request heads in order, one answer each.
    asio::awaitable<void> serve(tcp::socket socket) {
        static constexpr std::size_t max_head = 8192;
        const tracked entry(m_connections, socket);
        std::string buffer;
        std::array<char, 4096> chunk{};
        std::error_code ignored;
        while (true) {
            const auto head_end = buffer.find("\r\n\r\n");
            if (head_end == std::string::npos) {
                if (buffer.size() > max_head) {
                    (*entry).busy = true;
                    // Named, not temporaries in the co_await expression: g++ 12.2
                    // destroys a class temporary made in a co_await operand twice
                    // (here: free(): invalid pointer, from the std::string).
                    const response too_large{.status = 431, .body = "request head too large\n", .close = true};
                    const request unread;
                    (void)co_await send(socket, too_large, unread);
                    break;
                }
                if (m_stopping) {
                    break;
                }
                auto [error, got] = co_await socket.async_read_some(asio::buffer(chunk), nothrow_awaitable);
                if (error) {
                    break;  // the peer closed, or stop() closed an idle connection
                }
                buffer.append(chunk.data(), got);
                continue;
            }
            const request asked = parse_request(std::string_view(buffer).substr(0, head_end + 4));
            buffer.erase(0, head_end + 4);
            (*entry).busy = true;
            const response answer = co_await answer_request(asked);
            const bool keep_alive = asked.keep_alive && !answer.close && !m_stopping;
            if (!co_await send(socket, answer, asked, keep_alive) || !keep_alive) {
                break;
            }
            (*entry).busy = false;
        }
        socket.shutdown(tcp::socket::shutdown_both, ignored);
        socket.close(ignored);
    }

    /// Writes one answer; false when the connection failed.
    asio::awaitable<bool> send(tcp::socket& socket, const response& answer, const request& asked,
                               bool keep_alive = false) {
        const std::string bytes = render(answer, asked, keep_alive);
        auto [error, written] = co_await asio::async_write(socket, asio::buffer(bytes), nothrow_awaitable);
        (void)written;
        co_return !error;
    }

    asio::awaitable<response> answer_request(const request& asked) {
        if (!asked.valid || asked.has_body) {
            co_return response{.status = 400, .body = "bad request: GET requests without a body only\n", .close = true};
        }
        if (asked.method != "GET") {
            co_return response{.status = 405, .body = "method not allowed\n", .extra_headers = "Allow: GET\r\n"};
        }
        if (asked.path == "/value") {
            co_return co_await through_gate("/value", m_value_sql);
        }
        if (asked.path == "/fail") {
            co_return co_await through_gate("/fail", m_fail_sql);
        }
        if (asked.path == "/stats") {
            co_return response{.body = stats_text()};
        }
        if (asked.path == "/health") {
            co_return health_answer();
        }
        co_return response{.status = 404, .body = "not found: try /value, /fail, /stats or /health\n"};
    }

    /// 200 while the gate serves (with a warning when it has one), 503 when
    /// it does not; the first line names the reason, the rest is the detail.
    response health_answer() {
        const bulkhead::gate_health health = m_gate.health();
        std::string body = health.serving ? "serving" : "not serving";
        if (health.reason != bulkhead::health_reason::none) {
            body.append(": ").append(bulkhead::to_string(health.reason)).append("\n").append(health.detail);
        }
        return response{.status = health.serving ? 200 : 503, .body = body + "\n"};
    }

    /// Runs `sql` (one row, one int) in a transaction through the gate.
    asio::awaitable<response> through_gate(std::string_view what, const std::string& sql) {
        std::exception_ptr failure;  // lives in this frame until the completion has run
        // The options and the callback are named for the same reason as in
        // serve(): with g++ 12.2 a temporary options{.stop = token} in the
        // co_await expression would release its stop state twice.
        const gate_type::options call{.queue_wait = m_settings.queue_wait};
        const auto work = [statement = &sql](pqxx::dbtransaction& tx) { return tx.exec(*statement)[0][0].as<int>(); };
        auto [code, value] = co_await m_gate.async_transaction(call, work, failure, nothrow_awaitable);
        if (!code) {
            ++m_answered_200;
            co_return response{.body = std::to_string(value) + "\n"};
        }
        if (bulkhead::is_rejection(code)) {
            ++m_answered_503;
            const long retry_after = retry_after_seconds(m_gate);
            co_return response{.status = 503,
                               .body = "overloaded (" + std::string(bulkhead::to_string(bulkhead::rejection_of(code))) +
                                       "), retry after " + std::to_string(retry_after) + " s\n",
                               .extra_headers = "Retry-After: " + std::to_string(retry_after) + "\r\n"};
        }
        // The work started and failed: the client learns nothing of why (a
        // database message may name hosts, users, tables); the log does.
        ++m_answered_500;
        m_failures.report(what, failure_reason(code, failure));
        co_return response{.status = 500, .body = "internal error\n"};
    }

    std::string stats_text() {
        const bulkhead::gate_stats stats = m_gate.stats();
        std::string text;
        const auto line = [&text](std::string_view key, const auto& value) {
            text += key;
            text += '=';
            text += std::to_string(value);
            text += '\n';
        };
        line("concurrent", stats.concurrent);
        line("extra_slots", stats.extra_slots);
        line("available", stats.available);
        line("available_slots", stats.available_slots);
        line("running", stats.running);
        line("queued", stats.queued);
        line("admitted", stats.admitted);
        line("completed", stats.completed);
        line("failed", stats.failed);
        for (std::size_t i = 0; i < bulkhead::reject_reason_count; ++i) {
            const auto reason = static_cast<bulkhead::reject_reason>(i);
            text += "rejected_";
            text += bulkhead::to_string(reason);
            text += '=' + std::to_string(stats.rejections(reason)) + '\n';
        }
        line("answered_200", m_answered_200);
        line("answered_500", m_answered_500);
        line("answered_503", m_answered_503);
        line("mean_permit_hold_us",
             static_cast<long>(std::chrono::duration_cast<std::chrono::microseconds>(stats.mean_permit_hold).count()));
        line("retry_after", retry_after_seconds(m_gate));
        return text;
    }

    gate_type& m_gate;
    settings m_settings;
    tcp::acceptor& m_acceptor;
    const std::string m_value_sql;
    const std::string m_fail_sql = "SELECT 1/0";
    std::list<connection> m_connections;  // the connections being served
    failure_log m_failures;
    bool m_stopping = false;
    long m_answered_200 = 0;
    long m_answered_500 = 0;
    long m_answered_503 = 0;
};

}  // namespace

int main(int argc, char** argv) {
    const std::optional<settings> configured = parse_arguments(argc, argv);
    if (!configured) {
        return 2;
    }
    const char* url = std::getenv("DB_URL");  // NOLINT(concurrency-mt-unsafe): before any thread starts
    if (url == nullptr || *url == '\0') {
        std::cerr << "http_service: set DB_URL to a libpq connection string\n" << usage;
        return 2;
    }
    try {
        asio::io_context io(1);  // run by this thread alone
        // Before "listening" is printed: a SIGTERM sent as soon as it is seen is handled.
        asio::signal_set signals(io, SIGINT, SIGTERM);
        bulkhead::pqxx_pool pool({
            .conninfo = url,
            .max_size = static_cast<std::size_t>(configured->concurrent),  // one per work thread
            .min_idle = static_cast<std::size_t>(configured->concurrent),  // opened now: a bad DB_URL fails here
            .connection_timeout = 1s,
            .application_name = "bulkhead-http-service",
        });
        gate_type gate(pool, configured->concurrent, configured->extra_slots);
        tcp::acceptor acceptor(
            io, tcp::endpoint(asio::ip::address_v4::loopback(), static_cast<unsigned short>(configured->port)));
        service served(gate, *configured, acceptor);
        signals.async_wait([&served](const std::error_code& error, int) {
            if (!error) {
                served.stop();
            }
        });
        asio::co_spawn(io, served.accept_connections(), [](const std::exception_ptr& escaped) {
            if (escaped) {
                std::rethrow_exception(escaped);  // out of io.run(), to the catch below
            }
        });
        std::cout << "listening on 127.0.0.1:" << acceptor.local_endpoint().port() << std::endl;
        // Returns once stop() has closed the acceptor and every connection has
        // ended; a call in flight keeps it running until it completes.
        io.run();
        served.print_summary(std::cout);
        return 0;
    } catch (const std::exception& failure) {
        std::cerr << "http_service: " << bulkhead::redact_conninfo(failure.what()) << '\n';
        return 1;
    }
}
