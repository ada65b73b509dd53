// bulkhead: the exception family.
//
// Every exception that means "the work never started, nothing reached the
// database" derives from bulkhead::rejected, itself a std::runtime_error, so a
// service can map the whole family to one answer (HTTP 503 with Retry-After)
// and retry later without any risk of doing the work twice. Misuse of the API
// is reported with the standard std::logic_error family instead
// (std::invalid_argument for bad arguments).
//
// Three exceptions mean the work did start: work_cancelled (a stop request
// reached the running work), work_deadline_exceeded (the deadline cut it
// short) and commit_unknown (the connection was lost during COMMIT and the
// outcome could not be read back). Neither of the first two committed
// anything; commit_unknown may have.
//
// reject_reason names the same outcomes as values, for the non-throwing entry
// points (try_enter, try_transaction), which report a rejection without
// paying for an exception. The asynchronous API (asio.hpp) reports them as
// std::error_code values of the bulkhead category, with work_error for the
// outcomes of work that started.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace bulkhead {

/// Why a call was turned away before its work started.
enum class reject_reason : std::uint8_t {
    admission_full,       ///< all B + Q admission slots were taken
    admission_timeout,    ///< the queue wait ended before an execution permit was free
    admission_cancelled,  ///< a stop was requested before the work started
    pool_timeout,         ///< no pool connection within the pool's connection timeout
    deadline_exceeded,    ///< the call's deadline passed (or would pass) before the work started
    closed,               ///< the gate (or the pool) was closed: it admits nothing more
};

/// A short, stable, lower-case name for `reason` ("admission_full", ...),
/// suitable for metric labels and logs.
[[nodiscard]] constexpr std::string_view to_string(reject_reason reason) noexcept {
    switch (reason) {
        case reject_reason::admission_full:
            return "admission_full";
        case reject_reason::admission_timeout:
            return "admission_timeout";
        case reject_reason::admission_cancelled:
            return "admission_cancelled";
        case reject_reason::pool_timeout:
            return "pool_timeout";
        case reject_reason::deadline_exceeded:
            return "deadline_exceeded";
        case reject_reason::closed:
            return "closed";
    }
    return "unknown";
}

class rejected;

namespace detail {
/// Gives a rejection made outside the gate (a pool's connection timeout,
/// a stop while waiting for a connection, a deadline seen by BEGIN) the
/// gate's retry delay, unless it carries one of its own.
inline void suggest_retry(rejected& rejection, std::chrono::milliseconds retry_after) noexcept;
}  // namespace detail

