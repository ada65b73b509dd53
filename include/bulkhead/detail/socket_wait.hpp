// bulkhead: waiting for a socket with a deadline (poll), for the libpq code
// that must never block past a caller's deadline (pqxx/protocol.hpp,
// pqxx/connection_budget.hpp). No libpq here: a socket and a time point.
//
// Thread safety: a free function on its arguments.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>

#if defined(_WIN32)
#include <winsock2.h>
#else
#include <poll.h>
#endif

namespace bulkhead::detail {

/// Waits until `socket` is ready to read (an answer, an error, or the end
/// of the connection), or to write when `for_writing`, or `deadline`
/// passes. False on timeout or failure.
inline bool wait_socket(int socket, bool for_writing, std::chrono::steady_clock::time_point deadline) noexcept {
    if (socket < 0) {
        return false;
    }
    for (;;) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        const int wait_ms = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, INT_MAX));
#if defined(_WIN32)
        WSAPOLLFD entry{static_cast<SOCKET>(socket), static_cast<SHORT>(for_writing ? POLLWRNORM : POLLRDNORM), 0};
        const int ready = ::WSAPoll(&entry, 1, wait_ms);
#else
        pollfd entry{socket, static_cast<short>(for_writing ? POLLOUT : POLLIN), 0};
        const int ready = ::poll(&entry, 1, wait_ms);
#endif
        if (ready > 0) {
            return true;
        }
        if (ready == 0) {
            if (wait_ms == 0) {
                return false;
            }
            continue;  // woke a little early: the loop re-reads the clock
        }
        if (errno != EINTR) {
            return false;
        }
    }
}

}  // namespace bulkhead::detail
