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
//   connection for discard, and so does one whose connection the watchdog
//   cut off (its deadline, or a stop whose cancel went unanswered).
// - When it ends, the watchdog's entry for its connection (the deadline's,
//   or the one a stop armed) is disarmed: a cut never outlives the
//   transaction it was armed for, and a connection cut off is never kept.
//
// Thread safety: used only by the thread that holds the lease.
#pragma once

#include <bulkhead/error.hpp>
#include <bulkhead/pqxx/compat.hpp>
#include <bulkhead/pqxx/conninfo.hpp>
#include <bulkhead/pqxx/pooled_connection.hpp>
#include <bulkhead/pqxx/protocol.hpp>
#include <bulkhead/pqxx/statement_result.hpp>
#include <bulkhead/pqxx/watchdog.hpp>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bulkhead::detail {

struct transaction_control;
struct first_answer;

/// The pqxx::dbtransaction the gate's callback works in.
using gate_transaction = pqxx_compat::gate_transaction<transaction_control>;

/// What a gate transaction knows beyond libpqxx's own bookkeeping; the same
/// for every libpqxx version. Used only by the thread that holds the lease.
struct transaction_control {
    using clock = std::chrono::steady_clock;

    /// The message of the std::logic_error for commit or rollback requested
    /// from inside the gate's callback.
    static constexpr const char* refusal =
        "bulkhead: commit/rollback inside the gate's callback is refused; the gate commits after the callback returns";
    /// The message of the std::logic_error for a statement of the callback
    /// that ended the transaction block itself (COMMIT, ROLLBACK, END, ABORT,
    /// PREPARE TRANSACTION).
    static constexpr const char* block_ended =
        "bulkhead: a statement of the gate's callback ended the transaction block (COMMIT, ROLLBACK, END, ABORT or "
        "PREPARE TRANSACTION); the connection sends nothing more and is discarded, the call fails; the gate commits "
        "after the callback returns";
    /// The message of the pqxx::sql_error (SQLSTATE 25P02) for a commit of a
    /// transaction in which a statement had failed.
    static constexpr const char* failed_transaction =
        "bulkhead: not committed: a statement of this transaction failed and its error was caught, so the server "
        "has aborted the transaction (SQLSTATE 25P02: current transaction is aborted); COMMIT was not sent, "
        "rollback() ends it";

    pooled_connection* owner = nullptr;                     // the leased connection; outlives the transaction
    std::string begin_statement;                            // BEGIN ... [; SET LOCAL ...], integers only
    const connect_target* target = nullptr;                 // to read a lost COMMIT's outcome; the lease keeps it alive
    clock::time_point settle_until{};                       // reading that outcome ends by then
    clock::time_point deadline = clock::time_point::max();  // the call's, or max()
    bool read_only = false;                                 // BEGIN ... READ ONLY: nothing can have been written
    bool track_txid = false;                                // COMMIT in pipeline mode after the id question
    // What that question answered: the id, no_txid (none was assigned:
    // nothing was written), or txid_unheard (no answer arrived).
    std::int64_t txid = txid_unheard;
    static constexpr std::int64_t txid_unheard = -1;
    static constexpr std::int64_t no_txid = 0;  // ids start at 3
    bool begin_carries_work = false;            // the caller's first statement follows BEGIN in its query
    bool begin_pending = false;                 // BEGIN deferred (pqxx_transaction) and not sent yet
    bool begin_failed = false;                  // the begin query failed: the transaction is over
    bool timeout_from_deadline = false;         // statement_timeout was set from the call's deadline
    bool lock_timeout_from_deadline = false;    // lock_timeout was set from the call's deadline
    bool permitted = false;                     // set by pqxx_pool::commit/rollback around their call into libpqxx
    bool closing = false;                       // the destructor is ending the transaction
    bool backend_open = false;                  // BEGIN ran and no COMMIT/ROLLBACK has ended it
    bool in_doubt = false;                      // the connection was lost during COMMIT
    bool refused = false;                       // the callback called commit() or abort()
    bool reset_pending = false;                 // a COMMIT failed on the server: its reset did not run
    std::exception_ptr abort_failure;           // a ROLLBACK that failed inside libpqxx's abort()
    socket_watchdog* watchdog = nullptr;        // the pool's (a stop may arm it without a deadline)
    bool watched = false;                       // the deadline armed it
    // The statement that goes with COMMIT (pqxx_transaction::exec_with_commit),
    // shared with the statement_result the callback returned; or null.
    std::shared_ptr<one_trip_statement> at_commit;

