// bulkhead: the result of a statement that travelled with its COMMIT.
//
// pqxx_transaction::exec_with_commit() (and db_bulkhead::execute(), which
// calls it) does not run its statement when called: the pool sends it at
// commit, with BEGIN before it and COMMIT after it, in one round trip
// (transaction.hpp). What it returns is a statement_result that the gate
// fills in when the COMMIT succeeded, read after the call has returned.
// libpqxx cannot wrap a libpq result it did not make, so this is a small
// type of its own over libpq's PGresult: rows and columns of text, NULLs,
// the command tag and the number of rows affected.
//
// Guarantees: a statement_result holds a value only when its transaction
// committed; reading one that holds none throws std::logic_error (the call
// failed, or the callback reads it before the gate committed).
// Thread safety: a filled statement_result is immutable, and its copies
// share it: any number of threads may read it at once. It is filled by the
// thread that ran the call, before the call returns.
#pragma once

#include <bulkhead/pqxx/compat.hpp>
#include <bulkhead/pqxx/options.hpp>
#include <bulkhead/pqxx/protocol.hpp>

#include <libpq-fe.h>
#include <pqxx/pqxx>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace bulkhead {

namespace detail {

/// A statement that waits for the gate's COMMIT to carry it, and what it
/// returned once that COMMIT succeeded. Shared by the transaction and the
/// statement_result the callback returned.
struct one_trip_statement {
    std::string sql;
    std::vector<std::optional<std::string>> parameters;  // text; nullopt is NULL
    pqxx_transaction_options options;                    // the call's, for BEGIN
    std::vector<std::string> begin;                      // BEGIN and its SET LOCALs, made at commit
    result_ptr result;                                   // set when the COMMIT succeeded
};

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

/// One parameter as text (pqxx::to_string), or nullopt for NULL: nullptr,
/// std::nullopt and an empty std::optional.
/// \throws std::invalid_argument for text holding a NUL character.
template <class T>
std::optional<std::string> parameter_text(const T& value) {
    using plain = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<plain, std::nullptr_t> || std::is_same_v<plain, std::nullopt_t>) {
        return std::nullopt;
    } else if constexpr (is_optional<plain>::value) {
        return value ? parameter_text(*value) : std::nullopt;
    } else {
        std::string text;
        if constexpr (std::is_convertible_v<const T&, std::string_view>) {
            text = std::string(std::string_view(value));
        } else {
            text = pqxx::to_string(value);
        }
        if (text.find('\0') != std::string::npos) {
            throw std::invalid_argument("bulkhead: a statement's parameter must not contain a NUL character");
        }
        return text;
    }
}

}  // namespace detail

/// What a statement sent with its COMMIT returned (see the file comment).
/// Rows and columns count from 0. Cheap to copy: copies share the result.
class statement_result {
public:
    /// Empty: holds no value.
    statement_result() = default;

    /// True when the statement's transaction committed and its result is
    /// here.
    [[nodiscard]] bool has_value() const noexcept { return m_statement && m_statement->result; }

    /// Rows returned (0 for a statement that returns none).
    /// \throws std::logic_error when has_value() is false.
    [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(PQntuples(get())); }
    [[nodiscard]] bool empty() const { return size() == 0; }

    /// Columns of each row.
    /// \throws std::logic_error when has_value() is false.
    [[nodiscard]] int columns() const { return PQnfields(get()); }

    /// The name of `column`.
    /// \throws std::logic_error when has_value() is false; std::out_of_range
    ///         for a column out of range.
    [[nodiscard]] std::string_view column_name(int column) const {
        PGresult* result = get();
        check(result, 0, column, false);
        return PQfname(result, column);
    }

    /// The command tag ("INSERT 0 1", "SELECT 3", "UPDATE 2").
    /// \throws std::logic_error when has_value() is false.
    [[nodiscard]] std::string_view command_tag() const { return PQcmdStatus(get()); }

    /// Rows inserted, updated, deleted, selected, moved, fetched or copied,
    /// as the command tag says; 0 when it says none.
    /// \throws std::logic_error when has_value() is false.
    [[nodiscard]] std::uint64_t affected_rows() const {
        const char* count = PQcmdTuples(get());
        return count[0] == '\0' ? 0 : std::strtoull(count, nullptr, 10);
    }

    /// The text of `row`, `column`; nullopt for NULL. Valid while a copy of
    /// this statement_result lives.
    /// \throws std::logic_error when has_value() is false; std::out_of_range
    ///         for a row or column out of range.
    [[nodiscard]] std::optional<std::string_view> get(std::size_t row, int column) const {
        PGresult* result = get();
        check(result, row, column, true);
        const int index = static_cast<int>(row);
        if (PQgetisnull(result, index, column) != 0) {
            return std::nullopt;
        }
        return std::string_view(PQgetvalue(result, index, column),
                                static_cast<std::size_t>(PQgetlength(result, index, column)));
    }

    /// The value of `row`, `column` converted as libpqxx converts a field
    /// (pqxx::from_string).
    /// \throws std::logic_error when has_value() is false or the value is
    ///         NULL; std::out_of_range for a row or column out of range; what
    ///         libpqxx's conversion throws.
    template <class T>
    [[nodiscard]] T as(std::size_t row, int column) const {
        const std::optional<std::string_view> text = get(row, column);
        if (!text) {
            throw std::logic_error("bulkhead::statement_result: row " + std::to_string(row) + ", column " +
                                   std::to_string(column) + " is NULL");
        }
        return detail::pqxx_compat::from_text<T>(*text);
    }

private:
    friend class pqxx_transaction;

    explicit statement_result(std::shared_ptr<detail::one_trip_statement> statement) noexcept
        : m_statement(std::move(statement)) {}

    [[nodiscard]] PGresult* get() const {
        if (!has_value()) {
            throw std::logic_error(
                "bulkhead::statement_result: no value: the statement's transaction did not commit, or the result is "
                "read before the gate committed it (inside the callback)");
        }
        return m_statement->result.get();
    }

    static void check(PGresult* result, std::size_t row, int column, bool with_row) {
        if (column < 0 || column >= PQnfields(result)) {
            throw std::out_of_range("bulkhead::statement_result: column " + std::to_string(column) + " of " +
                                    std::to_string(PQnfields(result)));
        }
        if (with_row && row >= static_cast<std::size_t>(PQntuples(result))) {
            throw std::out_of_range("bulkhead::statement_result: row " + std::to_string(row) + " of " +
                                    std::to_string(PQntuples(result)));
        }
    }

    std::shared_ptr<detail::one_trip_statement> m_statement;
};

}  // namespace bulkhead
