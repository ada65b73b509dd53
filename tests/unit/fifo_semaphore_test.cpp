// fifo_semaphore: FIFO order, no overtaking, timed and cancellable waits, and
// the timeout/cancel-versus-release races, repeated thousands of times.
#include "test_util.hpp"

#include <bulkhead/fifo_semaphore.hpp>

#include "catch.hpp"

#include <atomic>
#include <chrono>
#include <latch>
#include <mutex>
#include <random>
#include <stop_token>
#include <thread>
#include <type_traits>
#include <vector>

using namespace std::chrono_literals;
using bulkhead::fifo_semaphore;
using bulkhead::wait_status;
using bulkhead_test::await;
using bulkhead_test::raise_max;

static_assert(!std::is_copy_constructible_v<fifo_semaphore> && !std::is_move_constructible_v<fifo_semaphore>);
static_assert(noexcept(std::declval<fifo_semaphore&>().try_acquire()));
static_assert(noexcept(std::declval<fifo_semaphore&>().release()));

TEST_CASE("fifo_semaphore counts permits", "[semaphore]") {
    fifo_semaphore sem(2);
    CHECK(sem.available() == 2);
    CHECK(sem.try_acquire());
    CHECK(sem.try_acquire());
    CHECK_FALSE(sem.try_acquire());
    CHECK(sem.available() == 0);
    sem.release(2);
    CHECK(sem.available() == 2);
    sem.release(0);
    CHECK(sem.available() == 2);
    CHECK(sem.waiting() == 0);
}

TEST_CASE("fifo_semaphore rejects a negative or oversized count", "[semaphore]") {
    CHECK_THROWS_AS(fifo_semaphore(-1), std::invalid_argument);
    CHECK_THROWS_AS(fifo_semaphore(fifo_semaphore::max_permits + 1), std::invalid_argument);
    CHECK_NOTHROW(fifo_semaphore(0));
}

TEST_CASE("fifo_semaphore, a zero or negative wait succeeds when a permit is free", "[semaphore][timeout]") {
    fifo_semaphore sem(1);
    CHECK(sem.try_acquire_for(0ms));
    CHECK_FALSE(sem.try_acquire_for(0ms));
    CHECK_FALSE(sem.try_acquire_for(-5ms));
    sem.release();
    CHECK(sem.try_acquire_for(-5ms));
}

TEST_CASE("fifo_semaphore, a timed wait gives up after its wait, within bounds", "[semaphore][timeout]") {
    fifo_semaphore sem(0);
    const auto start = std::chrono::steady_clock::now();
    CHECK_FALSE(sem.try_acquire_for(50ms));
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(elapsed >= 50ms);
    CHECK(elapsed < 5s);
    CHECK(sem.waiting() == 0);
    CHECK(sem.available() == 0);
}

TEST_CASE("fifo_semaphore, try_acquire_until accepts any clock", "[semaphore][timeout]") {
    fifo_semaphore sem(0);
    CHECK_FALSE(sem.try_acquire_until(std::chrono::system_clock::now() + 20ms));
    CHECK(sem.try_acquire_until(std::chrono::steady_clock::now() - 1s, std::stop_token{}) == wait_status::timed_out);
    sem.release();
    CHECK(sem.try_acquire_until(std::chrono::system_clock::now() + 20ms));
}

TEST_CASE("fifo_semaphore, an enormous wait does not overflow", "[semaphore][timeout]") {
    fifo_semaphore sem(0);
    std::thread releaser;
    std::atomic<bool> got{false};
    std::thread waiter([&] { got = sem.try_acquire_for(std::chrono::hours::max()); });
    await([&] { return sem.waiting() == 1; });
    sem.release();
    waiter.join();
    CHECK(got);
}

TEST_CASE("fifo_semaphore, a stop request ends the wait with cancelled", "[semaphore][cancel]") {
    fifo_semaphore sem(0);

    SECTION("a stop already requested returns at once, even with a free permit") {
        std::stop_source source;
        source.request_stop();
        sem.release();
        CHECK(sem.try_acquire_for(1s, source.get_token()) == wait_status::cancelled);
        CHECK(sem.acquire(source.get_token()) == wait_status::cancelled);
        CHECK(sem.available() == 1);
    }
    SECTION("a stop requested while waiting wakes the waiter") {
        std::stop_source source;
        wait_status status = wait_status::acquired;
        std::thread waiter([&] { status = sem.try_acquire_for(30s, source.get_token()); });
        await([&] { return sem.waiting() == 1; });
        const auto start = std::chrono::steady_clock::now();
        source.request_stop();
        waiter.join();
        CHECK(status == wait_status::cancelled);
        CHECK(std::chrono::steady_clock::now() - start < 5s);
        CHECK(sem.waiting() == 0);
        CHECK(sem.available() == 0);
    }
    SECTION("an untimed acquire with a stop token is cancelled too") {
        std::stop_source source;
        wait_status status = wait_status::acquired;
        std::thread waiter([&] { status = sem.acquire(source.get_token()); });
        await([&] { return sem.waiting() == 1; });
        source.request_stop();
        waiter.join();
        CHECK(status == wait_status::cancelled);
    }
}

TEST_CASE("fifo_semaphore, try_acquire never overtakes a queued waiter", "[semaphore][fifo]") {
    fifo_semaphore sem(0);
    std::atomic<bool> waiter_got{false};
    std::thread waiter([&] {
        sem.acquire();
        waiter_got = true;
    });
    await([&] { return sem.waiting() == 1; });
    // While the waiter is queued, a free permit goes to it, never to try_acquire.
    sem.release();
    CHECK_FALSE(sem.try_acquire());
    CHECK(sem.available() == 0);
    waiter.join();
    CHECK(waiter_got);
    CHECK_FALSE(sem.try_acquire());
    sem.release();
    CHECK(sem.try_acquire());
}