    /// Before the BEGIN query is sent: from here on the guard watches every
    /// result, the caller's first statement's when BEGIN carries one (BEGIN's
    /// and SET's own neither end the block nor write).
    void before_begin() noexcept { owner->guard.arm(); }
    void on_begun() noexcept { backend_open = true; }
    void settle_lost_commit(const std::exception& cause);
    /// The answer to xact_id_if_assigned().
    void read_txid(const PGresult& result) noexcept {
        if (PQresultStatus(&result) != PGRES_TUPLES_OK || PQntuples(&result) != 1 || PQnfields(&result) != 1) {
            return;
        }
        if (PQgetisnull(&result, 0, 0) != 0) {
            txid = no_txid;
            return;
        }
        const std::int64_t id = whole_integer(PQgetvalue(&result, 0, 0)).value_or(no_txid);
        if (id > no_txid) {
            txid = id;
        }
    }
    /// The BEGIN query failed. When it carried the caller's first statement
    /// and BEGIN itself ran (libpq says the session is in a transaction
    /// block), that statement failed: the transaction is rolled back, with the
    /// reset, and the connection kept if both succeed. Otherwise the
    /// connection is discarded.
    void on_begin_failed() noexcept;
    void on_closed() noexcept {
        owner->guard.disarm();
        if (backend_open || owner->guard.ended) {
            owner->discard = true;  // never ended on the server, or cut off: nobody may reuse the session
        }
        disarm_watchdog();
    }
    void on_commit(gate_transaction& tx);
    void on_abort(gate_transaction& tx);
    /// Sends BEGIN, at_commit's statement, COMMIT and the reset in one round
    /// trip; returns when the transaction committed.
    void commit_in_one_trip();
    /// After COMMIT's round trip: what the id question (when asked) and the
    /// COMMIT with its reset (`answer`) said, `alive` whether the connection
    /// held. Returns when the transaction committed; throws otherwise.
    void settle_commit(bool alive, const first_answer& question, const first_answer& answer);

    /// Before a statement of the callback is sent (libpqxx 6's do_exec; 7
    /// has no such hook and relies on block_guard's shut write side).
    /// \throws std::logic_error when an earlier statement ended the block.
    void before_statement() {
        if (owner->guard.ended) {
            throw std::logic_error(block_ended);
        }
        // A COMMIT of the callback's that failed (a deferred constraint)
        // ended the block with an error result, which the guard does not see:
        // libpq's status says so (no round trip).
        if (owner->guard.armed && PQtransactionStatus(owner->handle) == PQTRANS_IDLE) {
            owner->guard.ended = true;
            stop_sending(owner->handle);
            throw std::logic_error(block_ended);
        }
    }
    /// After a statement of the callback returned: one that ended the block
    /// (also a ROLLBACK that block_guard could not tell from ROLLBACK TO
    /// SAVEPOINT) throws at once, and nothing more is sent.
    /// \throws std::logic_error.
    void after_statement() {
        if (owner->guard.armed && !owner->guard.ended && PQtransactionStatus(owner->handle) == PQTRANS_IDLE) {
            owner->guard.ended = true;
            stop_sending(owner->handle);
        }
        before_statement();
    }

    /// True when a statement of the callback ended the transaction block.
    [[nodiscard]] bool ended_by_callback() const noexcept {
        return owner->guard.ended ||
               (owner->guard.armed && owner->handle != nullptr && PQtransactionStatus(owner->handle) == PQTRANS_IDLE);
    }

    /// True when the watchdog cut the connection off, for the deadline or
    /// for a stop.
    [[nodiscard]] bool cut_by_watchdog() const noexcept {
        return owner->cut_by_watchdog.load(std::memory_order_acquire);
    }

    /// True when the watchdog cut the connection off and no stop had armed
    /// it: the deadline and its slack passed.
    [[nodiscard]] bool cut_by_deadline() const noexcept {
        return cut_by_watchdog() && !owner->cut_for_stop.load(std::memory_order_acquire);
    }

    /// Disarms the watchdog's entry for the connection, the deadline's or a
    /// stop's; a connection it cut off meanwhile is discarded (after
    /// disarm(), `cut_by_watchdog` is final). Nothing, and no lock, for a
    /// call with neither.
    void disarm_watchdog() noexcept {
        if (watchdog == nullptr) {
            return;
        }
        if (std::exchange(watched, false) || owner->cut_for_stop.load(std::memory_order_acquire)) {
            watchdog->disarm(owner->watch_socket);
        }
        if (cut_by_watchdog()) {
            owner->discard = true;
        }
    }

