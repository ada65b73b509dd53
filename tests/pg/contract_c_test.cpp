// Contract section C: timeouts, cancellation and the pool, against a real PostgreSQL.
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"

#include "catch.hpp"

#include <future>
#include <latch>
#include <random>
#include <stop_token>
#include <thread>
#include <vector>

using namespace bulkhead_test;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

namespace {

int backend_pid(gate_t& gate) {
    return gate.transaction(
        1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT pg_backend_pid()")[0].as<int>(); });
}

}  // namespace

TEST_CASE("[C1] a server-side statement timeout fails with 57014, rolls back and the pool recovers", "[pg][C1]") {
    scratch_table table("bulkhead_c1", "id int");
    bulkhead::pqxx_pool pool(pool_options("bulkhead-c1", 1));
    gate_t gate(pool, 1, 0);
    const auto start = std::chrono::steady_clock::now();
    const auto state = sqlstate_of([&] {
        gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
            exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1)");
            exec_no_rows(tx, "SET LOCAL statement_timeout = '100ms'");
            tx.exec("SELECT pg_sleep(2)");
        });
    });
    CHECK(state == "57014");
    CHECK(std::chrono::steady_clock::now() - start < 1500ms);  // cut by the server, not after 2 s
    CHECK(table.rows() == 0);
    CHECK(gate.available() == 1);
    CHECK(gate.available_slots() == 1);
    // The same pool (one connection) serves the next call.
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 1")[0].as<int>(); }) == 1);
    CHECK(pool.in_use() == 0);
}

TEST_CASE("[C2] a lock timeout fails with 55P03, rolls back and the pool recovers", "[pg][C2]") {
    scratch_table table("bulkhead_c2", "id int PRIMARY KEY, v int");
    {
        auto setup = outside_connection();
        pqxx::work tx(setup);
        exec_no_rows(tx, "INSERT INTO " + table.name() + " VALUES (1, 0)");
        tx.commit();
    }
    bulkhead::pqxx_pool pool(pool_options("bulkhead-c2", 1));
    gate_t gate(pool, 1, 0);
    auto locker = outside_connection();
    {
        pqxx::work lock_tx(locker);
        exec_one_row(lock_tx, "SELECT v FROM " + table.name() + " WHERE id = 1 FOR UPDATE");
        const auto state = sqlstate_of([&] {
            gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
                exec_no_rows(tx, "SET LOCAL lock_timeout = '100ms'");
                exec_no_rows(tx, "UPDATE " + table.name() + " SET v = 1 WHERE id = 1");
            });
        });
        CHECK(state == "55P03");
        CHECK(gate.available() == 1);
        lock_tx.abort();
    }
    gate.transaction(
        1s, [&](pqxx::dbtransaction& tx) { exec_no_rows(tx, "UPDATE " + table.name() + " SET v = 2 WHERE id = 1"); });
    CHECK(table.rows("v = 2") == 1);
    CHECK(pool.in_use() == 0);
}

TEST_CASE("[C3] a caller that stops waiting for the result does not free the permits", "[pg][C3]") {
    bulkhead::pqxx_pool pool(pool_options("bulkhead-c3"));
    gate_t gate(pool, 1, 0);
    std::latch running(1);
    std::promise<void> finish;
    auto finish_signal = finish.get_future().share();
    auto result = std::async(std::launch::async, [&] {
        return gate.transaction(1s, [&](pqxx::dbtransaction& tx) {
            running.count_down();
            finish_signal.wait();
            return exec_one_row(tx, "SELECT 3")[0].as<int>();
        });
    });
    running.wait();
    CHECK(result.wait_for(50ms) == std::future_status::timeout);  // the caller gives up waiting
    CHECK(gate.available() == 0);                                 // the work still owns the permit
    CHECK_THROWS_AS(gate.transaction(0ms, [](pqxx::dbtransaction&) {}), bulkhead::admission_full);
    finish.set_value();
    CHECK(result.get() == 3);
    CHECK(gate.available() == 1);
}

TEST_CASE("[C4] pool exhaustion by callers outside the gate ends in pool_timeout after the connection timeout",
          "[pg][C4]") {
    auto options = pool_options("bulkhead-c4", 2);
    options.connection_timeout = 300ms;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 2, 0);
    {
        auto first = pool.acquire();   // outside the gate
        auto second = pool.acquire();  // the pool is now empty
        const auto start = std::chrono::steady_clock::now();
        CHECK_THROWS_AS(gate.transaction(1s, [](pqxx::dbtransaction&) {}), bulkhead::pool_timeout);
        const auto elapsed = std::chrono::steady_clock::now() - start;
        CHECK(elapsed >= 300ms);
        CHECK(elapsed < 3s);
        try {
            gate.transaction(1s, [](pqxx::dbtransaction&) {});
        } catch (const bulkhead::rejected& rejection) {  // a rejection: the work never started
            CHECK(rejection.reason() == bulkhead::reject_reason::pool_timeout);
        }
        CHECK(gate.available() == 2);  // the permits came back
        CHECK(gate.available_slots() == 2);
    }
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 4")[0].as<int>(); }) == 4);
}

