// bulkhead: what db_bulkhead::enter() hands out.
#pragma once

#include <bulkhead/detail/gate_core.hpp>
#include <bulkhead/detail/held_gates.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace bulkhead {

template <class Pool, class Observer>
class db_bulkhead;

/// One execution permit and one admission slot of a gate, held until
/// destroyed or released. From db_bulkhead::enter(), for callers that run
/// their own transaction manager inside the admitted scope.
/// \note Move-only. It may move to, and be released on, another thread:
/// the entering thread is then no longer counted as inside the gate
/// (detail/held_gates.hpp says how), and the releasing thread's own
/// standing is untouched.
class [[nodiscard]] permit {
public:
    /// An empty permit, holding nothing.
    permit() noexcept = default;

    permit(permit&& other) noexcept
        : m_core(std::exchange(other.m_core, nullptr)),
          m_record(std::exchange(other.m_record, nullptr)),
          m_serial(std::exchange(other.m_serial, 0)),
          m_workload(other.m_workload) {}

    /// Gives back what this permit held, then takes over `other`'s.
    permit& operator=(permit&& other) noexcept {
        if (this != &other) {
            release();
            m_core = std::exchange(other.m_core, nullptr);
            m_record = std::exchange(other.m_record, nullptr);
            m_serial = std::exchange(other.m_serial, 0);
            m_workload = other.m_workload;
        }
        return *this;
    }

    permit(const permit&) = delete;
    permit& operator=(const permit&) = delete;

    ~permit() { release(); }

    /// Returns the execution permit and the admission slot. Idempotent.
    void release() noexcept {
        if (detail::gate_core* core = std::exchange(m_core, nullptr)) {
            if (detail::held_gates* record = std::exchange(m_record, nullptr)) {
                if (record == &detail::this_thread_gates) {
                    record->remove(m_serial);
                } else {
                    core->released_elsewhere(record, m_serial);  // entered on another thread
                }
            }
            core->leave(m_workload);
        }
    }

    /// True while it holds a permit.
    explicit operator bool() const noexcept { return m_core != nullptr; }

private:
    template <class Pool, class Observer>
    friend class db_bulkhead;

    permit(detail::gate_core& core, detail::held_gates* record, std::uint64_t serial, int workload) noexcept
        : m_core(&core), m_record(serial != 0 ? record : nullptr), m_serial(serial), m_workload(workload) {}

    detail::gate_core* m_core = nullptr;
    detail::held_gates* m_record = nullptr;  // the entering thread's record, when tracked there; only compared
                                             // unless it is the releasing thread's own
    std::uint64_t m_serial = 0;              // the entry in that record
    int m_workload = 0;                      // its class
};

static_assert(std::is_nothrow_move_constructible_v<permit> && !std::is_copy_constructible_v<permit>);

}  // namespace bulkhead
