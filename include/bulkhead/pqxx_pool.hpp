// bulkhead: a thread-safe pool of libpqxx connections, ready for the gate.
//
// pqxx_pool lends out pqxx::connection objects through move-only leases and
// runs the gate's transactions on them; it satisfies bulkhead::transactional_pool,
// so `db_bulkhead<pqxx_pool>` works as is. This is the only header of the
// library that includes libpqxx (and libpq's libpq-fe.h: link libpq, as the
// CMake target bulkhead::pqxx does); the differences between libpqxx 6 and 7
// are kept in one place, namespace bulkhead::detail::pqxx_compat below.
//
// Guarantees.
// - Never more than max_size connections are open or being opened, also when
//   many threads ask at once: a thread reserves a slot under the mutex and
//   opens the connection outside it, so opening never holds up callers that
//   could take an idle connection. A failed attempt gives its slot back.
// - acquire() waits at most connection_timeout, and never past the caller's
//   deadline; then it throws bulkhead::pool_timeout, whose message carries the
//   last connection error (if one happened during the wait) with every
//   password removed.
// - A connection that is broken, discarded, retired, or that may still be
//   inside a transaction is closed, never handed out again.
//
// Fairness. Waiting callers are served in arrival order: a returned connection
// is handed directly to the oldest waiter, and a newcomer never takes an idle
// connection or a free slot while anyone waits. One exception, on purpose: a
// caller whose connection attempt failed goes back to the front of the line,
// not the back, since it was first. Callers that find an idle connection do
// not wait at all.
//
// Validation and retirement (there is no background thread; all of this
// happens inside acquire() and when a lease is returned):
// - on borrow, a connection idle for longer than validate_after_idle is
//   checked with one round trip bounded by validation_timeout; a dead one is
//   closed and replaced without the caller seeing an error;
// - on borrow and on return, a connection older than max_lifetime is closed;
// - on borrow and on return, idle connections idle for longer than
//   idle_timeout are closed, as long as more than min_idle stay open;
// - min_idle connections are opened by the constructor, best effort; the pool
//   does not open connections in the background to refill min_idle later.
//
// What a returned connection is checked for: a discard() mark; a broken
// connection (`!is_open()`); a gate transaction that was begun and not ended
// by a successful commit or rollback; and, only for leases whose connection()
// was used directly, whether the session is still inside a transaction block
// (a raw "BEGIN", or a failed transaction) or busy. That last check reads
// libpq's transaction status (PQtransactionStatus, libpq's record of the
// server's last answer: no round trip); libpqxx 6 hides the PGconn* it needs,
// which namespace pqxx_compat reaches through largeobject's protected
// raw_connection, once per connection when it is opened. Only when that
// handle could not be read does the check cost one round trip (bounded by
// validation_timeout). Transaction-control SQL sent through the gate's
// transaction object itself (tx.exec("COMMIT")) is not detected.
//
// Commit. COMMIT of a transaction in which a statement failed rolls back and
// reports success; the pool reads PQtransactionStatus first and, in that state
// (PQTRANS_INERROR), sends nothing and throws pqxx::sql_error with SQLSTATE
// 25P02. Otherwise it sends a plain COMMIT.
//
// Lifetime. The pool's state is shared with its leases: destroying the pool
// while leases are out is safe; each such lease keeps working, and closes its
// connection when it is returned. Destroying the pool while a thread is
// inside acquire(), or calling a member of a destroyed pool, is undefined
// behaviour (as for any object). A gate transaction must end before its lease
// is returned (the gate's transaction_guard does this).
//
// Thread safety. All pool members may be called concurrently. Everything a
// thread did with a connection before returning it happens-before everything
// the next borrower does with it: the hand-over goes through m_mutex (into the
// idle list or into the waiter's node under the mutex, out of it under the
// mutex). A lease and the connection in it belong to one thread at a time, as
// libpqxx requires; the pool touches a leased connection only in the calls
// that are given that lease. Observers read counters that are written under
// the mutex; they are snapshots, stale as soon as they return.
#pragma once

#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/pool_stats.hpp>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#if defined(_WIN32)
#include <winsock2.h>
#else
#include <poll.h>
#endif

