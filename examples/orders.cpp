// Real use: several worker threads write orders through one gate.
//
// A small schema, 8 workers, a gate of B = 2 with Q = 2 over a pool of 4
// connections, a 5 ms queue wait. Some calls are refused under this load; each
// refusal is counted, nothing it carried reached the database. At the end the
// table holds exactly the orders that were committed, and the gate is idle.
//
//   DB_URL='host=... dbname=... user=...' build/release/examples/orders
#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

int main() {
    const char* url = std::getenv("DB_URL");  // NOLINT(concurrency-mt-unsafe): before any thread starts
    if (url == nullptr) {
        std::cerr << "orders: set DB_URL to a libpq connection string\n";
        return 2;
    }
    try {
        bulkhead::pqxx_pool pool({.conninfo = url, .max_size = 4, .application_name = "bulkhead-orders"});
        bulkhead::db_bulkhead gate(pool, /*concurrent=*/2, /*extra_slots=*/2);

        gate.transaction(1s, [](pqxx::dbtransaction& tx) {
            tx.exec(
                "CREATE TABLE IF NOT EXISTS bulkhead_orders ("
                " id bigserial PRIMARY KEY, worker int NOT NULL, item text NOT NULL,"
                " quantity int NOT NULL CHECK (quantity > 0), created timestamptz NOT NULL DEFAULT now())");
            tx.exec("TRUNCATE bulkhead_orders");
        });

        constexpr int workers = 8;
        constexpr int orders_per_worker = 200;
        std::atomic<long> committed{0};
        std::atomic<long> failed{0};
        std::mutex report;                            // one failure message at a time
        std::array<std::atomic<long>, 5> rejected{};  // by bulkhead::reject_reason
        std::vector<std::jthread> threads;
        threads.reserve(workers);
        for (int worker = 0; worker < workers; ++worker) {
            threads.emplace_back([&, worker] {
                for (int n = 0; n < orders_per_worker; ++n) {
                    try {
                        auto outcome = gate.try_transaction(5ms, [&](pqxx::dbtransaction& tx) {
                            // tx.quote and exec(string) are spelled the same in libpqxx 6 and 7;
                            // a parameterised statement is not (exec_params in 6, exec(sql, pqxx::params) in 7).
                            return tx
                                .exec("INSERT INTO bulkhead_orders(worker, item, quantity) VALUES (" +
                                      std::to_string(worker) + ", " + tx.quote("item-" + std::to_string(n)) + ", " +
                                      std::to_string(1 + n % 5) + ") RETURNING id")[0][0]
                                .as<long>();
                        });
                        if (outcome) {
                            ++committed;
                        } else {
                            ++rejected[static_cast<std::size_t>(outcome.error())];
                        }
                    } catch (const std::exception& error) {
                        // The database failed the call (a restart, a lost
                        // connection): counted and reported; nothing of it was
                        // committed, unless the failure says the outcome is unknown.
                        ++failed;
                        const std::lock_guard lock(report);
                        std::cerr << "orders: a transaction failed: " << bulkhead::redact_conninfo(error.what())
                                  << '\n';
                    }
                }
            });
        }
        threads.clear();  // joins

        const long rows = gate.transaction(1s, [](pqxx::dbtransaction& tx) {
            return tx.exec("SELECT count(*) FROM bulkhead_orders")[0][0].as<long>();
        });
        long refused = 0;
        std::cout << "attempted=" << workers * orders_per_worker << " committed=" << committed << '\n';
        if (failed != 0) {
            std::cout << "failed=" << failed << '\n';
        }
        for (std::size_t reason = 0; reason < rejected.size(); ++reason) {
            refused += rejected[reason];
            if (rejected[reason] != 0) {
                std::cout << "rejected." << bulkhead::to_string(static_cast<bulkhead::reject_reason>(reason)) << '='
                          << rejected[reason] << '\n';
            }
        }
        std::cout << "rows=" << rows << " gate.available=" << gate.available()
                  << " gate.available_slots=" << gate.available_slots() << " pool.in_use=" << pool.in_use() << '\n';
        // A call that failed committed nothing, except one whose outcome was
        // unknown (bulkhead::commit_unknown): those may have.
        const bool consistent = rows >= committed && rows <= committed + failed &&
                                committed + refused + failed == long{workers} * orders_per_worker &&
                                gate.available() == 2 && gate.available_slots() == 4 && pool.in_use() == 0;
        std::cout << (consistent ? "consistent" : "INCONSISTENT") << '\n';
        return consistent ? 0 : 1;
    } catch (const std::exception& failure) {
        std::cerr << "orders: " << failure.what() << '\n';
        return 1;
    }
}
