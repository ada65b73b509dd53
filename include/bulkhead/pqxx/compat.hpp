// bulkhead: every difference between libpqxx 6 and 7 that the pool meets.
//
// Nothing else in bulkhead names a libpqxx API that differs between the two
// major versions; this header is where a port to another version starts.
// What differs, and what each piece uses:
// - opening: libpqxx 6 reconnects a broken connection behind its user's back
//   unless told not to (`connection_base::inhibit_reactivation`, deprecated
//   there but the only switch); libpqxx 7 never reconnects.
// - closing: `connection_base::disconnect()` (6), `connection::close()` (7).
// - libpq's handle: both keep `largeobject::raw_connection(const
//   dbtransaction&)` as a protected static, the one way to the PGconn* that
//   every 6.x and 7.x release offers; a subclass makes it reachable, and a
//   transaction object that is never begun reaches it for a connection
//   outside any transaction (handle_probe). The pool reads it once per
//   connection, when it opens it; everything else goes through libpqxx's
//   public API.
// - conversions: from_string<T>(text) returns the value in 7; 6 fills a T
//   from a C string (from_text).
// - errors: libpqxx 6's transaction_rollback family (serialization_failure,
//   deadlock_detected) is not an sql_error and carries no SQLSTATE; 7's is
//   (throw_server_error).
// - the gate's transaction class: libpqxx 6 begins through the virtual
//   do_begin() and runs statements through the virtual do_exec(); libpqxx 7
//   has neither hook (its constructor protocol is register_transaction() and
//   direct_exec()). gate_transaction<Control> hides that: it runs
//   Control's begin statement (at construction, or later for a deferred
//   BEGIN: begin()), routes commit and abort to Control, and on libpqxx 6
//   lets Control check the session around each statement of the callback
//   (before_statement, after_statement).
//
// Thread safety: as libpqxx's: a connection, and everything made from it,
// belongs to one thread at a time.
#pragma once

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace bulkhead::detail::pqxx_compat {

#if PQXX_VERSION_MAJOR == 6

/// Opens a connection that stays dead once broken. libpqxx 6 reconnects a
/// broken connection behind the caller's back ("reactivation"); a pooled
/// connection must not, so that the pool sees the failure and replaces it.
inline std::unique_ptr<pqxx::connection> open_connection(const std::string& conninfo) {
    auto connection = std::make_unique<pqxx::connection>(conninfo);
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    connection->inhibit_reactivation(true);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    return connection;
}

/// Closes the connection's socket now; the object stays valid.
inline void close_connection(pqxx::connection& connection) noexcept { connection.disconnect(); }

/// libpqxx 6 hands out a transaction's PGconn* only to its large-object
/// classes: `largeobject::raw_connection(const dbtransaction&)` is a protected
/// static. A subclass makes it reachable; nothing of largeobject is used.
struct raw_connection_access : pqxx::largeobject {
    using pqxx::largeobject::raw_connection;
};

/// The PGconn* under `tx`'s connection (null when it is closed). Sends nothing.
inline PGconn* native_handle(const pqxx::dbtransaction& tx) noexcept {
    return raw_connection_access::raw_connection(tx);
}

/// A transaction object that is never begun: building and destroying it
/// sends nothing to the server (libpqxx 6 sends BEGIN only from Begin(), and
/// End() of a transaction that never began only deregisters it). It lets
/// native_handle() read the PGconn* of a connection without a transaction.
class handle_probe final : public pqxx::dbtransaction {
public:
    explicit handle_probe(pqxx::connection& connection)
        : pqxx::internal::namedclass("handle_probe"), pqxx::dbtransaction(connection) {}
    handle_probe(const handle_probe&) = delete;
    handle_probe& operator=(const handle_probe&) = delete;
    ~handle_probe() override { End(); }

private:
    void do_commit() override {}
};

#elif PQXX_VERSION_MAJOR == 7

inline std::unique_ptr<pqxx::connection> open_connection(const std::string& conninfo) {
    return std::make_unique<pqxx::connection>(conninfo);
}

inline void close_connection(pqxx::connection& connection) noexcept {
    try {
        connection.close();
    } catch (...) {
        // close() only reports notices; the socket is closed either way.
    }
}

// libpqxx 7 keeps `largeobject::raw_connection(const dbtransaction&)` as a
// protected static too (the class is deprecated there, in favour of blob).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
struct raw_connection_access : pqxx::largeobject {
    using pqxx::largeobject::raw_connection;
};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

inline PGconn* native_handle(const pqxx::dbtransaction& tx) noexcept {
    return raw_connection_access::raw_connection(tx);
}

/// A transaction object that never registers with its connection and never
/// sends anything (libpqxx 7's dbtransaction constructor sends nothing; the
/// derived class sends BEGIN). Only for native_handle().
class handle_probe final : public pqxx::dbtransaction {
public:
    explicit handle_probe(pqxx::connection& connection) : pqxx::dbtransaction(connection) {}
    handle_probe(const handle_probe&) = delete;
    handle_probe& operator=(const handle_probe&) = delete;
    ~handle_probe() override = default;

private:
    void do_commit() override {}
    void do_abort() override {}
};

#else
#error "bulkhead/pqxx_pool.hpp supports libpqxx 6 and 7"
#endif

/// `text` converted to T as libpqxx converts a field: from_string<T>(text)
/// in libpqxx 7; libpqxx 6 has only the form that fills a T from a C string.
template <class T>
T from_text(std::string_view text) {
#if PQXX_VERSION_MAJOR >= 7
    return pqxx::from_string<T>(text);
#else
    T value{};
    pqxx::from_string(std::string(text).c_str(), value);
    return value;
#endif
}

/// libpqxx's exec_params and exec_prepared: since 7.10 spelled
/// exec(sql, params) and exec(prepped, params), the old names deprecated.
#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)
template <class... Args>
pqxx::result exec_params(pqxx::dbtransaction& tx, const std::string& sql, Args&&... args) {
    return tx.exec(sql, pqxx::params{std::forward<Args>(args)...});
}
template <class... Args>
pqxx::result exec_prepared(pqxx::dbtransaction& tx, const std::string& name, Args&&... args) {
    return tx.exec(pqxx::prepped{name}, pqxx::params{std::forward<Args>(args)...});
}
#else
template <class... Args>
pqxx::result exec_params(pqxx::dbtransaction& tx, const std::string& sql, Args&&... args) {
    return tx.exec_params(sql, std::forward<Args>(args)...);
}
template <class... Args>
pqxx::result exec_prepared(pqxx::dbtransaction& tx, const std::string& name, Args&&... args) {
    return tx.exec_prepared(name, std::forward<Args>(args)...);
}
#endif

/// The PGconn* of `connection`, which must have no transaction open (one is
/// built, never begun, to reach it); null when it cannot be read. Sends nothing.
inline PGconn* native_handle(pqxx::connection& connection) noexcept {
    try {
        const handle_probe probe(connection);
        return native_handle(probe);
    } catch (...) {
        return nullptr;  // the pool then asks the server instead
    }
}

#if PQXX_VERSION_MAJOR == 6

/// The transaction the gate's callback works in (it sees a
/// pqxx::dbtransaction&). Its commit() and abort() are refused unless
/// pqxx_pool::commit or pqxx_pool::rollback asked for them.
template <class Control>
class gate_transaction final : public pqxx::dbtransaction {
public:
    /// Sends Control's begin statement unless `begin_now` is false
    /// (begin() then sends it).
    gate_transaction(pqxx::connection& connection, Control control, bool begin_now = true)
        : pqxx::internal::namedclass("gate_transaction"),
          pqxx::dbtransaction(connection),
          m_control(std::move(control)) {
        if (begin_now) {
            begin();
        }
    }

    gate_transaction(const gate_transaction&) = delete;
    gate_transaction& operator=(const gate_transaction&) = delete;

    ~gate_transaction() override {
        m_control.closing = true;
        if (!m_control.begin_failed) {
            End();  // a failed Begin() has ended it already
        }
        m_control.on_closed();
    }

    /// Sends Control's begin statement (once: not begun at construction).
    /// \throws what it failed with; the transaction is ended then.
    void begin() {
        try {
            m_control.before_begin();
            Begin();  // libpqxx calls do_begin(), and End() itself when that fails
        } catch (...) {
            m_control.begin_failed = true;
            m_control.on_begin_failed();
            throw;
        }
        m_control.on_begun();
    }

    /// The pool's bookkeeping for this transaction (the pool's, not the callback's).
    Control& control() noexcept { return m_control; }
    [[nodiscard]] const Control& control() const noexcept { return m_control; }
    /// What the BEGIN query's last statement returned: the caller's first
    /// statement's result when the query carried one.
    [[nodiscard]] const pqxx::result& begin_result() const noexcept { return m_begin_result; }

private:
    friend Control;

    pqxx::result run(const std::string& statement) { return direct_exec(statement.c_str()); }

    void do_begin() override { m_begin_result = run(m_control.begin_statement); }
    // libpqxx 6's dbtransaction aborts on any failed statement; here the
    // gate decides, so a failure leaves the transaction for rollback(). The
    // control checks the session around each of the callback's statements:
    // one that ended the transaction block throws at once.
    pqxx::result do_exec(const char query[]) override {
        m_control.before_statement();
        pqxx::result answer = direct_exec(query);
        m_control.after_statement();
        return answer;
    }
    void do_commit() override { m_control.on_commit(*this); }
    void do_abort() override {
        reactivation_avoidance_clear();
        m_control.on_abort(*this);
    }

    Control m_control;
    pqxx::result m_begin_result;
};

#elif PQXX_VERSION_MAJOR == 7

template <class Control>
class gate_transaction final : public pqxx::dbtransaction {
public:
    /// Sends Control's begin statement unless `begin_now` is false
    /// (begin() then sends it).
    gate_transaction(pqxx::connection& connection, Control control, bool begin_now = true)
        : pqxx::dbtransaction(connection), m_control(std::move(control)) {
        register_transaction();
        if (!begin_now) {
            return;
        }
        try {
            begin();
        } catch (...) {
            m_control.closing = true;
            close();
            throw;
        }
    }

    /// Sends Control's begin statement (once: not begun at construction).
    /// \throws what it failed with.
    void begin() {
        try {
            m_control.before_begin();
            m_begin_result = run(m_control.begin_statement);
        } catch (...) {
            m_control.begin_failed = true;
            m_control.on_begin_failed();
            throw;
        }
        m_control.on_begun();
    }

    gate_transaction(const gate_transaction&) = delete;
    gate_transaction& operator=(const gate_transaction&) = delete;

    ~gate_transaction() override {
        m_control.closing = true;
        close();
        m_control.on_closed();
    }

    /// The pool's bookkeeping for this transaction (the pool's, not the callback's).
    Control& control() noexcept { return m_control; }
    [[nodiscard]] const Control& control() const noexcept { return m_control; }
    /// What the BEGIN query's last statement returned: the caller's first
    /// statement's result when the query carried one.
    [[nodiscard]] const pqxx::result& begin_result() const noexcept { return m_begin_result; }

private:
    friend Control;

    pqxx::result run(const std::string& statement) { return direct_exec(statement); }

    void do_commit() override { m_control.on_commit(*this); }
    void do_abort() override { m_control.on_abort(*this); }

    Control m_control;
    pqxx::result m_begin_result;
};

#endif

/// Throws a `Error` for a server error: with the query and SQLSTATE where
/// the class takes them (every sql_error, and libpqxx 7's
/// transaction_rollback family), with the message alone where it does not
/// (libpqxx 6's transaction_rollback family is no sql_error).
template <class Error>
[[noreturn]] void throw_as(const std::string& message, const std::string& query, const char* sqlstate) {
    if constexpr (std::is_constructible_v<Error, const std::string&, const std::string&, const char*>) {
        throw Error(message, query, sqlstate);
    } else {
        throw Error(message);
    }
}

/// Throws what libpqxx throws for a server error with `sqlstate` in answer
/// to `query`, for the errors a COMMIT or ROLLBACK can meet: the integrity
/// constraint classes (a deferred constraint), the transaction rollback
/// classes (serialization failure, deadlock), insufficient resources, and
/// pqxx::sql_error for anything else.
[[noreturn]] inline void throw_server_error(const std::string& message, const std::string& query,
                                            const std::string& sqlstate) {
    const char* const state = sqlstate.empty() ? nullptr : sqlstate.c_str();
    const auto is = [&](std::string_view code) { return sqlstate == code; };
    const auto in_class = [&](std::string_view prefix) { return sqlstate.compare(0, prefix.size(), prefix) == 0; };
    if (is("23505")) {
        throw_as<pqxx::unique_violation>(message, query, state);
    }
    if (is("23503")) {
        throw_as<pqxx::foreign_key_violation>(message, query, state);
    }
    if (is("23502")) {
        throw_as<pqxx::not_null_violation>(message, query, state);
    }
    if (is("23514")) {
        throw_as<pqxx::check_violation>(message, query, state);
    }
    if (is("23001")) {
        throw_as<pqxx::restrict_violation>(message, query, state);
    }
    if (in_class("23")) {
        throw_as<pqxx::integrity_constraint_violation>(message, query, state);
    }
    if (in_class("53")) {
        throw_as<pqxx::insufficient_resources>(message, query, state);
    }
    if (is("40001")) {
        throw_as<pqxx::serialization_failure>(message, query, state);
    }
    if (is("40P01")) {
        throw_as<pqxx::deadlock_detected>(message, query, state);
    }
    if (in_class("40")) {
        throw_as<pqxx::transaction_rollback>(message, query, state);
    }
    throw_as<pqxx::sql_error>(message, query, state);
}

}  // namespace bulkhead::detail::pqxx_compat