namespace bulkhead {

class pqxx_pool;

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

/// Settings of a pqxx_pool. Use designated initializers:
/// `bulkhead::pqxx_pool pool({.conninfo = "host=db dbname=app", .max_size = 8});`
/// A duration of zero for idle_timeout or max_lifetime means "never".
struct pqxx_pool_options {
    /// libpq connection string: keyword/value ("host=db user=app") or URI
    /// ("postgresql://app@db/app"). Must not be empty.
    std::string conninfo;
    /// Most connections open (or being opened) at once. In [1, 262143]
    /// (PostgreSQL's own limit for max_connections).
    std::size_t max_size = 10;
    /// Connections opened by the constructor, and kept open when idle
    /// connections are retired for idle_timeout. At most max_size.
    std::size_t min_idle = 0;
    /// Longest wait in acquire() for a connection. At least 250 ms.
    std::chrono::milliseconds connection_timeout{30000};
    /// Longest wait for the answer to the pool's own check of a connection.
    /// At least 250 ms.
    std::chrono::milliseconds validation_timeout{5000};
    /// An idle connection idle for longer than this is closed (above
    /// min_idle). Zero: never.
    std::chrono::milliseconds idle_timeout{600000};
    /// A connection older than this is closed when next seen by the pool.
    /// Zero: never.
    std::chrono::milliseconds max_lifetime{1800000};
    /// An idle connection idle for longer than this is checked (one round
    /// trip) before it is handed out. Zero: every time.
    std::chrono::milliseconds validate_after_idle{500};
    /// Sent as libpq's application_name (it overrides one in conninfo); shows
    /// in pg_stat_activity. Empty: leave it to conninfo and the environment.
    std::string application_name = "bulkhead";
    /// Called once for every connection the pool closes, with the reason
    /// (discarded, broken, lifetime, idle, validation_failed, shutdown): an
    /// observer hook for logging or tracing. Must not throw and must not call
    /// acquire(); it may run with the pool's mutex held. Empty: nothing is called.
    std::function<void(close_reason)> on_close{};
};

/// Transaction isolation levels (PostgreSQL's; READ UNCOMMITTED behaves as
/// READ COMMITTED there and is left out).
enum class isolation : std::uint8_t {
    read_committed,   ///< READ COMMITTED, PostgreSQL's default
    repeatable_read,  ///< REPEATABLE READ
    serializable,     ///< SERIALIZABLE
};

/// The libpq connection string `conninfo` (or any text, such as an error
/// message) with every password value replaced by `***`: values of keywords
/// ending in "password" (`password`, `sslpassword`; quoted or not, with
/// backslash escapes), the password in a URI's user information
/// (`postgresql://user:secret@host`), URI parameters ending in "password",
/// and SQL's `PASSWORD '...'`. Everything else is kept as is.
/// \throws std::bad_alloc only.
/// \note Best effort on malformed text: a quoted value that never closes is
/// redacted up to the end of the text.
[[nodiscard]] inline std::string redact_conninfo(std::string_view conninfo);

// ---------------------------------------------------------------------------
// Internals: conninfo handling
// ---------------------------------------------------------------------------

namespace detail {

/// The most connections a pool may hold: PostgreSQL's own upper limit for
/// max_connections.
inline constexpr std::size_t max_pool_size = 262143;

inline constexpr std::string_view redacted = "***";

[[nodiscard]] constexpr bool conninfo_key_char(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

[[nodiscard]] constexpr bool conninfo_space(char c) noexcept {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

[[nodiscard]] constexpr char ascii_lower(char c) noexcept {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

[[nodiscard]] constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) {
        return false;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (ascii_lower(a[i]) != ascii_lower(b[i])) {
            return false;
        }
    }
    return true;
}

/// True for `password`, `sslpassword` and any other key ending in "password".
[[nodiscard]] constexpr bool is_password_key(std::string_view key) noexcept {
    constexpr std::string_view suffix = "password";
    return key.size() >= suffix.size() && iequals(key.substr(key.size() - suffix.size()), suffix);
}

/// Length of the URI scheme (`postgresql://` or `postgres://`) starting at
/// `at`, or 0. Case-insensitive: this is for finding secrets, not for parsing.
[[nodiscard]] constexpr std::size_t uri_scheme_length(std::string_view text, std::size_t at) noexcept {
    for (std::string_view scheme : {std::string_view("postgresql://"), std::string_view("postgres://")}) {
        if (text.size() - at >= scheme.size() && iequals(text.substr(at, scheme.size()), scheme)) {
            return scheme.size();
        }
    }
    return 0;
}

/// A URI as libpq takes it (case-sensitive scheme).
[[nodiscard]] constexpr bool is_uri(std::string_view conninfo) noexcept {
    return conninfo.starts_with("postgresql://") || conninfo.starts_with("postgres://");
}

[[nodiscard]] constexpr int hex_value(char c) noexcept {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/// `%XX` decoded; a malformed escape is kept as spelled.
[[nodiscard]] inline std::string percent_decode(std::string_view text) {
    std::string decoded;
    decoded.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '%' && i + 2 < text.size()) {
            const int high = hex_value(text[i + 1]);
            const int low = hex_value(text[i + 2]);
            if (high >= 0 && low >= 0) {
                decoded += static_cast<char>(high * 16 + low);
                i += 2;
                continue;
            }
        }
        decoded += text[i];
    }
    return decoded;
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
[[nodiscard]] inline std::string percent_encode(std::string_view text) {
    constexpr std::string_view hex = "0123456789ABCDEF";
    std::string encoded;
    encoded.reserve(text.size() * 3);
    for (const char c : text) {
        if (conninfo_key_char(c) || c == '-' || c == '.' || c == '~') {
            encoded += c;
        } else {
            const auto byte = static_cast<unsigned char>(c);
            encoded += '%';
            encoded += hex[static_cast<std::size_t>(byte >> 4U)];
            encoded += hex[static_cast<std::size_t>(byte & 0x0FU)];
        }
    }
    return encoded;
}

/// A keyword value as spelled (quoted or not) turned into the value libpq
/// sees: quotes dropped, backslash escapes undone.
[[nodiscard]] inline std::string unquote_keyword_value(std::string_view spelled) {
    if (!spelled.empty() && spelled.front() == '\'') {
        spelled.remove_prefix(1);
        if (!spelled.empty() && spelled.back() == '\'') {
            spelled.remove_suffix(1);
        }
    }
    std::string value;
    value.reserve(spelled.size());
    for (std::size_t i = 0; i < spelled.size(); ++i) {
        if (spelled[i] == '\\' && i + 1 < spelled.size()) {
            ++i;
        }
        value += spelled[i];
    }
    return value;
}

/// `value` as a single-quoted libpq keyword value.
[[nodiscard]] inline std::string quote_keyword_value(std::string_view value) {
    std::string quoted = "'";
    for (const char c : value) {
        if (c == '\'' || c == '\\') {
            quoted += '\\';
        }
        quoted += c;
    }
    quoted += '\'';
    return quoted;
}

/// Where a value is spelled in a text, what it means, and whether it came
/// from a URI (percent-encoded) or a keyword string (quoted, escaped).
struct conninfo_value {
    std::string_view key;
    std::size_t begin;  // offset of the first character of the spelling
    std::size_t end;    // one past the last
    bool from_uri;
};

/// End of the value spelled at `at` in keyword form (libpq's rules: a quoted
/// value ends at the unescaped closing quote, an unquoted one at whitespace;
/// a backslash escapes the next character in both).
[[nodiscard]] constexpr std::size_t keyword_value_end(std::string_view text, std::size_t at) noexcept {
    std::size_t pos = at;
    const bool quoted = pos < text.size() && text[pos] == '\'';
    if (quoted) {
        ++pos;
    }
    while (pos < text.size()) {
        const char c = text[pos];
        if (c == '\\' && pos + 1 < text.size()) {
            pos += 2;
            continue;
        }
        if (quoted ? c == '\'' : conninfo_space(c)) {
            break;
        }
        ++pos;
    }
    if (quoted && pos < text.size()) {
        ++pos;  // the closing quote
    }
    return pos;
}

/// Visits the user information password and the query parameters of the URI
/// whose scheme starts at `at`; returns where the URI ends (at whitespace).
template <class Visit>
std::size_t scan_uri(std::string_view text, std::size_t at, std::size_t scheme_length, Visit& visit) {
    const std::size_t body = at + scheme_length;
    std::size_t end = body;
    while (end < text.size() && !conninfo_space(text[end])) {
        ++end;
    }
    // User information ends at the first '@' that comes before any '/'
    // (libpq's rule).
    std::size_t at_sign = body;
    while (at_sign < end && text[at_sign] != '@' && text[at_sign] != '/') {
        ++at_sign;
    }
    std::size_t rest = body;
    if (at_sign < end && text[at_sign] == '@') {
        const std::size_t colon = text.find(':', body);
        if (colon < at_sign && colon + 1 < at_sign) {
            visit(conninfo_value{"password", colon + 1, at_sign, true});
        }
        rest = at_sign + 1;
    }
    const std::size_t question = text.find('?', rest);
    if (question < end) {
        std::size_t param = question + 1;
        while (param < end) {
            std::size_t amp = text.find('&', param);
            if (amp > end) {
                amp = end;
            }
            const std::size_t equals = text.find('=', param);
            if (equals < amp) {
                visit(conninfo_value{text.substr(param, equals - param), equals + 1, amp, true});
            }
            param = amp + 1;
        }
    }
    return end;
}

/// Calls `visit(conninfo_value)` for every `key=value` in `text`, in keyword
/// strings and in URIs found anywhere in it. Tolerant by design: it also
/// reads error messages, where a connection string may be quoted inside prose.
template <class Visit>
void scan_conninfo(std::string_view text, Visit visit) {
    std::size_t pos = 0;
    while (pos < text.size()) {
        const bool word_start = pos == 0 || !conninfo_key_char(text[pos - 1]);
        if (word_start) {
            if (const std::size_t scheme = uri_scheme_length(text, pos); scheme != 0) {
                pos = scan_uri(text, pos, scheme, visit);
                continue;
            }
        }
        if (!word_start || !conninfo_key_char(text[pos])) {
            ++pos;
            continue;
        }
        std::size_t key_end = pos;
        while (key_end < text.size() && conninfo_key_char(text[key_end])) {
            ++key_end;
        }
        const std::string_view key = text.substr(pos, key_end - pos);
        std::size_t next = key_end;
        while (next < text.size() && conninfo_space(text[next])) {
            ++next;
        }
        const bool assigned = next < text.size() && text[next] == '=';
        // `PASSWORD 'secret'` (SQL spelling) counts too, for passwords only.
        const bool sql_spelling = !assigned && next < text.size() && text[next] == '\'' && is_password_key(key);
        if (!assigned && !sql_spelling) {
            pos = key_end;
            continue;
        }
        if (assigned) {
            ++next;
            while (next < text.size() && conninfo_space(text[next])) {
                ++next;
            }
        }
        const std::size_t value_end = keyword_value_end(text, next);
        if (value_end > next) {
            visit(conninfo_value{key, next, value_end, false});
        }
        pos = std::max(value_end, key_end);
    }
}

/// The password values in `conninfo` as libpq would read them, and as
/// spelled, for scrubbing error messages.
[[nodiscard]] inline std::vector<std::string> conninfo_secrets(std::string_view conninfo) {
    std::vector<std::string> secrets;
    scan_conninfo(conninfo, [&](const conninfo_value& value) {
        if (!is_password_key(value.key)) {
            return;
        }
        const std::string_view spelled = conninfo.substr(value.begin, value.end - value.begin);
        secrets.emplace_back(spelled);
        secrets.push_back(value.from_uri ? percent_decode(spelled) : unquote_keyword_value(spelled));
    });
    return secrets;
}

/// `secrets` sorted longest first, so that scrub() replaces a secret that
/// contains another whole.
[[nodiscard]] inline std::vector<std::string> longest_first(std::vector<std::string> secrets) {
    std::sort(secrets.begin(), secrets.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    return secrets;
}

/// True when `conninfo` sets `key` (keyword or URI parameter).
[[nodiscard]] inline bool conninfo_sets(std::string_view conninfo, std::string_view key) {
    bool found = false;
    scan_conninfo(conninfo, [&](const conninfo_value& value) { found = found || value.key == key; });
    return found;
}

/// `text` with each occurrence of each secret replaced by `***`, after
/// redact_conninfo().
[[nodiscard]] inline std::string scrub(std::string_view text, const std::vector<std::string>& secrets) {
    std::string scrubbed = redact_conninfo(text);
    for (const std::string& secret : secrets) {
        if (secret.empty()) {
            continue;
        }
        for (std::size_t at = scrubbed.find(secret); at != std::string::npos;
             at = scrubbed.find(secret, at + redacted.size())) {
            scrubbed.replace(at, secret.size(), redacted);
        }
    }
    return scrubbed;
}

/// An error message on one line: whitespace runs (libpq's "\n\t") become one
/// space, and trailing whitespace goes.
[[nodiscard]] inline std::string one_line(std::string_view text) {
    std::string line;
    line.reserve(text.size());
    bool in_space = false;
    for (const char c : text) {
        if (conninfo_space(c)) {
            in_space = true;
            continue;
        }
        if (in_space && !line.empty()) {
            line += ' ';
        }
        in_space = false;
        line += c;
    }
    return line;
}

/// `now + duration`, or time_point::max() when that does not fit.
[[nodiscard]] inline std::chrono::steady_clock::time_point saturating_add(std::chrono::steady_clock::time_point now,
                                                                          std::chrono::milliseconds duration) noexcept {
    using std::chrono::steady_clock;
    if (duration > std::chrono::duration_cast<std::chrono::milliseconds>(steady_clock::time_point::max() - now)) {
        return steady_clock::time_point::max();
    }
    return now + duration;
}

/// Whole milliseconds from `from` to `to` (never overflows a comparison
/// with a user's milliseconds value).
[[nodiscard]] inline std::chrono::milliseconds elapsed_ms(std::chrono::steady_clock::time_point from,
                                                          std::chrono::steady_clock::time_point to) noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(to - from);
}

/// How the pool connects: the user's conninfo with application_name, and
/// whether it may add a connect_timeout of its own.
struct connect_target {
    std::string base;                  // conninfo plus application_name
    bool uri = false;                  // URI form (parameters after '?', joined by '&')
    bool add_connect_timeout = false;  // neither conninfo nor PGCONNECT_TIMEOUT sets one
};

[[nodiscard]] inline connect_target make_connect_target(const pqxx_pool_options& options) {
    connect_target target;
    target.base = options.conninfo;
    target.uri = is_uri(options.conninfo);
    const auto append = [&](std::string_view key, std::string_view value) {
        if (target.uri) {
            target.base += target.base.find('?') == std::string::npos ? '?' : '&';
            target.base.append(key).append("=").append(percent_encode(value));
        } else {
            target.base.append(" ").append(key).append("=").append(quote_keyword_value(value));
        }
    };
    if (!options.application_name.empty()) {
        append("application_name", options.application_name);
    }
    // concurrency-mt-unsafe: read once, when the pool is built; libpq itself
    // reads PGCONNECT_TIMEOUT with getenv on every connection attempt.
    const char* from_environment = std::getenv("PGCONNECT_TIMEOUT");  // NOLINT(concurrency-mt-unsafe)
    target.add_connect_timeout = !conninfo_sets(options.conninfo, "connect_timeout") &&
                                 (from_environment == nullptr || *from_environment == '\0');
    return target;
}

/// The connection string for one attempt that should end within `remaining`.
/// libpq counts connect_timeout in whole seconds, at least 2.
[[nodiscard]] inline std::string connect_string(const connect_target& target,
                                                std::chrono::steady_clock::duration remaining) {
    if (!target.add_connect_timeout) {
        return target.base;
    }
    const auto seconds =
        std::clamp<std::int64_t>(std::chrono::ceil<std::chrono::seconds>(remaining).count(), 2, INT_MAX);
    std::string info = target.base;
    if (target.uri) {
        info += info.find('?') == std::string::npos ? '?' : '&';
    } else {
        info += ' ';
    }
    info.append("connect_timeout=").append(std::to_string(seconds));
    return info;
}

/// Throws std::invalid_argument with libpq's complaint (every password
/// scrubbed) unless libpq can parse `conninfo` (keywords and syntax only:
/// libpq checks values such as a port number when it connects).
inline void check_conninfo_syntax(const std::string& conninfo) {
    char* complaint = nullptr;
    if (PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &complaint); parsed != nullptr) {
        PQconninfoFree(parsed);
        return;
    }
    const std::string said = complaint != nullptr ? complaint : "libpq could not parse it (out of memory?)";
    PQfreemem(complaint);
    throw std::invalid_argument("bulkhead::pqxx_pool: conninfo is malformed: " +
                                one_line(scrub(said, longest_first(conninfo_secrets(conninfo)))));
}

/// Throws std::invalid_argument naming the field, unless the options are valid.
inline void check_options(const pqxx_pool_options& options) {
    const auto fail = [](const std::string& what) { throw std::invalid_argument("bulkhead::pqxx_pool: " + what); };
    if (options.conninfo.empty()) {
        fail("conninfo must not be empty");
    }
    if (options.conninfo.find('\0') != std::string::npos) {
        fail("conninfo must not contain a NUL character");
    }
    check_conninfo_syntax(options.conninfo);
    if (options.max_size < 1 || options.max_size > max_pool_size) {
        fail("max_size must be in [1, " + std::to_string(max_pool_size) + "], got " + std::to_string(options.max_size));
    }
    if (options.min_idle > options.max_size) {
        fail("min_idle must not exceed max_size (" + std::to_string(options.max_size) + "), got " +
             std::to_string(options.min_idle));
    }
    const auto at_least = [&](std::string_view field, std::chrono::milliseconds value, std::int64_t minimum) {
        if (value.count() < minimum) {
            fail(std::string(field) +
                 (minimum == 0 ? " must not be negative" : " must be at least " + std::to_string(minimum) + " ms") +
                 ", got " + std::to_string(value.count()) + " ms");
        }
    };
    at_least("connection_timeout", options.connection_timeout, 250);
    at_least("validation_timeout", options.validation_timeout, 250);
    at_least("idle_timeout", options.idle_timeout, 0);
    at_least("max_lifetime", options.max_lifetime, 0);
    at_least("validate_after_idle", options.validate_after_idle, 0);
    if (options.application_name.find('\0') != std::string::npos) {
        fail("application_name must not contain a NUL character");
    }
}

}  // namespace detail

inline std::string redact_conninfo(std::string_view conninfo) {
    std::string redacted_text;
    redacted_text.reserve(conninfo.size());
    std::size_t copied = 0;
    detail::scan_conninfo(conninfo, [&](const detail::conninfo_value& value) {
        if (!detail::is_password_key(value.key) || value.begin < copied) {
            return;
        }
        redacted_text.append(conninfo.substr(copied, value.begin - copied));
        redacted_text.append(detail::redacted);
        copied = value.end;
    });
    redacted_text.append(conninfo.substr(copied));
    return redacted_text;
}

// ---------------------------------------------------------------------------
// Internals: connections and waiters
// ---------------------------------------------------------------------------

namespace detail {

/// One open connection and what the pool knows about it. Allocated once per
/// connection; moves between the idle list and leases by pointer, so its
/// address is stable while a lease (and a transaction on it) holds it.
struct pooled_connection {
    std::unique_ptr<pqxx::connection> connection;      // never null
    std::chrono::steady_clock::time_point opened_at;   // for max_lifetime
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
};

/// One thread waiting in acquire(). Lives on the waiting thread's stack.
/// (bulkhead::detail::wait_queue does not fit here: a pool waiter needs a
/// connection handed into its node, and a failed opener rejoins at the front.)
struct pool_waiter {
    pool_waiter* prev = nullptr;                // guarded by the pool's mutex
    pool_waiter* next = nullptr;                // guarded by the pool's mutex
    bool queued = false;                        // guarded by the pool's mutex
    std::unique_ptr<pooled_connection> handed;  // guarded by the pool's mutex; set by give_back()
    std::condition_variable wake;               // notified under the pool's mutex
};

/// An intrusive doubly linked FIFO of waiters; owns none of them. Guarded by
/// the pool's mutex.
class pool_wait_queue {
public:
    [[nodiscard]] bool empty() const noexcept { return m_head == nullptr; }
    [[nodiscard]] pool_waiter* front() const noexcept { return m_head; }

