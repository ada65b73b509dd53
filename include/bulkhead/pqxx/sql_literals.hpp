// bulkhead: a statement's parameters written into its text as literals.
//
// The deferred BEGIN (pqxx_transaction) sends BEGIN and the callback's first
// statement in one simple query, so that they cost one round trip; a simple
// query carries no parameters. bind_literals() writes each parameter
// reference ($1, $2, ...) of one statement as the literal that libpqxx
// quoted for its value (quote(): the connection's own escaping, NULL for a
// null). A literal is untyped until the server resolves it from its
// context, as a parameter sent without a type is: the statement means the
// same either way.
//
// Where a $n is a parameter follows the server's lexer: not inside a string
// constant ('...', E'...' with backslash escapes, '...' with them too when
// standard_conforming_strings is off, U&'...', B'...', X'...'), a quoted
// identifier, a dollar-quoted string ($$...$$, $tag$...$tag$) or a comment
// (-- to the end of the line, nested /* */), and not inside an identifier
// or number ($ continues one: a$1 is a name). A value is never interpreted
// as SQL: it goes in whole, as one quoted literal.
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bulkhead::detail {

namespace sql_lexing {

[[nodiscard]] constexpr bool word_start(char c) noexcept {
    const auto u = static_cast<unsigned char>(c);
    return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_' || u >= 0x80;
}

[[nodiscard]] constexpr bool digit(char c) noexcept { return c >= '0' && c <= '9'; }

[[nodiscard]] constexpr bool word_part(char c) noexcept { return word_start(c) || digit(c) || c == '$'; }

/// The end (one past) of the quoted run that starts at `from` (the opening
/// `quote`): a doubled quote stays inside, and with `backslashes` a
/// backslash escapes the next character. npos when it never closes.
[[nodiscard]] inline std::size_t quoted_end(std::string_view sql, std::size_t from, char quote,
                                            bool backslashes) noexcept {
    for (std::size_t i = from + 1; i < sql.size(); ++i) {
        if (backslashes && sql[i] == '\\') {
            ++i;
        } else if (sql[i] == quote) {
            if (i + 1 < sql.size() && sql[i + 1] == quote) {
                ++i;
            } else {
                return i + 1;
            }
        }
    }
    return std::string_view::npos;
}

/// The end of the comment that starts at `from` ("--" or "/*"), nested
/// block comments included; the end of `sql` when it never closes.
[[nodiscard]] inline std::size_t comment_end(std::string_view sql, std::size_t from) noexcept {
    if (sql[from + 1] == '-') {
        const std::size_t line = sql.find('\n', from);
        return line == std::string_view::npos ? sql.size() : line + 1;
    }
    int depth = 0;
    for (std::size_t i = from; i + 1 < sql.size(); ++i) {
        if (sql[i] == '/' && sql[i + 1] == '*') {
            ++depth;
            ++i;
        } else if (sql[i] == '*' && sql[i + 1] == '/') {
            ++i;
            if (--depth == 0) {
                return i + 1;
            }
        }
    }
    return sql.size();
}

/// The length of the dollar-quote tag ("$$", "$tag$") that starts at
/// `from`, or 0 when none does.
[[nodiscard]] inline std::size_t dollar_tag(std::string_view sql, std::size_t from) noexcept {
    std::size_t i = from + 1;
    if (i < sql.size() && word_start(sql[i])) {
        while (i < sql.size() && (word_start(sql[i]) || digit(sql[i]))) {
            ++i;
        }
    }
    return i < sql.size() && sql[i] == '$' ? i + 1 - from : 0;
}

/// True when only white space, comments and semicolons follow `from`.
[[nodiscard]] inline bool nothing_after(std::string_view sql, std::size_t from) noexcept {
    for (std::size_t i = from; i < sql.size();) {
        const char c = sql[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == ';') {
            ++i;
        } else if (i + 1 < sql.size() && ((c == '-' && sql[i + 1] == '-') || (c == '/' && sql[i + 1] == '*'))) {
            i = comment_end(sql, i);
        } else {
            return false;
        }
    }
    return true;
}

}  // namespace sql_lexing

/// `sql`, one statement, with each parameter reference $n replaced by
/// `literals[n - 1]`. `standard_strings`: the session's
/// standard_conforming_strings (off: backslashes escape in '...' too).
/// \throws std::invalid_argument, naming the problem, when `sql` holds more
///         than one statement, refers to a parameter beyond `literals`, or
///         leaves one of them unused; or when a string, quoted identifier or
///         dollar quote never closes.
[[nodiscard]] inline std::string bind_literals(std::string_view sql, const std::vector<std::string>& literals,
                                               bool standard_strings) {
    using namespace sql_lexing;
    std::string out;
    out.reserve(sql.size() + 16 * literals.size());
    std::vector<bool> used(literals.size(), false);
    const auto unclosed = [](const char* what) {
        throw std::invalid_argument(std::string("bulkhead::pqxx_transaction: the statement has ") + what +
                                    " that never closes");
    };
    std::size_t i = 0;
    while (i < sql.size()) {
        const char c = sql[i];
        const char next = i + 1 < sql.size() ? sql[i + 1] : '\0';
        std::size_t end = i + 1;
        if ((c == '-' && next == '-') || (c == '/' && next == '*')) {
            end = comment_end(sql, i);
        } else if (c == '\'') {
            end = quoted_end(sql, i, '\'', !standard_strings);
            if (end == std::string_view::npos) {
                unclosed("a string constant");
            }
        } else if (c == '"') {
            end = quoted_end(sql, i, '"', false);
            if (end == std::string_view::npos) {
                unclosed("a quoted identifier");
            }
        } else if (c == '$' && digit(next)) {
            end = i + 1;
            std::size_t number = 0;
            while (end < sql.size() && digit(sql[end])) {
                if (number <= literals.size()) {  // past that it is refused below: no overflow
                    number = number * 10 + static_cast<std::size_t>(sql[end] - '0');
                }
                ++end;
            }
            if (number == 0 || number > literals.size()) {
                throw std::invalid_argument("bulkhead::pqxx_transaction: the statement refers to parameter $" +
                                            std::string(sql.substr(i + 1, end - i - 1)) + ", but " +
                                            std::to_string(literals.size()) + " were given");
            }
            used[number - 1] = true;
            out += literals[number - 1];
            i = end;
            continue;
        } else if (c == '$') {
            if (const std::size_t tag = dollar_tag(sql, i); tag > 0) {
                const std::size_t close = sql.find(sql.substr(i, tag), i + tag);
                if (close == std::string_view::npos) {
                    unclosed("a dollar-quoted string");
                }
                end = close + tag;
            }
        } else if (word_start(c) || digit(c)) {
            while (end < sql.size() && word_part(sql[end])) {
                ++end;
            }
            // E'...': an escape string constant, backslashes escape.
            if (end == i + 1 && (c == 'E' || c == 'e') && end < sql.size() && sql[end] == '\'') {
                end = quoted_end(sql, end, '\'', true);
                if (end == std::string_view::npos) {
                    unclosed("a string constant");
                }
            }
        } else if (c == ';' && !nothing_after(sql, i + 1)) {
            throw std::invalid_argument(
                "bulkhead::pqxx_transaction: a statement with parameters must be one statement; this one has more "
                "after a ';'");
        }
        out.append(sql.substr(i, end - i));
        i = end;
    }
    for (std::size_t n = 0; n < used.size(); ++n) {
        if (!used[n]) {
            throw std::invalid_argument("bulkhead::pqxx_transaction: parameter $" + std::to_string(n + 1) +
                                        " was given but the statement never refers to it");
        }
    }
    return out;
}

}  // namespace bulkhead::detail
