// bulkhead: one pooled libpqxx connection and what the pool knows about it.
//
// A pooled_connection is allocated once per connection and moves between
// the pool's idle list and leases by pointer, so its address is stable while
// a lease, and a transaction on it, holds it. Its fields belong to whoever
// holds it: the lease's thread while leased, the pool (under its mutex)
// while idle.
#pragma once

#include <bulkhead/call_site.hpp>
#include <bulkhead/pqxx/protocol.hpp>
#include <bulkhead/pqxx/watchdog.hpp>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace bulkhead::detail {

/// One open connection and what the pool knows about it. Allocated once per
/// connection; moves between the idle list and leases by pointer, so its
/// address is stable while a lease (and a transaction on it) holds it.
struct pooled_connection {
    std::unique_ptr<pqxx::connection> connection;     // never null
    std::chrono::steady_clock::time_point opened_at;  // when it was opened
    // When it is retired: opened_at plus max_lifetime less its jitter
    // (jittered_lifetime), or time_point::max() without a max_lifetime.
    std::chrono::steady_clock::time_point retire_at = std::chrono::steady_clock::time_point::max();
    std::chrono::steady_clock::time_point idle_since;  // for idle_timeout and validation
    // The two flags below belong to whoever holds the connection: the lease's
    // thread while leased, the pool (under its mutex) while idle.
    bool discard = false;     // close on return: discard(), a broken or unfinished transaction
    bool raw_access = false;  // the lease handed out the connection itself: check it on return
    // libpq's handle, read once when the connection was opened (null when it
    // could not be read), and the backend it belonged to: the return check
    // reads libpq's transaction status through it instead of asking the server.
    PGconn* handle = nullptr;
    int backend_pid = 0;
    int server_version = 0;  // PQserverVersion, for the names of the xact functions
    // Which server it reached when it opened (system identifier, postmaster
    // start, timeline): a lost COMMIT is settled only by that server.
    server_place place;
    // Watches the callback's statements (registered with libpq as an event
    // procedure on `handle`; needs this stable address).
    block_guard guard;
    // The backend's cancel key, made when the connection was opened, on the
    // thread that opened it; shared with a send still in flight.
    std::shared_ptr<cancel_request> cancel;
    // "COMMIT; <reset>; <restore>" and "ROLLBACK; <reset>; <restore>", made
    // once when the connection was opened (protocol.hpp: reset_steps), and
    // the reset alone for a session returned from raw use; the COMMIT and the
    // reset also one statement each, for a commit in pipeline mode.
    std::vector<std::string> commit_steps;
    // The thread that borrowed it last: it gets this one back first while
    // it has been idle only briefly (pool_core::take_idle_locked).
    std::thread::id last_borrower;
    // With a leak_threshold, written when it is lent (under the pool's
    // mutex) and read by the housekeeping thread under it: when, and where.
    std::chrono::steady_clock::time_point leased_at;
    call_site leased_by;
    bool leak_reported = false;  // under the pool's mutex
    std::string commit_statement;
    // The question for the transaction's id (xact_id_if_assigned), then
    // commit_statement: one simple query, for a read-write transaction none of
    // whose statements reported a write.
    std::string asked_commit_statement;
    std::string rollback_statement;
    std::string reset_statement;
    // Set by the watchdog, from its own thread, when it cut this connection
    // off (a deadline and its slack passed, or a stop's cancel went
    // unanswered for the slack); read by the lease's thread after its
    // statement failed. Never cleared: a connection cut off is discarded.
    std::atomic<bool> cut_by_watchdog{false};
    // Set by pqxx_pool::cancel (a stop callback's thread) before it arms the
    // watchdog at the stop plus deadline_slack; read by the lease's thread,
    // which disarms that entry when the transaction ends and clears this
    // when the lease is returned (no cancel() can run by then). release /
    // acquire: a reader that sees the cut sees this too.
    std::atomic<bool> cut_for_stop{false};
    // The descriptor the watchdog shuts the socket down through, made when
    // the connection was opened; closed with it.
    watched_socket watch_socket;
};

}  // namespace bulkhead::detail
