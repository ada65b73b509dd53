// bulkhead: the gate's transaction on a libpqxx connection.
//
// transaction_control is the pool's side of one gate transaction, the same
// for every libpqxx version: it supplies the BEGIN statement (protocol.hpp),
// refuses commit and abort requested by the callback (contract B8), sends
// COMMIT and ROLLBACK only when the pool asks, and settles a COMMIT whose
// connection was lost by asking the server what became of the transaction.
// gate_transaction (compat.hpp) is the pqxx::dbtransaction the callback
// sees.
//
// Guarantees.
// - COMMIT is sent only by pqxx_pool::commit, ROLLBACK only by
//   pqxx_pool::rollback; a commit() or abort() from the callback throws
//   std::logic_error and leaves the transaction for the gate to roll back.
// - A transaction in which a statement failed is never committed: COMMIT is
//   not sent, and the caller gets SQLSTATE 25P02.
// - A COMMIT whose connection was lost returns (committed), throws
//   pqxx::broken_connection (rolled back, or read only), or throws
//   bulkhead::commit_unknown; it is never retried.
// - A transaction that was begun and not ended on the server marks its
//   connection for discard.
//
// Thread safety: used only by the thread that holds the lease.
#pragma once

#include <bulkhead/error.hpp>
#include <bulkhead/pqxx/compat.hpp>
#include <bulkhead/pqxx/conninfo.hpp>
#include <bulkhead/pqxx/pooled_connection.hpp>
#include <bulkhead/pqxx/protocol.hpp>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace bulkhead::detail {

struct transaction_control;

/// The pqxx::dbtransaction the gate's callback works in.
using gate_transaction = pqxx_compat::gate_transaction<transaction_control>;

/// What a gate transaction knows beyond libpqxx's own bookkeeping; the same
/// for every libpqxx version. Used only by the thread that holds the lease.
struct transaction_control {
    /// The message of the std::logic_error for commit or rollback requested
    /// from inside the gate's callback.
    static constexpr const char* refusal =
        "bulkhead: commit/rollback inside the gate's callback is refused; the gate commits after the callback returns";
    /// The message of the pqxx::sql_error (SQLSTATE 25P02) for a commit of a
    /// transaction in which a statement had failed.
    static constexpr const char* failed_transaction =
        "bulkhead: not committed: a statement of this transaction failed and its error was caught, so the server "
        "has aborted the transaction (SQLSTATE 25P02: current transaction is aborted); COMMIT was not sent, "
        "rollback() ends it";

    pooled_connection* owner = nullptr;          // the leased connection; outlives the transaction
    std::string begin_statement;                 // BEGIN ... [; SET LOCAL ...][; SELECT txid_current()], integers only
    const connect_target* target = nullptr;      // to read a lost COMMIT's outcome; the lease keeps it alive
    std::chrono::milliseconds settle_budget{0};  // how long reading that outcome may take
    bool read_only = false;                      // BEGIN ... READ ONLY: nothing can have been written
    bool track_txid = false;                     // the BEGIN statement ends with SELECT txid_current()
    std::int64_t txid = -1;                      // that txid, when tracked
    bool timeout_from_deadline = false;          // statement_timeout was set from the call's deadline
    bool lock_timeout_from_deadline = false;     // lock_timeout was set from the call's deadline
    bool permitted = false;                      // set by pqxx_pool::commit/rollback around their call into libpqxx
    bool closing = false;                        // the destructor is ending the transaction
    bool backend_open = false;                   // BEGIN ran and no COMMIT/ROLLBACK has ended it
    bool in_doubt = false;                       // the connection was lost during COMMIT
    bool refused = false;                        // the callback called commit() or abort()
    std::exception_ptr abort_failure;            // a ROLLBACK that failed inside libpqxx's abort()

    void on_begun() noexcept { backend_open = true; }
    void on_begin_result(const pqxx::result& answer) {
        if (track_txid) {
            txid = answer.at(0).at(0).as<std::int64_t>();
        }
    }
    void settle_lost_commit(const std::exception& cause);
    void on_begin_failed() noexcept { owner->discard = true; }
    void on_closed() noexcept {
        if (backend_open) {
            owner->discard = true;  // never ended on the server: nobody may reuse the session
        }
    }
    void on_commit(gate_transaction& tx);
    void on_abort(gate_transaction& tx);

    /// pqxx_pool::commit and pqxx_pool::rollback.
    static void commit(gate_transaction& tx);
    static void rollback(gate_transaction& tx);
};

inline void transaction_control::on_commit(gate_transaction& tx) {
    if (!permitted) {
        refused = true;
        throw std::logic_error(refusal);
    }
    // COMMIT of a transaction in which a statement failed (an error the
    // callback caught) rolls back and reports success. libpq knows that state
    // from the server's last answer (PQtransactionStatus: PQTRANS_INERROR):
    // COMMIT is then not sent, and the caller gets what any statement gets
    // there, SQLSTATE 25P02; the transaction stays open, for rollback().
    if (in_failed_transaction(pqxx_compat::native_handle(tx))) {
        throw pqxx::sql_error(failed_transaction, "COMMIT", "25P02");
    }
    try {
        (void)tx.run("COMMIT");
    } catch (const pqxx::in_doubt_error& unknown) {
        settle_lost_commit(unknown);
        return;
    } catch (const pqxx::statement_completion_unknown& unknown) {
        settle_lost_commit(unknown);
        return;
    } catch (const pqxx::sql_error& error) {
        if (!tx.conn().is_open()) {
            settle_lost_commit(error);
            return;
        }
        // The server answered. A failed COMMIT ends the transaction; libpq's
        // status says so without a round trip.
        backend_open = inside_transaction_block(pqxx_compat::native_handle(tx));
        throw;
    } catch (const std::exception& failure) {
        if (!tx.conn().is_open()) {
            settle_lost_commit(failure);
            return;
        }
        throw;  // not sent (a client-side error): the transaction is still open
    }
    backend_open = false;
}