    void push_back(pool_waiter& node) noexcept {
        node.prev = m_tail;
        node.next = nullptr;
        (m_tail != nullptr ? m_tail->next : m_head) = &node;
        m_tail = &node;
        node.queued = true;
    }

    void push_front(pool_waiter& node) noexcept {
        node.prev = nullptr;
        node.next = m_head;
        (m_head != nullptr ? m_head->prev : m_tail) = &node;
        m_head = &node;
        node.queued = true;
    }

    /// Unlinks `node`, which must be queued here.
    void remove(pool_waiter& node) noexcept {
        assert(node.queued);
        (node.prev != nullptr ? node.prev->next : m_head) = node.next;
        (node.next != nullptr ? node.next->prev : m_tail) = node.prev;
        node.prev = nullptr;
        node.next = nullptr;
        node.queued = false;
    }

private:
    pool_waiter* m_head = nullptr;
    pool_waiter* m_tail = nullptr;
};

/// Waits until `socket` has something to read (an answer, an error, or the
/// end of the connection) or `deadline` passes. False on timeout or failure.
inline bool wait_readable(int socket, std::chrono::steady_clock::time_point deadline) noexcept {
    if (socket < 0) {
        return false;
    }
    for (;;) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        const int wait_ms = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, INT_MAX));
#if defined(_WIN32)
        WSAPOLLFD entry{static_cast<SOCKET>(socket), POLLRDNORM, 0};
        const int ready = ::WSAPoll(&entry, 1, wait_ms);
#else
        pollfd entry{socket, POLLIN, 0};
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

/// A few connections to close after the mutex is released: retirement never
/// allocates, and closes at most this many per call (the rest next time).
class retired_connections {
public:
    retired_connections() = default;
    retired_connections(const retired_connections&) = delete;
    retired_connections& operator=(const retired_connections&) = delete;
    ~retired_connections() = default;  // closes them (pqxx's destructors do not throw)

