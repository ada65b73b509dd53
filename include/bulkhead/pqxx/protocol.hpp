// bulkhead: the gate's transaction protocol, on libpq's PGconn*.
//
// What the pool says to the server around a gate transaction, and what it
// reads back, written against libpq alone so that another pool (raw libpq,
// an asynchronous one) can reuse it:
// - the BEGIN statement: isolation level and access mode spelled out, SET
//   LOCAL for the timeouts, in one simple query (one round trip);
// - status checks from libpq's record of the server's last ReadyForQuery
//   (PQtransactionStatus): no round trip;
// - the guard on the callback's statements: a libpq event procedure sees
//   every result the server sends; one that ended the transaction block
//   (COMMIT, ROLLBACK, PREPARE TRANSACTION from the callback) shuts the
//   connection's write side at once, so no later statement can reach the
//   server and run outside the transaction (block_guard);
// - the session reset that follows the gate's own COMMIT or ROLLBACK in the
//   same round trip (session_reset_steps): no round trip of its own;
// - the COMMIT of a transaction whose outcome is tracked, in pipeline mode
//   after a question for the transaction's id if it has one, whose answer
//   the server sends before it commits (run_pipeline): the id is learned
//   without forcing the server to assign one, and without a round trip of
//   its own;
// - a cancel request sent from a thread of its own (cancel_request), so the
//   thread that asks never waits on the network;
// - the lost-commit lookup: the server's function names by version, and
//   which server answers it (commit_origin.hpp: an answer counts only from
//   the instance and timeline the transaction ran on).
//
// Guarantees: only integers and fixed keywords go into a statement built
// here; nothing here sends anything unless its comment says so.
// Thread safety: a PGconn* belongs to one thread at a time; block_guard is
// touched only by that thread (libpq calls the event procedure there);
// cancel_request::send may be called from any thread.
#pragma once

#include <bulkhead/detail/detached_threads.hpp>
#include <bulkhead/detail/socket_wait.hpp>
#include <bulkhead/pqxx/commit_origin.hpp>
#include <bulkhead/pqxx/conninfo.hpp>
#include <bulkhead/pqxx/options.hpp>

#include <libpq-events.h>
#include <libpq-fe.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#if defined(_WIN32)
#include <winsock2.h>
#else
#include <sys/socket.h>
#endif

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

/// The statement that reads the transaction's id when it has one, for a
/// server of version `server_version` (PQserverVersion): NULL when nothing
/// has made the server assign one, that is when the transaction has written
/// nothing. pg_current_xact_id_if_assigned() from 13 on,
/// txid_current_if_assigned() before. Asking does not assign an id (asking
/// with pg_current_xact_id() would, and an id costs the server work at
/// COMMIT: a commit record, the commit log, the shared list of running ids).
[[nodiscard]] constexpr const char* xact_id_if_assigned(int server_version) noexcept {
    return server_version >= 130000 ? "SELECT pg_current_xact_id_if_assigned()" : "SELECT txid_current_if_assigned()";
}

/// Which server answers (commit_origin.hpp): in recovery or not, the
/// system identifier, the postmaster's start time in microseconds, and, out
/// of recovery, the WAL file name of the insert position, which names the
/// timeline (pg_walfile_name() fails during recovery). Asked when a
/// connection opens and first on a lost COMMIT's lookup. PostgreSQL 10 or
/// later; every function in it may be called by any user.
inline constexpr const char* server_place_query =
    "SELECT pg_is_in_recovery(), (SELECT system_identifier FROM pg_control_system()), "
    "(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint, "
    "CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_insert_lsn()) END";

/// The function that reads a transaction's status, by server version.
[[nodiscard]] constexpr std::string_view xact_status_function(int server_version) noexcept {
    return server_version >= 130000 ? "pg_xact_status" : "txid_status";
}

