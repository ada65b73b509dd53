// bulkhead: coroutine (and any Boost.Asio completion token) callers of a
// gate, over Boost.Asio (Boost 1.81 or newer: libboost1.81-dev in Debian 12,
// libboost-dev in Debian 13; CMake target bulkhead::boost_asio).
//
//   const gate_t::options options{.queue_wait = 20ms};
//   int n = co_await gate.async_transaction(options, work, boost::asio::use_awaitable);
//
// The same code as bulkhead/asio.hpp, built over boost::asio instead of
// ::asio: what that header says (where the work runs, completion, error
// codes, cancellation, lifetime) holds here, with one difference: the
// completion's error code is a boost::system::error_code (holding the
// std::error_code: it compares equal to a reject_reason or work_error and
// converts back for is_rejection()), the type Boost.Asio's use_awaitable
// and use_future throw. A program uses one of the two headers, not both.
#pragma once

#ifdef BULKHEAD_DETAIL_STANDALONE_ASIO
#error "bulkhead/boost_asio.hpp after bulkhead/asio.hpp: a program's gates use one Asio, standalone or Boost's"
#endif
#define BULKHEAD_DETAIL_BOOST_ASIO 1

#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/detail/async_access.hpp>

#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/system/error_code.hpp>
#include <boost/version.hpp>

static_assert(BOOST_VERSION >= 108100, "bulkhead/boost_asio.hpp needs Boost 1.81 or newer");

namespace bulkhead::detail {
inline namespace boost_asio {
namespace net = ::boost::asio;
using error_code = ::boost::system::error_code;
}  // namespace boost_asio
}  // namespace bulkhead::detail

#define BULKHEAD_DETAIL_ASIO_ABI boost_asio
#include <bulkhead/detail/asio_operation.ipp>
#undef BULKHEAD_DETAIL_ASIO_ABI