    [[nodiscard]] bool full() const noexcept { return m_count == capacity; }
    void add(std::unique_ptr<pooled_connection> connection) noexcept {
        assert(!full());
        m_slots[m_count++] = std::move(connection);
    }

private:
    static constexpr std::size_t capacity = 4;
    std::unique_ptr<pooled_connection> m_slots[capacity];
    std::size_t m_count = 0;
};

}  // namespace detail

// ---------------------------------------------------------------------------
// libpqxx 6 / 7 differences: only here
// ---------------------------------------------------------------------------

namespace detail {

struct transaction_control;

namespace pqxx_compat {

class gate_transaction;

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

/// True when the server's last answer left `tx`'s transaction failed: a
/// statement failed, and the server now refuses everything but ROLLBACK
/// (COMMIT included: it would roll back and report success). libpq's own
/// record of the last ReadyForQuery; no round trip.
inline bool in_failed_transaction(const pqxx::dbtransaction& tx) noexcept {
    return PQtransactionStatus(native_handle(tx)) == PQTRANS_INERROR;
}

/// True when libpq says the session is inside a transaction block (open or
/// failed), also after a statement of it failed. No round trip.
inline bool inside_transaction_block(const pqxx::dbtransaction& tx) noexcept {
    const PGTransactionStatusType status = PQtransactionStatus(native_handle(tx));
    return status == PQTRANS_INTRANS || status == PQTRANS_INERROR;
}

}  // namespace pqxx_compat

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
    void on_commit(pqxx_compat::gate_transaction& tx);
    void on_abort(pqxx_compat::gate_transaction& tx);

    /// pqxx_pool::commit and pqxx_pool::rollback.
    static void commit(pqxx_compat::gate_transaction& tx);
    static void rollback(pqxx_compat::gate_transaction& tx);
};

namespace pqxx_compat {

#if PQXX_VERSION_MAJOR == 6

/// The transaction the gate's callback works in (it sees a
/// pqxx::dbtransaction&). Its commit() and abort() are refused unless
/// pqxx_pool::commit or pqxx_pool::rollback asked for them.
class gate_transaction final : public pqxx::dbtransaction {
public:
    gate_transaction(pqxx::connection& connection, transaction_control control)
        : pqxx::internal::namedclass("gate_transaction"),
          pqxx::dbtransaction(connection),
          m_control(std::move(control)) {
        try {
            Begin();  // libpqxx calls do_begin(), and End() itself when that fails
        } catch (...) {
            m_control.on_begin_failed();
            throw;
        }
        m_control.on_begun();
    }

    gate_transaction(const gate_transaction&) = delete;
    gate_transaction& operator=(const gate_transaction&) = delete;

    ~gate_transaction() override {
        m_control.closing = true;
        End();
        m_control.on_closed();
    }

    /// The pool's bookkeeping for this transaction (the pool's, not the callback's).
    transaction_control& control() noexcept { return m_control; }

private:
    friend struct detail::transaction_control;

    pqxx::result run(const std::string& statement) { return direct_exec(statement.c_str()); }

    void do_begin() override { m_control.on_begin_result(run(m_control.begin_statement)); }
    // libpqxx 6's dbtransaction aborts on any failed statement; here the
    // gate decides, so a failure leaves the transaction for rollback().
    pqxx::result do_exec(const char query[]) override { return direct_exec(query); }
    void do_commit() override { m_control.on_commit(*this); }
    void do_abort() override {
        reactivation_avoidance_clear();
        m_control.on_abort(*this);
    }