TEST_CASE("[C5] connection and validation timeouts under 250 ms are refused", "[pg][C5]") {
    auto options = pool_options("bulkhead-c5");
    options.connection_timeout = 249ms;
    CHECK_THROWS_AS(bulkhead::pqxx_pool(options), std::invalid_argument);
    CHECK_THROWS_WITH(bulkhead::pqxx_pool(options), Catch::Matchers::ContainsSubstring("connection_timeout"));
    options = pool_options("bulkhead-c5");
    options.validation_timeout = 100ms;
    CHECK_THROWS_AS(bulkhead::pqxx_pool(options), std::invalid_argument);
    CHECK_THROWS_WITH(bulkhead::pqxx_pool(options), Catch::Matchers::ContainsSubstring("validation_timeout"));
    options = pool_options("bulkhead-c5");
    options.connection_timeout = 250ms;
    options.validation_timeout = 250ms;
    CHECK_NOTHROW(bulkhead::pqxx_pool(options));
}

TEST_CASE("[C6] a short queue wait does not shorten the pool wait unless a deadline says so", "[pg][C6]") {
    auto options = pool_options("bulkhead-c6", 1);
    options.connection_timeout = 400ms;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    auto held = pool.acquire();  // outside the gate: the pool is empty

    auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(gate.transaction(1ms, [](pqxx::dbtransaction&) {}), bulkhead::pool_timeout);
    auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(elapsed >= 400ms);  // the pool's budget, not the 1 ms queue wait
    CHECK(elapsed < 3s);

    start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(gate.transaction({.queue_wait = 1ms, .deadline = start + 100ms}, [](pqxx::dbtransaction&) {}),
                    bulkhead::deadline_exceeded);
    elapsed = std::chrono::steady_clock::now() - start;
    CHECK(elapsed >= 100ms);
    CHECK(elapsed < 350ms);  // the deadline cut the pool wait short
    CHECK(gate.available() == 1);
}

// [direct]: terminates the pool connection's backend by its pid; through PgBouncer there is no backend of the
// pool's own to kill; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE("[C7] an idle connection killed on the server is found out on borrow and replaced without an error",
          "[pg][C7][direct]") {
    auto options = pool_options("bulkhead-c7", 1);
    options.validate_after_idle = 0ms;  // validate every borrow
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    const int first_pid = backend_pid(gate);
    CHECK(pool.idle() == 1);
    terminate_backend(monitor, first_pid);
    int second_pid = 0;
    CHECK_NOTHROW(second_pid = backend_pid(gate));
    CHECK(second_pid != first_pid);
    CHECK(pool.size() == 1);
    CHECK(sessions(monitor, "bulkhead-c7") == 1);
}

// [direct]: terminates the pool connection's backend by its pid; through PgBouncer there is no backend of the
// pool's own to kill; left out of the pgbouncer pass (docs/pgbouncer.md).
TEST_CASE("[C7] with the default validation, a connection killed while idle is replaced without an error",
          "[pg][C7][direct]") {
    auto options = pool_options("bulkhead-c7b", 1);
    options.validate_after_idle = 50ms;
    bulkhead::pqxx_pool pool(options);
    gate_t gate(pool, 1, 0);
    auto monitor = outside_connection();
    const int first_pid = backend_pid(gate);
    terminate_backend(monitor, first_pid);
    std::this_thread::sleep_for(80ms);  // idle longer than validate_after_idle: this is the condition under test
    int second_pid = 0;
    CHECK_NOTHROW(second_pid = backend_pid(gate));
    CHECK(second_pid != first_pid);
}

