// bulkhead: which gates the current thread is inside (for non-reentrancy).
//
// A gate is not reentrant: a thread that holds one of its execution permits
// and asks again would wait for itself. Each thread keeps a small record of the
// gates it is inside, so the second entry fails at once with std::logic_error
// instead of deadlocking. The record is thread_local, constant-initialized and
// fixed-size: no allocation, no lock, no guard variable on the fast path.
#pragma once

#include <array>
#include <cstddef>

namespace bulkhead::detail {

class held_gates {
public:
    /// How many gates one thread can be inside at once and still be checked.
    /// Deeper nesting works, but entries beyond this are not tracked.
    static constexpr std::size_t capacity = 16;

    [[nodiscard]] bool holds(const void* gate) const noexcept {
        for (std::size_t i = 0; i < m_count; ++i) {
            if (m_gates[i] == gate) {
                return true;
            }
        }
        return false;
    }

    /// Records `gate`; returns false (and records nothing) when full.
    bool add(const void* gate) noexcept {
        if (m_count == capacity) {
            return false;
        }
        m_gates[m_count++] = gate;
        return true;
    }

    /// Forgets one record of `gate`, if present.
    void remove(const void* gate) noexcept {
        for (std::size_t i = m_count; i-- > 0;) {
            if (m_gates[i] == gate) {
                m_gates[i] = m_gates[--m_count];
                return;
            }
        }
    }

private:
    std::array<const void*, capacity> m_gates{};  // owned by one thread, no sharing
    std::size_t m_count = 0;                      // owned by one thread, no sharing
};

/// The current thread's record.
inline thread_local held_gates this_thread_gates;

}  // namespace bulkhead::detail
