// The C++ snippets of docs/*.md, as shown there, in the context that makes
// them compile (see snippet_readme.cpp). A snippet that begins with
// #include starts at file scope; the function around the rest is context.
#include "snippet_stubs.hpp"

#include <cstdio>
#include <iostream>
#include <optional>

using namespace snippet;  // snippet-context

// --- docs/design.md ---------------------------------------------------------
#include <bulkhead/bulkhead.hpp>      // the core: no libpqxx needed
#include <bulkhead/pqxx_pool.hpp>     // the libpqxx pool

namespace design {  // snippet-context
using namespace std::chrono_literals;  // snippet-context
void design_md() {  // snippet-context
bulkhead::pqxx_pool pool({.conninfo = url, .max_size = 24});
bulkhead::db_bulkhead gate(pool, /*concurrent B*/ 16, /*extra_slots Q*/ 32);

int id = gate.transaction({.queue_wait = 20ms, .stop = token}, [&](pqxx::dbtransaction& tx) {
    return tx.exec("INSERT INTO orders(item) VALUES ('book') RETURNING id").at(0).at(0).as<int>();
});
reply_201(id);  // snippet-context
}  // snippet-context
}  // namespace design  // snippet-context

// --- docs/deadlines.md ------------------------------------------------------
namespace deadlines {  // snippet-context
void deadlines_md(bulkhead::db_bulkhead<bulkhead::pqxx_pool>& gate, const http_request& request,  // snippet-context
                  const order_t& order) {  // snippet-context
using namespace std::chrono_literals;
auto deadline = std::chrono::steady_clock::now() + 800ms;   // from the request, e.g. a gRPC deadline

try {
    auto id = gate.transaction({.queue_wait = 50ms, .stop = request.stop_token(), .deadline = deadline},
                               [&](pqxx::dbtransaction& tx) { return insert_order(tx, order); });
    reply_201(id);
} catch (const bulkhead::rejected& no) {                  // never started: safe to retry later
    reply_503(no.what(), /*Retry-After=*/1s);
} catch (const bulkhead::work_deadline_exceeded&) {       // started, cut short, rolled back
    reply_504();
} catch (const bulkhead::work_cancelled&) {               // started, cancelled on the server, rolled back
    /* the client went away; nothing to answer */
} catch (const bulkhead::commit_unknown&) {               // may or may not have committed
    reply_500_check_with_idempotency_key();
}
}  // snippet-context
}  // namespace deadlines  // snippet-context

// --- docs/observability.md --------------------------------------------------
#include <bulkhead/prometheus.hpp>

namespace observability {  // snippet-context
std::string metrics_md(bulkhead::db_bulkhead<bulkhead::pqxx_pool>& gate, bulkhead::pqxx_pool& pool) {  // snippet-context
bulkhead::gate_stats g = gate.stats();     // plain struct: counters, gauges, latency histograms
bulkhead::pool_stats p = pool.stats();     // plain struct: gauges, opened, closed by reason, timeouts
double p99_queue = g.permit_wait.quantile(0.99) / 1e9;   // seconds

bulkhead::prometheus_exposition metrics;   // text format 0.0.4
metrics.add("orders", g);                  // label gate="orders"
metrics.add("main", p);                    // label pool="main"
std::string body = metrics.render();       // Content-Type: text/plain; version=0.0.4
return body + std::to_string(p99_queue);  // snippet-context
}  // snippet-context

void observer_md() {  // snippet-context
struct log_observer {
    void on_rejected(bulkhead::reject_reason /*reason*/) noexcept { /* count or sample a log line */ }
    void on_rollback_failed(std::exception_ptr /*failure*/) noexcept { /* log: the connection was discarded */ }
};
bulkhead::pqxx_pool pool({.conninfo = url, .on_close = [](bulkhead::close_reason /*why*/) { /* log the discard */ }});
bulkhead::db_bulkhead<bulkhead::pqxx_pool, log_observer> gate(pool, {.concurrent = 16, .extra_slots = 32}, log_observer{});
}  // snippet-context
}  // namespace observability  // snippet-context

// --- docs/pgbouncer.md ------------------------------------------------------
namespace pgbouncer {  // snippet-context
using namespace std::chrono_literals;  // snippet-context
void pgbouncer_md() {  // snippet-context
// An application behind PgBouncer (pool_mode = transaction): nothing changes in the code.
bulkhead::pqxx_pool pool({.conninfo = "host=pgbouncer port=6432 dbname=shop user=app", .max_size = 10,
                          .application_name = "shop-api-7"});
bulkhead::db_bulkhead gate(pool, 8, 32);
gate.transaction({.deadline = std::chrono::steady_clock::now() + 200ms}, work);  // SET LOCAL: holds (H5)
}  // snippet-context
}  // namespace pgbouncer  // snippet-context

