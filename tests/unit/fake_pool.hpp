// A test-double pool for the permit logic: it records every begin, commit,
// rollback, discard and return, and can be told to fail at any step. It
// stands in for nothing the database does; the [pg] suite covers that.
#pragma once

#include <bulkhead/db_bulkhead.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace bulkhead_test {

/// Thrown by the fake when told to fail.
struct fake_failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// What a callback throws to play "the server cut the statement short because
/// of the deadline"; the fake's failed_by_deadline() recognizes it.
struct fake_deadline_hit : std::runtime_error {
    fake_deadline_hit() : std::runtime_error("fake: statement timeout") {}
};

class fake_pool {
public:
    /// What the callback receives: it can "write" and must not commit itself.
    class work {
    public:
        explicit work(fake_pool& pool) : m_pool(&pool) {}
        void write(int value) { m_written.push_back(value); }
        /// The callback trying to end the gate's transaction: refused.
        void commit() { throw std::logic_error("fake_pool: commit inside the callback is refused"); }
        void rollback() { throw std::logic_error("fake_pool: rollback inside the callback is refused"); }
        [[nodiscard]] fake_pool& pool() const noexcept { return *m_pool; }

    private:
        friend class fake_pool;
        fake_pool* m_pool;
        std::vector<int> m_written;
    };

    class lease {
    public:
        lease() = default;
        lease(fake_pool& pool, int id) : m_pool(&pool), m_id(id) {}
        lease(lease&& other) noexcept
            : m_pool(std::exchange(other.m_pool, nullptr)), m_id(other.m_id), m_discard(other.m_discard) {}
        lease& operator=(lease&&) = delete;
        lease(const lease&) = delete;
        ~lease() {
            if (m_pool != nullptr) {
                m_pool->give_back(*this);
            }
        }
        [[nodiscard]] int id() const noexcept { return m_id; }

    private:
        friend class fake_pool;
        fake_pool* m_pool = nullptr;
        int m_id = 0;
        bool m_discard = false;
    };

    using transaction = std::unique_ptr<work>;
    struct transaction_options {
        int tag = 0;
        std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
    };

    // --- knobs: fail at a step ---------------------------------------------
    std::atomic<bool> fail_acquire{false};           // throws pool_timeout
    std::atomic<bool> acquire_breaks{false};         // throws fake_failure (not a bulkhead::rejected)
    std::atomic<bool> fail_begin{false};             // throws fake_failure
    std::atomic<bool> fail_commit{false};            // throws fake_failure, nothing committed
    std::atomic<bool> fail_rollback{false};          // throws fake_failure
    std::atomic<bool> commit_throws_unknown{false};  // commit throws bulkhead::commit_unknown

    // --- what happened -------------------------------------------------------
    std::atomic<int> acquired{0};
    std::atomic<int> returned{0};
    std::atomic<int> begun{0};
    std::atomic<int> commits{0};
    std::atomic<int> rollbacks{0};
    std::atomic<int> discarded{0};
    std::atomic<int> in_use{0};
    std::atomic<int> last_tag{-1};
    std::atomic<int> cancels{0};
    std::atomic<std::chrono::steady_clock::time_point> last_deadline{};

    /// Values written by committed transactions, in commit order.
    std::vector<int> committed_values() const {
        const std::lock_guard lock(m_mutex);
        return m_committed;
    }
    /// The order of events as strings ("acquire", "begin", "commit", ...).
    std::vector<std::string> events() const {
        const std::lock_guard lock(m_mutex);
        return m_events;
    }

    // --- the Pool concept ----------------------------------------------------
    lease acquire(std::chrono::steady_clock::time_point /*deadline*/) {
        if (fail_acquire) {
            throw bulkhead::pool_timeout("fake_pool: no connection");
        }
        if (acquire_breaks) {
            throw fake_failure("fake_pool: acquire failed");
        }
        record("acquire");
        ++acquired;
        ++in_use;
        return lease(*this, m_next_id++);
    }

    transaction begin(lease& /*held*/, const transaction_options& options) {
        if (fail_begin) {
            throw fake_failure("fake_pool: begin failed");
        }
        record("begin");
        ++begun;
        last_tag = options.tag;
        last_deadline = options.deadline;
        return std::make_unique<work>(*this);
    }

    void commit(lease& /*held*/, transaction& tx) {
        record("commit");
        if (commit_throws_unknown) {
            throw bulkhead::commit_unknown();
        }
        if (fail_commit) {
            throw fake_failure("fake_pool: commit failed");
        }
        {
            const std::lock_guard lock(m_mutex);
            m_committed.insert(m_committed.end(), tx->m_written.begin(), tx->m_written.end());
        }
        tx->m_written.clear();
        ++commits;
    }

    void rollback(lease& /*held*/, transaction& tx) {
        record("rollback");
        tx->m_written.clear();
        if (fail_rollback) {
            throw fake_failure("fake_pool: rollback failed");
        }
        ++rollbacks;
    }

    void discard(lease& held) noexcept {
        held.m_discard = true;
        ++discarded;
    }

    // --- the optional extensions ----------------------------------------------
    /// Records the request; the callback under test plays the server's part.
    void cancel(lease& /*held*/) noexcept { ++cancels; }

    [[nodiscard]] bool failed_by_deadline(transaction& /*tx*/) noexcept {
        try {
            throw;
        } catch (const fake_deadline_hit&) {
            return true;
        } catch (...) {
            return false;
        }
    }

private:
    void give_back(lease& held) noexcept {
        record(held.m_discard ? "return-discarded" : "return");
        ++returned;
        --in_use;
    }

    void record(const char* event) noexcept {
        try {
            const std::lock_guard lock(m_mutex);
            m_events.emplace_back(event);
        } catch (...) {  // recording is best effort in a noexcept path
        }
    }

    mutable std::mutex m_mutex;
    std::vector<std::string> m_events;  // guarded by m_mutex
    std::vector<int> m_committed;       // guarded by m_mutex
    std::atomic<int> m_next_id{1};
};

static_assert(bulkhead::transactional_pool<fake_pool>);
static_assert(bulkhead::pool_takes_deadlines<fake_pool> && bulkhead::pool_cancels_work<fake_pool> &&
              bulkhead::pool_reports_deadlines<fake_pool>);

/// An observer that records what it is told.
struct recording_observer {
    std::atomic<int> rejected_full{0};
    std::atomic<int> rejected_timeout{0};
    std::atomic<int> rejected_cancelled{0};
    std::atomic<int> rejected_other{0};
    std::atomic<int> rollback_failures{0};
    std::exception_ptr last_rollback_failure;

    void on_rejected(bulkhead::reject_reason reason) noexcept {
        switch (reason) {
            case bulkhead::reject_reason::admission_full:
                ++rejected_full;
                break;
            case bulkhead::reject_reason::admission_timeout:
                ++rejected_timeout;
                break;
            case bulkhead::reject_reason::admission_cancelled:
                ++rejected_cancelled;
                break;
            default:
                ++rejected_other;
                break;
        }
    }
    void on_rollback_failed(std::exception_ptr failure) noexcept {
        ++rollback_failures;
        last_rollback_failure = std::move(failure);
    }
};

}  // namespace bulkhead_test
