// bulkhead: immediate, lock-free admission.
//
// admission_counter holds admission slots: a gate's B + Q, or one workload
// class's ceiling + queue (detail/permit_engine.hpp). Taking a slot
// is a single compare-and-swap loop on one atomic integer: no lock, no
// syscall, no yield, no allocation, on success and on failure alike. A caller
// that finds no slot is told so at once; that is the whole point (compare
// libstdc++'s std::counting_semaphore::try_acquire(), which spins and calls
// sched_yield before it gives up).
//
// Fairness: none, on purpose. The counter never queues anybody, so "who gets
// the last slot" is decided by whichever compare-and-swap lands first. Order
// among admitted callers is established later, by the permits
// (fifo_semaphore, or workload_scheduler for a gate with classes).
//
// Thread safety: every member may be called from any number of threads at
// once. A successful try_acquire() synchronizes with the release() that made
// its slot available (acquire/release on m_available), so whatever the
// releasing thread wrote before release() is visible to the next holder.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace bulkhead {

/// A lock-free counter of admission slots. Not fair: see the file comment.
class admission_counter {
public:
    /// The largest capacity a counter accepts.
    static constexpr std::int64_t max_capacity = std::numeric_limits<std::int32_t>::max();

    /// Creates a counter with `capacity` free slots.
    /// \throws std::invalid_argument when capacity is negative or above max_capacity.
    explicit admission_counter(std::int64_t capacity) : m_capacity(checked(capacity)), m_available(m_capacity) {}

    admission_counter(const admission_counter&) = delete;
    admission_counter& operator=(const admission_counter&) = delete;

    /// Takes one slot if one is free. Never blocks, never fails spuriously:
    /// it returns false only when it observed zero free slots.
    [[nodiscard]] bool try_acquire() noexcept {
        // relaxed load: only a starting guess for the CAS, which re-reads.
        std::int64_t seen = m_available.load(std::memory_order_relaxed);
        do {
            if (seen <= 0) {
                return false;
            }
            // acquire on success: pairs with the release in release() so the
            // previous holder's writes happen-before this holder's work.
        } while (
            !m_available.compare_exchange_weak(seen, seen - 1, std::memory_order_acquire, std::memory_order_relaxed));
        return true;
    }

    /// Gives one slot back. Must pair with a successful try_acquire().
    void release() noexcept {
        // release: publishes this holder's writes to the next acquirer.
        m_available.fetch_add(1, std::memory_order_release);
    }

    /// Free slots right now. An observation only: by the time it returns it
    /// may be stale; never decide admission with it (use try_acquire()).
    [[nodiscard]] std::int64_t available() const noexcept {
        // relaxed: a snapshot for monitoring, it orders nothing.
        return m_available.load(std::memory_order_relaxed);
    }

    /// The number of slots the counter was created with.
    [[nodiscard]] std::int64_t capacity() const noexcept { return m_capacity; }

private:
    static std::int64_t checked(std::int64_t capacity) {
        if (capacity < 0) {
            throw std::invalid_argument("bulkhead::admission_counter: capacity must not be negative");
        }
        if (capacity > max_capacity) {
            throw std::invalid_argument("bulkhead::admission_counter: capacity above max_capacity");
        }
        return capacity;
    }

    const std::int64_t m_capacity;
    alignas(64) std::atomic<std::int64_t> m_available;  // lock-free, see try_acquire()
};

}  // namespace bulkhead
