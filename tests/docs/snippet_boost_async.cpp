// docs/async.md's Boost.Asio snippet (see snippet_readme.cpp), built with bulkhead::boost_asio.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <bulkhead/boost_asio.hpp>   // target bulkhead::boost_asio (Boost 1.81 or newer)
#include <bulkhead/pqxx_pool.hpp>
using namespace std::chrono_literals;  // snippet-context

boost::asio::awaitable<int> count_orders_boost(bulkhead::db_bulkhead<bulkhead::pqxx_pool>& gate) {
    const bulkhead::db_bulkhead<bulkhead::pqxx_pool>::options options{.queue_wait = 20ms};
    const auto count = [](pqxx::dbtransaction& tx) { return tx.exec("SELECT count(*) FROM orders")[0][0].as<int>(); };
    try {
        co_return co_await gate.async_transaction(options, count, boost::asio::use_awaitable);
    } catch (const boost::system::system_error& e) {
        if (bulkhead::is_rejection(e.code())) { co_return -1; /* 503 */ }
        throw;
    }
}
