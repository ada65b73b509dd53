// bulkhead: libpq connection strings, read without libpq.
//
// The pool's conninfo handling, usable and tested without a server or
// libpqxx: finding every password in a keyword string or URI (and in prose
// that quotes one, such as an error message), redacting and scrubbing them,
// refusing a URI whose user information libpq would misread, and building
// the string the pool connects with (application_name, a connect_timeout
// bounded by the caller's wait, TCP keepalive and tcp_user_timeout defaults).
//
// Guarantees.
// - redact_conninfo() replaces every password value with `***`, whatever
//   characters it holds: quoted or not, escaped or not, percent-encoded or
//   not, in keyword form or in a URI's user information or parameters.
// - scrub() additionally removes each known secret (as spelled and as libpq
//   reads it) from any text, so a message that echoes a password in another
//   form does not carry it either.
// - check_uri_user_information() refuses a URI that holds more than one '@',
//   or an '@' after the host part: libpq would take part of a password that
//   holds an unencoded '@', '/', '?' or '#' for a host, port or database and
//   put it in its error messages. The refusal names no part of the password.
// - Nothing here allocates beyond the strings it returns; nothing throws but
//   std::bad_alloc and the documented std::invalid_argument.
//
// Thread safety: free functions on their arguments; make_connect_target()
// reads the environment (PGCONNECT_TIMEOUT) once.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bulkhead {

/// The libpq connection string `conninfo` (or any text, such as an error
/// message) with every password value replaced by `***`: values of keywords
/// ending in "password" (`password`, `sslpassword`; quoted or not, with
/// backslash escapes), the password in a URI's user information
/// (`postgresql://user:secret@host`, up to the URI's last '@', so a password
/// holding an unencoded '/' or '@' is hidden whole), URI parameters ending in
/// "password", and SQL's `PASSWORD '...'`. Everything else is kept as is.
/// \throws std::bad_alloc only.
/// \note Best effort on malformed text: a quoted value that never closes is
/// redacted up to the end of the text.
[[nodiscard]] inline std::string redact_conninfo(std::string_view conninfo);

