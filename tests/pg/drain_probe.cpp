// A program that destroys a gate or a pool with work still inside, for the
// [K5] test in drain_test.cpp: `drain_probe gate` destroys a gate while a
// permit of it is held; `drain_probe pool CONNINFO` destroys a pool while a
// thread waits in acquire(). Either must end the process with a message on
// stderr naming what was destroyed, not go on into freed memory. Prints
// "survived" if it does go on.
#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>

namespace {

int run(const std::string& mode, const std::string& conninfo) {
    using namespace std::chrono_literals;
    std::optional<bulkhead::pqxx_pool> pool;
    pool.emplace(bulkhead::pqxx_pool_options{.conninfo = conninfo, .max_size = 1, .connection_timeout = 30s});
    if (mode == "gate") {
        std::optional<bulkhead::db_bulkhead<bulkhead::pqxx_pool>> gate;
        gate.emplace(*pool, 1, 0);
        bulkhead::permit held = gate->enter();
        gate.reset();
    } else if (mode == "pool") {
        bulkhead::pqxx_pool::lease held = pool->acquire();
        std::thread waiter([&] {
            try {
                (void)pool->acquire();
            } catch (...) {
                std::puts("waiter ended");
            }
        });
        while (pool->stats().waiting == 0) {
            std::this_thread::yield();
        }
        pool.reset();
        waiter.join();
    } else {
        std::fputs("usage: drain_probe gate | pool CONNINFO\n", stderr);
        return 2;
    }
    std::puts("survived");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc > 1 ? argv[1] : "", argc > 2 ? argv[2] : "");
    } catch (const std::exception& failure) {
        std::printf("failed: %s\n", failure.what());
        return 1;
    }
}
