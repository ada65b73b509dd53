// Must NOT compile: the pool below has no discard(). The test checks that the
// compiler's message names the missing part of the Pool concept.
#include <bulkhead/db_bulkhead.hpp>

#include <chrono>

struct almost_a_pool {
    struct lease {
        lease() = default;
        lease(lease&&) = default;
        lease(const lease&) = delete;
    };
    struct handle {
        int operator*() const { return 0; }
    };
    using transaction = handle;
    struct transaction_options {};
    lease acquire(std::chrono::steady_clock::time_point) { return {}; }
    transaction begin(lease&, const transaction_options&) { return {}; }
    void commit(lease&, transaction&) {}
    void rollback(lease&, transaction&) {}
};

int main() {
    almost_a_pool pool;
    bulkhead::db_bulkhead<almost_a_pool> gate(pool, 1, 0);
    (void)gate;
}
