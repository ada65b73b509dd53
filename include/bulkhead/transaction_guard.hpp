// bulkhead: one transaction on one leased connection, rolled back unless
// committed.
#pragma once

#include <bulkhead/pool_concept.hpp>

#include <exception>
#include <stdexcept>
#include <utility>

namespace bulkhead {

// ---------------------------------------------------------------------------
// transaction_guard
// ---------------------------------------------------------------------------

/// Selects transaction_guard's constructor that defers BEGIN.
struct defer_begin_t {
    explicit defer_begin_t() = default;
};
inline constexpr defer_begin_t defer_begin{};

/// Where a transaction_guard reports a rollback that failed: a context pointer
/// and a function, so reporting needs no allocation. An empty hook drops the
/// report (the connection is still discarded).
struct rollback_failure_hook {
    void* context = nullptr;
    void (*report)(void* context, std::exception_ptr failure) noexcept = nullptr;

    void operator()(std::exception_ptr failure) const noexcept {
        if (report != nullptr) {
            report(context, std::move(failure));
        }
    }
};

/// Begins a transaction on construction; commits only when told; rolls back
/// in its destructor otherwise. A failed rollback never throws and is never
/// swallowed: the connection is marked for discard and the failure goes to
/// the hook.
/// \note Scoped like std::lock_guard: neither copyable nor movable. The pool
/// and the lease must outlive it.
template <class Pool>
requires transactional_pool<Pool>
class transaction_guard {
public:
    using lease_type = typename Pool::lease;
    using transaction_type = typename Pool::transaction;
    using options_type = typename Pool::transaction_options;

    /// Begins a transaction on `lease`.
    /// \throws whatever the pool's begin() throws; nothing is held then.
    transaction_guard(Pool& pool, lease_type& lease, const options_type& options = {},
                      rollback_failure_hook on_rollback_failure = {})
        : m_pool(&pool),
          m_lease(&lease),
          m_on_rollback_failure(on_rollback_failure),
          m_transaction(pool.begin(lease, options)) {}

    /// Opens a transaction on `lease` whose BEGIN waits for its first
    /// statement (pool_defers_begin: pool.begin_deferred()).
    /// \throws whatever the pool's begin_deferred() throws; nothing is held then.
    transaction_guard(defer_begin_t /*tag*/, Pool& pool, lease_type& lease, const options_type& options,
                      rollback_failure_hook on_rollback_failure) requires pool_defers_begin<Pool>
        : m_pool(&pool),
          m_lease(&lease),
          m_on_rollback_failure(on_rollback_failure),
          m_transaction(pool.begin_deferred(lease, options)) {}

    transaction_guard(const transaction_guard&) = delete;
    transaction_guard& operator=(const transaction_guard&) = delete;

    /// Rolls back unless commit() succeeded.
    ~transaction_guard() { rollback(); }

    /// What the callback works with (`*transaction`).
    [[nodiscard]] decltype(auto) work() noexcept(noexcept(*std::declval<transaction_type&>())) {
        return *m_transaction;
    }

    /// Commits. If the commit throws, the transaction still counts as open and
    /// is rolled back by rollback() or the destructor.
    /// \throws std::logic_error when the transaction already ended.
    void commit() {
        if (!m_open) {
            throw std::logic_error("bulkhead::transaction_guard: commit after the transaction ended");
        }
        m_pool->commit(*m_lease, m_transaction);
        m_open = false;
    }

    /// Rolls back if still open. Idempotent; never throws: a failure marks the
    /// connection for discard and goes to the hook.
    void rollback() noexcept {
        if (!m_open) {
            return;
        }
        m_open = false;
        try {
            m_pool->rollback(*m_lease, m_transaction);
        } catch (...) {
            m_pool->discard(*m_lease);
            m_on_rollback_failure(std::current_exception());
        }
    }

    /// The pool's transaction handle.
    [[nodiscard]] transaction_type& handle() noexcept { return m_transaction; }

    /// True until commit() succeeded or rollback() ran.
    [[nodiscard]] bool open() const noexcept { return m_open; }

private:
    Pool* m_pool;
    lease_type* m_lease;
    rollback_failure_hook m_on_rollback_failure;
    transaction_type m_transaction;
    bool m_open = true;
};

}  // namespace bulkhead
