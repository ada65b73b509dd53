// docs/async.md's snippet (see snippet_readme.cpp).
#include <asio/awaitable.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <bulkhead/asio.hpp>
#include <bulkhead/pqxx_pool.hpp>

using namespace std::chrono_literals;  // snippet-context
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

asio::awaitable<void> handle(gate_t& gate) {
    const gate_t::options options{.queue_wait = 20ms};
    const auto count_orders = [](pqxx::dbtransaction& tx) {
        return tx.exec("SELECT count(*) FROM orders").at(0).at(0).as<int>();
    };
    // Throws std::system_error on a rejection (e.code() == bulkhead::reject_reason::admission_full, ...).
    int n = co_await gate.async_transaction(options, count_orders, asio::use_awaitable);

    // Non-throwing: the error code goes to `ec` (asio::as_tuple, Asio 1.24 and later, or
    // asio::experimental::as_tuple before, give it with the value instead).
    std::error_code ec;
    const int m = co_await gate.async_transaction(options, count_orders, asio::redirect_error(asio::use_awaitable, ec));
    if (bulkhead::is_rejection(ec)) { /* 503, Retry-After: safe to retry */ }
    (void)n;  // snippet-context
    (void)m;  // snippet-context
}