/// The statement asking what became of transaction `xid`.
[[nodiscard]] inline std::string xact_status_query(int server_version, std::int64_t xid) {
    std::string query = "SELECT ";
    query.append(xact_status_function(server_version));
    // xid8 has no cast from integer types; from text it has.
    query.append(server_version >= 130000 ? "('" : "(").append(std::to_string(xid));
    query.append(server_version >= 130000 ? "'::xid8)" : ")");
    return query;
}

/// Waits until `socket` has something to read, or `deadline` passes.
inline bool wait_readable(int socket, std::chrono::steady_clock::time_point deadline) noexcept {
    return wait_socket(socket, false, deadline);
}

/// True when the server has sent something on an idle connection that
/// nobody has read yet: most often that it is closing the connection (a
/// terminated backend, a restart). Looks without waiting.
[[nodiscard]] inline bool has_unread_input(PGconn* connection) noexcept {
    return connection != nullptr && wait_readable(PQsocket(connection), std::chrono::steady_clock::now());
}

/// True when the session is gone or going, as far as libpq can tell without
/// waiting: libpq knows it is broken, or the server sent something nobody
/// asked for. Between the statements of a transaction the server sends
/// nothing unasked except its farewell (a terminated backend, a restart,
/// idle_in_transaction_session_timeout; a notification waits for the end of
/// the transaction). Looks without blocking; sends and reads nothing.
[[nodiscard]] inline bool session_ending(PGconn* connection) noexcept {
    return connection == nullptr || PQstatus(connection) == CONNECTION_BAD || has_unread_input(connection);
}

/// Makes libpq initialize its crypto library now, on this thread, once per
/// process. libpq uses OpenSSL's libcrypto for SCRAM and TLS, and OpenSSL
/// registers its exit-time cleanup (std::atexit) when it is first
/// initialized. Exit handlers run in reverse order of registration, so that
/// cleanup must be registered before detached_threads registers its exit
/// hook: then the hook waits for the threads that may still be inside
/// OpenSSL before OpenSSL frees its locks. Without this, the first
/// connection of a process, made on a detached thread, registered it after
/// the hook (ThreadSanitizer reported the exit freeing a lock that thread had
/// used). Computes one MD5 password hash (a libpq call that needs no
/// connection and initializes the library); without OpenSSL in libpq it
/// does nothing else.
inline void initialize_libpq_crypto() noexcept {
    static const bool done = [] {
        char* hashed = PQencryptPassword("bulkhead", "bulkhead");
        PQfreemem(hashed);
        return true;
    }();
    (void)done;
}

/// A libpq connection of the pool's own, for short lookups: PQfinish on
/// destruction.
class owned_pgconn {
public:
    explicit owned_pgconn(PGconn* connection) noexcept : m_connection(connection) {}
    owned_pgconn(const owned_pgconn&) = delete;
    owned_pgconn& operator=(const owned_pgconn&) = delete;
    ~owned_pgconn() {
        if (m_connection != nullptr) {
            PQfinish(m_connection);
        }
    }
    [[nodiscard]] PGconn* get() const noexcept { return m_connection; }

private:
    PGconn* m_connection;
};

/// Connects without blocking past `deadline` (libpq's asynchronous
/// connect, PQconnectStart and PQconnectPoll). Null on failure or timeout.
[[nodiscard]] inline std::unique_ptr<owned_pgconn> connect_before(const std::string& conninfo,
                                                                  std::chrono::steady_clock::time_point deadline) {
    auto connection = std::make_unique<owned_pgconn>(PQconnectStart(conninfo.c_str()));
    if (connection->get() == nullptr || PQstatus(connection->get()) == CONNECTION_BAD) {
        return nullptr;
    }
    for (PostgresPollingStatusType state = PGRES_POLLING_WRITING;;) {
        if (state == PGRES_POLLING_OK) {
            return connection;
        }
        if (state == PGRES_POLLING_FAILED ||
            !wait_socket(PQsocket(connection->get()), state == PGRES_POLLING_WRITING, deadline)) {
            return nullptr;
        }
        state = PQconnectPoll(connection->get());
    }
}