    transaction_control m_control;
};

#elif PQXX_VERSION_MAJOR == 7

class gate_transaction final : public pqxx::dbtransaction {
public:
    gate_transaction(pqxx::connection& connection, transaction_control control)
        : pqxx::dbtransaction(connection), m_control(std::move(control)) {
        register_transaction();
        try {
            m_control.on_begin_result(run(m_control.begin_statement));
        } catch (...) {
            m_control.on_begin_failed();
            m_control.closing = true;
            close();
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
    transaction_control& control() noexcept { return m_control; }

private:
    friend struct detail::transaction_control;

    pqxx::result run(const std::string& statement) { return direct_exec(statement); }

    void do_commit() override { m_control.on_commit(*this); }
    void do_abort() override { m_control.on_abort(*this); }

    transaction_control m_control;
};

#endif

}  // namespace pqxx_compat

using pqxx_compat::gate_transaction;

// --- transaction_control: the same for every libpqxx version ---------------

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
    if (pqxx_compat::in_failed_transaction(tx)) {
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
        backend_open = pqxx_compat::inside_transaction_block(tx);
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

/// What txid_status() said about a transaction whose COMMIT was lost.
enum class commit_status : std::uint8_t { committed, aborted, unknown };

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
/// reading an answer that has started to arrive.
inline bool check_idle_session(pqxx::connection& connection, std::chrono::steady_clock::time_point deadline) noexcept {
    try {
        if (!connection.is_open()) {
            return false;
        }
        pqxx::nontransaction check(connection);
        pqxx::pipeline pipe(check);
        const auto query = pipe.insert("SELECT transaction_timestamp() = statement_timestamp()");
        if (!wait_readable(connection.sock(), deadline)) {
            pqxx_compat::close_connection(connection);
            return false;
        }
        const pqxx::result answer = pipe.retrieve(query);
        return answer.size() == 1 && answer[0][0].as<bool>();
    } catch (...) {
        return false;
    }
}

/// True when the session of a connection returned from raw use is outside
/// any transaction block. Without a round trip when the pool holds the
/// connection's PGconn* (read when it was opened) and the session is still
/// the one it was read for: libpq's record of the server's last answer
/// (PQtransactionStatus) must say idle; a transaction block left open, a
/// failed one, a command still in progress or a connection libpq knows is
/// bad all say otherwise. Otherwise check_idle_session's round trip.
inline bool session_idle(pooled_connection& pooled, std::chrono::steady_clock::time_point deadline) noexcept {
    pqxx::connection& connection = *pooled.connection;
    if (pooled.handle != nullptr && connection.is_open() && connection.backendpid() == pooled.backend_pid) {
        return PQtransactionStatus(pooled.handle) == PQTRANS_IDLE;
    }
    return check_idle_session(connection, deadline);
}

// ---------------------------------------------------------------------------
// Internals: the shared state
// ---------------------------------------------------------------------------

/// Everything a pool and its leases share. Owned by std::shared_ptr: the pool
/// holds one reference, every lease another.
class pool_core {
public:
    using clock = std::chrono::steady_clock;

    explicit pool_core(pqxx_pool_options options)
        : m_options(std::move(options)),
          m_target(make_connect_target(m_options)),
          m_secrets(collect_secrets(m_options.conninfo)) {
        m_idle.reserve(m_options.max_size);
    }

    pool_core(const pool_core&) = delete;
    pool_core& operator=(const pool_core&) = delete;

    ~pool_core() = default;  // only idle connections can be left: closed with m_idle

    [[nodiscard]] const pqxx_pool_options& options() const noexcept { return m_options; }
    [[nodiscard]] const connect_target& target() const noexcept { return m_target; }

    /// Opens up to min_idle connections; stops at the first failure.
    void open_min_idle() {
        const auto until = saturating_add(clock::now(), m_options.connection_timeout);
        for (std::size_t opened = 0; opened < m_options.min_idle; ++opened) {
            {
                const std::lock_guard lock(m_mutex);
                if (m_size.load(std::memory_order_relaxed) >= m_options.max_size) {
                    return;
                }
                reserve_slot_locked();
            }
            std::unique_ptr<pooled_connection> connection = open(until);
            if (!connection) {
                return;
            }
            give_back(std::move(connection));
        }
    }

    /// A connection for a lease; see pqxx_pool::acquire.
    std::unique_ptr<pooled_connection> acquire(clock::time_point deadline) {
        const auto start = clock::now();
        const auto until = std::min(deadline, saturating_add(start, m_options.connection_timeout));
        bool rejoin_at_front = false;
        for (;;) {
            std::unique_ptr<pooled_connection> connection = take(start, until, rejoin_at_front);
            if (connection) {
                const std::optional<close_reason> unusable = unusable_on_borrow(*connection);
                if (!unusable) {
                    connection->discard = false;
                    connection->raw_access = false;
                    return connection;
                }
                // Dead or too old: close it; its slot is ours to open a
                // replacement in, at once.
                connection.reset();
                count_close(*unusable);
                const std::lock_guard lock(m_mutex);
                store(m_in_use, load(m_in_use) - 1);
                store(m_opening, load(m_opening) + 1);
            }
            if (std::unique_ptr<pooled_connection> opened = open(until)) {
                return opened;
            }
            rejoin_at_front = true;
        }
    }

    /// Takes a connection back from a lease: keeps it (for the oldest waiter,
    /// or idle) or closes it.
    void give_back(std::unique_ptr<pooled_connection> connection) noexcept {
        const auto now = clock::now();
        if (const std::optional<close_reason> unusable = unusable_on_return(*connection, now)) {
            connection.reset();  // closed outside the mutex
            count_close(*unusable);
        }
        retired_connections retired;
        const std::lock_guard lock(m_mutex);
        if (connection && !m_closed) {
            connection->idle_since = now;
            if (!m_queue.empty()) {
                // Straight to the oldest waiter: it owns the connection from
                // here; in_use does not change. Notified under the mutex, so
                // the waiter cannot return (and free its node) before we let go.
                pool_waiter& oldest = *m_queue.front();
                m_queue.remove(oldest);
                store(m_waiting, load(m_waiting) - 1);
                oldest.handed = std::move(connection);
                oldest.wake.notify_one();
            } else {
                m_idle.push_back(std::move(connection));  // capacity is max_size: no allocation
                store(m_idle_count, load(m_idle_count) + 1);
                store(m_in_use, load(m_in_use) - 1);
            }
        } else {
            if (connection) {  // the pool object is gone: close it
                retired.add(std::move(connection));
                count_close(close_reason::shutdown);
            }
            store(m_in_use, load(m_in_use) - 1);
            store(m_size, load(m_size) - 1);
            wake_oldest_locked();  // a slot is free
        }
        retire_expired_locked(now, retired);
    }

    /// The pool object is gone: close the idle connections; later returns close theirs.
    void shut_down() noexcept {
        std::vector<std::unique_ptr<pooled_connection>> idle;
        {
            const std::lock_guard lock(m_mutex);
            assert(m_queue.empty() && "bulkhead::pqxx_pool destroyed while a thread waits in acquire()");
            m_closed = true;
            idle.swap(m_idle);
            for (std::size_t i = 0; i < idle.size(); ++i) {
                count_close(close_reason::shutdown);
            }
            store(m_size, load(m_size) - idle.size());
            store(m_idle_count, 0);
        }
    }

    [[nodiscard]] std::size_t size() const noexcept { return load(m_size); }
    [[nodiscard]] std::size_t idle() const noexcept { return load(m_idle_count); }
    [[nodiscard]] std::size_t in_use() const noexcept { return load(m_in_use); }
    [[nodiscard]] std::size_t waiting() const noexcept { return load(m_waiting); }

private:
    // relaxed: every write happens under m_mutex, and every read that decides
    // anything happens under it too; the observers only want a snapshot.
    static std::size_t load(const std::atomic<std::size_t>& counter) noexcept {
        return counter.load(std::memory_order_relaxed);
    }
    static void store(std::atomic<std::size_t>& counter, std::size_t value) noexcept {
        counter.store(value, std::memory_order_relaxed);
    }

    static std::vector<std::string> collect_secrets(const std::string& conninfo) {
        std::vector<std::string> secrets = conninfo_secrets(conninfo);
        // concurrency-mt-unsafe: read once, when the pool is built; libpq itself
        // reads PGPASSWORD with getenv on every connection attempt.
        if (const char* from_environment = std::getenv("PGPASSWORD")) {  // NOLINT(concurrency-mt-unsafe)
            secrets.emplace_back(from_environment);
        }
        return longest_first(std::move(secrets));
    }

    void reserve_slot_locked() noexcept {
        store(m_size, load(m_size) + 1);
        store(m_opening, load(m_opening) + 1);
    }

    [[nodiscard]] bool can_open_locked(clock::time_point now) const noexcept {
        return load(m_size) < m_options.max_size && now >= m_retry_at;
    }

    std::unique_ptr<pooled_connection> take_idle_locked() noexcept {
        if (m_idle.empty()) {
            return nullptr;
        }
        std::unique_ptr<pooled_connection> connection = std::move(m_idle.back());  // most recently used
        m_idle.pop_back();
        store(m_idle_count, load(m_idle_count) - 1);
        store(m_in_use, load(m_in_use) + 1);
        return connection;
    }

    void wake_oldest_locked() noexcept {
        if (!m_queue.empty()) {
            m_queue.front()->wake.notify_one();
        }
    }

    void leave_queue_locked(pool_waiter& node) noexcept {
        m_queue.remove(node);
        store(m_waiting, load(m_waiting) - 1);
        wake_oldest_locked();  // the new oldest waiter may be able to act now
    }

    /// Leaves the queue on any way out of take() (an exception included),
    /// under the mutex: declared after the lock, so destroyed before it.
    class queue_exit {
    public:
        queue_exit(pool_core& core, pool_waiter& node) noexcept : m_core(core), m_node(node) {}
        queue_exit(const queue_exit&) = delete;
        queue_exit& operator=(const queue_exit&) = delete;
        ~queue_exit() {
            if (m_node.queued) {
                m_core.leave_queue_locked(m_node);
            }
        }

    private:
        pool_core& m_core;
        pool_waiter& m_node;
    };

    /// Under the mutex: closes idle connections past max_lifetime, and those
    /// past idle_timeout while more than min_idle are open. Oldest first.
    void retire_expired_locked(clock::time_point now, retired_connections& retired) noexcept {
        bool freed = false;
        for (std::size_t index = 0; index < m_idle.size() && !retired.full();) {
            const pooled_connection& candidate = *m_idle[index];
            const bool too_old =
                m_options.max_lifetime.count() > 0 && elapsed_ms(candidate.opened_at, now) >= m_options.max_lifetime;
            const bool idle_too_long = m_options.idle_timeout.count() > 0 &&
                                       elapsed_ms(candidate.idle_since, now) >= m_options.idle_timeout &&
                                       load(m_size) > m_options.min_idle;
            if (too_old || idle_too_long) {
                count_close(too_old ? close_reason::lifetime : close_reason::idle);
                retired.add(std::move(m_idle[index]));
                m_idle.erase(m_idle.begin() + static_cast<std::ptrdiff_t>(index));
                store(m_idle_count, load(m_idle_count) - 1);
                store(m_size, load(m_size) - 1);
                freed = true;
            } else {
                ++index;
            }
        }
        if (freed) {
            wake_oldest_locked();
        }
    }

    /// An idle connection, or an empty pointer meaning "a slot is reserved
    /// for you: open one"; waits in line for either.
    /// \throws pool_timeout at `until`.
    std::unique_ptr<pooled_connection> take(clock::time_point start, clock::time_point until, bool at_front) {
        retired_connections retired;  // destroyed after the lock: closes outside the mutex
        pool_waiter node;
        std::unique_lock lock(m_mutex);
        auto now = clock::now();
        retire_expired_locked(now, retired);
        if (m_queue.empty()) {
            if (std::unique_ptr<pooled_connection> connection = take_idle_locked()) {
                return connection;
            }
            if (can_open_locked(now)) {
                reserve_slot_locked();
                return nullptr;
            }
        }
        if (at_front) {
            m_queue.push_front(node);
        } else {
            m_queue.push_back(node);
        }
        store(m_waiting, load(m_waiting) + 1);
        const queue_exit exit(*this, node);
        for (;;) {
            // A hand-over is checked first: it wins over a timeout that raced
            // with it. The giver unlinked the node and counted the connection
            // in use; if the deadline passed meanwhile, the caller still gets
            // the connection (never lost, never given twice).
            if (node.handed) {
                return std::move(node.handed);
            }
            now = clock::now();
            const bool oldest = m_queue.front() == &node;
            if (oldest) {
                if (std::unique_ptr<pooled_connection> connection = take_idle_locked()) {
                    leave_queue_locked(node);
                    return connection;
                }
                if (can_open_locked(now)) {
                    leave_queue_locked(node);
                    reserve_slot_locked();
                    return nullptr;
                }
            }
            if (now >= until) {
                leave_queue_locked(node);
                bump(m_acquire_timeouts);
                throw pool_timeout(timeout_message_locked(start, until));
            }
            auto wake_at = until;
            if (oldest && load(m_size) < m_options.max_size && m_retry_at < wake_at) {
                wake_at = m_retry_at;  // the oldest waiter retries after the back-off
            }
            node.wake.wait_until(lock, wake_at);
        }
    }

    [[nodiscard]] std::string timeout_message_locked(clock::time_point start, clock::time_point until) const {
        std::string message = "db pool: no connection within " + std::to_string(elapsed_ms(start, until).count()) +
                              " ms (max_size " + std::to_string(m_options.max_size) + ", in use " +
                              std::to_string(load(m_in_use)) + ")";
        if (!m_last_error.empty() && m_last_error_at >= start) {
            message += "; last connection error: " + m_last_error;
        }
        return message;
    }

    /// Opens a connection in a slot the caller reserved. On failure gives the
    /// slot back, records the (scrubbed) error, backs off, and returns null.
    std::unique_ptr<pooled_connection> open(clock::time_point until) {
        std::string error;
        try {
            auto record = std::make_unique<pooled_connection>();
            record->connection = pqxx_compat::open_connection(connect_string(m_target, until - clock::now()));
            record->handle = pqxx_compat::native_handle(*record->connection);
            record->backend_pid = record->connection->backendpid();
            record->opened_at = clock::now();
            record->idle_since = record->opened_at;
            const std::lock_guard lock(m_mutex);
            store(m_opening, load(m_opening) - 1);
            store(m_in_use, load(m_in_use) + 1);
            bump(m_opened);
            m_backoff = clock::duration::zero();
            m_retry_at = clock::time_point::min();
            return record;
        } catch (const std::exception& failure) {
            error = failure.what();
        } catch (...) {
            error = "unknown error";
        }
        std::string reported;
        try {
            reported = one_line(scrub(error, m_secrets));
        } catch (...) {
            reported = "(the error message could not be processed)";
        }
        const std::lock_guard lock(m_mutex);
        store(m_opening, load(m_opening) - 1);
        store(m_size, load(m_size) - 1);
        bump(m_connect_failures);
        const auto now = clock::now();
        m_last_error = std::move(reported);
        m_last_error_at = now;
        m_backoff = std::clamp<clock::duration>(m_backoff * 2, std::chrono::milliseconds(25), std::chrono::seconds(1));
        m_retry_at = now + m_backoff;
        wake_oldest_locked();  // it adopts the back-off (or opens, once it is over)
        return nullptr;
    }

    /// Outside the mutex, for a connection just taken from the idle list:
    /// why it must be closed instead of handed out, or nothing.
    std::optional<close_reason> unusable_on_borrow(pooled_connection& connection) const noexcept {
        const auto now = clock::now();
        if (!connection.connection->is_open()) {
            return close_reason::broken;
        }
        if (m_options.max_lifetime.count() > 0 && elapsed_ms(connection.opened_at, now) >= m_options.max_lifetime) {
            return close_reason::lifetime;
        }
        // Rounded up: with validate_after_idle = 0 every connection that was
        // idle at all is checked.
        if (std::chrono::ceil<std::chrono::milliseconds>(now - connection.idle_since) > m_options.validate_after_idle &&
            !check_idle_session(*connection.connection, saturating_add(now, m_options.validation_timeout))) {
            return close_reason::validation_failed;
        }
        return std::nullopt;
    }

    /// Outside the mutex, for a connection coming back from a lease: why it
    /// must be closed instead of kept, or nothing.
    std::optional<close_reason> unusable_on_return(pooled_connection& connection,
                                                   clock::time_point now) const noexcept {
        if (connection.discard) {
            return close_reason::discarded;
        }
        if (!connection.connection->is_open()) {
            return close_reason::broken;
        }
        if (m_options.max_lifetime.count() > 0 && elapsed_ms(connection.opened_at, now) >= m_options.max_lifetime) {
            return close_reason::lifetime;
        }
        if (connection.raw_access) {
            connection.raw_access = false;
            if (!session_idle(connection, saturating_add(now, m_options.validation_timeout))) {
                return close_reason::validation_failed;
            }
        }
        return std::nullopt;
    }

    /// Counts a closed connection and tells the hook, if any.
    void count_close(close_reason reason) noexcept {
        bump(m_closed_by[static_cast<std::size_t>(reason)]);
        if (m_options.on_close) {
            try {
                m_options.on_close(reason);
            } catch (...) {  // the hook must not throw; a throwing one is ignored
            }
        }
    }

    // relaxed: statistics, they order nothing.
    static void bump(std::atomic<std::uint64_t>& counter) noexcept { counter.fetch_add(1, std::memory_order_relaxed); }

public:
    /// The counters and gauges.
    [[nodiscard]] pool_stats stats() const noexcept {
        pool_stats stats;
        stats.max_size = m_options.max_size;
        stats.size = size();
        stats.idle = idle();
        stats.in_use = in_use();
        stats.waiting = waiting();
        stats.opened = m_opened.load(std::memory_order_relaxed);
        stats.connect_failures = m_connect_failures.load(std::memory_order_relaxed);
        stats.acquire_timeouts = m_acquire_timeouts.load(std::memory_order_relaxed);
        for (std::size_t i = 0; i < close_reason_count; ++i) {
            stats.closed[i] = m_closed_by[i].load(std::memory_order_relaxed);
        }
        return stats;
    }

private:
    const pqxx_pool_options m_options;         // immutable after construction
    const connect_target m_target;             // immutable after construction
    const std::vector<std::string> m_secrets;  // immutable after construction: passwords to scrub

    mutable std::mutex m_mutex;
    std::vector<std::unique_ptr<pooled_connection>> m_idle;        // guarded by m_mutex; most recently returned last
    pool_wait_queue m_queue;                                       // guarded by m_mutex
    bool m_closed = false;                                         // guarded by m_mutex; the pool object is gone
    clock::time_point m_retry_at = clock::time_point::min();       // guarded by m_mutex; no new attempt before
    clock::duration m_backoff = clock::duration::zero();           // guarded by m_mutex; after the last failure
    std::string m_last_error;                                      // guarded by m_mutex; scrubbed
    clock::time_point m_last_error_at = clock::time_point::min();  // guarded by m_mutex

    // Written only under m_mutex; read there, or relaxed by the observers.
    std::atomic<std::size_t> m_size{0};        // open or being opened (idle + in use + opening)
    std::atomic<std::size_t> m_idle_count{0};  // m_idle.size()
    std::atomic<std::size_t> m_in_use{0};      // in leases (or being checked on borrow)
    std::atomic<std::size_t> m_opening{0};     // slots reserved, connection not open yet
    std::atomic<std::size_t> m_waiting{0};     // nodes in m_queue

    // Statistics: relaxed counters, written anywhere.
    std::atomic<std::uint64_t> m_opened{0};
    std::atomic<std::uint64_t> m_connect_failures{0};
    std::atomic<std::uint64_t> m_acquire_timeouts{0};
    std::array<std::atomic<std::uint64_t>, close_reason_count> m_closed_by{};
};

}  // namespace detail

// ---------------------------------------------------------------------------
// pqxx_pool
// ---------------------------------------------------------------------------

/// A thread-safe pool of pqxx::connection, and a bulkhead::transactional_pool
/// for db_bulkhead. See the file comment for guarantees, fairness, the
/// validation and retirement policy, and lifetime.
class pqxx_pool {
public:
    using clock = std::chrono::steady_clock;

