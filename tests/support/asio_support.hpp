// Helpers for the coroutine-caller tests: an io_context on a thread of its
// own, and the Asio names that moved between 1.22 (Debian 12) and 1.30
// (Debian 13).
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/version.hpp>

#if ASIO_VERSION >= 102400
#include <asio/as_tuple.hpp>
#include <asio/deferred.hpp>
#else
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/deferred.hpp>
#endif
#include <asio/experimental/awaitable_operators.hpp>

#include <optional>
#include <thread>

namespace bulkhead_test {

#if ASIO_VERSION >= 102400
using asio::as_tuple;
inline constexpr auto deferred = asio::deferred;
#else
using asio::experimental::as_tuple;
inline constexpr auto deferred = asio::experimental::deferred;
#endif

/// An io_context run by one thread of its own until destroyed.
class io_thread {
public:
    io_thread() : m_thread([this] { m_context.run(); }) {}
    io_thread(const io_thread&) = delete;
    io_thread& operator=(const io_thread&) = delete;
    ~io_thread() { stop(); }

    [[nodiscard]] asio::io_context& context() noexcept { return m_context; }
    [[nodiscard]] asio::io_context::executor_type executor() noexcept { return m_context.get_executor(); }
    [[nodiscard]] std::thread::id id() const noexcept { return m_thread.get_id(); }

    /// Lets run() return once nothing is left to do, and joins the thread.
    void stop() {
        if (m_thread.joinable()) {
            m_guard.reset();
            m_thread.join();
        }
    }

private:
    asio::io_context m_context{1};
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> m_guard{m_context.get_executor()};
    std::thread m_thread;
};

}  // namespace bulkhead_test
