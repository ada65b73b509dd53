// Small helpers shared by the unit and [pg] tests.
#pragma once

#include "catch.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

namespace bulkhead_test {

/// Sets an environment variable for one scope and restores it after.
class scoped_env {
public:
    scoped_env(const char* name, const char* value) : m_name(name) {
        if (const char* before = std::getenv(name)) {  // NOLINT(concurrency-mt-unsafe): no other thread runs
            m_before = before;
        }
        set(value);
    }
    scoped_env(const scoped_env&) = delete;
    scoped_env& operator=(const scoped_env&) = delete;
    ~scoped_env() { set(m_before ? m_before->c_str() : nullptr); }

    /// Sets the variable to `value`, or unsets it for null.
    void set(const char* value) const {
        if (value == nullptr) {
            ::unsetenv(m_name);  // NOLINT(concurrency-mt-unsafe): no other thread runs
        } else {
            ::setenv(m_name, value, 1);  // NOLINT(concurrency-mt-unsafe): no other thread runs
        }
    }

private:
    const char* m_name;
    std::optional<std::string> m_before;
};

/// The message of the `Exception` thrown by `call`; "(no exception)" when it
/// returned (any other exception propagates).
template <class Exception, class Call>
std::string message_of(Call&& call) {
    try {
        call();
    } catch (const Exception& failure) {
        return failure.what();
    }
    return "(no exception)";
}

/// Spins (yielding) until `done()` holds, for ordering threads by an observable
/// state instead of a sleep; fails the test after 10 s.
template <class Predicate>
void await(Predicate done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
        REQUIRE(std::chrono::steady_clock::now() < give_up);
        std::this_thread::yield();
    }
}

/// Spins (yielding) until `done()` holds, for use off the test's main thread
/// (Catch2's assertions are not thread-safe): true when it held within
/// `limit` (10 s unless given).
template <class Predicate>
[[nodiscard]] bool eventually(Predicate done, std::chrono::steady_clock::duration limit = std::chrono::seconds(10)) {
    const auto give_up = std::chrono::steady_clock::now() + limit;
    while (!done()) {
        if (std::chrono::steady_clock::now() >= give_up) {
            return false;
        }
        std::this_thread::yield();
    }
    return true;
}

/// The [G8] early-refusal tests' timing, for threads (tests/unit) and
/// coroutines (tests/async) alike: the gate learns a permit hold of `hold`,
/// a call whose deadline is `deadline` away is refused, and the refusal must
/// come within `bound`, or it may have waited its deadline out. The margins
/// cover an exception thrown under a sanitizer on a slow machine, and a
/// coroutine's completion on Asio's system thread pool, started by that
/// very call, with both cores busy (the coroutine refusal took 42.8 ms
/// under a sanitizer, 124 ms in CI beside the Debian 13 root's
/// preparation, against bounds of 25 and 120 ms).
namespace early_refusal {
inline constexpr std::chrono::milliseconds hold{1000};
inline constexpr std::chrono::milliseconds deadline{500};
inline constexpr std::chrono::milliseconds bound{400};
}  // namespace early_refusal

/// Raises `most` to `value` if it is larger (a lock-free running maximum).
template <class T>
void raise_max(std::atomic<T>& most, T value) noexcept {
    T seen = most.load();
    while (value > seen && !most.compare_exchange_weak(seen, value)) {
    }
}

}  // namespace bulkhead_test
