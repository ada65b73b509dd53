// A loopback TCP proxy between libpq and PostgreSQL that can cut a
// connection exactly at COMMIT (tests of in-doubt commits), go silent (hold
// every byte both ways while the connections stay open: a network that stops
// answering), hold new connections unanswered (a cancel or connect that
// never gets a reply), hold only cancel requests unanswered while sessions
// go through (a pooler or load balancer that drops cancels), refuse new
// connections, sever every connection without forwarding what a silence
// held (a partition), send new connections to another port, and count the
// connections open through it at once.
//
// It forwards bytes both ways and parses the protocol both ways (the untyped
// startup packets and the one-byte answers to SSLRequest/GSSENCRequest, then
// typed messages), so that it recognizes a COMMIT: a simple query that
// starts or ends with COMMIT or asks the pool's id question and then
// commits, or an extended-protocol Parse of "COMMIT" (the pool's commit in
// pipeline mode), and knows which of the server's answers
// come before the COMMIT's own (it counts statement completions). When armed
// it then either
//   - drop_after_commit: forwards the COMMIT, relays the server's answers up
//     to the COMMIT's own, swallows the rest up to the server's next
//     ReadyForQuery and closes the client's socket: the commit landed, the
//     client never hears of it (it did hear everything the server answered
//     before, such as the transaction id asked for in the same pipeline);
//   - drop_commit_and_id: as drop_after_commit, but from the answer to the
//     pool's question for the transaction id on (the
//     pg_current_xact_id_if_assigned() that goes ahead of the COMMIT, in the
//     pipeline or the simple query): the commit lands and the client hears
//     neither;
//   - drop_before_commit: closes both sockets instead of forwarding the
//     COMMIT, once the server's earlier answers reached the client's socket: the server sees
//     the client vanish inside a transaction and aborts it;
//   - drop_at_next_query: closes both sockets instead of forwarding the next
//     query, whatever it is (a BEGIN on a connection that looked fine).
// It fires once per arming. Listens on 127.0.0.1, ephemeral port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
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
    enum class cut { none, drop_after_commit, drop_commit_and_id, drop_before_commit, drop_at_next_query };

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

    /// Cuts every connection through the proxy without forwarding what a
    /// silence held (a partition that ends with the network lost, not
    /// healed), and refuses new connections from then on.
    void sever() noexcept {
        m_severed.store(true);
        m_refusing.store(true);
        const std::lock_guard lock(m_mutex);
        for (auto& each : m_links) {
            each.close_both();
        }
    }

    /// New connections go to 127.0.0.1:`port` from now on (another server
    /// behind the same address); open ones stay where they are.
    void set_upstream_port(int port) noexcept { m_upstream_port.store(port); }

    /// While set, new connections are accepted and then left unanswered (no
    /// upstream, nothing read or sent) until the proxy is destroyed.
    void hold_new(bool hold) noexcept { m_holding.store(hold); }

    /// Connections accepted and left unanswered by hold_new.
    [[nodiscard]] int held() const noexcept { return m_held_count.load(); }

    /// While set, a new connection whose first packet is a CancelRequest
    /// (16 bytes, code 80877102) is accepted and left unanswered until the
    /// proxy is destroyed; every other connection goes through as usual.
    void hold_cancels(bool hold) noexcept { m_holding_cancels.store(hold); }

    /// Cancel requests accepted and left unanswered by hold_cancels.
    [[nodiscard]] int held_cancels() const noexcept { return m_held_cancels.load(); }

    /// Client connections open through the proxy now, and the most at once.
    [[nodiscard]] int open_links() const noexcept { return m_open.load(); }
    [[nodiscard]] int max_open_links() const noexcept { return m_max_open.load(); }
    /// Starts the most-at-once count again from the connections open now.
    void reset_max_open_links() noexcept { m_max_open.store(m_open.load()); }

    /// How many times a cut happened.
    [[nodiscard]] int cuts() const noexcept { return m_cuts.load(); }

    /// Queries the clients sent so far (simple-query messages and Parse
    /// messages), and those of them that are a COMMIT. A query is counted
    /// before it is forwarded, so once its answer has arrived the count
    /// includes it.
    [[nodiscard]] int queries() const noexcept { return m_queries.load(); }
    [[nodiscard]] int commits() const noexcept { return m_commits.load(); }
    /// How many of them went in pipeline mode (an extended-protocol Parse of COMMIT).
    [[nodiscard]] int pipelined_commits() const noexcept { return m_pipelined_commits.load(); }