/// Sends `sql` as one simple query and hands each of its results to
/// on_result(const PGresult&), never waiting past `deadline`. False when it
/// could not be sent or the wait ended first: an answer may then be pending,
/// and the connection must not be reused. Each result is cleared after
/// on_result, also when it throws.
template <class OnResult>
[[nodiscard]] bool query_before(PGconn* connection, const char* sql, std::chrono::steady_clock::time_point deadline,
                                OnResult&& on_result) {
    if (connection == nullptr || PQsendQuery(connection, sql) == 0) {
        return false;
    }
    for (;;) {
        while (PQisBusy(connection) != 0) {
            if (!wait_readable(PQsocket(connection), deadline) || PQconsumeInput(connection) == 0) {
                return false;
            }
        }
        const std::unique_ptr<PGresult, decltype(&PQclear)> result(PQgetResult(connection), &PQclear);
        if (!result) {
            return true;
        }
        on_result(*result);
    }
}

/// Runs `sql` (one statement returning one value) without waiting past
/// `deadline`. The value as text, or nothing on any failure, a NULL
/// included.
[[nodiscard]] inline std::optional<std::string> query_value_before(PGconn* connection, const std::string& sql,
                                                                   std::chrono::steady_clock::time_point deadline) {
    std::optional<std::string> value;
    bool failed = false;
    const bool read = query_before(connection, sql.c_str(), deadline, [&](const PGresult& result) {
        if (PQresultStatus(&result) == PGRES_TUPLES_OK && PQntuples(&result) == 1 && PQnfields(&result) == 1 &&
            PQgetisnull(&result, 0, 0) == 0) {
            value.emplace(PQgetvalue(&result, 0, 0));
        } else {
            failed = true;
        }
    });
    return read && !failed ? value : std::nullopt;
}

/// Runs `sql` (one or more statements) without waiting past `deadline`.
/// True when every statement succeeded and the connection is still good;
/// on false the connection must not be reused (an answer may be pending).
[[nodiscard]] inline bool run_before(PGconn* connection, const char* sql,
                                     std::chrono::steady_clock::time_point deadline) noexcept {
    bool ok = true;
    const bool read = query_before(connection, sql, deadline, [&](const PGresult& result) noexcept {
        const ExecStatusType status = PQresultStatus(&result);
        ok = ok && (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK);
    });
    return read && ok && PQstatus(connection) == CONNECTION_OK;
}

/// Asks the server on `connection` which server it is (server_place_query),
/// without waiting past `deadline`. Nothing on any failure (out of memory
/// included); then the connection may have an answer pending.
[[nodiscard]] inline std::optional<server_place> read_server_place(
    PGconn* connection, std::chrono::steady_clock::time_point deadline) noexcept {
    std::optional<server_place> place;
    bool failed = false;
    const bool read = query_before(connection, server_place_query, deadline, [&](const PGresult& result) noexcept {
        if (PQresultStatus(&result) != PGRES_TUPLES_OK || PQntuples(&result) != 1 || PQnfields(&result) != 4 ||
            PQgetisnull(&result, 0, 0) != 0) {
            failed = true;
            return;
        }
        const auto field = [&](int column) -> const char* {
            return PQgetisnull(&result, 0, column) != 0 ? nullptr : PQgetvalue(&result, 0, column);
        };
        try {
            place.emplace();
            place->in_recovery = std::string_view(PQgetvalue(&result, 0, 0)) != "f";
            place->system_identifier = field(1) != nullptr ? field(1) : "";
            place->started_us = field(2) != nullptr ? whole_integer(field(2)).value_or(0) : 0;
            place->timeline = field(3) != nullptr ? walfile_timeline(field(3)).value_or(0) : 0;
        } catch (...) {  // out of memory
            failed = true;
        }
    });
    return read && !failed ? place : std::nullopt;
}

/// What a lost COMMIT's lookup found: the status, and when it is unknown
/// because another server answered, why.
struct commit_lookup {
    commit_status status = commit_status::unknown;
    std::string other_server;  // empty unless the answering server cannot speak for the transaction
};

