// bulkhead: the events a gate reports to an observer.
#pragma once

#include <bulkhead/error.hpp>

#include <exception>
#include <utility>

namespace bulkhead {

// ---------------------------------------------------------------------------
// Observer
// ---------------------------------------------------------------------------

/// The default observer: every event compiles to nothing. An observer type is
/// any class with some of these member functions (all noexcept); events it
/// does not declare are not delivered, at no cost.
struct null_observer {
    /// A call was turned away before its work started.
    void on_rejected(reject_reason /*reason*/) noexcept {}
    /// A rollback failed; the connection has been marked for discard. The
    /// original exception, if any, still reaches the caller.
    void on_rollback_failed(std::exception_ptr /*failure*/) noexcept {}
};

namespace detail {

template <class Observer>
void notify_rejected(Observer& observer, reject_reason reason) noexcept {
    if constexpr (requires { observer.on_rejected(reason); }) {
        static_assert(noexcept(observer.on_rejected(reason)), "bulkhead: Observer::on_rejected must be noexcept");
        observer.on_rejected(reason);
    }
}

template <class Observer>
void notify_rollback_failed(Observer& observer, std::exception_ptr failure) noexcept {
    if constexpr (requires { observer.on_rollback_failed(failure); }) {
        static_assert(noexcept(observer.on_rollback_failed(failure)),
                      "bulkhead: Observer::on_rollback_failed must be noexcept");
        observer.on_rollback_failed(std::move(failure));
    }
}

}  // namespace detail

}  // namespace bulkhead