namespace detail {

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
    // libpq ends the user information at the first '@' before any '/'. For
    // finding secrets the last '@' counts instead: a password that holds an
    // unencoded '@', '/', '?' or '#' was meant to end there, and libpq would
    // read parts of it as host, port or database (pqxx_pool refuses such a
    // URI; redaction still hides all of it).
    std::size_t at_sign = end;
    for (std::size_t pos = body; pos < end; ++pos) {
        if (text[pos] == '@') {
            at_sign = pos;
        }
    }
    if (at_sign < end) {
        const std::size_t colon = text.find(':', body);
        if (colon < at_sign && colon + 1 < at_sign) {
            visit(conninfo_value{"password", colon + 1, at_sign, true});
        }
    }
    // Parameters are read from the first '?' on, also when it stands inside
    // what the user information covers: a visit that overlaps one already
    // made is ignored by the visitors that edit text.
    const std::size_t question = text.find('?', body);
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

/// Throws std::invalid_argument unless libpq reads the user information of
/// the URI `conninfo` (if it is one) as its author meant: no whitespace, at
/// most one '@', and none after the host part. The message names the rule,
/// never the text.
inline void check_uri_user_information(std::string_view conninfo) {
    if (!is_uri(conninfo)) {
        return;
    }
    if (std::any_of(conninfo.begin(), conninfo.end(), conninfo_space)) {
        throw std::invalid_argument(
            "bulkhead::pqxx_pool: conninfo is a URI that holds whitespace: percent-encode it (%20)");
    }
    const std::size_t body = conninfo.find("://") + 3;
    const std::size_t first_at = conninfo.find('@', body);
    if (first_at == std::string_view::npos) {
        return;
    }
    const std::size_t host_end = conninfo.find_first_of("/?#", body);
    if (conninfo.find('@', first_at + 1) != std::string_view::npos || host_end < first_at) {
        throw std::invalid_argument(
            "bulkhead::pqxx_pool: conninfo is a URI whose user name or password holds an unencoded '@', '/', '?' "
            "or '#' (libpq would read part of it as a host, port or database): percent-encode those characters "
            "(%40, %2F, %3F, %23)");
    }
}

/// True when a keyword-form password value in `conninfo` is followed by a
/// word that is not `key=value`: most likely the rest of a password that
/// held a space or a quote and was not quoted as libpq expects, which libpq
/// would quote back in its complaint.
[[nodiscard]] inline bool password_may_spill(std::string_view conninfo) {
    bool spills = false;
    scan_conninfo(conninfo, [&](const conninfo_value& value) {
        if (spills || value.from_uri || !is_password_key(value.key)) {
            return;
        }
        std::size_t next = value.end;
        while (next < conninfo.size() && conninfo_space(conninfo[next])) {
            ++next;
        }
        std::size_t word_end = next;
        while (word_end < conninfo.size() && !conninfo_space(conninfo[word_end]) && conninfo[word_end] != '=') {
            ++word_end;
        }
        const bool assigned = word_end < conninfo.size() && conninfo[word_end] == '=';
        const bool spaced_assignment = [&] {
            std::size_t after = word_end;
            while (after < conninfo.size() && conninfo_space(conninfo[after])) {
                ++after;
            }
            return after < conninfo.size() && conninfo[after] == '=';
        }();
        spills = next < conninfo.size() && !assigned && !spaced_assignment;
    });
    return spills;
}

/// What the pool adds to a connection string unless it sets the keyword
/// itself: TCP keepalives (a peer that vanished is noticed after about
/// keepalives_idle + keepalives_interval x keepalives_count = 30 s of
/// silence) and tcp_user_timeout (sent data unacknowledged for 30 s ends the
/// connection). Neither helps against a server that is alive but frozen
/// (its kernel still acknowledges): the call's deadline does (docs/deadlines.md).
inline constexpr std::pair<std::string_view, std::string_view> tcp_defaults[] = {
    {"keepalives", "1"},       {"keepalives_idle", "15"},     {"keepalives_interval", "5"},
    {"keepalives_count", "3"}, {"tcp_user_timeout", "30000"},
};

/// The values of target_session_attrs libpq 14 and later take.
inline constexpr std::string_view known_session_attrs[] = {"any",     "read-write", "read-only",
                                                           "primary", "standby",    "prefer-standby"};

/// What a pool needs of its server, from target_session_attrs
/// (`session_attrs`: empty when neither the conninfo nor the environment
/// sets one, which the pool reads as primary).
enum class session_need : std::uint8_t {
    any,             ///< read-only, standby, any: whatever libpq picked
    prefer_standby,  ///< prefer-standby: a standby, or the primary for a while (fallback_lifetime)
    primary,         ///< primary (the default): not in recovery
    read_write,      ///< read-write: not in recovery, and default_transaction_read_only off
};

[[nodiscard]] constexpr session_need session_need_of(std::string_view session_attrs) noexcept {
    if (session_attrs.empty() || session_attrs == "primary") {
        return session_need::primary;
    }
    if (session_attrs == "prefer-standby") {
        return session_need::prefer_standby;
    }
    return session_attrs == "read-write" ? session_need::read_write : session_need::any;
}

/// How the pool connects: the user's conninfo with application_name, the
/// TCP defaults and target_session_attrs, and whether it may add a
/// connect_timeout of its own.
struct connect_target {
    std::string base;                           // conninfo plus application_name, tcp_defaults, target_session_attrs
    bool uri = false;                           // URI form (parameters after '?', joined by '&')
    bool add_connect_timeout = false;           // neither conninfo nor PGCONNECT_TIMEOUT sets one
    session_need sessions = session_need::any;  // a pool's: what its server must be (session_need_of())
};

/// Appends `key=value` to a connection string in its own form.
inline void append_parameter(std::string& conninfo, bool uri, std::string_view key, std::string_view value) {
    if (uri) {
        conninfo += conninfo.find('?') == std::string::npos ? '?' : '&';
        conninfo.append(key).append("=").append(percent_encode(value));
    } else {
        conninfo.append(" ").append(key).append("=").append(quote_keyword_value(value));
    }
}

/// The pool's connect_target for `conninfo` and `application_name` (empty:
/// leave it to conninfo and the environment). `session_attrs`, for a pool,
/// is the target_session_attrs the conninfo or the environment sets (empty:
/// none); without one the pool asks libpq for a primary (a server not in
/// recovery), so that a host list moves on past a standby, and a standby
/// alone is a connection error that says so. Without `session_attrs`
/// (another connection than a pool's) target_session_attrs is left as it
/// is.
[[nodiscard]] inline connect_target make_connect_target(const std::string& conninfo,
                                                        const std::string& application_name,
                                                        std::optional<std::string_view> session_attrs = {}) {
    connect_target target;
    target.base = conninfo;
    target.uri = is_uri(conninfo);
    target.sessions = session_attrs ? session_need_of(*session_attrs) : session_need::any;
    if (!application_name.empty()) {
        append_parameter(target.base, target.uri, "application_name", application_name);
    }
    if (session_attrs && session_attrs->empty()) {
        append_parameter(target.base, target.uri, "target_session_attrs", "primary");
    }
    for (const auto& [key, value] : tcp_defaults) {
        if (!conninfo_sets(conninfo, key)) {
            append_parameter(target.base, target.uri, key, value);
        }
    }
    // concurrency-mt-unsafe: read once, when the pool is built; libpq itself
    // reads PGCONNECT_TIMEOUT with getenv on every connection attempt.
    const char* from_environment = std::getenv("PGCONNECT_TIMEOUT");  // NOLINT(concurrency-mt-unsafe)
    target.add_connect_timeout =
        !conninfo_sets(conninfo, "connect_timeout") && (from_environment == nullptr || *from_environment == '\0');
    return target;
}

/// The connect_timeout the pool gives libpq for one attempt that should end
/// within `remaining`: libpq counts it in whole seconds, at least 2 (per host
/// address it tries); the pool bounds the attempt more finely itself
/// (pool_core::open).
[[nodiscard]] inline std::chrono::seconds connect_timeout_for(std::chrono::steady_clock::duration remaining) noexcept {
    return std::chrono::seconds(
        std::clamp<std::int64_t>(std::chrono::ceil<std::chrono::seconds>(remaining).count(), 2, INT_MAX));
}

/// The connection string for one attempt that should end within `remaining`.
[[nodiscard]] inline std::string connect_string(const connect_target& target,
                                                std::chrono::steady_clock::duration remaining) {
    if (!target.add_connect_timeout) {
        return target.base;
    }
    std::string info = target.base;
    append_parameter(info, target.uri, "connect_timeout", std::to_string(connect_timeout_for(remaining).count()));
    return info;
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

}  // namespace bulkhead
