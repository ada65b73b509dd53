// bulkhead: whether a gate and its pool can serve now, and why not
// (db_bulkhead::health(), pqxx_pool::health()). Read from what the gate and
// the pool already know: nothing is sent to the server, so a health
// endpoint may ask as often as it likes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace bulkhead {

/// What a pool knows of its server without asking it.
struct pool_health {
    /// False when no connection is open and the last attempt to open one
    /// failed: a call now would wait for a connection that is not coming.
    bool can_connect = true;
    /// The error of the last attempt to open a connection when that attempt
    /// failed (no connection was opened since), scrubbed of passwords;
    /// empty otherwise. Set while can_connect is still true too: the pool
    /// may have connections open while it fails to open more (a failover).
    std::string last_error;
    /// The last connection budget the pool read (at start-up, or
    /// read_budget()) left the fleet over the server's limit: its
    /// explanation, scrubbed; empty when it fit or none was read.
    std::string budget_excess;
};

/// Why a gate is not serving, or serves with a warning.
enum class health_reason : std::uint8_t {
    none,             ///< serving, nothing to report
    closed,           ///< close() began: nothing is admitted (not serving)
    cannot_connect,   ///< the pool has no connection and cannot open one (not serving)
    limit_at_floor,   ///< the adaptive limit is at its floor: the database is struggling (serving)
    budget_exceeded,  ///< the fleet does not fit the server's connection budget (serving)
};

/// A short, stable, lower-case name for `reason` ("closed", ...).
[[nodiscard]] constexpr std::string_view to_string(health_reason reason) noexcept {
    switch (reason) {
        case health_reason::none:
            return "none";
        case health_reason::closed:
            return "closed";
        case health_reason::cannot_connect:
            return "cannot_connect";
        case health_reason::limit_at_floor:
            return "limit_at_floor";
        case health_reason::budget_exceeded:
            return "budget_exceeded";
    }
    return "unknown";
}

/// db_bulkhead::health(): serving or not, and the first reason that
/// applies, in the order of health_reason. The warnings (limit_at_floor,
/// budget_exceeded) leave the gate serving: taking an instance out of a
/// load balancer because the database is slow moves its load onto the
/// others, which share that database.
struct gate_health {
    bool serving = true;
    health_reason reason = health_reason::none;
    std::string detail;  ///< for people: the pool's last error, the limit, the budget; never a password
};

}  // namespace bulkhead