    /// Closes the session, whose transaction the server then rolls back if
    /// it still holds it; the connection is discarded.
    void close_session() noexcept {
        backend_open = false;
        owner->discard = true;
        disarm_watchdog();  // first: the entry must not outlive what it watches
        pqxx_compat::close_connection(*owner->connection);
    }

    /// pqxx_pool::commit and pqxx_pool::rollback.
    static void commit(gate_transaction& tx);
    static void rollback(gate_transaction& tx);
};

/// Turns a failed result of the gate's own COMMIT or ROLLBACK into the
/// exception libpqxx would have thrown.
[[noreturn]] inline void throw_sql_error(const std::string& message, const std::string& statement,
                                         const std::string& sqlstate) {
    pqxx_compat::throw_server_error(one_line(message), statement, sqlstate);
}

/// What the server answered to the first statement of a simple query that
/// carries a reset after it.
struct first_answer {
    bool answered = false;     // a result for the first statement arrived
    bool succeeded = false;    // and it was a success
    bool rest_failed = false;  // a statement after it (the reset) failed
    std::string message;       // the first statement's error, when it failed
    std::string sqlstate;      // and its SQLSTATE
    bool from_server = false;  // that error came from the server (libpq's own carry no severity field)

    void record(std::size_t index, const PGresult& result) noexcept {
        const ExecStatusType status = PQresultStatus(&result);
        const bool ok = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
        if (index != 0) {
            rest_failed = rest_failed || !ok;
            return;
        }
        answered = true;
        succeeded = ok;
        if (!ok) {
            try {
                message = PQresultErrorMessage(&result);
                const char* state = PQresultErrorField(&result, PG_DIAG_SQLSTATE);
                sqlstate = state != nullptr ? state : "";
                from_server = PQresultErrorField(&result, PG_DIAG_SEVERITY_NONLOCALIZED) != nullptr;
            } catch (...) {  // out of memory: the failure is still recorded
            }
        }
    }
};

/// Sends `sql` as one simple query (a statement, then what follows it: the
/// reset) and records every answer in `answer`. True when the connection is
/// still good afterwards.
inline bool run_recorded(PGconn* connection, const char* sql, first_answer& answer) noexcept {
    return run_simple_query(connection, sql,
                            [&](std::size_t index, const PGresult& result) noexcept { answer.record(index, result); });
}

inline void transaction_control::on_begin_failed() noexcept {
    owner->guard.disarm();
    bool kept = false;
    if (begin_carries_work && !owner->guard.ended && !session_ending(owner->handle) &&
        inside_transaction_block(owner->handle)) {
        first_answer answer;
        const bool alive = run_recorded(owner->handle, owner->rollback_statement.c_str(), answer);
        kept = alive && answer.succeeded && !answer.rest_failed && !inside_transaction_block(owner->handle);
    }
    owner->discard = owner->discard || !kept;
    disarm_watchdog();
}