/// The work never started: nothing reached the database, retrying later is
/// safe. Catch this to treat every kind of rejection alike.
class rejected : public std::runtime_error {
public:
    /// \param reason why the call was turned away.
    /// \param what   the human-readable message.
    /// \param retry_after the suggested retry delay (retry_after()).
    rejected(reject_reason reason, const std::string& what,
             std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : std::runtime_error(what), m_reason(reason), m_retry_after(retry_after) {}
    /// As above, for a fixed message: one allocation fewer per throw (no
    /// temporary std::string).
    rejected(reject_reason reason, const char* what,
             std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : std::runtime_error(what), m_reason(reason), m_retry_after(retry_after) {}

    /// Why the call was turned away.
    [[nodiscard]] reject_reason reason() const noexcept { return m_reason; }

    /// When trying again may succeed, by the gate's own figures at the time
    /// of the rejection (db_bulkhead::suggested_retry_delay(): the work ahead
    /// of a new call, spread over the gate's permits), for a `Retry-After`
    /// header or a retry budget. Zero when the gate knew nothing yet (no
    /// transaction had finished) or the exception was made elsewhere.
    [[nodiscard]] std::chrono::milliseconds retry_after() const noexcept { return m_retry_after; }

private:
    friend void detail::suggest_retry(rejected& rejection, std::chrono::milliseconds retry_after) noexcept;

    reject_reason m_reason;
    std::chrono::milliseconds m_retry_after{0};
};

inline void detail::suggest_retry(rejected& rejection, std::chrono::milliseconds retry_after) noexcept {
    if (rejection.m_retry_after.count() == 0) {
        rejection.m_retry_after = retry_after;
    }
}

/// Every admission slot (B + Q) was taken; the call was refused at once,
/// whatever its queue wait.
class admission_full : public rejected {
public:
    explicit admission_full(std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::admission_full, "db admission full", retry_after) {}
};

/// The call was admitted but no execution permit became free within its
/// queue wait.
class admission_timeout : public rejected {
public:
    explicit admission_timeout(std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::admission_timeout, "db admission timed out", retry_after) {}
    explicit admission_timeout(const std::string& what,
                               std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::admission_timeout, what, retry_after) {}
};

/// A stop was requested (std::stop_token) before the work started.
class admission_cancelled : public rejected {
public:
    explicit admission_cancelled(std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::admission_cancelled, "db admission cancelled", retry_after) {}
};

/// The pool had no connection to give within its connection timeout.
class pool_timeout : public rejected {
public:
    explicit pool_timeout(std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::pool_timeout, "db pool connection timed out", retry_after) {}
    explicit pool_timeout(const std::string& what, std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::pool_timeout, what, retry_after) {}
};

/// The call's deadline passed, or would pass, before the work could start.
class deadline_exceeded : public rejected {
public:
    explicit deadline_exceeded(std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::deadline_exceeded, "db deadline exceeded before the work started", retry_after) {}
    explicit deadline_exceeded(const std::string& what,
                               std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::deadline_exceeded, what, retry_after) {}
};

/// The gate (or the pool) was closed (db_bulkhead::close(), pqxx_pool::close()):
/// a call arriving after close() began (that found an admission slot free),
/// or still queued for a permit when its deadline came. A service that is shutting down answers it as
/// unavailable (HTTP 503); another instance can serve the retry.
class closed : public rejected {
public:
    explicit closed(std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
        : rejected(reject_reason::closed, "db gate closed", retry_after) {}
    explicit closed(const std::string& what) : rejected(reject_reason::closed, what) {}
};

/// The work started and was cancelled by a stop request: the gate asked the
/// server to cancel the running statement and rolled back. Not a `rejected`:
/// the work did start (nothing of it was committed). The exception that the
/// cancelled statement raised is nested (std::rethrow_if_nested).
class work_cancelled : public std::runtime_error {
public:
    work_cancelled() : std::runtime_error("db work cancelled by a stop request; rolled back") {}
};

/// The work started and ran into the call's deadline: the statement the
/// server cut short (statement_timeout set from the deadline) is nested.
/// Nothing was committed. Not a `rejected`: the work did start.
class work_deadline_exceeded : public std::runtime_error {
public:
    work_deadline_exceeded() : std::runtime_error("db deadline exceeded while the work ran; rolled back") {}
};

/// The connection was lost during COMMIT and the outcome could not be
/// established afterwards (the transaction's status could not be read). The
/// write may or may not have happened: never retry it blindly; use an
/// idempotency key or look the result up. The original failure is nested.
class commit_unknown : public std::runtime_error {
public:
    explicit commit_unknown(
        const std::string& what = "db commit outcome unknown: the connection was lost during COMMIT")
        : std::runtime_error(what) {}
};

/// Throws the exception of the `rejected` family that matches `reason`,
/// with `retry_after` as its suggested retry delay. A `cause` (what the
/// gate knows of why a wait ran out: the pool's last connection error) is
/// appended to the message of the rejections that follow a wait:
/// admission_timeout, pool_timeout and deadline_exceeded.
[[noreturn]] inline void throw_rejection(reject_reason reason,
                                         std::chrono::milliseconds retry_after = std::chrono::milliseconds(0),
                                         std::string_view cause = {}) {
    if (!cause.empty()) {
        const auto message = [cause](const char* plain) { return std::string(plain).append("; ").append(cause); };
        switch (reason) {
            case reject_reason::admission_timeout:
                throw admission_timeout(message("db admission timed out"), retry_after);
            case reject_reason::pool_timeout:
                throw pool_timeout(message("db pool connection timed out"), retry_after);
            case reject_reason::deadline_exceeded:
                throw deadline_exceeded(message("db deadline exceeded before the work started"), retry_after);
            default:
                break;
        }
    }
    switch (reason) {
        case reject_reason::admission_full:
            throw admission_full(retry_after);
        case reject_reason::admission_timeout:
            throw admission_timeout(retry_after);
        case reject_reason::admission_cancelled:
            throw admission_cancelled(retry_after);
        case reject_reason::pool_timeout:
            throw pool_timeout(retry_after);
        case reject_reason::deadline_exceeded:
            throw deadline_exceeded(retry_after);
        case reject_reason::closed:
            throw closed(retry_after);
    }
    throw rejected(reason, "db admission rejected", retry_after);
}

/// The exception throw_rejection() would throw, as an exception_ptr (what
/// async_transaction() hands a caller that asked for the exception). It
/// costs what a thrown rejection costs; std::bad_alloc instead when its
/// message cannot be stored.
[[nodiscard]] inline std::exception_ptr make_rejection(
    reject_reason reason, std::chrono::milliseconds retry_after = std::chrono::milliseconds(0),
    std::string_view cause = {}) noexcept {
    try {
        throw_rejection(reason, retry_after, cause);
    } catch (...) {
        return std::current_exception();
    }
}

// ---------------------------------------------------------------------------
// Error codes, for the asynchronous API (asio.hpp)
// ---------------------------------------------------------------------------

/// What went wrong once the work had started, as an error code value: the
/// counterparts of work_cancelled, work_deadline_exceeded and commit_unknown,
/// and work_failed for anything else (the callback's own exception, a
/// database error). Rejections are reject_reason values.
enum class work_error : std::uint8_t {
    work_cancelled = 16,     ///< a stop or a cancellation reached the running work; rolled back
    work_deadline_exceeded,  ///< the deadline cut the running work short; rolled back
    commit_unknown,          ///< the connection was lost during COMMIT; the outcome is unknown
    work_failed,             ///< the callback, BEGIN or COMMIT threw; rolled back
};

namespace detail {

/// The bulkhead error category: values 1 to 6 are the reject_reasons (value
/// = reason + 1, so that no reason is the zero "success"), 16 to 19 the
/// work_errors.
class error_category_impl final : public std::error_category {
public:
    [[nodiscard]] const char* name() const noexcept override { return "bulkhead"; }

    [[nodiscard]] std::string message(int value) const override {
        switch (value) {
            case 1:
                return "admission_full: all admission slots (B + Q) were taken";
            case 2:
                return "admission_timeout: no execution permit within the queue wait";
            case 3:
                return "admission_cancelled: cancelled before the work started";
            case 4:
                return "pool_timeout: no pool connection within the pool's connection timeout";
            case 5:
                return "deadline_exceeded: the deadline passed before the work started";
            case 6:
                return "closed: the gate was closed and admits nothing more";
            case static_cast<int>(work_error::work_cancelled):
                return "work_cancelled: cancelled while the work ran; rolled back";
            case static_cast<int>(work_error::work_deadline_exceeded):
                return "work_deadline_exceeded: the deadline passed while the work ran; rolled back";
            case static_cast<int>(work_error::commit_unknown):
                return "commit_unknown: the connection was lost during COMMIT; the outcome is unknown";
            case static_cast<int>(work_error::work_failed):
                return "work_failed: the work failed and was rolled back";
            default:
                return "bulkhead: unknown error " + std::to_string(value);
        }
    }
};

}  // namespace detail

/// The category of every bulkhead error code.
[[nodiscard]] inline const std::error_category& error_category() noexcept {
    static const detail::error_category_impl category;
    return category;
}

/// `reason` as an error code of the bulkhead category (value reason + 1).
[[nodiscard]] inline std::error_code make_error_code(reject_reason reason) noexcept {
    return {static_cast<int>(reason) + 1, error_category()};
}

/// `error` as an error code of the bulkhead category.
[[nodiscard]] inline std::error_code make_error_code(work_error error) noexcept {
    return {static_cast<int>(error), error_category()};
}

/// True when `code` is a rejection: the work never started, so retrying
/// later is safe.
[[nodiscard]] inline bool is_rejection(const std::error_code& code) noexcept {
    return code.category() == error_category() && code.value() >= 1 &&
           code.value() <= static_cast<int>(reject_reason::closed) + 1;
}

/// The rejection `code` stands for. Precondition: is_rejection(code).
[[nodiscard]] inline reject_reason rejection_of(const std::error_code& code) noexcept {
    return static_cast<reject_reason>(code.value() - 1);
}

}  // namespace bulkhead

template <>
struct std::is_error_code_enum<bulkhead::reject_reason> : std::true_type {};
template <>
struct std::is_error_code_enum<bulkhead::work_error> : std::true_type {};
