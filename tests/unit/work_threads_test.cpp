// detail::work_threads, the B threads behind the asynchronous front end
// (asio.hpp): which queued job wakes a thread.
#include <bulkhead/detail/work_threads.hpp>

#include "catch.hpp"
#include "test_util.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <utility>

namespace {

using namespace std::chrono_literals;
using bulkhead::detail::work_job;
using bulkhead::detail::work_threads;

/// A job that runs a function.
struct function_job : work_job {
    explicit function_job(std::function<void()> body) : work_job(&run), m_body(std::move(body)) {}
    static void run(work_job& job) noexcept { static_cast<function_job&>(job).m_body(); }
    std::function<void()> m_body;
};

}  // namespace

TEST_CASE("work threads: two jobs queued by a work thread in one run run at once, the second on a woken thread",
          "[work_threads][async]") {
    // A worker that queues a job takes it itself when it comes back (no
    // wake); the async gate does that when a finishing call grants its
    // permit to the next waiter. An adaptive limit that grew in the same
    // moment grants a second permit there: that job must wake an idle
    // thread, or both wait for the one worker and the calls run one at a
    // time whatever the limit.
    work_threads threads(2);
    threads.start();
    std::atomic<int> running{0};
    std::atomic<int> together{0};  // jobs that saw the other one running beside them
    std::atomic<int> finished{0};
    const auto meet = [&] {
        running.fetch_add(1);
        // Waits for the other job; a bound, not an order: alone, it gives up.
        if (bulkhead_test::eventually([&] { return running.load() == 2; }, 5s)) {
            together.fetch_add(1);
        }
        finished.fetch_add(1);
        (void)bulkhead_test::eventually([&] { return finished.load() == 2; }, 10s);  // leave together
        running.fetch_sub(1);
    };
    function_job second(meet);
    function_job third(meet);
    std::atomic<bool> queued_on_work_thread{false};
    function_job first([&] {
        queued_on_work_thread = threads.on_work_thread();
        threads.push(second);
        threads.push(third);
    });
    // Both threads parked first: one is woken for `first`, the other only if
    // a wake reaches it (a thread still starting would find the jobs itself).
    REQUIRE(bulkhead_test::eventually([&] { return threads.idle() == 2; }, 10s));
    threads.push(first);
    REQUIRE(bulkhead_test::eventually([&] { return finished.load() == 2 && running.load() == 0; }, 30s));
    CHECK(queued_on_work_thread.load());
    CHECK(together.load() == 2);
    // Both threads go back to waiting: nothing runs when the jobs go away.
    REQUIRE(bulkhead_test::eventually([&] { return threads.idle() == 2; }, 10s));
}
