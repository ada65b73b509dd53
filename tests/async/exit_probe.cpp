// A program for the [F2] exit test (tests/async/CMakeLists.txt): a coroutine
// queued for a permit is cancelled while the process's queue-wait timer
// thread is held busy, so that its timer's cancelled handler, which holds
// the operation's last reference, is still waiting to run when main
// returns. The timer thread's teardown must run it, and free the operation,
// rather than drop it. The operations are allocated through the handler's
// allocator, which counts them; an exit handler registered before the timer
// thread existed (so it runs after that thread's teardown) prints how many
// are still allocated. Prints "operations alive at exit: 0" when none leaked.
#include "asio_support.hpp"
#include "fake_pool.hpp"
#include "gate_blocker.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <latch>
#include <memory>
#include <system_error>
#include <thread>

namespace {

std::atomic<int> alive{0};

/// Counts what the operation allocates with it.
template <class T>
struct counting_allocator {
    using value_type = T;
    counting_allocator() = default;
    template <class U>
    explicit counting_allocator(const counting_allocator<U>& /*other*/) noexcept {}
    T* allocate(std::size_t n) {
        alive.fetch_add(1);
        return std::allocator<T>().allocate(n);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        alive.fetch_sub(1);
        std::allocator<T>().deallocate(p, n);
    }
    template <class U>
    bool operator==(const counting_allocator<U>& /*other*/) const noexcept {
        return true;
    }
};

/// The completion: records the code, on `io`, with the counting allocator
/// and the cancellation slot of `signal`.
struct completion {
    asio::io_context* io;
    asio::cancellation_signal* signal;
    std::error_code* code;

    using executor_type = asio::io_context::executor_type;
    using allocator_type = counting_allocator<void>;
    using cancellation_slot_type = asio::cancellation_slot;
    [[nodiscard]] executor_type get_executor() const noexcept { return io->get_executor(); }
    [[nodiscard]] allocator_type get_allocator() const noexcept { return {}; }
    [[nodiscard]] cancellation_slot_type get_cancellation_slot() const noexcept { return signal->slot(); }
    void operator()(std::error_code error, int /*value*/) const { *code = error; }
};

void report() {
    std::printf("operations alive at exit: %d\n", alive.load());
    (void)std::fflush(stdout);
}

}  // namespace

namespace {

void run() {
    using namespace std::chrono_literals;
    using gate_t = bulkhead::db_bulkhead<bulkhead_test::fake_pool>;

    bulkhead_test::fake_pool pool;
    gate_t gate(pool, 1, 1);
    bulkhead_test::blocker<gate_t> busy(gate);  // holds the one permit
    asio::io_context io;
    asio::cancellation_signal signal;
    std::error_code code;
    gate.async_transaction(
        {.queue_wait = 10s}, [](bulkhead_test::fake_pool::work&) { return 1; }, completion{&io, &signal, &code});

    // The timer thread is held busy until it is stopped at exit.
    asio::io_context& clock = bulkhead::detail::queue_wait_clock();
    std::latch holding(1);
    asio::post(clock, [&clock, &holding] {
        holding.count_down();
        while (!clock.stopped()) {
            std::this_thread::sleep_for(1ms);
        }
    });
    holding.wait();

    signal.emit(asio::cancellation_type::terminal);  // its timer's cancelled handler queues behind the holder
    io.run();                                        // the completion runs
    std::printf("completed: %s\n", code.message().c_str());
    busy.go();
}

}  // namespace

int main() {
    (void)std::atexit(report);  // before the timer thread's object exists: runs after its teardown
    try {
        run();
    } catch (const std::exception& failure) {
        std::printf("failed: %s\n", failure.what());
        return 1;
    }
    return 0;
}
