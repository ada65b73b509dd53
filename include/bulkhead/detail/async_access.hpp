// bulkhead: what the asynchronous front end (bulkhead/asio.hpp,
// bulkhead/boost_asio.hpp) reaches inside a gate. Needs no Asio.
#pragma once

#include <bulkhead/detail/gate_core.hpp>
#include <bulkhead/error.hpp>

#include <string>

namespace bulkhead::detail {

/// What the asynchronous front end uses of a gate: its admission core
/// (detail/gate_core.hpp, the same members the blocking path calls), the
/// checks of a call, and the pool path for a call admitted elsewhere.
struct async_access {
    /// What a callback of type Work returns (it receives the pool's
    /// transaction, or its deferred transaction: see db_bulkhead).
    template <class Gate, class Work>
    using work_result_t = typename Gate::template work_result_t<Work>;

    template <class Gate>
    static gate_core& core(Gate& gate) noexcept {
        return gate.m_core;
    }
    /// The pool's last connection error for a refusal after a wait, or
    /// empty (db_bulkhead::outage_cause); empty when it cannot be built.
    template <class Gate>
    static std::string outage_cause(const Gate& gate, reject_reason reason) noexcept {
        try {
            return gate.outage_cause(reason);
        } catch (...) {
            return {};
        }
    }
    template <class Gate, class Work>
    static void check_call(Gate& gate, const typename Gate::options& call, const Work& work) {
        Gate::check_callable(work);
        gate_core::check_queue_wait(call.queue_wait);
        gate.m_core.workers().start();
    }
    template <class Gate, class Work>
    static decltype(auto) run_adopted(Gate& gate, const typename Gate::options& call, Work& work,
                                      const admission_times& times, bool* started) {
        return gate.run_adopted(call, work, times, started);
    }
};

}  // namespace bulkhead::detail
