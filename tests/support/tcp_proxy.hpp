// A loopback TCP proxy between libpq and PostgreSQL that can cut a
// connection exactly at COMMIT (tests of in-doubt commits), go silent (hold
// every byte both ways while the connections stay open: a network that stops
// answering), hold new connections unanswered (a cancel or connect that
// never gets a reply), refuse new connections, and count the connections
// open through it at once.
//
// It forwards bytes both ways and parses the client's side of the protocol
// (the untyped startup packets, then typed messages) so that it recognizes a
// simple query that ends with COMMIT. When armed it then either
//   - drop_after_commit: forwards the COMMIT, swallows the server's answer and
//     closes the client's socket once the answer arrived: the commit landed,
//     the client never hears of it;
//   - drop_before_commit: closes both sockets instead of forwarding the COMMIT:
//     the server sees the client vanish inside a transaction and aborts it;
//   - drop_at_next_query: closes both sockets instead of forwarding the next
//     simple query, whatever it is (a BEGIN on a connection that looked fine).
// It fires once per arming. Listens on 127.0.0.1, ephemeral port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace bulkhead_test {

class tcp_proxy {
public:
    enum class cut { none, drop_after_commit, drop_before_commit, drop_at_next_query };

    /// Proxies 127.0.0.1:port() to upstream_host:upstream_port.
    tcp_proxy(std::string upstream_host, int upstream_port)
        : m_upstream_host(std::move(upstream_host)), m_upstream_port(upstream_port) {
        m_listener = ::socket(AF_INET, SOCK_STREAM, 0);
        if (m_listener < 0) {
            throw std::runtime_error("tcp_proxy: socket failed");
        }
        const int yes = 1;
        ::setsockopt(m_listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = 0;
        if (::bind(m_listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
            ::listen(m_listener, 64) != 0) {
            ::close(m_listener);
            throw std::runtime_error("tcp_proxy: bind/listen failed");
        }
        socklen_t length = sizeof address;
        ::getsockname(m_listener, reinterpret_cast<sockaddr*>(&address), &length);
        m_port = ntohs(address.sin_port);
        m_acceptor = std::thread([this] { accept_loop(); });
    }

    tcp_proxy(const tcp_proxy&) = delete;
    tcp_proxy& operator=(const tcp_proxy&) = delete;

    ~tcp_proxy() {
        m_stopping = true;
        ::shutdown(m_listener, SHUT_RDWR);
        ::close(m_listener);
        m_acceptor.join();
        const std::lock_guard lock(m_mutex);
        for (const int each : m_held) {
            ::close(each);
        }
        for (auto& each : m_links) {
            each.close_both();
        }
        for (auto& each : m_links) {
            if (each.upstream_to_client.joinable()) {
                each.upstream_to_client.join();
            }
            if (each.client_to_upstream.joinable()) {
                each.client_to_upstream.join();
            }
            ::close(each.client);
            ::close(each.upstream);
        }
    }

    [[nodiscard]] int port() const noexcept { return m_port; }

    /// Cuts the next COMMIT that passes through, in the given way.
    void arm(cut how) noexcept { m_armed.store(how); }

    /// While set, new connections are accepted and closed at once (the
    /// server looks unreachable through the proxy).
    void refuse_new(bool refuse) noexcept { m_refusing.store(refuse); }

    /// While set, nothing is forwarded either way: bytes wait in the proxy,
    /// connections stay open. Clearing it forwards what waited.
    void silence(bool silent) noexcept { m_silent.store(silent); }

    /// While set, new connections are accepted and then left unanswered (no
    /// upstream, nothing read or sent) until the proxy is destroyed.
    void hold_new(bool hold) noexcept { m_holding.store(hold); }

    /// Connections accepted and left unanswered by hold_new.
    [[nodiscard]] int held() const noexcept { return m_held_count.load(); }

    /// Client connections open through the proxy now, and the most at once.
    [[nodiscard]] int open_links() const noexcept { return m_open.load(); }
    [[nodiscard]] int max_open_links() const noexcept { return m_max_open.load(); }
    /// Starts the most-at-once count again from the connections open now.
    void reset_max_open_links() noexcept { m_max_open.store(m_open.load()); }

    /// How many times a cut happened.
    [[nodiscard]] int cuts() const noexcept { return m_cuts.load(); }

    /// Simple-query messages the clients sent so far, and those of them that
    /// end with COMMIT. A query is counted before it is forwarded, so once
    /// its answer has arrived the count includes it.
    [[nodiscard]] int queries() const noexcept { return m_queries.load(); }
    [[nodiscard]] int commits() const noexcept { return m_commits.load(); }

private:
    struct link {
        int client = -1;
        int upstream = -1;
        std::atomic<bool> swallow{false};  // drop_after_commit: eat the server's answer
        std::atomic<bool> closed{false};
        std::atomic<int>* open = nullptr;
        std::thread client_to_upstream;
        std::thread upstream_to_client;
        void close_both() noexcept {
            if (!closed.exchange(true)) {
                --*open;  // before the client can see the close and connect again
                ::shutdown(client, SHUT_RDWR);
                ::shutdown(upstream, SHUT_RDWR);
            }
        }
    };

    static bool send_all(int socket, const char* data, std::size_t size) noexcept {
        while (size > 0) {
            const ssize_t sent = ::send(socket, data, size, MSG_NOSIGNAL);
            if (sent <= 0) {
                return false;
            }
            data += sent;
            size -= static_cast<std::size_t>(sent);
        }
        return true;
    }

    [[nodiscard]] int connect_upstream() const {
        const int upstream = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(static_cast<std::uint16_t>(m_upstream_port));
        ::inet_pton(AF_INET, m_upstream_host.c_str(), &address.sin_addr);
        if (::connect(upstream, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
            ::close(upstream);
            return -1;
        }
        return upstream;
    }

    void accept_loop() {
        while (!m_stopping) {
            const int client = ::accept(m_listener, nullptr, nullptr);
            if (client < 0) {
                continue;
            }
            if (m_refusing) {
                ::close(client);
                continue;
            }
            if (m_holding) {
                const std::lock_guard lock(m_mutex);
                m_held.push_back(client);
                ++m_held_count;
                continue;
            }
            const int upstream = connect_upstream();
            if (upstream < 0) {
                ::close(client);
                continue;
            }
            const std::lock_guard lock(m_mutex);
            link& added = m_links.emplace_back();
            added.client = client;
            added.upstream = upstream;
            added.open = &m_open;
            const int now_open = ++m_open;
            for (int seen = m_max_open.load(); now_open > seen && !m_max_open.compare_exchange_weak(seen, now_open);) {
            }
            added.client_to_upstream = std::thread([this, &added] { pump_client(added); });
            added.upstream_to_client = std::thread([this, &added] { pump_upstream(added); });
        }
    }

    /// Client to server, message by message, watching for COMMIT.
    void pump_client(link& through) {
        std::vector<char> pending;
        bool startup = true;  // untyped packets until the StartupMessage went through
        char buffer[65536];
        for (;;) {
            const ssize_t got = ::recv(through.client, buffer, sizeof buffer, 0);
            if (got <= 0) {
                break;
            }
            pending.insert(pending.end(), buffer, buffer + got);
            std::size_t at = 0;
            for (;;) {
                const std::size_t header = startup ? 0 : 1;
                if (pending.size() - at < header + 4) {
                    break;
                }
                std::uint32_t length_be = 0;
                std::memcpy(&length_be, pending.data() + at + header, 4);
                const std::size_t length = ntohl(length_be);
                const std::size_t total = header + length;
                if (pending.size() - at < total) {
                    break;
                }
                const char* message = pending.data() + at;
                if (startup) {
                    std::uint32_t code_be = 0;
                    std::memcpy(&code_be, message + 4, 4);
                    const std::uint32_t code = ntohl(code_be);
                    // SSLRequest / GSSENCRequest are followed by another untyped packet.
                    startup = (code == 80877103U || code == 80877104U);
                } else if (message[0] == 'Q') {
                    ++m_queries;
                    if (m_armed.load() == cut::drop_at_next_query &&
                        m_armed.exchange(cut::none) == cut::drop_at_next_query) {
                        ++m_cuts;
                        through.close_both();
                        return;
                    }
                    if (is_commit(message + 5, length - 4)) {
                        ++m_commits;
                        const cut how = m_armed.exchange(cut::none);
                        if (how == cut::drop_before_commit) {
                            ++m_cuts;
                            through.close_both();
                            return;
                        }
                        if (how == cut::drop_after_commit) {
                            ++m_cuts;
                            through.swallow = true;
                        }
                    }
                }
                wait_while_silent(through);
                if (!send_all(through.upstream, message, total)) {
                    through.close_both();
                    return;
                }
                at += total;
            }
            pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(at));
        }
        through.close_both();
    }

    /// Server to client, raw; when swallowing, the answer is eaten and the
    /// client cut off.
    void pump_upstream(link& through) {
        char buffer[65536];
        for (;;) {
            const ssize_t got = ::recv(through.upstream, buffer, sizeof buffer, 0);
            if (got <= 0) {
                break;
            }
            if (through.swallow) {
                through.close_both();
                return;
            }
            wait_while_silent(through);
            if (!send_all(through.client, buffer, static_cast<std::size_t>(got))) {
                break;
            }
        }
        through.close_both();
    }

    void wait_while_silent(const link& through) const noexcept {
        while (m_silent && !through.closed && !m_stopping) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }

    /// True for a simple query whose first or last statement is COMMIT: the
    /// pool's "COMMIT; <session reset>", and also "...; COMMIT"; `size`
    /// counts the terminating NUL.
    static bool is_commit(const char* text, std::size_t size) noexcept {
        if (size >= 7 && std::strncmp(text, "COMMIT", 6) == 0 && (text[6] == ';' || text[6] == '\0')) {
            return true;
        }
        std::size_t end = size;
        while (end > 0 &&
               (text[end - 1] == '\0' || text[end - 1] == ';' || text[end - 1] == ' ' || text[end - 1] == '\n')) {
            --end;
        }
        static constexpr char word[] = "COMMIT";
        if (end < 6) {
            return false;
        }
        for (std::size_t i = 0; i < 6; ++i) {
            const char c = text[end - 6 + i];
            if ((c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c) != word[i]) {
                return false;
            }
        }
        return end == 6 || text[end - 7] == ' ' || text[end - 7] == ';';
    }

    std::string m_upstream_host;
    int m_upstream_port;
    int m_listener = -1;
    int m_port = 0;
    std::atomic<bool> m_stopping{false};
    std::atomic<bool> m_refusing{false};
    std::atomic<bool> m_silent{false};
    std::atomic<bool> m_holding{false};
    std::atomic<int> m_held_count{0};
    std::atomic<int> m_open{0};
    std::atomic<int> m_max_open{0};
    std::vector<int> m_held;  // guarded by m_mutex; closed by the destructor
    std::atomic<cut> m_armed{cut::none};
    std::atomic<int> m_cuts{0};
    std::atomic<int> m_queries{0};
    std::atomic<int> m_commits{0};
    std::mutex m_mutex;
    std::list<link> m_links;  // guarded by m_mutex; std::list keeps addresses stable
    std::thread m_acceptor;
};

}  // namespace bulkhead_test