TEST_CASE("fifo_semaphore grants permits in arrival order", "[semaphore][fifo]") {
    const int waiters = GENERATE(16, 40);
    fifo_semaphore sem(0);
    std::mutex order_mutex;
    std::vector<int> order;
    std::vector<std::thread> threads;
    for (int i = 0; i < waiters; ++i) {
        threads.emplace_back([&, i] {
            sem.acquire();
            {
                const std::lock_guard lock(order_mutex);
                order.push_back(i);
            }
            sem.release();  // passes the permit on to the next in line
        });
        // Thread i is queued before thread i + 1 starts: arrival order is known.
        await([&] { return sem.waiting() == i + 1; });
    }
    sem.release();
    for (auto& thread : threads) {
        thread.join();
    }
    std::vector<int> expected(static_cast<std::size_t>(waiters));
    for (int i = 0; i < waiters; ++i) {
        expected[static_cast<std::size_t>(i)] = i;
    }
    CHECK(order == expected);
    CHECK(sem.available() == 1);
}

TEST_CASE("fifo_semaphore, a release of n permits wakes the n oldest waiters", "[semaphore][fifo]") {
    fifo_semaphore sem(0);
    std::atomic<int> granted{0};
    std::vector<std::thread> threads;
    std::vector<std::stop_source> stops(4);
    std::vector<wait_status> outcome(4, wait_status::timed_out);
    for (std::size_t i = 0; i < 4; ++i) {
        threads.emplace_back([&, i] {
            outcome[i] = sem.acquire(stops[i].get_token());
            if (outcome[i] == wait_status::acquired) {
                ++granted;
            }
        });
        await([&] { return sem.waiting() == static_cast<std::int64_t>(i) + 1; });
    }
    sem.release(2);
    await([&] { return granted == 2; });
    CHECK(sem.waiting() == 2);
    stops[2].request_stop();
    stops[3].request_stop();
    for (auto& thread : threads) {
        thread.join();
    }
    CHECK(outcome[0] == wait_status::acquired);
    CHECK(outcome[1] == wait_status::acquired);
    CHECK(outcome[2] == wait_status::cancelled);
    CHECK(outcome[3] == wait_status::cancelled);
    CHECK(sem.available() == 0);
}

TEST_CASE("fifo_semaphore, a timeout racing a release neither loses nor duplicates a permit",
          "[semaphore][race][timeout]") {
    std::mt19937 random(20261130);
    std::uniform_int_distribution<int> wait_us(0, 200);
    int acquired = 0;
    int timed_out = 0;
    for (int round = 0; round < 5000; ++round) {
        fifo_semaphore sem(0);
        std::latch start(2);
        bool got = false;
        const auto wait = std::chrono::microseconds(wait_us(random));
        std::thread waiter([&] {
            start.arrive_and_wait();
            got = sem.try_acquire_for(wait);
        });
        start.arrive_and_wait();
        sem.release();
        waiter.join();
        // Exactly one party owns the permit: the waiter or the semaphore.
        REQUIRE(sem.waiting() == 0);
        REQUIRE(sem.available() == (got ? 0 : 1));
        (got ? acquired : timed_out) += 1;
    }
    INFO("acquired " << acquired << ", timed out " << timed_out);
    CHECK(acquired + timed_out == 5000);
}

TEST_CASE("fifo_semaphore, a cancellation racing a release neither loses nor duplicates a permit",
          "[semaphore][race][cancel]") {
    int acquired = 0;
    int cancelled = 0;
    for (int round = 0; round < 5000; ++round) {
        fifo_semaphore sem(0);
        std::stop_source source;
        std::latch start(3);
        wait_status status = wait_status::timed_out;
        std::thread waiter([&] {
            start.arrive_and_wait();
            status = sem.try_acquire_for(10s, source.get_token());
        });
        std::thread canceller([&] {
            start.arrive_and_wait();
            source.request_stop();
        });
        start.arrive_and_wait();
        sem.release();
        waiter.join();
        canceller.join();
        REQUIRE(status != wait_status::timed_out);
        REQUIRE(sem.waiting() == 0);
        REQUIRE(sem.available() == (status == wait_status::acquired ? 0 : 1));
        (status == wait_status::acquired ? acquired : cancelled) += 1;
    }
    INFO("acquired " << acquired << ", cancelled " << cancelled);
    CHECK(acquired + cancelled == 5000);
}

TEST_CASE("fifo_semaphore, many threads never hold more than the permits", "[semaphore][stress]") {
    const int permits = GENERATE(1, 3);
    fifo_semaphore sem(permits);
    std::atomic<int> holding{0};
    std::atomic<int> most{0};
    std::atomic<int> gave_up{0};
    std::vector<std::thread> threads;
    threads.reserve(16);
    for (int t = 0; t < 16; ++t) {
        threads.emplace_back([&, t] {
            std::stop_source source;
            for (int i = 0; i < 2000; ++i) {
                bool got = false;
                switch ((i + t) % 4) {
                    case 0:
                        got = sem.try_acquire();
                        break;
                    case 1:
                        got = sem.try_acquire_for(std::chrono::microseconds(50));
                        break;
                    case 2:
                        got = sem.try_acquire_for(1s, source.get_token()) == wait_status::acquired;
                        break;
                    default:
                        sem.acquire();
                        got = true;
                        break;
                }
                if (!got) {
                    ++gave_up;
                    continue;
                }
                raise_max(most, ++holding);
                --holding;
                sem.release();
            }
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    CHECK(most.load() <= permits);
    CHECK(sem.available() == permits);
    CHECK(sem.waiting() == 0);
}