/// Asks a server, on a connection of its own made from `target`, what
/// became of transaction `xid`, which ran at `ran`. First asks which server
/// answers: unless it is the instance and timeline the transaction ran on,
/// out of recovery, nothing else is asked and the outcome is unknown at once
/// (other_server says why; that server will not become the right one).
/// Retries while the transaction is still "in progress" (its backend is
/// still ending it) or no server can be reached, never past `until`. Every
/// wait is bounded by `until`, the connection attempt included.
inline commit_lookup read_commit_status(const connect_target& target, int server_version, std::int64_t xid,
                                        const server_place& ran, std::chrono::steady_clock::time_point until) noexcept {
    using clock = std::chrono::steady_clock;
    commit_lookup found;
    for (auto pause = std::chrono::milliseconds(10);; pause = std::min(pause * 2, std::chrono::milliseconds(200))) {
        try {
            if (const auto connection = connect_before(connect_string(target, until - clock::now()), until)) {
                if (const std::optional<server_place> answering = read_server_place(connection->get(), until)) {
                    found.other_server = other_place(ran, *answering);
                    if (!found.other_server.empty()) {
                        return found;
                    }
                    const std::optional<std::string> said =
                        query_value_before(connection->get(), xact_status_query(server_version, xid), until);
                    if (said == "committed") {
                        found.status = commit_status::committed;
                        return found;
                    }
                    if (said == "aborted") {
                        found.status = commit_status::aborted;
                        return found;
                    }
                }
            }
        } catch (...) {  // out of memory: as unreachable
            found.other_server.clear();
        }
        if (clock::now() + pause >= until) {
            return found;
        }
        std::this_thread::sleep_for(pause);
    }
}

/// BEGIN with the options' isolation level and access mode, then SET LOCAL
/// for each timeout they set: one statement each.
/// \throws std::invalid_argument for a timeout outside [0, INT_MAX] ms.
template <class Options>
std::vector<std::string> begin_steps(const Options& options) {
    std::vector<std::string> steps;
    std::string& begin = steps.emplace_back("BEGIN ISOLATION LEVEL ");
    switch (options.isolation_level) {
        case isolation::read_committed:
            begin += "READ COMMITTED";
            break;
        case isolation::repeatable_read:
            begin += "REPEATABLE READ";
            break;
        case isolation::serializable:
            begin += "SERIALIZABLE";
            break;
        default:
            throw std::invalid_argument("bulkhead::pqxx_pool: isolation_level is not a bulkhead::isolation");
    }
    begin += options.read_only ? " READ ONLY" : " READ WRITE";
    const auto set_local = [&](std::string_view name, const std::optional<std::chrono::milliseconds>& value) {
        if (!value) {
            return;
        }
        if (value->count() < 0 || value->count() > INT_MAX) {
            throw std::invalid_argument("bulkhead::pqxx_pool: " + std::string(name) + " must be in [0, " +
                                        std::to_string(INT_MAX) + "] ms, got " + std::to_string(value->count()) +
                                        " ms");
        }
        steps.push_back("SET LOCAL " + std::string(name) + " = " + std::to_string(value->count()));
    };
    set_local("statement_timeout", options.statement_timeout);
    set_local("lock_timeout", options.lock_timeout);
    return steps;
}

/// Statements joined into one simple query.
[[nodiscard]] inline std::string one_query(const std::vector<std::string>& statements) {
    std::string query;
    for (const std::string& statement : statements) {
        query.append(query.empty() ? "" : "; ").append(statement);
    }
    return query;
}

/// begin_steps() as one simple query: one round trip.
/// \throws std::invalid_argument for a timeout outside [0, INT_MAX] ms.
template <class Options>
std::string begin_statement(const Options& options) {
    return one_query(begin_steps(options));
}

// --- the guard on the callback's statements ---------------------------------

