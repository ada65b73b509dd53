// The C++ snippets of README.md, as shown there, in the context that makes
// them compile. Lines marked "snippet-context" are that context;
// check_snippets.py skips them when it looks for each snippet here.
#include "snippet_stubs.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>
#include <string>  // snippet-context

using namespace std::chrono_literals;

namespace snippet {  // snippet-context
void readme_usage(const http_request& request, const std::string& item) {  // snippet-context
bulkhead::pqxx_pool pool({.conninfo = "host=db dbname=shop user=app", .max_size = 24, .min_idle = 4,
                          .connection_timeout = 500ms, .keepalive_time = 60s});  // kept open, pinged when idle
bulkhead::db_bulkhead gate(pool, /*concurrent B=*/16, /*extra_slots Q=*/32);  // one per instance

// Throwing API: every refusal derives from bulkhead::rejected ("the work never started").
try {
    int id = gate.transaction({.queue_wait = 20ms, .stop = request.stop_token()},
                              [&](bulkhead::pqxx_transaction& tx) {
                                  return tx.exec_params("INSERT INTO orders(item) VALUES ($1) RETURNING id", item)
                                      .at(0).at(0).as<int>();
                              });  // committed, connection back in the pool, permits released
    reply_201(id);  // snippet-context
} catch (const bulkhead::rejected& overload) {
    reply_503(overload.what());  // safe to retry later
}

// Non-throwing API: a refusal is a value, not an exception.
auto total = gate.try_transaction(20ms, [](bulkhead::pqxx_transaction& tx) {
    return tx.exec("SELECT count(*) FROM orders").at(0).at(0).as<long>();
});
if (!total) {
    reply_503(bulkhead::to_string(total.error()));
}

// Health, for a load balancer: 503 only when the gate cannot serve (closed, no connection to be had).
const bulkhead::gate_health health = gate.health();
reply(health.serving ? 200 : 503, bulkhead::to_string(health.reason));

// Shutdown: new calls are refused with bulkhead::closed; those inside get 10 s, then are cancelled.
if (gate.close(std::chrono::steady_clock::now() + 10s).drained()) {
    pool.close(std::chrono::steady_clock::now() + 1s);
}
}  // snippet-context

void readme_workloads(bulkhead::pqxx_pool& pool) {  // snippet-context
bulkhead::db_bulkhead gate(pool, {.concurrent = 10, .workloads = bulkhead::workload_plan{{
    {.name = "interactive", .reserved = 4, .queue = 32, .priority = 10},   // 4 permits nobody else takes
    {.name = "batch", .ceiling = 6, .queue = 4, .queue_wait = 2s},         // never more than 6 at once
}}});
const bulkhead::workload_id batch = gate.workload("batch");                // once, at start-up
gate.transaction({.queue_wait = 30s, .workload = batch}, nightly_rollup);
}  // snippet-context
}  // namespace snippet  // snippet-context
