// bulkhead: coroutine (and any Asio completion token) callers of a gate.
//
// Including this header makes db_bulkhead::async_transaction() callable:
//
//   const gate_t::options options{.queue_wait = 20ms};
//   int n = co_await gate.async_transaction(options, work, asio::use_awaitable);
//   auto [ec, m] = co_await gate.async_transaction(options, work, as_tuple(asio::use_awaitable));
//
// Name the options and the callback, as here, rather than passing
// temporaries inside the co_await: g++ 12 destroys such temporaries twice
// (docs/async.md has the measurement).
//
// One gate, one queue. An asynchronous caller takes an admission slot
// exactly as a thread does (tried, never waited for) and queues for an
// execution permit in the same fifo_semaphore as the blocked threads, in
// the same arrival order: a fifo_semaphore::async_node in the operation's
// state, so a waiting coroutine holds no thread and its wait allocates
// nothing beyond the operation itself (allocated once, with the handler's
// associated allocator).
//
// Where the work runs. libpqxx blocks, so the callback never runs on the
// caller's thread: once the call holds its permit, the call is queued to one
// of the gate's B work threads (detail/work_threads.hpp; started on the
// gate's first asynchronous call), which takes a connection, runs BEGIN,
// the callback and COMMIT, returns the connection and releases the permit
// and the slot, exactly as transaction() does on the caller's thread. Then
// the completion is posted to the handler's associated executor (Asio's
// system_executor when the handler names none). docs/async.md draws one call.
//
// Completion. `void(std::error_code, T)`, or `void(std::error_code)` when
// the callback returns void. A rejection (the work never started) is its
// reject_reason as an error code of the bulkhead category
// (bulkhead::is_rejection(ec) is true, ec == reject_reason::admission_full
// compares); a failure of started work is a work_error (work_cancelled,
// work_deadline_exceeded, commit_unknown, work_failed), and the overload
// with a `std::exception_ptr&` receives the exception behind it: for a
// rejection the `rejected` transaction() would throw, with its retry
// delay. With
// use_awaitable an error is thrown as std::system_error, whose what() names
// the reason; as_tuple(use_awaitable) is the non-throwing form. T must be
// default-constructible: an error completes with T{}.
//
// Cancellation (Asio per-operation cancellation, any type, and
// options::stop). While the call waits for its permit, it leaves the queue
// and completes with admission_cancelled, giving back its slot; a permit
// granted at that very moment wins and the call goes on (to be stopped
// before the pool is touched, with admission_cancelled too). While the work
// runs, the server is asked to cancel the statement in progress (the pool's
// cancel(), which never blocks the cancelling thread for long); the permits
// stay held until the rollback and the connection's return are done, and
// the call completes with work_cancelled. options::deadline and queue_wait
// bound the wait as in the blocking API (a steady_timer while queued, on one
// timer thread shared by the process: the handler's executor may belong to
// no event loop). The gate's close(), at its deadline, stops a call the same
// way (its stop is forwarded to the operation's). Nothing frees the permits
// early: the operation
// owns the handler, so the awaiting coroutine lives until the work has
// unwound, and a caller that lost interest (a destroyed future, the losing
// side of an awaitable `||`) does not shorten the work.
//
// Which Asio. This header uses standalone Asio (libasio-dev: 1.22 in
// Debian 12, 1.30 in Debian 13; CMake target bulkhead::asio);
// bulkhead/boost_asio.hpp is the same code over Boost.Asio (Boost 1.81 or
// newer; target bulkhead::boost_asio). A program uses one of them: the two
// cannot both be included in one translation unit (an #error says so), and
// translation units of one program must not mix them (both define
// detail::async_frontend, which db_bulkhead::async_transaction() calls).
//
// Lifetime. The gate, its pool and the execution context of the handler's
// executor must outlive every call in progress (the operation keeps that
// executor's work count up, so io_context::run() does not return early).
#pragma once

#ifdef BULKHEAD_DETAIL_BOOST_ASIO
#error "bulkhead/asio.hpp after bulkhead/boost_asio.hpp: a program's gates use one Asio, standalone or Boost's"
#endif
#define BULKHEAD_DETAIL_STANDALONE_ASIO 1

#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/detail/async_access.hpp>

#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <system_error>

namespace bulkhead::detail {
inline namespace standalone_asio {
namespace net = ::asio;
using error_code = std::error_code;
}  // namespace standalone_asio
}  // namespace bulkhead::detail

#define BULKHEAD_DETAIL_ASIO_ABI standalone_asio
#include <bulkhead/detail/asio_operation.ipp>
#undef BULKHEAD_DETAIL_ASIO_ABI