// --- docs/cluster.md --------------------------------------------------------
namespace cluster {  // snippet-context
void cluster_md() {  // snippet-context
// Writes: list every member; the pool asks libpq for the primary.
bulkhead::pqxx_pool writes({.conninfo = "host=db1,db2,db3 port=5432 dbname=shop user=app", .max_size = 10});
bulkhead::db_bulkhead write_gate(writes, 8, 32);

// Reads: a pool and a gate of their own, on a standby while one answers.
bulkhead::pqxx_pool reads({.conninfo = "host=db1,db2,db3 dbname=shop user=app target_session_attrs=prefer-standby",
                           .max_size = 10});
bulkhead::db_bulkhead read_gate(reads, 8, 32);
}  // snippet-context

void patroni_md() {  // snippet-context
using namespace std::chrono_literals;  // snippet-context
// Both members in a libpq host list; libpq connects to the first that
// accepts writes. Patroni runs with synchronous_mode: true.
bulkhead::pqxx_pool pool({.conninfo = "host=10.0.0.1,10.0.0.2 port=5432,5432 dbname=shop user=app "
                                      "target_session_attrs=read-write",
                          .max_size = 8, .connection_timeout = 3s});
bulkhead::db_bulkhead gate(pool, 8, 0);
gate.transaction({.queue_wait = 1s, .deadline = std::chrono::steady_clock::now() + 3s}, work);
}  // snippet-context
}  // namespace cluster  // snippet-context

// --- docs/pqxx_pool.md ------------------------------------------------------
#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>   // the libpqxx pool; it and bulkhead/pqxx/*.hpp are the only headers with <pqxx/pqxx>