    /// Settings of one gate transaction (db_bulkhead's `options::transaction`).
    struct transaction_options {
        /// The transaction's isolation level (spelled out in BEGIN, so a
        /// server default does not apply).
        isolation isolation_level = isolation::read_committed;
        /// BEGIN ... READ ONLY instead of READ WRITE.
        bool read_only = false;
        /// SET LOCAL statement_timeout, in whole milliseconds (0 disables the
        /// server's timeout for this transaction). A statement that runs
        /// longer fails with SQLSTATE 57014. In [0, INT_MAX].
        std::optional<std::chrono::milliseconds> statement_timeout{};
        /// SET LOCAL lock_timeout, in whole milliseconds; a lock wait that
        /// lasts longer fails with SQLSTATE 55P03. In [0, INT_MAX].
        std::optional<std::chrono::milliseconds> lock_timeout{};
        /// The call's deadline (db_bulkhead sets it from its options). When
        /// set, statement_timeout becomes the time left when the transaction
        /// begins, if that is shorter; a statement the server cuts short for
        /// it reaches the caller as bulkhead::work_deadline_exceeded.
        clock::time_point deadline = clock::time_point::max();
        /// With a deadline, bound lock waits by the time left as well
        /// (lock_timeout), not only statements.
        bool deadline_sets_lock_timeout = false;
        /// Read-write transactions learn their transaction id with BEGIN (no
        /// extra round trip) so that a COMMIT whose connection is lost can be
        /// settled afterwards with txid_status(): the caller then gets the
        /// value (it committed), the failure (it was rolled back), or
        /// bulkhead::commit_unknown. Costs: every read-write transaction gets
        /// a transaction id, even one that writes nothing.
        bool resolve_commit_outcome = true;
    };

