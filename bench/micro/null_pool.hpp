// bulkhead benchmarks: a pool that does nothing, for measuring the gate
// alone (bench/micro, bench/async). Needs nothing but the core.
#pragma once

#include <bulkhead/pool_concept.hpp>

#include <chrono>

namespace bulkhead_bench {

/// A pool that does nothing: leases, transactions, commits and rollbacks are
/// empty. What remains of gate.transaction() over it is the gate's own cost.
class null_pool {
public:
    /// What the callback receives.
    struct work {};

    class lease {
    public:
        lease() = default;
        lease(lease&&) noexcept = default;
        lease(const lease&) = delete;
        lease& operator=(const lease&) = delete;
        lease& operator=(lease&&) = delete;
        ~lease() = default;
    };

    class transaction {
    public:
        work& operator*() noexcept { return m_work; }

    private:
        work m_work;
    };

    struct transaction_options {};

    lease acquire(std::chrono::steady_clock::time_point /*deadline*/) { return lease{}; }
    transaction begin(lease& /*held*/, const transaction_options& /*options*/) { return transaction{}; }
    void commit(lease& /*held*/, transaction& /*tx*/) {}
    void rollback(lease& /*held*/, transaction& /*tx*/) {}
    void discard(lease& /*held*/) noexcept {}
};

static_assert(bulkhead::transactional_pool<null_pool>);

}  // namespace bulkhead_bench
