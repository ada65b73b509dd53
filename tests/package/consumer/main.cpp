// A consumer of the installed package: uses the core without any pool.
#include <bulkhead/bulkhead.hpp>

#include <iostream>

int main() {
    bulkhead::admission_counter slots(1);
    const bool first = slots.try_acquire();
    const bool second = slots.try_acquire();
    bulkhead::fifo_semaphore running(1);
    running.acquire();
    running.release();
    std::cout << "consumer: admitted=" << int{first} << " rejected=" << int{!second} << " version "
              << bulkhead::version_string << '\n';
    return first && !second ? 0 : 1;
}