/// Watches the results of one connection while the gate's callback runs on
/// it. Lives in the pooled connection (a stable address, handed to libpq as
/// the event procedure's pass-through pointer). Owned by the thread that uses
/// the connection.
struct block_guard {
    bool armed = false;  // the callback's statements are running
    bool ended = false;  // one of them ended the transaction block
    // SAVEPOINT results minus RELEASE results since arming: never below the
    // number of savepoints that exist (RELEASE may free several), so with 0
    // no savepoint exists and a "ROLLBACK" result cannot be ROLLBACK TO.
    int savepoints = 0;
    // A result since arming whose command tag may come from a write
    // (reports_no_write() false for it): INSERT, UPDATE, a failed statement,
    // anything but the tags of reading and of session bookkeeping. Not every
    // write shows in a tag (a SELECT calling a function that writes, or a
    // SELECT ... FOR UPDATE), so false means "no statement said it wrote",
    // not "nothing was written".
    bool wrote = false;

    void arm() noexcept {
        armed = true;
        ended = false;
        savepoints = 0;
        wrote = false;
    }
    void disarm() noexcept { armed = false; }
};

/// True when a statement whose command tag is `tag` ended the transaction
/// block it ran in. COMMIT and END say "COMMIT" (and COMMIT of a failed
/// transaction says "ROLLBACK"); ROLLBACK and ABORT say "ROLLBACK", and so
/// does ROLLBACK TO SAVEPOINT, which is told apart by the savepoint count.
[[nodiscard]] constexpr bool ends_transaction_block(std::string_view tag, int savepoints) noexcept {
    return tag == "COMMIT" || tag == "PREPARE TRANSACTION" || (tag == "ROLLBACK" && savepoints == 0);
}

/// True when a result with command tag `tag` (PQcmdStatus: "SELECT 1",
/// "FETCH 10", "SET") is of a statement that does not write by itself:
/// SELECT, SHOW, FETCH, MOVE, cursors, SET and RESET, savepoints, BEGIN
/// (the pool's own, when it carries the caller's first statement). Anything
/// else, an empty tag (an error, COPY) and EXPLAIN (EXPLAIN ANALYZE runs the
/// statement) included, may have written.
[[nodiscard]] constexpr bool reports_no_write(std::string_view tag) noexcept {
    const std::string_view word = tag.substr(0, tag.find(' '));
    return word == "SELECT" || word == "SHOW" || word == "BEGIN" || word == "FETCH" || word == "MOVE" ||
           tag == "DECLARE CURSOR" || tag == "CLOSE CURSOR" || tag == "CLOSE CURSOR ALL" || word == "SET" ||
           word == "RESET" || word == "SAVEPOINT" || word == "RELEASE" || word == "ROLLBACK";
}

/// Shuts the write side of the connection's socket: what was sent is still
/// answered and read; the next statement fails on the client (libpq reports
/// the connection lost) before any of it reaches the server.
inline void stop_sending(PGconn* connection) noexcept {
    const int socket = PQsocket(connection);
    if (socket >= 0) {
#if defined(_WIN32)
        (void)::shutdown(static_cast<SOCKET>(socket), SD_SEND);
#else
        (void)::shutdown(socket, SHUT_WR);
#endif
    }
}

/// libpq's event procedure for block_guard (PGEventProc): called on the
/// connection's own thread for each result libpq builds from the server's
/// answer, before the call that sent the statement returns.
inline int block_guard_event(PGEventId event, void* info, void* pass_through) noexcept {
    if (event != PGEVT_RESULTCREATE || pass_through == nullptr) {
        return 1;
    }
    block_guard& guard = *static_cast<block_guard*>(pass_through);
    if (!guard.armed || guard.ended) {
        return 1;
    }
    const auto& created = *static_cast<PGEventResultCreate*>(info);
    const std::string_view tag = PQcmdStatus(created.result);
    guard.wrote = guard.wrote || !reports_no_write(tag);
    if (tag == "SAVEPOINT") {
        ++guard.savepoints;
    } else if (tag == "RELEASE") {
        guard.savepoints = std::max(0, guard.savepoints - 1);
    } else if (ends_transaction_block(tag, guard.savepoints)) {
        guard.ended = true;
        stop_sending(created.conn);
    }
    return 1;  // never fails the result: what the server did, it did
}

