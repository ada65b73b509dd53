// bulkhead: the gate's transaction protocol, on libpq's PGconn*.
//
// What the pool says to the server around a gate transaction, and what it
// reads back, written against libpq alone so that another pool (raw libpq,
// an asynchronous one) can reuse it:
// - the BEGIN statement: isolation level and access mode spelled out, SET
//   LOCAL for the timeouts, and the transaction id when lost-commit
//   resolution is on, in one simple query (one round trip);
// - status checks from libpq's record of the server's last ReadyForQuery
//   (PQtransactionStatus): no round trip;
// - the words of a commit outcome (committed, aborted, unknown).
//
// Guarantees: only integers and fixed keywords go into a statement built
// here; nothing here sends anything unless its comment says so.
// Thread safety: a PGconn* belongs to one thread at a time.
#pragma once

#include <bulkhead/pqxx/options.hpp>

#include <libpq-fe.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace bulkhead::detail {

/// True when the server's last answer left the session's transaction failed:
/// a statement failed, and the server now refuses everything but ROLLBACK
/// (COMMIT included: it would roll back and report success).
[[nodiscard]] inline bool in_failed_transaction(PGconn* connection) noexcept {
    return PQtransactionStatus(connection) == PQTRANS_INERROR;
}

/// True when libpq says the session is inside a transaction block (open or
/// failed), also after a statement of it failed.
[[nodiscard]] inline bool inside_transaction_block(PGconn* connection) noexcept {
    const PGTransactionStatusType status = PQtransactionStatus(connection);
    return status == PQTRANS_INTRANS || status == PQTRANS_INERROR;
}

/// What the server said about a transaction whose COMMIT was lost.
enum class commit_status : std::uint8_t { committed, aborted, unknown };

/// \throws std::invalid_argument for a timeout outside [0, INT_MAX] ms.
template <class Options>
std::string begin_statement(const Options& options) {
    std::string statement = "BEGIN ISOLATION LEVEL ";
    switch (options.isolation_level) {
        case isolation::read_committed:
            statement += "READ COMMITTED";
            break;
        case isolation::repeatable_read:
            statement += "REPEATABLE READ";
            break;
        case isolation::serializable:
            statement += "SERIALIZABLE";
            break;
        default:
            throw std::invalid_argument("bulkhead::pqxx_pool: isolation_level is not a bulkhead::isolation");
    }
    statement += options.read_only ? " READ ONLY" : " READ WRITE";
    const auto set_local = [&](std::string_view name, const std::optional<std::chrono::milliseconds>& value) {
        if (!value) {
            return;
        }
        if (value->count() < 0 || value->count() > INT_MAX) {
            throw std::invalid_argument("bulkhead::pqxx_pool: " + std::string(name) + " must be in [0, " +
                                        std::to_string(INT_MAX) + "] ms, got " + std::to_string(value->count()) +
                                        " ms");
        }
        statement.append("; SET LOCAL ").append(name).append(" = ").append(std::to_string(value->count()));
    };
    set_local("statement_timeout", options.statement_timeout);
    set_local("lock_timeout", options.lock_timeout);
    return statement;
}

/// One round trip: true when the connection answers and its session is
/// outside any transaction block. The query starts a transaction of its own
/// exactly when none is open, and then its transaction and statement start
/// times are the same value. The wait for the answer to start arriving is
/// bounded by `deadline` (a server that is gone, stopped or cut off by the
/// network); on a timeout the connection is closed, since the answer may still
/// come and nobody may read it. libpqxx offers no non-blocking way to finish

}  // namespace bulkhead::detail