TEST_CASE("[C8] with the server down acquiring fails clearly without the password, the pool recovers", "[pg][C8]") {
    private_cluster cluster;
    const std::string conninfo = cluster.conninfo();
    const auto password_at = conninfo.find("password=");
    REQUIRE(password_at != std::string::npos);
    std::string password = conninfo.substr(password_at + 9);
    password = password.substr(0, password.find(' '));
    REQUIRE(password.size() >= 8);

    bulkhead::pqxx_pool pool({.conninfo = conninfo,
                              .max_size = 2,
                              .connection_timeout = 500ms,
                              .validation_timeout = 250ms,
                              .validate_after_idle = 0ms,
                              .application_name = "bulkhead-c8"});
    gate_t gate(pool, 2, 0);
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 8")[0].as<int>(); }) == 8);

    cluster.stop_server();
    std::string message;
    try {
        gate.transaction(1s, [](pqxx::dbtransaction& tx) { exec_one_row(tx, "SELECT 1"); });
    } catch (const bulkhead::pool_timeout& failure) {
        message = failure.what();
    }
    INFO(message);
    CHECK_FALSE(message.empty());  // a pool_timeout, not some other error
    CHECK(message.find(password) == std::string::npos);
    CHECK(message.find("password=") == std::string::npos);
    CHECK(gate.available() == 2);

    cluster.start_server();
    int value = 0;
    CHECK_NOTHROW(value = gate.transaction(
                      1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 9")[0].as<int>(); }));
    CHECK(value == 9);
    CHECK(pool.in_use() == 0);
}

TEST_CASE("[C9] after 1,000 calls failing in every way, mixed, the gate and the pool are back to full",
          "[pg][C9][stress]") {
    scratch_table parent("bulkhead_c9_parent", "id int PRIMARY KEY");
    scratch_table child("bulkhead_c9_child", "id serial PRIMARY KEY, parent int REFERENCES " + parent.name() +
                                                 "(id) DEFERRABLE INITIALLY DEFERRED");
    auto options = pool_options("bulkhead-c9", 3);
    options.connection_timeout = 250ms;
    bulkhead::pqxx_pool pool(options);
    constexpr int concurrent = 3;
    constexpr int extra = 2;
    bulkhead::db_bulkhead<bulkhead::pqxx_pool, counting_observer> gate(pool, concurrent, extra);
    std::atomic<int> calls{0};
    std::atomic<int> succeeded{0};
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    threads.reserve(8);
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&, t] {
            std::mt19937 random(static_cast<unsigned>(t) + 9U);
            for (int i = 0; i < 125; ++i) {
                const int kind = static_cast<int>(random() % 8);
                std::stop_source source;
                if (kind == 6) {
                    source.request_stop();
                }
                try {
                    (void)gate.transaction(
                        {.queue_wait = std::chrono::milliseconds(random() % 5), .stop = source.get_token()},
                        [&](pqxx::dbtransaction& tx) {
                            switch (kind) {
                                case 0:
                                    throw std::runtime_error("callback failure");
                                case 1:
                                    exec_one_row(tx, "SELECT 1/0");
                                    break;
                                case 2:
                                    exec_no_rows(tx, "SET LOCAL statement_timeout = '5ms'");
                                    tx.exec("SELECT pg_sleep(0.05)");
                                    break;
                                case 3:
                                    exec_no_rows(tx, "INSERT INTO " + child.name() + "(parent) VALUES (-1)");
                                    break;
                                case 4:
                                    tx.commit();
                                    break;
                                case 5:
                                    exec_no_rows(tx, "SELEKT");
                                    break;
                                default:
                                    exec_one_row(tx, "SELECT 1");
                                    break;
                            }
                            return kind;
                        });
                    ++succeeded;
                } catch (...) {
                    ++failed;
                }
                ++calls;
            }
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    CHECK(calls == 1000);
    CHECK(succeeded + failed == 1000);
    CHECK(failed > 500);
    CHECK(gate.available() == concurrent);
    CHECK(gate.available_slots() == concurrent + extra);
    CHECK(pool.in_use() == 0);
    CHECK(child.rows() == 0);  // every deferred violation was refused at commit
    auto monitor = outside_connection();
    CHECK(sessions(monitor, "bulkhead-c9", "idle in transaction") == 0);
    CHECK(sessions(monitor, "bulkhead-c9", "active") == 0);
    // And it still works.
    CHECK(gate.transaction(1s, [](pqxx::dbtransaction& tx) { return exec_one_row(tx, "SELECT 10")[0].as<int>(); }) ==
          10);
}

TEST_CASE("[C10] server-side concurrency through one gate never exceeds B under 64 threads", "[pg][C10][stress]") {
    constexpr int concurrent = 3;
    bulkhead::pqxx_pool pool(pool_options("bulkhead-c10", 8));
    gate_t gate(pool, concurrent, 64);
    auto monitor = outside_connection();
    std::atomic<bool> done{false};
    long most_active = 0;
    long samples = 0;
    std::thread sampler([&] {
        while (!done) {
            // Sessions of this gate's pool that are not idle (running a statement or inside a
            // transaction), counted in one snapshot.
            const long busy = scalar<long>(monitor, std::string("SELECT count(*) FROM pg_stat_activity WHERE "
                                                                "application_name = 'bulkhead-c10' AND state IN "
                                                                "('active', 'idle in transaction')") +
                                                        not_the_monitor);
            most_active = std::max(most_active, busy);
            ++samples;
        }
    });
    std::atomic<int> completed{0};
    std::vector<std::thread> threads;
    threads.reserve(64);
    for (int t = 0; t < 64; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 5; ++i) {
                auto outcome =
                    gate.try_transaction(10s, [](pqxx::dbtransaction& tx) { tx.exec("SELECT pg_sleep(0.01)"); });
                if (outcome) {
                    ++completed;
                }
            }
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    done = true;
    sampler.join();
    INFO("samples " << samples << ", most busy sessions " << most_active);
    CHECK(completed == 64 * 5);
    CHECK(most_active <= concurrent);
    CHECK(most_active >= 1);                                     // the sampler did see the gate's work
    CHECK(pool.size() <= static_cast<std::size_t>(concurrent));  // the gate never needed more connections
}