/// Asks the server, on a fresh connection, what became of transaction
/// `txid`. Retries while the old backend is still finishing ("in progress")
/// or the server cannot be reached, for at most `budget`.
inline commit_status read_commit_status(const connect_target& target, std::int64_t txid,
                                        std::chrono::milliseconds budget) noexcept {
    using clock = std::chrono::steady_clock;
    const auto until = clock::now() + budget;
    for (auto pause = std::chrono::milliseconds(10);; pause = std::min(pause * 2, std::chrono::milliseconds(200))) {
        try {
            const auto connection = pqxx_compat::open_connection(connect_string(target, until - clock::now()));
            pqxx::nontransaction query(*connection);
            const pqxx::row status = query.exec1("SELECT txid_status(" + std::to_string(txid) + ")");
            if (status[0].is_null()) {
                return commit_status::unknown;  // wrapped around, or never assigned
            }
            const auto said = status[0].as<std::string>();
            if (said == "committed") {
                return commit_status::committed;
            }
            if (said == "aborted") {
                return commit_status::aborted;
            }
        } catch (...) {  // the server is unreachable for now: try again while the budget lasts
        }
        if (clock::now() + pause >= until) {
            return commit_status::unknown;
        }
        std::this_thread::sleep_for(pause);
    }
}

/// Called inside the catch handler for a COMMIT whose connection was lost.
/// Returns (the COMMIT counts as done) when the server confirms the
/// transaction committed; otherwise throws: pqxx::broken_connection when it
/// confirms the rollback, or when nothing could have been written (read
/// only); bulkhead::commit_unknown, with the original nested, when the
/// outcome cannot be had.
inline void transaction_control::settle_lost_commit(const std::exception& cause) {
    in_doubt = true;
    backend_open = false;  // the session is gone, and the transaction with it
    owner->discard = true;
    const std::string lost = std::string("bulkhead: the connection was lost during COMMIT: ") + cause.what();
    if (read_only) {
        throw pqxx::broken_connection(lost + " (a read-only transaction: nothing was written)");
    }
    if (!track_txid || target == nullptr) {
        std::throw_with_nested(commit_unknown(lost + " (commit outcome tracking is off)"));
    }
    switch (read_commit_status(*target, txid, settle_budget)) {
        case commit_status::committed:
            in_doubt = false;
            return;
        case commit_status::aborted:
            throw pqxx::broken_connection(lost + " (txid_status confirms the transaction was rolled back)");
        case commit_status::unknown:
            break;
    }
    std::throw_with_nested(commit_unknown(lost + " (txid_status could not be read)"));
}

inline void transaction_control::on_abort(gate_transaction& tx) {
    if (closing) {
        return;  // destroyed unended: no ROLLBACK from a destructor; on_closed() marks the connection
    }
    if (!permitted) {
        refused = true;
        throw std::logic_error(refusal);  // libpqxx swallows it; commit() reports the refusal
    }
    if (!backend_open) {
        return;
    }
    try {
        tx.run("ROLLBACK");
        backend_open = false;
    } catch (...) {
        abort_failure = std::current_exception();  // libpqxx's abort() swallows it; rollback() rethrows
        throw;
    }
}

/// Sets transaction_control::permitted for one call.
class permitted_scope {
public:
    explicit permitted_scope(transaction_control& control) noexcept : m_control(control) { m_control.permitted = true; }
    permitted_scope(const permitted_scope&) = delete;
    permitted_scope& operator=(const permitted_scope&) = delete;
    ~permitted_scope() { m_control.permitted = false; }

private:
    transaction_control& m_control;
};

inline void transaction_control::commit(gate_transaction& tx) {
    transaction_control& control = tx.control();
    if (control.refused) {
        throw std::logic_error(refusal);
    }
    const permitted_scope permit(control);
    tx.commit();
}

inline void transaction_control::rollback(gate_transaction& tx) {
    transaction_control& control = tx.control();
    const permitted_scope permit(control);
    if (!control.in_doubt) {
        tx.abort();  // libpqxx's books; sends ROLLBACK (do_abort) while it counts the transaction active
    }
    if (control.abort_failure) {
        std::rethrow_exception(std::exchange(control.abort_failure, nullptr));
    }
    if (control.backend_open) {
        // libpqxx had already closed its books (a refused commit or abort, or
        // a COMMIT that was lost): end the server's transaction directly.
        tx.run("ROLLBACK");
        control.backend_open = false;
    }
}

/// The BEGIN statement for `options`, with SET LOCAL for the timeouts. Only
/// integers and fixed keywords go into it.

}  // namespace bulkhead::detail
