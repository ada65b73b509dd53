// The coroutine snippet of README.md (see snippet_readme.cpp).
#include "snippet_stubs.hpp"

using namespace std::chrono_literals;  // snippet-context
using namespace snippet;               // snippet-context

#include <asio/awaitable.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <bulkhead/asio.hpp>   // target bulkhead::asio (standalone Asio, libasio-dev)

asio::awaitable<void> count_orders(bulkhead::db_bulkhead<bulkhead::pqxx_pool>& gate) {
    const bulkhead::db_bulkhead<bulkhead::pqxx_pool>::options options{.queue_wait = 20ms};
    const auto count = [](pqxx::dbtransaction& tx) {
        return tx.exec("SELECT count(*) FROM orders").at(0).at(0).as<long>();
    };  // named, not temporaries in the co_await: g++ 12 destroys those twice (docs/async.md)
    std::error_code ec;    // a rejection arrives here instead of as an exception
    const long n = co_await gate.async_transaction(options, count, asio::redirect_error(asio::use_awaitable, ec));
    if (bulkhead::is_rejection(ec)) {
        co_return reply_503(ec.message());   // the work never started
    }
    reply_200(n);
}