    /// The gate's transaction handle; `*tx` is what the callback receives,
    /// usable as a pqxx::dbtransaction&.
    using transaction = std::unique_ptr<detail::gate_transaction>;

    /// One borrowed connection. Returns it to the pool when destroyed.
    /// \note Move-only; used by one thread at a time. Any pqxx transaction
    /// object opened on its connection must be gone before it is returned.
    class [[nodiscard]] lease {
    public:
        /// An empty lease, holding nothing.
        lease() noexcept = default;

        lease(lease&& other) noexcept = default;

        /// Returns what this lease held, then takes over `other`'s connection.
        lease& operator=(lease&& other) noexcept {
            if (this != &other) {
                release();
                m_core = std::move(other.m_core);
                m_connection = std::move(other.m_connection);
            }
            return *this;
        }

        lease(const lease&) = delete;
        lease& operator=(const lease&) = delete;

        ~lease() { release(); }

        /// Returns the connection to the pool (or closes it: see the file
        /// comment for what is checked). Idempotent.
        /// \note If connection() was used, the session is checked through
        /// libpq's transaction status, without a round trip; only when the
        /// pool could not read the connection's libpq handle with one round
        /// trip (bounded by validation_timeout).
        void release() noexcept {
            if (m_connection) {
                std::shared_ptr<detail::pool_core> core = std::move(m_core);
                core->give_back(std::move(m_connection));
            }
            m_core.reset();
        }

        /// True while it holds a connection.
        explicit operator bool() const noexcept { return m_connection != nullptr; }

        /// The connection itself, for work outside the gate. Using it makes
        /// the pool check the session when the lease is returned.
        /// \throws std::logic_error on an empty lease.
        [[nodiscard]] pqxx::connection& connection() {
            if (!m_connection) {
                throw std::logic_error("bulkhead::pqxx_pool::lease: the lease is empty");
            }
            m_connection->raw_access = true;
            return *m_connection->connection;
        }

        /// `lease->exec(...)`-style access to connection().
        /// \throws std::logic_error on an empty lease.
        pqxx::connection* operator->() { return &connection(); }

    private:
        friend class pqxx_pool;

        lease(std::shared_ptr<detail::pool_core> core, std::unique_ptr<detail::pooled_connection> connection) noexcept
            : m_core(std::move(core)), m_connection(std::move(connection)) {}

        std::shared_ptr<detail::pool_core> m_core;                // keeps the pool's state alive
        std::unique_ptr<detail::pooled_connection> m_connection;  // null when empty
    };

    /// Creates a pool; opens min_idle connections (best effort: a server that
    /// is down does not make construction fail; it stops at the first failed
    /// attempt, which can take up to libpq's connect_timeout).
    /// \throws std::invalid_argument naming the field and its value when an
    ///         option is out of range (max_size < 1, min_idle > max_size,
    ///         connection_timeout or validation_timeout below 250 ms, negative
    ///         durations, empty conninfo), or naming conninfo with libpq's
    ///         complaint (passwords removed) when libpq cannot parse it
    ///         (PQconninfoParse: syntax and keywords; values such as a port
    ///         number are checked when connecting). Nothing is opened then.
    explicit pqxx_pool(pqxx_pool_options options) : m_core(make_core(std::move(options))) { m_core->open_min_idle(); }