/// Registers `guard` with `connection` (once, when the pool opens it).
/// False when libpq refuses (out of memory).
[[nodiscard]] inline bool watch_transaction_block(PGconn* connection, block_guard& guard) noexcept {
    return connection != nullptr &&
           PQregisterEventProc(connection, block_guard_event, "bulkhead block_guard", &guard) != 0;
}

// --- the session reset --------------------------------------------------------

/// What puts a session back as the pool opened it: settings (SET, SET
/// SESSION, set_config), role and session authorization, session advisory
/// locks, cursors (WITH HOLD ones included), LISTEN registrations and
/// temporary tables. Prepared statements stay (on_connect prepares those that
/// are meant to). It follows the gate's COMMIT or ROLLBACK in the same simple
/// query, where it runs in an implicit transaction of its own: no round trip
/// of its own, and a failure in it cannot touch the transaction before it.
/// DISCARD ALL would do most of this but cannot run in a multi-statement
/// query.
inline constexpr std::array<std::string_view, 6> session_reset_steps = {
    "RESET ALL",    "SET SESSION AUTHORIZATION DEFAULT", "SELECT pg_advisory_unlock_all()", "CLOSE ALL", "UNLISTEN *",
    "DISCARD TEMP",
};

/// Run once on a new connection after on_connect: a statement that sets
/// again what on_connect set for the session (RESET ALL undoes it), or an
/// empty string. set_config() takes each value as SHOW shows it; %L quotes.
inline constexpr const char* session_settings_query =
    "SELECT coalesce('SELECT ' || string_agg(format('set_config(%L, %L, false)', name, current_setting(name)), "
    "', '), '') FROM pg_settings WHERE source = 'session'";

/// `first` (COMMIT or ROLLBACK, or nothing), then the reset, then `restore`
/// (what session_settings_query returned, possibly empty): one statement each.
[[nodiscard]] inline std::vector<std::string> reset_steps(std::string_view first, std::string_view restore) {
    std::vector<std::string> steps;
    steps.reserve(session_reset_steps.size() + 2);
    if (!first.empty()) {
        steps.emplace_back(first);
    }
    steps.insert(steps.end(), session_reset_steps.begin(), session_reset_steps.end());
    if (!restore.empty()) {
        steps.emplace_back(restore);
    }
    return steps;
}

/// Sends `sql` as one simple query and reads every result, calling
/// `on_result(index, result)` (noexcept) for each. True when the connection
/// is still good after the last one; false when it broke (or the query could
/// not be sent), in which case some results may be missing.
template <class OnResult>
bool run_simple_query(PGconn* connection, const char* sql, OnResult&& on_result) noexcept {
    static_assert(noexcept(on_result(std::size_t{}, std::declval<const PGresult&>())));
    if (connection == nullptr || PQsendQuery(connection, sql) == 0) {
        return false;
    }
    std::size_t index = 0;
    while (PGresult* result = PQgetResult(connection)) {
        on_result(index++, *result);
        PQclear(result);
    }
    return PQstatus(connection) == CONNECTION_OK;
}

/// Frees a libpq result.
struct result_clear {
    void operator()(PGresult* result) const noexcept { PQclear(result); }
};
/// A libpq result, owned.
using result_ptr = std::unique_ptr<PGresult, result_clear>;

/// One statement sent in pipeline mode: its text and its parameters ($1,
/// ...), text format, a null pointer for NULL.
struct pipeline_statement {
    const char* sql = nullptr;
    int parameter_count = 0;
    const char* const* parameters = nullptr;
};

