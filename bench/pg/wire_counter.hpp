// bench/pg: counting round trips on the wire.
//
// wire_counter is a loopback TCP relay in front of the server that reads the
// frontend side of the PostgreSQL protocol (v3) as it passes and counts the
// messages that make the client wait for the server: Query ('Q', the simple
// protocol: one round trip however many statements it holds) and Sync ('S',
// the end of an extended-protocol exchange). Their sum is the number of round
// trips a client made, whatever the library above libpq does. The server's
// own statistics cannot tell this: pg_stat_statements counts statements, and
// one round trip may carry several ("SELECT 1; COMMIT").
//
// With a delay D, the relay is also a network: each chunk it reads is
// written to the other side D later, in order, in each direction, so a
// round trip costs 2D more (scripts/bench-rtt). The kernel here has no
// netem; a user-space delay serves every client alike, pgbench included.
//
// The relay does not understand TLS: clients must connect with
// sslmode=disable and gssencmode=disable (for_clients() sets both).
//
// Thread safety: the counters may be read from any thread while connections
// are relayed (relaxed atomics: statistics, read after the calls they count
// have returned, which needed the relay to forward their messages first).
#pragma once

#include "conninfo.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace bulkhead_bench {

/// Reads the frontend byte stream of one connection and counts messages.
class frontend_parser {
public:
    /// Feeds `size` bytes that the client sent, in order.
    void feed(const unsigned char* data, std::size_t size) noexcept {
        while (size > 0) {
            if (m_skip > 0) {
                const std::size_t skipped = m_skip < size ? static_cast<std::size_t>(m_skip) : size;
                data += skipped;
                size -= skipped;
                m_skip -= skipped;
                continue;
            }
            // Before the startup message the frames have no type byte:
            // length (4) and a request code (4). After it: type (1), length (4).
            const std::size_t header_size = m_started ? 5 : 8;
            const std::size_t taken = std::min(header_size - m_header_size, size);
            std::memcpy(m_header.data() + m_header_size, data, taken);
            m_header_size += taken;
            data += taken;
            size -= taken;
            if (m_header_size < header_size) {
                return;
            }
            m_header_size = 0;
            if (!m_started) {
                const std::uint32_t length = big_endian(&m_header[0]);
                const std::uint32_t code = big_endian(&m_header[4]);
                constexpr std::uint32_t ssl_request = 80877103;
                constexpr std::uint32_t gssenc_request = 80877104;
                if (code != ssl_request && code != gssenc_request) {
                    m_started = true;  // the startup message (or a cancel request: the connection ends)
                }
                m_skip = length >= 8 ? length - 8U : 0U;
            } else {
                const std::uint32_t length = big_endian(&m_header[1]);
                if (m_header[0] == 'Q') {
                    queries.fetch_add(1, std::memory_order_relaxed);
                } else if (m_header[0] == 'S') {
                    syncs.fetch_add(1, std::memory_order_relaxed);
                }
                m_skip = length >= 4 ? length - 4U : 0U;
            }
        }
    }

    // relaxed: counters, see the file comment.
    std::atomic<std::uint64_t> queries{0};  ///< simple-protocol Query messages
    std::atomic<std::uint64_t> syncs{0};    ///< extended-protocol Sync messages

private:
    static std::uint32_t big_endian(const unsigned char* bytes) noexcept {
        return (std::uint32_t{bytes[0]} << 24U) | (std::uint32_t{bytes[1]} << 16U) | (std::uint32_t{bytes[2]} << 8U) |
               std::uint32_t{bytes[3]};
    }

    std::array<unsigned char, 8> m_header{};
    std::size_t m_header_size = 0;
    std::uint64_t m_skip = 0;  // bytes of the current message body still to pass
    bool m_started = false;    // the startup message has passed
};

