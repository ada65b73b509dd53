// Helpers for the coroutine-caller tests: the Asio they run against, an
// io_context on a thread of its own, and the Asio names that moved between
// versions.
//
// The tests are written against `asio::`. Built with
// BULKHEAD_TEST_BOOST_ASIO (tests/async/CMakeLists.txt), the same sources
// run against Boost.Asio and bulkhead/boost_asio.hpp: `asio` is then an
// alias of boost::asio (this translation unit has no standalone Asio).
#pragma once

#ifdef BULKHEAD_TEST_BOOST_ASIO
#include <bulkhead/boost_asio.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_allocator.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/system/system_error.hpp>

namespace asio = boost::asio;
#else
#include <bulkhead/asio.hpp>

#include <asio/bind_allocator.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <asio/version.hpp>

#if ASIO_VERSION >= 102400
#include <asio/as_tuple.hpp>
#include <asio/deferred.hpp>
#else
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/deferred.hpp>
#endif
#endif

#include <optional>
#include <system_error>
#include <thread>

namespace bulkhead_test {

#if defined(BULKHEAD_TEST_BOOST_ASIO)
using asio::as_tuple;
inline constexpr auto deferred = asio::deferred;
/// What use_awaitable and use_future throw for an error.
using asio_system_error = boost::system::system_error;
#else
#if ASIO_VERSION >= 102400
using asio::as_tuple;
inline constexpr auto deferred = asio::deferred;
#else
using asio::experimental::as_tuple;
inline constexpr auto deferred = asio::experimental::deferred;
#endif
/// What use_awaitable and use_future throw for an error.
using asio_system_error = std::system_error;
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