/// Sends each of `head` (one statement each), a Flush, each of `tail` (one
/// statement each) and a Sync, in pipeline mode and in one write, and reads
/// every answer: on_head(index, result) for the result(s) of head[index]
/// (a result_ptr&, which it may take over),
/// on_tail(index, result) for those of tail[index] (a statement skipped
/// after an error before it gets a PGRES_PIPELINE_ABORTED result). The
/// server answers `head` and, told by the Flush, sends those answers before
/// it runs anything of `tail`. One round trip. A COPY in `head` has its
/// rows read and dropped (TO STDOUT); one FROM STDIN fails on the server,
/// which finds the pipeline's next message where it wanted rows, and libpq
/// is told the COPY is over; on_head sees its results. True when the connection is still good
/// afterwards, every answer was read and pipeline mode was left; false when
/// it broke (or nothing could be sent), in which case some results may be
/// missing. Needs libpq 14.5 or later (pipeline_usable()); any server with
/// the extended query protocol.
#if defined(LIBPQ_HAS_PIPELINING)
template <class OnHead, class OnTail>
bool run_pipeline(PGconn* connection, std::span<const pipeline_statement> head, const std::vector<std::string>& tail,
                  OnHead&& on_head, OnTail&& on_tail) noexcept {
    static_assert(noexcept(on_head(std::size_t{}, std::declval<result_ptr&>())));
    static_assert(noexcept(on_tail(std::size_t{}, std::declval<const PGresult&>())));
    if (connection == nullptr || PQenterPipelineMode(connection) == 0) {
        return false;
    }
    bool sent = true;
    for (const pipeline_statement& statement : head) {
        sent = sent && PQsendQueryParams(connection, statement.sql, statement.parameter_count, nullptr,
                                         statement.parameters, nullptr, nullptr, 0) != 0;
    }
    sent = sent && PQsendFlushRequest(connection) != 0;
    for (const std::string& statement : tail) {
        sent = sent && PQsendQueryParams(connection, statement.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0) != 0;
    }
    sent = sent && PQpipelineSync(connection) != 0;  // sends everything
    // The results of one statement, up to the null that ends them; false when
    // the connection broke or the answers are out of step.
    const auto read_statement = [connection](auto&& each) noexcept {
        while (result_ptr result{PQgetResult(connection)}) {
            const ExecStatusType status = PQresultStatus(result.get());
            if (status == PGRES_PIPELINE_SYNC) {
                return false;
            }
            each(result);
            if (status == PGRES_COPY_OUT) {
                char* row = nullptr;
                int length = 0;
                while ((length = PQgetCopyData(connection, &row, 0)) >= 0) {
                    PQfreemem(row);
                }
                if (length == -2) {
                    return false;
                }
            } else if (status == PGRES_COPY_IN || status == PGRES_COPY_BOTH) {
                if (PQputCopyEnd(connection, "bulkhead: COPY FROM STDIN cannot run in one round trip") != 1 ||
                    PQflush(connection) != 0) {
                    return false;
                }
            }
        }
        return PQstatus(connection) == CONNECTION_OK;
    };
    bool in_step = sent;
    for (std::size_t index = 0; in_step && index < head.size(); ++index) {
        in_step = read_statement([&](result_ptr& result) noexcept { on_head(index, result); });
    }
    for (std::size_t index = 0; in_step && index < tail.size(); ++index) {
        in_step = read_statement([&](result_ptr& result) noexcept { on_tail(index, *result); });
    }
    if (in_step) {
        PGresult* result = PQgetResult(connection);
        in_step = result != nullptr && PQresultStatus(result) == PGRES_PIPELINE_SYNC;
        PQclear(result);
    }
    return in_step && PQexitPipelineMode(connection) != 0 && PQstatus(connection) == CONNECTION_OK;
}
#endif

/// Whether the COMMIT can go in pipeline mode (run_pipeline): libpq 14.5 or
/// later (from 14.0 to 14.4 libpq could lose the end of a statement's
/// results in pipeline mode). Read once.
[[nodiscard]] inline bool pipeline_usable() noexcept {
#if defined(LIBPQ_HAS_PIPELINING)
    static const bool usable = PQlibVersion() >= 140005;
    return usable;
#else
    return false;
#endif
}

