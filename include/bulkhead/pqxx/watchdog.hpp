// bulkhead: a watchdog that cuts off connections whose call must end now.
//
// libpq waits for an answer without a timeout of its own. When the server or
// the network stops answering mid-statement (a frozen backend, a silent
// link), nothing on the client would end the wait before TCP gives up, which
// with keepalives is tens of seconds and without them hours. The same holds
// for a stop whose cancel request goes unanswered (a proxy or pooler that
// drops cancels): the statement runs on until it ends by itself. The pool
// arms this watchdog for every gate transaction with a deadline, at the
// deadline plus a stated slack, and for a stop, at the stop plus that slack
// (pqxx_pool::cancel); then it shuts the connection's socket down (both
// directions), which makes the blocked libpq call return at once with a lost
// connection. The connection is then discarded, never reused.
//
// Guarantees.
// - Only the socket it was armed for is ever shut down. The watchdog shuts a
//   socket down through a watched_socket, a duplicate of its descriptor (dup)
//   that the pooled connection owns from the time it is opened until it is
//   destroyed, which is after every entry armed for it was disarmed. libpq may
//   close its own descriptor meanwhile (a connection it finds lost), but the
//   socket, and the duplicate's number, stay reserved, so a number reused by
//   another connection is never touched. Shutting the duplicate down shuts
//   the shared socket down.
// - At most one entry per socket: arming a socket already armed keeps the
//   earlier of the two times (a stop brings a deadline's cut forward), and
//   disarm() forgets it whoever armed it. Only leased connections are armed,
//   so the entries never outnumber the pool's max_size.
// - One thread per watchdog (per pool), started on the first arm(); arm()
//   and disarm() make no system call but the wake of that thread when the
//   new time is the earliest, never allocate once the entries' capacity (the
//   pool's max_size) is reserved, and never block on the network. (A dup per
//   arm() and a close per disarm() would put two system calls under the
//   mutex on every call.)
//
// Thread safety: all members may be called concurrently. What the firing
// thread did (the shutdown, `fired = true`) happens-before a reader of
// `fired` with acquire ordering, and happens-before the return of a
// disarm() of that socket: after disarm() returns, `fired` says for good
// whether the socket was shut down.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#if defined(_WIN32)
#include <winsock2.h>
#else
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>
#endif

namespace bulkhead::detail {

/// A duplicate of a connection's socket descriptor, for the watchdog; owned by
/// the connection from its opening to its destruction. Invalid (-1) when no
/// descriptor was left: calls on that connection then go without a watchdog.
class watched_socket {
public:
    watched_socket() noexcept = default;
    watched_socket(const watched_socket&) = delete;
    watched_socket& operator=(const watched_socket&) = delete;
    ~watched_socket() {
        if (m_descriptor >= 0) {
#if !defined(_WIN32)
            (void)::close(m_descriptor);
#endif
        }
    }

    /// Duplicates `socket` (once: a second call keeps the first duplicate).
    void watch(int socket) noexcept {
        if (m_descriptor < 0) {
            m_descriptor = duplicate(socket);
        }
    }

    /// The duplicate's number, or -1.
    [[nodiscard]] int get() const noexcept { return m_descriptor; }

private:
    static int duplicate(int socket) noexcept {
#if defined(_WIN32)
        return socket;  // no dup for Windows sockets: the pool disarms before it closes one
#else
        return socket < 0 ? -1 : ::fcntl(socket, F_DUPFD_CLOEXEC, 0);
#endif
    }

    int m_descriptor = -1;
};

/// Cuts off the sockets of connections whose call must end; one per pool.
/// See the file comment.
class socket_watchdog {
public:
    using clock = std::chrono::steady_clock;

    explicit socket_watchdog(std::size_t capacity) { m_entries.reserve(capacity); }
    socket_watchdog(const socket_watchdog&) = delete;
    socket_watchdog& operator=(const socket_watchdog&) = delete;

    ~socket_watchdog() {
        {
            const std::lock_guard lock(m_mutex);
            m_stopping = true;
        }
        m_wake.notify_one();
        if (m_thread.joinable()) {
            m_thread.join();
        }
    }

    /// Shuts `socket` down at `at` unless disarmed first, setting `*fired`
    /// just before. When `socket` is armed already, its entry keeps the
    /// earlier of the two times and its own `fired`. Both must outlive the
    /// entry (disarm it before they go). False when the connection has no
    /// descriptor: nothing is armed, the call goes without a watchdog.
    /// \throws std::system_error when the watchdog's thread cannot be started;
    ///         std::bad_alloc beyond the reserved capacity.
    [[nodiscard]] bool arm(const watched_socket& socket, clock::time_point at, std::atomic<bool>& fired) {
        if (socket.get() < 0) {
            return false;
        }
        std::unique_lock lock(m_mutex);
        if (!m_thread.joinable()) {
            m_thread = std::thread([this] { run(); });
        }
        const auto found = find_locked(socket.get());
        if (found != m_entries.end()) {
            found->at = std::min(found->at, at);
        } else {
            m_entries.push_back(entry{socket.get(), at, &fired});
        }
        const bool earliest = at < m_next_wake;
        lock.unlock();
        if (earliest) {
            m_wake.notify_one();
        }
        return true;
    }

    /// Forgets the entry of `socket` (a no-op when none is armed, or when it
    /// fired). On return the watchdog no longer touches `socket`.
    void disarm(const watched_socket& socket) noexcept {
        if (socket.get() < 0) {
            return;
        }
        const std::lock_guard lock(m_mutex);
        const auto found = find_locked(socket.get());
        if (found != m_entries.end()) {
            *found = m_entries.back();
            m_entries.pop_back();
        }
    }

private:
    struct entry {
        int socket;  // a watched_socket's descriptor; one entry per socket
        clock::time_point at;
        std::atomic<bool>* fired;
    };

    std::vector<entry>::iterator find_locked(int socket) noexcept {
        return std::find_if(m_entries.begin(), m_entries.end(),
                            [&](const entry& each) { return each.socket == socket; });
    }

    void run() noexcept {
        std::unique_lock lock(m_mutex);
        while (!m_stopping) {
            const clock::time_point now = clock::now();
            m_next_wake = clock::time_point::max();
            for (std::size_t index = 0; index < m_entries.size();) {
                entry& each = m_entries[index];
                if (each.at <= now) {
                    // Marked before the shutdown: the waiting thread wakes
                    // from it and must then see why.
                    each.fired->store(true, std::memory_order_release);
                    shut_down(each.socket);  // under the mutex: disarm() waits, and the descriptor stays open
                    each = m_entries.back();
                    m_entries.pop_back();
                    continue;
                }
                m_next_wake = std::min(m_next_wake, each.at);
                ++index;
            }
            if (m_next_wake == clock::time_point::max()) {
                m_wake.wait(lock);
            } else {
                m_wake.wait_until(lock, m_next_wake);
            }
        }
    }

    static void shut_down(int socket) noexcept {
#if defined(_WIN32)
        (void)::shutdown(static_cast<SOCKET>(socket), SD_BOTH);
#else
        (void)::shutdown(socket, SHUT_RDWR);
#endif
    }

    std::mutex m_mutex;
    std::condition_variable m_wake;                            // the thread waits on it with m_mutex
    std::vector<entry> m_entries;                              // guarded by m_mutex
    clock::time_point m_next_wake = clock::time_point::max();  // guarded by m_mutex
    bool m_stopping = false;                                   // guarded by m_mutex
    std::thread m_thread;                                      // started under m_mutex, joined by the destructor
};

}  // namespace bulkhead::detail