private:
    struct link {
        int client = -1;
        int upstream = -1;
        // Statement completions (CommandComplete, ErrorResponse,
        // EmptyQueryResponse) relayed to the client; once swallow_from of
        // them were, the server's answers are eaten and the client cut off
        // (drop_after_commit, drop_commit_and_id).
        std::atomic<long> completions_relayed{0};
        std::atomic<long> completions_delivered{0};  // of those, handed to the client's socket
        std::atomic<long> swallow_from{LONG_MAX};
        long id_answered_at = -1;  // client pump only: completions once the id question is answered
        // Client pump only: Parse messages since the last Sync, and the
        // completions relayed when the first of them came. A pipeline sends
        // several statements before any is answered: the k-th one's answer
        // is completion pipeline_base + k.
        int parses_since_sync = 0;
        long pipeline_base = 0;
        std::atomic<int> single_bytes_owed{0};  // answers to SSLRequest / GSSENCRequest
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
        address.sin_port = htons(static_cast<std::uint16_t>(m_upstream_port.load()));
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
            if (m_holding_cancels && is_cancel_request(client)) {
                const std::lock_guard lock(m_mutex);
                m_held.push_back(client);
                ++m_held_cancels;
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

    /// True when the first packet `client` sends is a CancelRequest: length
    /// 16, code 80877102. Peeks (the packet stays for the upstream), waiting
    /// up to a second for its first 8 bytes; libpq sends them at once.
    static bool is_cancel_request(int client) noexcept {
        char head[8];
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        for (;;) {
            pollfd ready{client, POLLIN, 0};
            if (::poll(&ready, 1, 1000) <= 0) {
                return false;
            }
            const ssize_t got = ::recv(client, head, sizeof head, MSG_PEEK);
            if (got <= 0) {
                return false;
            }
            if (got == static_cast<ssize_t>(sizeof head)) {
                break;
            }
            if (std::chrono::steady_clock::now() >= give_up) {
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the rest of 8 bytes, rarely split
        }
        std::uint32_t length_be = 0;
        std::uint32_t code_be = 0;
        std::memcpy(&length_be, head, 4);
        std::memcpy(&code_be, head + 4, 4);
        return ntohl(length_be) == 16U && ntohl(code_be) == 80877102U;
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
                    // SSLRequest / GSSENCRequest get a one-byte answer and are
                    // followed by another untyped packet.
                    startup = (code == 80877103U || code == 80877104U);
                    if (startup) {
                        ++through.single_bytes_owed;
                    }
                } else if (message[0] == 'Q' || message[0] == 'P') {
                    if (!on_query(through, message, length)) {
                        return;
                    }
                } else if (message[0] == 'S') {
                    through.parses_since_sync = 0;
                }
                wait_while_silent(through);
                if (m_severed || !send_all(through.upstream, message, total)) {
                    through.close_both();
                    return;
                }
                at += total;
            }
            pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(at));
        }
        through.close_both();
    }

    /// A simple query ('Q') or Parse ('P') message of `length` (as the
    /// message says, without the type byte) about to be forwarded; false
    /// when the link was cut instead.
    bool on_query(link& through, const char* message, std::size_t length) {
        ++m_queries;
        if (m_armed.load() == cut::drop_at_next_query && m_armed.exchange(cut::none) == cut::drop_at_next_query) {
            ++m_cuts;
            through.close_both();
            return false;
        }
        const char* text = message + 5;
        std::size_t size = length - 4;
        if (message[0] == 'P') {  // statement name, then the query
            const std::size_t name = ::strnlen(text, size) + 1;
            text += name;
            size = name < size ? ::strnlen(text, size - name) + 1 : 0;
        }
        // The completions the client hears before this statement's own. A
        // simple query is sent once everything before it was answered
        // (libpq waits for that); a Parse may follow others of its pipeline,
        // not answered yet.
        long answered_before = through.completions_relayed.load();
        if (message[0] == 'P') {
            if (through.parses_since_sync++ == 0) {
                through.pipeline_base = answered_before;
            }
            answered_before = through.pipeline_base + through.parses_since_sync - 1;
        }
        if (is_id_question(text)) {
            // Its answer is the next completion.
            through.id_answered_at = answered_before + 1;
            if (m_armed.load() == cut::drop_commit_and_id && m_armed.exchange(cut::none) == cut::drop_commit_and_id) {
                ++m_cuts;
                through.swallow_from = through.id_answered_at - 1;  // from its answer on
            }
        }
        if (!is_commit(text, size)) {
            return true;
        }
        ++m_commits;
        if (message[0] == 'P') {
            ++m_pipelined_commits;
        }
        // The completions the client hears before the COMMIT's own: all so
        // far, and the id question's answer when one is on its way.
        const long before_commit = std::max(answered_before, through.id_answered_at);
        through.id_answered_at = -1;
        const cut how = m_armed.load() == cut::drop_commit_and_id ? cut::none : m_armed.exchange(cut::none);
        if (how == cut::drop_before_commit) {
            ++m_cuts;
            for (int waited = 0; through.completions_delivered < before_commit && waited < 2000; ++waited) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            through.close_both();
            return false;
        }
        if (how == cut::drop_after_commit) {
            ++m_cuts;
            through.swallow_from = before_commit;
        }
        return true;
    }

    /// Server to client, message by message, counting statement
    /// completions; once swallow_from of them were relayed the answers are
    /// eaten up to the next ReadyForQuery (so what the client sent has run
    /// on the server), and the client is cut off.
    void pump_upstream(link& through) {
        std::vector<char> pending;
        std::vector<char> out;
        char buffer[65536];
        bool swallowing = false;  // from here on nothing reaches the client
        for (;;) {
            const ssize_t got = ::recv(through.upstream, buffer, sizeof buffer, 0);
            if (got <= 0) {
                break;
            }
            pending.insert(pending.end(), buffer, buffer + got);
            std::size_t at = 0;
            long completions = 0;
            bool finished = false;  // swallowed up to a ReadyForQuery: what was sent has run
            while (!finished) {
                std::size_t total = 0;
                if (through.single_bytes_owed > 0 && pending.size() - at >= 1) {
                    --through.single_bytes_owed;
                    total = 1;
                } else {
                    if (pending.size() - at < 5) {
                        break;
                    }
                    std::uint32_t length_be = 0;
                    std::memcpy(&length_be, pending.data() + at + 1, 4);
                    total = 1 + static_cast<std::size_t>(ntohl(length_be));
                    if (pending.size() - at < total) {
                        break;
                    }
                }
                const char type = total > 1 ? pending[at] : '\0';
                swallowing = swallowing || through.completions_relayed >= through.swallow_from;
                if (swallowing) {
                    finished = type == 'Z';  // the server is done with the client's last query or Sync
                } else {
                    if (type == 'C' || type == 'E' || type == 'I') {
                        ++through.completions_relayed;
                        ++completions;
                    }
                    out.insert(out.end(), pending.begin() + static_cast<std::ptrdiff_t>(at),
                               pending.begin() + static_cast<std::ptrdiff_t>(at + total));
                }
                at += total;
            }
            pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(at));
            wait_while_silent(through);
            if (m_severed || (!out.empty() && !send_all(through.client, out.data(), out.size()))) {
                break;
            }
            through.completions_delivered += completions;
            out.clear();
            if (finished) {
                break;
            }
        }
        through.close_both();
    }

    /// The pool's question for the transaction's id, asked ahead of its COMMIT.
    static bool is_id_question(const char* text) noexcept {
        return std::strncmp(text, "SELECT pg_current_xact_id_if_assigned()", 39) == 0 ||
               std::strncmp(text, "SELECT txid_current_if_assigned()", 33) == 0;
    }

    void wait_while_silent(const link& through) const noexcept {
        while (m_silent && !through.closed && !m_stopping) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }

    /// True for a query whose first or last statement is COMMIT: the pool's
    /// "COMMIT; <session reset>" or "COMMIT" alone, and also "...; COMMIT";
    /// `size` counts the terminating NUL.
    static bool is_commit(const char* text, std::size_t size) noexcept {
        if (size >= 7 && std::strncmp(text, "COMMIT", 6) == 0 && (text[6] == ';' || text[6] == '\0')) {
            return true;
        }
        if (is_id_question(text)) {  // the question, then "; COMMIT; <reset>" in one simple query
            const char* rest = std::strstr(text, "; COMMIT");
            return rest != nullptr && (rest[8] == ';' || rest[8] == '\0');
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
    std::atomic<int> m_upstream_port;
    int m_listener = -1;
    int m_port = 0;
    std::atomic<bool> m_stopping{false};
    std::atomic<bool> m_refusing{false};
    std::atomic<bool> m_severed{false};  // sever(): nothing is forwarded again
    std::atomic<bool> m_silent{false};
    std::atomic<bool> m_holding{false};
    std::atomic<int> m_held_count{0};
    std::atomic<bool> m_holding_cancels{false};
    std::atomic<int> m_held_cancels{0};
    std::atomic<int> m_open{0};
    std::atomic<int> m_max_open{0};
    std::vector<int> m_held;  // guarded by m_mutex; closed by the destructor
    std::atomic<cut> m_armed{cut::none};
    std::atomic<int> m_cuts{0};
    std::atomic<int> m_queries{0};
    std::atomic<int> m_commits{0};
    std::atomic<int> m_pipelined_commits{0};
    std::mutex m_mutex;
    std::list<link> m_links;  // guarded by m_mutex; std::list keeps addresses stable
    std::thread m_acceptor;
};

}  // namespace bulkhead_test
