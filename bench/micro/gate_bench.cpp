// The whole gate, db_bulkhead<null_pool>: admission slot + execution permit
// + (for transaction) lease, begin, callback, commit, release. Over a pool
// that does nothing, what is measured is the gate's own cost.
#include "bench_support.hpp"

#include <bulkhead/db_bulkhead.hpp>

#include <chrono>
#include <optional>

namespace {

using namespace std::chrono_literals;
using bulkhead_bench::contention_report;
using bulkhead_bench::do_nothing;
using bulkhead_bench::hold_work;
using bulkhead_bench::null_pool;
using gate_type = bulkhead::db_bulkhead<null_pool>;

null_pool g_pool;
std::optional<gate_type> g_gate;  // (re)made by thread 0 before each run

/// B = range(0) execution permits, and enough extra slots (Q = 64) that
/// no contended caller is turned away at admission.
void make_gate(const benchmark::State& state) {
    if (state.thread_index() == 0) {
        g_gate.emplace(g_pool, static_cast<int>(state.range(0)), 64);
    }
}

/// What contended callers pass: a queue wait that never expires in a run.
const gate_type::options g_wait_long{.queue_wait = 10s};

void gate_enter_leave(benchmark::State& state) {
    make_gate(state);
    if (state.threads() == 1) {
        for (auto _ : state) {
            bulkhead::permit held = g_gate->enter();
            benchmark::DoNotOptimize(held);
            held.release();
        }
        bulkhead_bench::report_probe(state, [] { g_gate->enter().release(); });
        return;
    }
    static contention_report report;
    bulkhead::permit held;
    bulkhead_bench::run_contended(
        state, report, bulkhead_bench::hold_inside::between, [&] { held = g_gate->enter(g_wait_long); },
        [&] { held.release(); });
}
BENCHMARK(gate_enter_leave)->Name("gate/enter_leave")->Apply(bulkhead_bench::uncontended_gate);
BENCHMARK(gate_enter_leave)->Name("gate/enter_leave")->Apply(bulkhead_bench::contended);

/// The same on a gate with two workload classes (workload.hpp), a call of
/// the class without a reservation: what the classes' one mutex costs over
/// the plain gate's lock-free path (docs/workloads.md, "Cost").
std::optional<gate_type> g_classed_gate;

void gate_classes_enter_leave(benchmark::State& state) {
    if (state.thread_index() == 0) {
        // One permit more than the plain gate's: interactive's reservation;
        // batch has the rest (range(0) shared permits).
        g_classed_gate.emplace(g_pool, bulkhead::gate_settings{.concurrent = static_cast<int>(state.range(0)) + 1,
                                                               .workloads = bulkhead::workload_plan{{
                                                                   {.name = "interactive", .reserved = 1, .queue = 64},
                                                                   {.name = "batch", .queue = 64},
                                                               }}});
    }
    const gate_type::options call{.workload = g_classed_gate->workload("batch")};
    for (auto _ : state) {
        bulkhead::permit held = g_classed_gate->enter(call);
        benchmark::DoNotOptimize(held);
        held.release();
    }
}
BENCHMARK(gate_classes_enter_leave)->Name("gate_classes/enter_leave")->Apply(bulkhead_bench::uncontended_gate);

/// The full call. Contended, the "wait" of the report is the whole call
/// (admission, the queue, the empty transaction and the release).
void gate_transaction(benchmark::State& state) {
    make_gate(state);
    if (state.threads() == 1) {
        for (auto _ : state) {
            g_gate->transaction(0ms, do_nothing);
        }
        bulkhead_bench::report_probe(state, [] { g_gate->transaction(0ms, do_nothing); });
        return;
    }
    static contention_report report;
    bulkhead_bench::run_contended(
        state, report, bulkhead_bench::hold_inside::acquire, [] { g_gate->transaction(g_wait_long, hold_work); },
        [] {});
}
BENCHMARK(gate_transaction)->Name("gate/transaction")->Apply(bulkhead_bench::uncontended_gate);
BENCHMARK(gate_transaction)->Name("gate/transaction")->Apply(bulkhead_bench::contended);

void gate_try_transaction(benchmark::State& state) {
    make_gate(state);
    if (state.threads() == 1) {
        for (auto _ : state) {
            bulkhead::result<void> outcome = g_gate->try_transaction(0ms, do_nothing);
            benchmark::DoNotOptimize(outcome);
        }
        bulkhead_bench::report_probe(state, [] { (void)g_gate->try_transaction(0ms, do_nothing); });
        return;
    }
    static contention_report report;
    bulkhead_bench::run_contended(
        state, report, bulkhead_bench::hold_inside::acquire,
        [&] {
            if (!g_gate->try_transaction(g_wait_long, hold_work)) {
                state.SkipWithError("gate: a call with a queue wait that cannot expire was rejected");
            }
        },
        [] {});
}
BENCHMARK(gate_try_transaction)->Name("gate/try_transaction")->Apply(bulkhead_bench::uncontended_gate);
BENCHMARK(gate_try_transaction)->Name("gate/try_transaction")->Apply(bulkhead_bench::contended);

}  // namespace
