// pqxx_compat.hpp: the row-count-checked queries the tests run, spelled once
// for libpqxx 6.4 (Debian 12) and 7.10 (Debian 13).
//
// libpqxx 7.10 deprecates exec0, exec1, exec_params and exec_params1 in
// favour of exec(query).no_rows(), exec(query).one_row() and
// exec(query, pqxx::params{...}), none of which exists in 6.4. The tests call
// these helpers instead; each keeps the old check (exactly one row, or none)
// and throws pqxx::unexpected_rows, as exec1 and exec0 did, when it fails.
// Only the parameterised form needs the version: the rest is plain exec().
#pragma once

#include <pqxx/pqxx>

#include <string>
#include <tuple>
#include <utility>

namespace bulkhead_test {

namespace detail {
inline void expect_rows(const pqxx::result& result, pqxx::result::size_type expected, const std::string& sql) {
    if (result.size() != expected) {
        throw pqxx::unexpected_rows("expected " + std::to_string(expected) + " row(s), got " +
                                    std::to_string(result.size()) + ": " + sql);
    }
}
}  // namespace detail

/// Runs `sql`, which must return no rows (libpqxx 6's exec0).
/// \throws pqxx::unexpected_rows when it returns any; libpqxx's errors as they are.
inline void exec_no_rows(pqxx::transaction_base& tx, const std::string& sql) {
    detail::expect_rows(tx.exec(sql), 0, sql);
}

/// Runs `sql` and returns its one row (libpqxx 6's exec1).
/// \throws pqxx::unexpected_rows unless it returns exactly one; libpqxx's errors as they are.
inline pqxx::row exec_one_row(pqxx::transaction_base& tx, const std::string& sql) {
    pqxx::result result = tx.exec(sql);
    detail::expect_rows(result, 1, sql);
    return result[0];
}

/// Runs `sql` with `$1`, `$2`, ... bound to `args` and returns its one row
/// (libpqxx 6's exec_params1, libpqxx 7's exec(sql, params).one_row()).
/// \throws pqxx::unexpected_rows unless it returns exactly one; libpqxx's errors as they are.
template <class... Args>
pqxx::row exec_one_row_params(pqxx::transaction_base& tx, const std::string& sql, Args&&... args) {
#if PQXX_VERSION_MAJOR >= 7
    pqxx::result result = tx.exec(sql, pqxx::params{std::forward<Args>(args)...});
#else
    pqxx::result result = tx.exec_params(sql, std::forward<Args>(args)...);
#endif
    detail::expect_rows(result, 1, sql);
    return result[0];
}

/// A COPY into `table` through libpqxx's stream_to (the constructor of
/// libpqxx 6, stream_to::table() of 7).
inline pqxx::stream_to stream_into(pqxx::transaction_base& tx, const std::string& table) {
#if PQXX_VERSION_MAJOR >= 7
    return pqxx::stream_to::table(tx, {table});
#else
    return pqxx::stream_to(tx, table);
#endif
}

/// Writes one row of one value to `stream`.
template <class Value>
void write_one(pqxx::stream_to& stream, const Value& value) {
#if PQXX_VERSION_MAJOR >= 7
    stream.write_values(value);
#else
    stream << std::make_tuple(value);
#endif
}

}  // namespace bulkhead_test
