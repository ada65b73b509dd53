// A gate under load, its metrics served for Prometheus on a local port.
//
//   export DB_URL='host=127.0.0.1 port=5432 dbname=app user=app'
//   build/release/examples/metrics_server [port] [seconds]
//   curl -s http://127.0.0.1:9464/metrics
//
// Eight workers push transactions of about 2 ms (pg_sleep) through a gate of
// B = 2, Q = 2 with a 5 ms queue wait, over a pool of 3: more than the gate
// admits, so the rejection counters, queue times and work times all move.
// Serves GET /metrics (Prometheus text format 0.0.4) on 127.0.0.1:port (9464
// by default; 0 picks a free port) and stops by itself after `seconds` (60 by
// default). The first line on standard output says where it listens.
#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>
#include <bulkhead/prometheus.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

/// A listening socket on 127.0.0.1:port; returns it and the port it got.
std::pair<int, int> listen_on_loopback(int port) {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) {
        throw std::runtime_error("metrics_server: socket() failed");
    }
    const int yes = 1;
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(listener, 16) != 0) {
        ::close(listener);
        throw std::runtime_error("metrics_server: cannot listen on 127.0.0.1:" + std::to_string(port));
    }
    socklen_t length = sizeof address;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
    return {listener, ntohs(address.sin_port)};
}

/// Answers one HTTP request: /metrics gets the exposition, anything else 404.
void answer(int client, const std::string& metrics) {
    char request[2048];
    const ssize_t got = ::recv(client, request, sizeof request - 1, 0);
    if (got <= 0) {
        return;
    }
    request[got] = '\0';
    const std::string_view line(request);
    const bool wanted = line.starts_with("GET /metrics ") || line.starts_with("GET /metrics?");
    const std::string body = wanted ? metrics : "not found: try /metrics\n";
    const std::string response = std::string(wanted ? "HTTP/1.0 200 OK\r\n" : "HTTP/1.0 404 Not Found\r\n") +
                                 "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" +
                                 "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                                 body;
    std::size_t sent = 0;
    while (sent < response.size()) {
        const ssize_t n = ::send(client, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) {
            return;
        }
        sent += static_cast<std::size_t>(n);
    }
}

}  // namespace

/// Calls the database failed (not rejections: those are in the figures).
std::atomic<long> failed_calls{0};

/// Prints a failed call's reason to standard error, at most once a second
/// (with how many failed since), passwords removed.
void report_failure(const std::string& what) {
    static std::mutex lock;
    static std::optional<std::chrono::steady_clock::time_point> last;
    static long since = 0;
    ++failed_calls;
    const std::lock_guard guard(lock);
    ++since;
    const auto now = std::chrono::steady_clock::now();
    if (!last || now - *last >= 1s) {
        std::cerr << "metrics_server: " << since << " call(s) failed, last: " << bulkhead::redact_conninfo(what)
                  << '\n';
        last = now;
        since = 0;
    }
}

int main(int argc, char** argv) {
    const char* url = std::getenv("DB_URL");  // NOLINT(concurrency-mt-unsafe): before any thread starts
    if (url == nullptr) {
        std::cerr << "metrics_server: set DB_URL to a libpq connection string\n";
        return 2;
    }
    const int port = argc > 1 ? std::atoi(argv[1]) : 9464;
    const auto seconds = std::chrono::seconds(argc > 2 ? std::atoi(argv[2]) : 60);
    try {
        bulkhead::pqxx_pool pool(
            {.conninfo = url, .max_size = 3, .connection_timeout = 500ms, .application_name = "bulkhead-metrics"});
        bulkhead::db_bulkhead gate(pool, /*concurrent=*/2, /*extra_slots=*/2);
        const auto [listener, bound_port] = listen_on_loopback(port);
        std::cout << "listening on http://127.0.0.1:" << bound_port << "/metrics for " << seconds.count() << " s"
                  << std::endl;

        const auto stop_at = std::chrono::steady_clock::now() + seconds;
        std::atomic<bool> stopping{false};
        constexpr int load_threads = 8;
        std::vector<std::jthread> workers;
        workers.reserve(load_threads);
        for (int i = 0; i < load_threads; ++i) {
            workers.emplace_back([&] {
                while (!stopping) {
                    try {
                        (void)gate.try_transaction(5ms,
                                                   [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(0.002)"); });
                    } catch (const std::exception& failure) {
                        // The database failed the call (a restart, a lost
                        // connection): say so once a second at most, back off
                        // a little, and keep serving the figures that show it.
                        report_failure(failure.what());
                        std::this_thread::sleep_for(20ms);
                    }
                }
            });
        }
        while (std::chrono::steady_clock::now() < stop_at) {
            pollfd ready{listener, POLLIN, 0};
            if (::poll(&ready, 1, 100) <= 0) {
                continue;
            }
            const int client = ::accept(listener, nullptr, nullptr);
            if (client < 0) {
                continue;
            }
            bulkhead::prometheus_exposition metrics;
            metrics.add("metrics-demo", gate.stats());
            metrics.add("metrics-demo", pool.stats());
            answer(client, metrics.render());
            ::close(client);
        }
        stopping = true;
        workers.clear();
        ::close(listener);
        const auto stats = gate.stats();
        std::cout << "completed=" << stats.completed
                  << " rejected_full=" << stats.rejections(bulkhead::reject_reason::admission_full)
                  << " rejected_queue_timeout=" << stats.rejections(bulkhead::reject_reason::admission_timeout)
                  << " rejected_pool_timeout=" << stats.rejections(bulkhead::reject_reason::pool_timeout)
                  << " failed=" << failed_calls << '\n';
        return 0;
    } catch (const std::exception& failure) {
        std::cerr << "metrics_server: " << failure.what() << '\n';
        return 1;
    }
}