namespace pqxx_pool_md {  // snippet-context
using namespace std::chrono_literals;

void usage() {  // snippet-context
bulkhead::pqxx_pool pool({
    .conninfo = "host=db dbname=shop user=app",   // keyword string or postgresql:// URI
    .max_size = 24,
    .connection_timeout = 2s,
    .application_name = "shop-api",
    .on_connect = [](pqxx::connection& c) { pqxx::nontransaction(c).exec("SET search_path = shop, public"); },
});

// Through the gate: BEGIN, the callback, COMMIT (ROLLBACK on any failure).
bulkhead::db_bulkhead gate(pool, /*concurrent*/ 16, /*extra_slots*/ 32);
int n = gate.transaction(
    {.queue_wait = 50ms,
     .transaction = {.isolation_level = bulkhead::isolation::repeatable_read,
                     .read_only = true,
                     .statement_timeout = 500ms}},
    [](pqxx::dbtransaction& tx) { return tx.exec("SELECT count(*) FROM orders").at(0).at(0).as<int>(); });

// Directly, for work of your own.
{
    bulkhead::pqxx_pool::lease lease = pool.acquire();      // waits at most connection_timeout
    pqxx::work tx(lease.connection());
    tx.exec("UPDATE stock SET n = n - 1 WHERE id = 7");
    tx.commit();
}                                                          // back to the pool (or closed, see below)

std::size_t open = pool.size(), idle = pool.idle(), busy = pool.in_use(), queued = pool.waiting();
reply_200(static_cast<long>(open + idle + busy + queued) + n);  // snippet-context
}  // snippet-context

void budget_check() {  // snippet-context
bulkhead::pqxx_pool pool({
    .conninfo = url,
    .max_size = 8,
    .application_name = "orders-api-" + host_name,   // one of its own per instance, for the live count
    .budget_check = bulkhead::budget_check_mode::refuse,
    .fleet = {.instances = 0, .application_prefix = "orders-api-", .overlap_percent = 25, .other_clients = 10},
});   // throws bulkhead::connection_budget_exceeded when the fleet does not fit
}  // snippet-context

using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;  // snippet-context
void deferred_begin(gate_t& gate, const gate_t::options& call, int id) {  // snippet-context
const long balance = gate.transaction(call, [&](bulkhead::pqxx_transaction& tx) {
    return tx.exec("SELECT balance FROM accounts WHERE id = " + std::to_string(id))[0][0].as<long>();
});
reply_200(balance);  // snippet-context
}  // snippet-context
void from_environment() {  // snippet-context
// BULKHEAD_POOL="max_size=24 min_idle=4 connection_timeout=500ms keepalive_time=60s"
// BULKHEAD_GATE="concurrent=16 extra_slots=32 adaptive_floor=2"
bulkhead::pqxx_pool pool(bulkhead::pool_settings_from_env("BULKHEAD_POOL", {.conninfo = url}));
bulkhead::db_bulkhead gate(pool, bulkhead::gate_settings_from_env("BULKHEAD_GATE").value_or(
                                     bulkhead::gate_settings{.concurrent = 16, .extra_slots = 32}));
reply_200(static_cast<long>(gate.available()));  // snippet-context
}  // snippet-context
void one_round_trip(gate_t& gate, const gate_t::options& call) {  // snippet-context
const bulkhead::statement_result moved = gate.execute(
    call, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", 100, 7);
const std::uint64_t rows = moved.affected_rows();
reply_200(static_cast<long>(rows));  // snippet-context
}  // snippet-context
}  // namespace pqxx_pool_md  // snippet-context

// --- docs/workloads.md ------------------------------------------------------
#include <bulkhead/bulkhead.hpp>

namespace workloads {  // snippet-context
using namespace std::chrono_literals;

void plan_md(bulkhead::pqxx_pool& pool) {  // snippet-context
const bulkhead::workload_plan plan{{
    {.name = "interactive", .reserved = 4, .queue = 32, .priority = 10},
    {.name = "batch", .ceiling = 6, .queue = 4, .queue_wait = 2s},
}};
bulkhead::db_bulkhead gate(pool, {.concurrent = 10, .workloads = plan});

const bulkhead::workload_id batch = gate.workload("batch");   // once, at start-up
gate.transaction({.queue_wait = 30s, .workload = batch}, nightly_rollup);  // waits at most 2 s
}  // snippet-context
}  // namespace workloads  // snippet-context

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/workload_config.hpp>   // core only: no libpqxx, no Asio

namespace workloads {  // snippet-context
void from_env(bulkhead::pqxx_pool& pool) {  // snippet-context
// BULKHEAD_WORKLOADS="interactive reserved=4 queue=32 priority=10; batch ceiling=6 queue=4 queue_wait=2s"
const std::optional<bulkhead::workload_plan> plan = bulkhead::workloads_from_env();
if (plan) {
    std::clog << bulkhead::describe_workloads(*plan, /*B=*/10);  // throws what the gate would refuse
}
bulkhead::db_bulkhead gate(pool, {.concurrent = 10, .workloads = plan.value_or(built_in_plan)});
}  // snippet-context
}  // namespace workloads  // snippet-context

// --- docs/adaptive.md -------------------------------------------------------
#include <bulkhead/pqxx_pool.hpp>   // includes adaptive_limit.hpp

namespace adaptive {  // snippet-context
void adaptive_md(const bulkhead::pqxx_pool_options& options) {  // snippet-context
bulkhead::pqxx_pool pool(options);
bulkhead::db_bulkhead gate(pool, {.concurrent = 16, .extra_slots = 64, .adaptive = bulkhead::adaptive_options{.floor = 2}});

const int limit = gate.limit();                                  // the permits in circulation now, in [floor, B]
const bulkhead::limit_reason why = gate.stats().limit_reason;    // why it last changed
reply_200(limit + static_cast<int>(why));  // snippet-context
}  // snippet-context
}  // namespace adaptive  // snippet-context

// --- docs/tuning.md ---------------------------------------------------------
namespace tuning {  // snippet-context
using namespace std::chrono_literals;  // snippet-context
constexpr std::size_t P = 24;          // snippet-context
constexpr int B = 16;                  // snippet-context
constexpr int Q = 32;                  // snippet-context
constexpr auto W = 20ms;               // snippet-context
void tuning_md() {  // snippet-context
bulkhead::pqxx_pool pool({.conninfo = url, .max_size = P, .connection_timeout = 500ms});
bulkhead::db_bulkhead gate(pool, /*concurrent=*/B, /*extra_slots=*/Q);
gate.transaction({.queue_wait = W}, work);
}  // snippet-context

void budget_md() {  // snippet-context
bulkhead::connection_budget budget = bulkhead::read_connection_budget(
    "host=db dbname=shop user=app application_name=orders-api-3", /*pool_size=*/4,
    {.instances = 0,                        // 0: count them live
     .application_prefix = "orders-api-",   // whose sessions are the fleet's
     .overlap_percent = 25,                 // rolling deploys: 25 % more at once
     .other_clients = 2});                  // batch, consoles, monitoring
if (!budget.fits()) {   // also headroom() and largest_pool_size()
    std::clog << budget.explain();
}
}  // snippet-context
}  // namespace tuning  // snippet-context