inline void transaction_control::on_commit(gate_transaction& /*tx*/) {
    if (!permitted) {
        refused = true;
        throw std::logic_error(refusal);
    }
    if (begin_pending || at_commit) {
        // A deferred BEGIN that no statement sent: nothing began, nothing to
        // commit or reset. Or the statement went with COMMIT, already sent.
        return;
    }
    if (ended_by_callback()) {
        throw std::logic_error(block_ended);
    }
    PGconn* const handle = owner->handle;
    // COMMIT of a transaction in which a statement failed (an error the
    // callback caught) rolls back and reports success. libpq knows that state
    // from the server's last answer (PQtransactionStatus: PQTRANS_INERROR):
    // COMMIT is then not sent, and the caller gets what any statement gets
    // there, SQLSTATE 25P02; the transaction stays open, for rollback().
    if (in_failed_transaction(handle)) {
        throw pqxx::sql_error(failed_transaction, "COMMIT", "25P02");
    }
    // A session the server ended while the callback ran (its backend
    // terminated, a restart) left its farewell or its close unread, which is
    // seen without waiting. COMMIT is then not sent and the connection is
    // closed: nothing can commit, and no lookup is needed to say so.
    if (session_ending(handle)) {
        close_session();
        throw pqxx::broken_connection(
            "bulkhead: the server ended the session before COMMIT, or sent something nobody asked for (COMMIT was "
            "not sent and the connection was closed, which confirms the transaction was rolled back)");
    }
    // COMMIT, then the session reset, in one round trip; each result is read
    // on its own, so the COMMIT's outcome is never mixed up with the reset's.
    // With the outcome tracked, the question for the transaction's id goes
    // first. After a statement that reported a write, in a pipeline with a
    // Flush behind the question: the server sends the id before it commits.
    // Otherwise ahead of COMMIT in the same simple query, where the server
    // sends the answers together at the end: an id that a write no tag showed
    // (a function called by a SELECT) is then learned unless the answers are
    // lost together, and the common read-only-in-effect transaction pays for
    // one short SELECT, not for eight extended-protocol statements.
    first_answer answer;
    const auto record = [&](std::size_t index, const PGresult& result) noexcept { answer.record(index, result); };
    first_answer question;  // the id question's, when tracked
    const auto record_question = [&](const PGresult& result) noexcept {
        question.record(0, result);
        read_txid(result);
    };
    bool alive = false;
    if (!track_txid) {
        alive = run_recorded(handle, owner->commit_statement.c_str(), answer);
    } else if (!owner->guard.wrote) {
        alive = run_simple_query(handle, owner->asked_commit_statement.c_str(),
                                 [&](std::size_t index, const PGresult& result) noexcept {
                                     if (index == 0) {
                                         record_question(result);
                                     } else {
                                         record(index - 1, result);
                                     }
                                 });
    } else {
#if defined(LIBPQ_HAS_PIPELINING)  // track_txid is only set where pipeline mode is usable
        const pipeline_statement asked{xact_id_if_assigned(owner->server_version)};
        alive = run_pipeline(
            handle, {&asked, 1}, owner->commit_steps,
            [&](std::size_t /*index*/, result_ptr& result) noexcept { record_question(*result); }, record);
#endif
    }
    settle_commit(alive, question, answer);
}

inline void transaction_control::settle_commit(bool alive, const first_answer& question, const first_answer& answer) {
    PGconn* const handle = owner->handle;
    if (question.answered && !question.succeeded && question.from_server) {
        // The server failed the question (a cancel or a timeout that hit it,
        // its farewell): it skipped everything up to the Sync, the COMMIT
        // included, so nothing was committed.
        const std::string why = "bulkhead: COMMIT was not run: the server failed the question sent ahead of it (" +
                                one_line(question.message) + ") and skipped the rest";
        if (!alive) {
            close_session();
            throw pqxx::broken_connection(why +
                                          ", then the connection was lost (which confirms the transaction was rolled "
                                          "back)");
        }
        backend_open = inside_transaction_block(handle);  // the server holds the failed transaction
        reset_pending = true;
        throw_sql_error(why, "COMMIT", question.sqlstate);
    }
    if (!answer.answered || (!answer.succeeded && !alive)) {
        try {
            throw pqxx::broken_connection(std::string(PQerrorMessage(handle)));
        } catch (const std::exception& lost) {
            settle_lost_commit(lost);
            return;
        }
    }
    if (!answer.succeeded) {
        // The server answered: a failed COMMIT ends the transaction (libpq's
        // status says so without a round trip); the reset after it did not
        // run, so the session is not trusted again.
        backend_open = inside_transaction_block(handle);
        reset_pending = true;
        throw_sql_error(answer.message, "COMMIT", answer.sqlstate);
    }
    backend_open = false;
    if (answer.rest_failed || !alive) {
        owner->discard = true;  // committed; the reset did not complete
    }
}

