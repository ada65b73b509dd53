// A consumer of the installed package: uses the core without any pool, and,
// when the package has bulkhead::pqxx, the pool's conninfo check (which calls
// libpq itself, so it shows that bulkhead::pqxx brings libpq along).
#include <bulkhead/bulkhead.hpp>

#if defined(BULKHEAD_CONSUMER_PQXX)
#include <bulkhead/pqxx_pool.hpp>

#include <stdexcept>
#endif

#include <iostream>

int main() {
    bulkhead::admission_counter slots(1);
    const bool first = slots.try_acquire();
    const bool second = slots.try_acquire();
    bulkhead::fifo_semaphore running(1);
    running.acquire();
    running.release();
    bool pool_ok = true;
#if defined(BULKHEAD_CONSUMER_PQXX)
    try {
        bulkhead::pqxx_pool pool({.conninfo = "host=localhost port"});
        pool_ok = false;
    } catch (const std::invalid_argument& refused) {
        std::cout << "consumer: pqxx_pool refused a malformed conninfo: " << refused.what() << '\n';
    }
#endif
    std::cout << "consumer: admitted=" << int{first} << " rejected=" << int{!second} << " version "
              << bulkhead::version_string << '\n';
    return first && !second && pool_ok ? 0 : 1;
}