    pqxx_pool(const pqxx_pool&) = delete;
    pqxx_pool& operator=(const pqxx_pool&) = delete;

    /// Closes the idle connections. Leases still out stay valid; their
    /// connections close when they are returned.
    /// \note No thread may be inside acquire() (or any other member) then.
    ~pqxx_pool() { m_core->shut_down(); }

    /// A connection, waiting at most connection_timeout.
    /// \throws bulkhead::pool_timeout when none is available in time; its
    ///         message says how long, max_size and how many are in use, and
    ///         the last connection error (password removed), if any.
    /// \note FIFO among waiters; see the file comment.
    [[nodiscard]] lease acquire() { return acquire(clock::time_point::max()); }

    /// A connection, waiting at most connection_timeout and never past
    /// `deadline` (time_point::max(): none). A connection attempt is bounded
    /// by the remaining wait where libpq allows (connect_timeout, whole
    /// seconds, at least 2, added only when the conninfo sets none).
    /// \throws bulkhead::pool_timeout as acquire().
    [[nodiscard]] lease acquire(clock::time_point deadline) { return lease(m_core, m_core->acquire(deadline)); }

    /// Starts a transaction on the leased connection: BEGIN with the options'
    /// isolation level and access mode, and SET LOCAL for their timeouts, in
    /// one round trip.
    /// \throws std::logic_error for an empty lease or one of another pool;
    ///         std::invalid_argument for a timeout out of range; whatever
    ///         libpqxx throws (the connection is then marked for discard).
    [[nodiscard]] transaction begin(lease& held, const transaction_options& options) {
        detail::pooled_connection& connection = leased(held);
        detail::transaction_control control;
        control.owner = &connection;
        control.target = &m_core->target();
        control.settle_budget = m_core->options().connection_timeout;
        control.read_only = options.read_only;
        control.track_txid = options.resolve_commit_outcome && !options.read_only;
        if (options.deadline == clock::time_point::max()) {
            control.begin_statement = detail::begin_statement(options);
        } else {
            transaction_options bounded = options;
            std::tie(control.timeout_from_deadline, control.lock_timeout_from_deadline) = bound_by_deadline(bounded);
            control.begin_statement = detail::begin_statement(bounded);
        }
        if (control.track_txid) {
            control.begin_statement += "; SELECT txid_current()";
        }
        return std::make_unique<detail::gate_transaction>(*connection.connection, std::move(control));
    }

    /// Asks the server to cancel the statement running on the leased
    /// connection (libpq's cancel request), from any thread; the statement
    /// then fails with SQLSTATE 57014. Does nothing when none runs. Never
    /// throws: a cancel that cannot be sent leaves the work to finish.
    void cancel(lease& held) noexcept {
        try {
            if (held.m_connection && held.m_connection->connection) {
                held.m_connection->connection->cancel_query();
            }
        } catch (...) {  // best effort by nature: the statement just runs on
        }
    }

    /// Inside a catch handler for the callback's failure: true when it is the
    /// server cutting a statement short (57014) under a statement_timeout, or
    /// a lock wait (55P03) under a lock_timeout, that came from the call's
    /// deadline.
    [[nodiscard]] bool failed_by_deadline(transaction& tx) noexcept {
        if (!tx) {
            return false;
        }
        const detail::transaction_control& control = tx->control();
        try {
            throw;
        } catch (const pqxx::sql_error& failure) {
            return (control.timeout_from_deadline && failure.sqlstate() == "57014") ||
                   (control.lock_timeout_from_deadline && failure.sqlstate() == "55P03");
        } catch (...) {
            return false;
        }
    }

    /// Commits. A COMMIT that fails on the server leaves nothing committed.
    /// \throws std::logic_error when the callback had called commit() or
    ///         abort() itself (refused: nothing is committed); pqxx::in_doubt_error
    ///         when the connection was lost during COMMIT; pqxx::sql_error from
    ///         the server (a failed COMMIT ends the transaction), or with
    ///         SQLSTATE 25P02 when a statement of the transaction had failed
    ///         and its error was caught (COMMIT is then not sent; rollback()
    ///         ends the transaction).
    void commit(lease& held, transaction& tx) {
        (void)leased(held);
        detail::transaction_control::commit(checked(tx));
    }

    /// Rolls back. Safe after a commit() that threw; a no-op when the server's
    /// transaction already ended.
    /// \throws whatever ROLLBACK failed with (then discard the lease).
    void rollback(lease& held, transaction& tx) {
        (void)leased(held);
        detail::transaction_control::rollback(checked(tx));
    }

    /// Marks the leased connection untrustworthy: it is closed when the lease
    /// is returned, never handed out again. A no-op for an empty lease.
    void discard(lease& held) noexcept {
        if (held.m_connection) {
            held.m_connection->discard = true;
        }
    }

    /// Connections open or being opened (idle + in use + opening); at most max_size.
    [[nodiscard]] std::size_t size() const noexcept { return m_core->size(); }
    /// Open connections waiting in the pool.
    [[nodiscard]] std::size_t idle() const noexcept { return m_core->idle(); }
    /// Connections in leases.
    [[nodiscard]] std::size_t in_use() const noexcept { return m_core->in_use(); }
    /// Threads waiting in acquire().
    [[nodiscard]] std::size_t waiting() const noexcept { return m_core->waiting(); }
    /// The options, as constructed.
    [[nodiscard]] const pqxx_pool_options& options() const noexcept { return m_core->options(); }
    /// Gauges and counters: connections opened, closed by reason, connection
    /// failures, acquire timeouts.
    [[nodiscard]] pool_stats stats() const noexcept { return m_core->stats(); }

private:
    detail::pooled_connection& leased(lease& held) const {
        if (!held.m_connection) {
            throw std::logic_error("bulkhead::pqxx_pool: the lease is empty");
        }
        if (held.m_core != m_core) {
            throw std::logic_error("bulkhead::pqxx_pool: the lease belongs to another pool");
        }
        return *held.m_connection;
    }

    static std::shared_ptr<detail::pool_core> make_core(pqxx_pool_options options) {
        detail::check_options(options);  // before anything is built
        return std::make_shared<detail::pool_core>(std::move(options));
    }

    /// Shortens the timeouts of `options` to the time left before its
    /// deadline; returns whether statement_timeout and lock_timeout now come
    /// from it.
    /// \throws bulkhead::deadline_exceeded when no whole millisecond is left.
    static std::pair<bool, bool> bound_by_deadline(transaction_options& options) {
        const auto left = std::chrono::floor<std::chrono::milliseconds>(options.deadline - clock::now());
        if (left < std::chrono::milliseconds(1)) {
            throw deadline_exceeded("db deadline passed before the transaction began");
        }
        const auto shorten = [&](std::optional<std::chrono::milliseconds>& timeout) {
            // A deadline further away than the server's largest timeout
            // (INT_MAX ms, about 24.8 days) cannot bind: leave the timeout be.
            if (left.count() > INT_MAX) {
                return false;
            }
            // 0 disables a timeout on the server: the deadline then applies.
            if (!timeout || timeout->count() == 0 || left < *timeout) {
                timeout = left;
                return true;
            }
            return false;
        };
        const bool statement = shorten(options.statement_timeout);
        const bool lock = options.deadline_sets_lock_timeout && shorten(options.lock_timeout);
        return {statement, lock};
    }

    static detail::gate_transaction& checked(transaction& tx) {
        if (!tx) {
            throw std::logic_error("bulkhead::pqxx_pool: no transaction");
        }
        return *tx;
    }

    std::shared_ptr<detail::pool_core> m_core;  // shared with the leases; never null
};

static_assert(transactional_pool<pqxx_pool>);
static_assert(std::is_nothrow_move_constructible_v<pqxx_pool::lease> &&
              !std::is_copy_constructible_v<pqxx_pool::lease>);

}  // namespace bulkhead