/// BEGIN and its SET LOCALs, the statement, the question for the id (when
/// tracked), a Flush, COMMIT and the reset, and a Sync, in pipeline mode and
/// one write. The server stops at the first statement that fails and skips
/// everything up to the Sync, COMMIT included: a failed statement commits
/// nothing and leaves the failed transaction for rollback(). The Flush makes
/// the server send the statement's result and the id before it commits, so
/// a COMMIT whose connection is lost is settled as any other (B, E, I1).
inline void transaction_control::commit_in_one_trip() {
    one_trip_statement& work = *at_commit;
    PGconn* const handle = owner->handle;
    if (session_ending(handle)) {
        close_session();
        throw pqxx::broken_connection(
            "bulkhead: the server ended the session before the statement was sent (nothing was sent, and the "
            "connection was closed)");
    }
    std::vector<const char*> values;
    values.reserve(work.parameters.size());
    for (const std::optional<std::string>& parameter : work.parameters) {
        values.push_back(parameter ? parameter->c_str() : nullptr);
    }
    std::vector<pipeline_statement> head;
    head.reserve(work.begin.size() + 2);
    for (const std::string& step : work.begin) {
        head.push_back({step.c_str()});
    }
    const std::size_t at = head.size();
    head.push_back({work.sql.c_str(), static_cast<int>(values.size()), values.data()});
    if (track_txid) {
        head.push_back({xact_id_if_assigned(owner->server_version)});
    }
    first_answer opening;    // BEGIN and SET LOCAL: the first that failed
    first_answer statement;  // the caller's
    result_ptr rows;
    first_answer question;
    first_answer answer;           // COMMIT, then the reset
    backend_open = true;           // until the answers say otherwise
#if defined(LIBPQ_HAS_PIPELINING)  // exec_with_commit refuses to register a statement without it
    const bool alive = run_pipeline(
        handle, head, owner->commit_steps,
        [&](std::size_t index, result_ptr& result) noexcept {
            if (index < at) {
                if (!opening.answered || opening.succeeded) {
                    opening.record(0, *result);
                }
            } else if (index == at) {
                statement.record(0, *result);
                rows = std::move(result);
            } else {
                question.record(0, *result);
                read_txid(*result);
            }
        },
        [&](std::size_t index, const PGresult& result) noexcept { answer.record(index, result); });
#else
    (void)at;
    const bool alive = false;
#endif
    // A failure the server reported before COMMIT: it skipped the rest.
    const first_answer* failed = nullptr;
    const char* failed_sql = nullptr;
    if (opening.answered && !opening.succeeded && opening.from_server) {
        failed = &opening;
        failed_sql = work.begin.front().c_str();
    } else if (statement.answered && !statement.succeeded && statement.from_server) {
        failed = &statement;
        failed_sql = work.sql.c_str();
    }
    if (failed != nullptr) {
        if (alive) {
            backend_open = inside_transaction_block(handle);  // the failed transaction, for rollback()
        } else {
            close_session();  // which the server rolls back
        }
        throw_sql_error(failed->message, failed_sql, failed->sqlstate);
    }
    // The statement ended the transaction block itself (COMMIT, ROLLBACK,
    // PREPARE TRANSACTION...): only the pool's own statements ran after it,
    // outside any block. Misuse, as from a callback (E3).
    if (statement.succeeded && rows && ends_transaction_block(PQcmdStatus(rows.get()), 0)) {
        owner->guard.ended = true;
        owner->discard = true;
        backend_open = false;
        throw std::logic_error(block_ended);
    }
    settle_commit(alive, question, answer);
    // Committed: the statement's answer came before the id's, which a
    // lookup needs, and before COMMIT's.
    work.result = std::move(rows);
}

/// Called for a COMMIT whose connection was lost. Returns (the COMMIT counts
/// as done) when the server confirms the transaction committed; otherwise
/// throws: pqxx::broken_connection when it confirms the rollback, or when
/// nothing could have been written (read only); bulkhead::commit_unknown,
/// with `cause` nested when called inside its catch handler, when the outcome
/// cannot be had by settle_until. The lost connection is closed before the
/// outcome is looked up on a new one, so the pool never has more than
/// max_size connections to the server.
inline void transaction_control::settle_lost_commit(const std::exception& cause) {
    in_doubt = true;
    close_session();  // the session is gone, and the transaction with it
    // After the watchdog's cut libpq says the server closed the connection:
    // name who did, and why.
    const bool cut = cut_by_watchdog();
    const char* why = cut_by_deadline() ? "the call's deadline and its slack having passed"
                                        : "a stop's cancel request having gone unanswered for deadline_slack";
    const std::string lost =
        std::string("bulkhead: the connection was lost during COMMIT: ") +
        (cut ? "the pool's watchdog shut it down, " + std::string(why) + " (libpq: " + one_line(cause.what()) + ")"
             : one_line(cause.what()));
    if (read_only) {
        throw pqxx::broken_connection(lost + " (a read-only transaction: nothing was written)");
    }
    if (!track_txid || target == nullptr) {
        std::throw_with_nested(commit_unknown(lost + " (commit outcome tracking is off)"));
    }
    if (txid == no_txid) {
        throw pqxx::broken_connection(lost +
                                      " (no transaction id was assigned before COMMIT: no row was written; a NOTIFY "
                                      "of it, which gets an id at COMMIT, may have been delivered)");
    }
    if (txid == txid_unheard) {
        std::throw_with_nested(commit_unknown(
            lost + " (the answer with the transaction's id was lost too, so its outcome cannot be read)"));
    }
    if (!owner->place.known()) {
        std::throw_with_nested(
            commit_unknown(lost + " (the outcome cannot be read: " + other_place(owner->place, server_place{}) + ")"));
    }
    const std::string_view function = xact_status_function(owner->server_version);
    const commit_lookup found = read_commit_status(*target, owner->server_version, txid, owner->place, settle_until);
    switch (found.status) {
        case commit_status::committed:
            in_doubt = false;
            return;
        case commit_status::aborted:
            throw pqxx::broken_connection(lost + " (" + std::string(function) +
                                          " confirms the transaction was rolled back)");
        case commit_status::unknown:
            break;
    }
    if (!found.other_server.empty()) {
        std::throw_with_nested(commit_unknown(lost + " (the outcome cannot be read: " + found.other_server + ")"));
    }
    std::throw_with_nested(commit_unknown(lost + " (" + std::string(function) + " could not be read in time)"));
}

