// snippet_stubs.hpp: what the documentation's C++ snippets take as given
// (a request, the replies, the caller's work), declared so that the
// snippets compile as they are shown (tests/docs/check_snippets.py).
#pragma once

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <chrono>
#include <stop_token>
#include <string>
#include <string_view>

namespace snippet {

/// An incoming request with its own stop token.
struct http_request {
    [[nodiscard]] std::stop_token stop_token() const { return {}; }
};

/// An order to insert.
struct order_t {
    std::string item;
};

inline void reply_200(long /*value*/) {}
inline void reply_201(int /*id*/) {}
inline void reply_503(std::string_view /*why*/) {}
inline void reply_503(std::string_view /*why*/, std::chrono::seconds /*retry_after*/) {}
inline void reply_504() {}
inline void reply(int /*status*/, std::string_view /*body*/) {}
inline void reply_500_check_with_idempotency_key() {}
inline int insert_order(pqxx::dbtransaction& tx, const order_t& order) {
    return tx.exec("INSERT INTO orders(item) VALUES (" + tx.quote(order.item) + ") RETURNING id").at(0).at(0).as<int>();
}
/// A connection string, a host name, a stop token: what a service has.
inline const std::string url = "host=db dbname=shop user=app";
inline const std::string host_name = "web-3";
inline const std::stop_token token{};
/// A workload plan built into the program.
inline const bulkhead::workload_plan built_in_plan{{{.name = "interactive", .reserved = 4, .queue = 32}}};

inline void nightly_rollup(pqxx::dbtransaction& tx) { tx.exec("SELECT 1"); }
inline void work(pqxx::dbtransaction& tx) { tx.exec("SELECT 1"); }

}  // namespace snippet
