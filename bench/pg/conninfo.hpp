// bench/pg: reading and rewriting libpq connection strings.
//
// The harness connects in three ways to the same server: the measured
// connections (named by application_name so their backends can be found in
// pg_stat_activity), a monitoring connection (in another database, so its own
// transactions do not count), and connections through the round-trip counter
// (host and port replaced). libpq parses the string given (keyword form or
// URI); the harness edits the fields and writes a keyword string back.
// Nothing here prints a connection string: it holds a password.
#pragma once

#include <bulkhead/pqxx_pool.hpp>

#include <libpq-fe.h>

#include <map>
#include <stdexcept>
#include <string>

namespace bulkhead_bench {

/// The fields of a connection string that are set, by keyword.
using conninfo_fields = std::map<std::string, std::string>;

/// The fields of `conninfo` (a libpq keyword string or URI).
/// \throws std::invalid_argument when libpq cannot parse it (the message does
///         not repeat the string).
inline conninfo_fields parse_conninfo(const std::string& conninfo) {
    char* error = nullptr;
    PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
    if (options == nullptr) {
        PQfreemem(error);
        throw std::invalid_argument("bulkhead_pg_bench: libpq cannot parse the connection string");
    }
    conninfo_fields fields;
    for (const PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
        if (option->val != nullptr && option->val[0] != '\0') {
            fields[option->keyword] = option->val;
        }
    }
    PQconninfoFree(options);
    return fields;
}

/// A keyword string with every field quoted the way libpq reads it (by the
/// pool's own quoting).
inline std::string format_conninfo(const conninfo_fields& fields) {
    std::string text;
    for (const auto& [keyword, value] : fields) {
        if (!text.empty()) {
            text += ' ';
        }
        text.append(keyword).append("=").append(bulkhead::detail::quote_keyword_value(value));
    }
    return text;
}

/// `conninfo` with `keyword` set to `value` (or removed, for an empty value).
inline std::string with_field(const std::string& conninfo, const std::string& keyword, const std::string& value) {
    conninfo_fields fields = parse_conninfo(conninfo);
    if (value.empty()) {
        fields.erase(keyword);
    } else {
        fields[keyword] = value;
    }
    return format_conninfo(fields);
}

}  // namespace bulkhead_bench