inline void transaction_control::on_abort(gate_transaction& /*tx*/) {
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
    if (owner->guard.ended) {
        backend_open = false;  // the callback ended it; the connection sends nothing more
        return;
    }
    first_answer answer;
    const bool alive = run_recorded(owner->handle, owner->rollback_statement.c_str(), answer);
    try {
        if (!answer.answered || (!answer.succeeded && !alive)) {
            throw pqxx::broken_connection("bulkhead: ROLLBACK failed, the connection was lost: " +
                                          one_line(PQerrorMessage(owner->handle)));
        }
        if (!answer.succeeded) {
            throw_sql_error(answer.message, "ROLLBACK", answer.sqlstate);
        }
    } catch (...) {
        abort_failure = std::current_exception();  // libpqxx's abort() swallows it; rollback() rethrows
        throw;
    }
    backend_open = false;
    if (answer.rest_failed || !alive) {
        owner->discard = true;  // rolled back; the reset did not complete
    }
}

/// Sets transaction_control::permitted for one call, and stops watching the
/// callback's statements (the pool's own follow).
class permitted_scope {
public:
    explicit permitted_scope(transaction_control& control) noexcept : m_control(control) {
        m_control.permitted = true;
        m_control.owner->guard.disarm();
    }
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
    if (control.begin_failed) {
        // A deferred BEGIN whose query failed, its error caught by the
        // callback: nothing is committed (on_begin_failed rolled it back).
        throw pqxx::sql_error(failed_transaction, "COMMIT", "25P02");
    }
    if (control.ended_by_callback()) {
        control.owner->guard.ended = true;
        throw std::logic_error(block_ended);
    }
    const permitted_scope permit(control);
    if (control.at_commit) {
        control.commit_in_one_trip();
        if (!control.owner->connection->is_open()) {
            // Settled as committed after its connection was lost: libpqxx 7
            // refuses commit() on a closed connection; the transaction's
            // destructor closes libpqxx's books.
            return;
        }
    }
    tx.commit();
}

inline void transaction_control::rollback(gate_transaction& tx) {
    transaction_control& control = tx.control();
    const permitted_scope permit(control);
    if (!control.in_doubt && !control.begin_failed) {
        tx.abort();  // libpqxx's books; sends ROLLBACK (do_abort) while it counts the transaction active
    }
    if (control.abort_failure) {
        std::rethrow_exception(std::exchange(control.abort_failure, nullptr));
    }
    const char* statement = nullptr;
    if (control.backend_open && !control.owner->guard.ended) {
        // libpqxx had already closed its books (a refused commit or abort, or
        // a commit refused for 25P02): end the server's transaction directly,
        // with the reset after it.
        statement = control.owner->rollback_statement.c_str();
    } else if (control.reset_pending) {
        statement = control.owner->reset_statement.c_str();  // a COMMIT failed before its reset ran
    }
    if (statement != nullptr) {
        first_answer answer;
        const bool alive = run_recorded(control.owner->handle, statement, answer);
        control.backend_open = control.backend_open && inside_transaction_block(control.owner->handle);
        control.reset_pending = false;
        if (!alive || !answer.succeeded || answer.rest_failed) {
            control.owner->discard = true;
            if (!answer.succeeded) {
                throw pqxx::broken_connection(
                    "bulkhead: ROLLBACK failed: " +
                    one_line(answer.message.empty() ? PQerrorMessage(control.owner->handle) : answer.message));
            }
        }
    }
}

}  // namespace bulkhead::detail