/// A counting relay on 127.0.0.1 in front of the server named by a conninfo.
class wire_counter {
public:
    /// Listens on an ephemeral loopback port; connections are relayed to the
    /// host (or hostaddr) and port of `conninfo`: TCP, or a Unix socket when
    /// the host is a directory. With a `delay`, every chunk reaches the other
    /// side that much later, in each direction.
    /// \throws std::system_error when it cannot listen.
    explicit wire_counter(const std::string& conninfo,
                          std::chrono::microseconds delay = std::chrono::microseconds::zero())
        : m_upstream(parse_conninfo(conninfo)), m_delay(delay) {
        m_listener = ::socket(AF_INET, SOCK_STREAM, 0);
        if (m_listener < 0) {
            throw std::system_error(errno, std::generic_category(), "wire_counter: socket");
        }
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = 0;
        socklen_t length = sizeof(address);
        if (::bind(m_listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
            ::listen(m_listener, 64) != 0 ||
            ::getsockname(m_listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
            const int error = errno;
            ::close(m_listener);
            throw std::system_error(error, std::generic_category(), "wire_counter: bind/listen");
        }
        m_port = ntohs(address.sin_port);
        m_acceptor = std::thread([this] { accept_loop(); });
    }

    wire_counter(const wire_counter&) = delete;
    wire_counter& operator=(const wire_counter&) = delete;

    /// Stops accepting, ends every relay and joins the threads.
    ~wire_counter() {
        m_stop.store(true);
        ::shutdown(m_listener, SHUT_RDWR);  // wakes accept()
        m_acceptor.join();
        ::close(m_listener);
        const std::lock_guard lock(m_mutex);
        for (std::thread& relay : m_relays) {
            relay.join();
        }
    }

    /// `conninfo` rewritten to connect through this relay, without TLS.
    [[nodiscard]] std::string for_clients(const std::string& conninfo) const {
        conninfo_fields fields = parse_conninfo(conninfo);
        fields.erase("hostaddr");
        fields["host"] = "127.0.0.1";
        fields["port"] = std::to_string(m_port);
        fields["sslmode"] = "disable";
        fields["gssencmode"] = "disable";
        return format_conninfo(fields);
    }

    /// Round trips so far: Query plus Sync messages, over all connections.
    [[nodiscard]] std::uint64_t round_trips() const noexcept {
        return m_parsers_queries.load(std::memory_order_relaxed) + m_parsers_syncs.load(std::memory_order_relaxed);
    }

    /// The port clients connect to (on 127.0.0.1).
    [[nodiscard]] std::uint16_t port() const noexcept { return m_port; }

private:
    /// Connects to the real server. Returns -1 on failure.
    int connect_upstream() const {
        const auto field = [&](const char* keyword, const char* fallback) {
            const auto found = m_upstream.find(keyword);
            return found != m_upstream.end() ? found->second : std::string(fallback);
        };
        std::string host = field("hostaddr", "");
        if (host.empty()) {
            host = field("host", "/var/run/postgresql");
        }
        const std::string port = field("port", "5432");
        if (!host.empty() && host[0] == '/') {
            const std::string path = host + "/.s.PGSQL." + port;
            sockaddr_un address{};
            address.sun_family = AF_UNIX;
            if (path.size() >= sizeof(address.sun_path)) {
                return -1;
            }
            std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
            const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
            if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
                return fd;
            }
            if (fd >= 0) {
                ::close(fd);
            }
            return -1;
        }
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* found = nullptr;
        if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) {
            return -1;
        }
        int connected = -1;
        for (const addrinfo* candidate = found; candidate != nullptr && connected < 0; candidate = candidate->ai_next) {
            const int fd = ::socket(candidate->ai_family, candidate->ai_socktype, candidate->ai_protocol);
            if (fd < 0) {
                continue;
            }
            if (::connect(fd, candidate->ai_addr, candidate->ai_addrlen) == 0) {
                connected = fd;
            } else {
                ::close(fd);
            }
        }
        ::freeaddrinfo(found);
        if (connected >= 0) {
            const int on = 1;
            ::setsockopt(connected, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
        }
        return connected;
    }

    void accept_loop() {
        while (!m_stop.load()) {
            const int client = ::accept(m_listener, nullptr, nullptr);
            if (client < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return;  // shut down
            }
            const int on = 1;
            ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
            const std::lock_guard lock(m_mutex);
            m_relays.emplace_back([this, client] { relay(client); });
        }
    }

    /// Counts what the client sent in `data` (one chunk, in order).
    void count(frontend_parser& parser, const unsigned char* data, std::size_t size) noexcept {
        const std::uint64_t queries_before = parser.queries.load(std::memory_order_relaxed);
        const std::uint64_t syncs_before = parser.syncs.load(std::memory_order_relaxed);
        parser.feed(data, size);
        m_parsers_queries.fetch_add(parser.queries.load(std::memory_order_relaxed) - queries_before,
                                    std::memory_order_relaxed);
        m_parsers_syncs.fetch_add(parser.syncs.load(std::memory_order_relaxed) - syncs_before,
                                  std::memory_order_relaxed);
    }

    /// Copies bytes both ways until either side closes (or the counter stops).
    void relay(int client) {
        const int server = connect_upstream();
        if (server < 0) {
            ::close(client);
            return;
        }
        if (m_delay > std::chrono::microseconds::zero()) {
            relay_delayed(client, server);
            return;
        }
        frontend_parser parser;
        std::array<unsigned char, 65536> buffer{};
        std::array<pollfd, 2> fds{pollfd{client, POLLIN, 0}, pollfd{server, POLLIN, 0}};
        bool open = true;
        while (open && !m_stop.load(std::memory_order_relaxed)) {
            if (::poll(fds.data(), fds.size(), 100) <= 0) {
                continue;
            }
            for (std::size_t side = 0; side < fds.size() && open; ++side) {
                if ((fds[side].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
                    continue;
                }
                const ssize_t got = ::read(fds[side].fd, buffer.data(), buffer.size());
                if (got <= 0) {
                    open = false;
                    break;
                }
                const auto size = static_cast<std::size_t>(got);
                if (side == 0) {
                    count(parser, buffer.data(), size);
                }
                open = write_all(fds[1 - side].fd, buffer.data(), size);
            }
        }
        ::close(client);
        ::close(server);
    }

    /// One direction of a delayed relay: chunks read from one side, each
    /// written to the other once its time has come.
    struct delayed_direction {
        struct chunk {
            std::chrono::steady_clock::time_point due;
            std::vector<unsigned char> bytes;  // empty: the reading side ended
        };
        std::mutex mutex;
        std::condition_variable ready;
        std::deque<chunk> queue;  // guarded by mutex

        void push(chunk next) {
            {
                const std::lock_guard lock(mutex);
                queue.push_back(std::move(next));
            }
            ready.notify_one();
        }
        chunk pop() {
            std::unique_lock lock(mutex);
            ready.wait(lock, [this] { return !queue.empty(); });
            chunk next = std::move(queue.front());
            queue.pop_front();
            return next;
        }
    };

    /// relay() with the delay: per direction, a reader that stamps each
    /// chunk with its due time and a writer that sends it then. Either side
    /// ending (or the counter stopping) ends both directions.
    void relay_delayed(int client, int server) {
        std::array<delayed_direction, 2> directions;  // 0: client to server, 1: server to client
        const std::array<int, 2> from{client, server};
        std::atomic<bool> ended{false};
        const auto end_both = [&] {
            if (!ended.exchange(true)) {
                ::shutdown(client, SHUT_RDWR);
                ::shutdown(server, SHUT_RDWR);
            }
        };
        std::array<std::thread, 4> threads;
        for (std::size_t side = 0; side < 2; ++side) {
            threads[side] = std::thread([&, side] {
                frontend_parser parser;
                std::array<unsigned char, 65536> buffer{};
                pollfd watched{from[side], POLLIN, 0};
                while (!ended.load() && !m_stop.load(std::memory_order_relaxed)) {
                    if (::poll(&watched, 1, 100) <= 0) {
                        continue;
                    }
                    const ssize_t got = ::read(from[side], buffer.data(), buffer.size());
                    if (got <= 0) {
                        break;
                    }
                    const auto size = static_cast<std::size_t>(got);
                    if (side == 0) {
                        count(parser, buffer.data(), size);
                    }
                    directions[side].push({std::chrono::steady_clock::now() + m_delay,
                                           std::vector<unsigned char>(buffer.data(), buffer.data() + size)});
                }
                directions[side].push({std::chrono::steady_clock::now(), {}});
            });
            threads[2 + side] = std::thread([&, side] {
                // Timed sleeps end within about a microsecond, not libc's 50 µs slack.
                (void)::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
                for (;;) {
                    delayed_direction::chunk next = directions[side].pop();
                    if (next.bytes.empty()) {
                        break;
                    }
                    std::this_thread::sleep_until(next.due);
                    if (!write_all(from[1 - side], next.bytes.data(), next.bytes.size())) {
                        break;
                    }
                }
                end_both();
            });
        }
        for (std::thread& thread : threads) {
            thread.join();
        }
        ::close(client);
        ::close(server);
    }

    static bool write_all(int fd, const unsigned char* data, std::size_t size) {
        while (size > 0) {
            const ssize_t sent = ::send(fd, data, size, MSG_NOSIGNAL);
            if (sent < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return false;
            }
            data += sent;
            size -= static_cast<std::size_t>(sent);
        }
        return true;
    }

    conninfo_fields m_upstream;
    std::chrono::microseconds m_delay;  // each way; zero: relayed at once
    int m_listener = -1;
    std::uint16_t m_port = 0;
    std::atomic<bool> m_stop{false};
    std::atomic<std::uint64_t> m_parsers_queries{0};  // relaxed: counters
    std::atomic<std::uint64_t> m_parsers_syncs{0};    // relaxed: counters
    std::thread m_acceptor;
    std::mutex m_mutex;
    std::vector<std::thread> m_relays;  // guarded by m_mutex
};

}  // namespace bulkhead_bench