// --- cancel requests ------------------------------------------------------------

/// A cancel request for one connection's backend. Made on the thread that
/// owns the connection (PQgetCancel reads the connection); sent from a
/// thread of its own (PQcancel connects to the server and waits for it), so
/// that the thread asking for the cancel, a stop callback say, returns at
/// once. in_flight() says whether a send has not finished: a connection
/// whose cancel is still in flight must not be handed to another borrower,
/// whose statement the late cancel would hit.
/// \note How long one send can take is bounded by the operating system's
/// TCP connect timeout and the connection's keepalive settings (libpq's
/// PQcancel has no timeout of its own); at most max_senders sends run at
/// once in the process, and a request beyond that is not sent.
class cancel_request {
public:
    /// Sends at once in the whole process, at most.
    static constexpr int max_senders = 64;

    /// How long a process that exits waits for a send still running (one to
    /// a server that answers takes a round trip).
    static constexpr std::chrono::seconds exit_patience{2};

    explicit cancel_request(PGconn* connection) noexcept
        : m_cancel(connection != nullptr ? PQgetCancel(connection) : nullptr) {}
    cancel_request(const cancel_request&) = delete;
    cancel_request& operator=(const cancel_request&) = delete;
    ~cancel_request() {
        if (m_cancel != nullptr) {
            PQfreeCancel(m_cancel);
        }
    }

    /// True while a send has not finished. acquire: what the sender did
    /// happens-before a caller that reads false.
    [[nodiscard]] bool in_flight() const noexcept { return m_in_flight.load(std::memory_order_acquire); }

    /// Waits until no send is in flight, at most `patience`; true when none
    /// is. A cancel to a healthy server completes in well under a
    /// millisecond, so a connection whose cancel raced its statement's end is
    /// kept; one whose cancel is not answered is not waited for long.
    [[nodiscard]] bool settled_within(std::chrono::milliseconds patience) noexcept {
        if (!in_flight()) {
            return true;
        }
        std::unique_lock lock(m_mutex);
        return m_sent.wait_for(lock, patience, [this] { return !in_flight(); });
    }

    /// Starts sending `request` on a thread of its own and returns at once.
    /// False when nothing was started: no request, one already in flight,
    /// max_senders already running, or no thread could be made.
    static bool send(const std::shared_ptr<cancel_request>& request) noexcept {
        if (!request || request->m_cancel == nullptr ||
            request->m_in_flight.exchange(true, std::memory_order_acq_rel)) {
            return false;
        }
        // relaxed: a count, it orders nothing.
        if (senders().fetch_add(1, std::memory_order_relaxed) >= max_senders) {
            senders().fetch_sub(1, std::memory_order_relaxed);
            request->m_in_flight.store(false, std::memory_order_release);
            return false;
        }
        if (detached_threads::start(std::chrono::steady_clock::now() + exit_patience, [request] {
                std::array<char, 256> error{};
                (void)PQcancel(request->m_cancel, error.data(), static_cast<int>(error.size()));
                {
                    const std::lock_guard lock(request->m_mutex);
                    request->m_in_flight.store(false, std::memory_order_release);
                }
                request->m_sent.notify_all();
                senders().fetch_sub(1, std::memory_order_relaxed);
            })) {
            return true;
        }
        senders().fetch_sub(1, std::memory_order_relaxed);
        request->m_in_flight.store(false, std::memory_order_release);
        return false;
    }

private:
    static std::atomic<int>& senders() noexcept {
        static std::atomic<int> running{0};
        return running;
    }

    PGcancel* m_cancel;                    // immutable; PQcancel may use it from any thread
    std::atomic<bool> m_in_flight{false};  // set by send(), cleared by the sending thread under m_mutex
    std::mutex m_mutex;                    // orders the clearing with settled_within's wait
    std::condition_variable m_sent;        // notified when a send finished
};

}  // namespace bulkhead::detail
