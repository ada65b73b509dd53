// bulkhead: what a connection pool reports, as plain data.
//
// pool_stats is filled by bulkhead::pqxx_pool::stats() (and can be by any
// pool that wants bulkhead's Prometheus rendering); it needs no libpqxx.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace bulkhead {

/// Why a pool closed a connection.
enum class close_reason : std::uint8_t {
    discarded,          ///< marked by discard() (a failed rollback, an unfinished transaction)
    broken,             ///< the connection was found broken
    lifetime,           ///< older than max_lifetime
    idle,               ///< idle longer than idle_timeout, above min_idle
    validation_failed,  ///< the check on borrow or return failed
    shutdown,           ///< the pool was destroyed
    read_only,          ///< a pool that needs writes found its server read-only or in recovery
};

/// The number of close_reason values.
inline constexpr std::size_t close_reason_count = 7;

/// A short lower-case name for `reason`, suitable for metric labels.
[[nodiscard]] constexpr std::string_view to_string(close_reason reason) noexcept {
    switch (reason) {
        case close_reason::discarded:
            return "discarded";
        case close_reason::broken:
            return "broken";
        case close_reason::lifetime:
            return "lifetime";
        case close_reason::idle:
            return "idle";
        case close_reason::validation_failed:
            return "validation_failed";
        case close_reason::shutdown:
            return "shutdown";
        case close_reason::read_only:
            return "read_only";
    }
    return "unknown";
}

/// A snapshot of a pool's gauges and counters.
struct pool_stats {
    // --- gauges ----------------------------------------------------------------
    std::size_t max_size = 0;  ///< the configured maximum
    std::size_t size = 0;      ///< open or being opened
    std::size_t idle = 0;      ///< open, in the pool
    std::size_t in_use = 0;    ///< in leases
    std::size_t waiting = 0;   ///< threads waiting in acquire()

    // --- counters since construction ---------------------------------------------
    std::uint64_t opened = 0;            ///< connections opened
    std::uint64_t connect_failures = 0;  ///< connection attempts that failed
    std::uint64_t acquire_timeouts = 0;  ///< acquire() calls that ended in pool_timeout
    /// Connections closed, by close_reason (index: static_cast<size_t>(reason)).
    std::array<std::uint64_t, close_reason_count> closed{};

    [[nodiscard]] std::uint64_t closed_for(close_reason reason) const noexcept {
        return closed[static_cast<std::size_t>(reason)];
    }
};

}  // namespace bulkhead
