// bulkhead: the result of a non-throwing entry point.
//
// try_enter() and try_transaction() say "no" without an exception: they
// return a result<T> holding either the value or the reject_reason. A
// rejection then costs a few atomic operations instead of a throw and catch
// (about a microsecond each). Exceptions thrown by the caller's own callback,
// and misuse (std::logic_error), still propagate as exceptions.
#pragma once

#include <bulkhead/error.hpp>

#include <optional>
#include <type_traits>
#include <utility>

namespace bulkhead {

/// Either a T or the reason the call was rejected.
template <class T>
class [[nodiscard]] result {
    static_assert(!std::is_reference_v<T>, "bulkhead::result<T>: T must be a value type");

public:
    /// A successful result holding `value`.
    result(T value) : m_value(std::move(value)) {}  // NOLINT(google-explicit-constructor): implicit by design
    /// A rejection.
    result(reject_reason reason) noexcept : m_reason(reason) {}  // NOLINT(google-explicit-constructor)

    [[nodiscard]] bool has_value() const noexcept { return m_value.has_value(); }
    explicit operator bool() const noexcept { return has_value(); }

    /// The value. \throws the matching bulkhead::rejected when there is none.
    [[nodiscard]] T& value() & {
        ensure_value();
        return *m_value;
    }
    [[nodiscard]] const T& value() const& {
        ensure_value();
        return *m_value;
    }
    [[nodiscard]] T&& value() && {
        ensure_value();
        return std::move(*m_value);
    }

    /// The value, unchecked. Precondition: has_value().
    [[nodiscard]] T& operator*() & noexcept { return *m_value; }
    [[nodiscard]] T&& operator*() && noexcept { return std::move(*m_value); }
    [[nodiscard]] T* operator->() noexcept { return &*m_value; }

    /// Why the call was rejected. Precondition: !has_value().
    [[nodiscard]] reject_reason error() const noexcept { return m_reason; }

private:
    void ensure_value() const {
        if (!m_value) {
            throw_rejection(m_reason);
        }
    }

    std::optional<T> m_value;
    reject_reason m_reason = reject_reason::admission_full;  // meaningful only without a value
};

/// The result of a call whose callback returns nothing.
template <>
class [[nodiscard]] result<void> {
public:
    /// A successful result.
    result() noexcept = default;
    /// A rejection.
    result(reject_reason reason) noexcept
        : m_rejected(true), m_reason(reason) {}  // NOLINT(google-explicit-constructor)

    [[nodiscard]] bool has_value() const noexcept { return !m_rejected; }
    explicit operator bool() const noexcept { return has_value(); }

    /// \throws the matching bulkhead::rejected when the call was rejected.
    void value() const {
        if (m_rejected) {
            throw_rejection(m_reason);
        }
    }

    /// Why the call was rejected. Precondition: !has_value().
    [[nodiscard]] reject_reason error() const noexcept { return m_reason; }

private:
    bool m_rejected = false;
    reject_reason m_reason = reject_reason::admission_full;  // meaningful only when m_rejected
};

}  // namespace bulkhead
