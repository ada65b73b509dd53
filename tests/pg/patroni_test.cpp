// Contract I6: under a real HA manager (Patroni with etcd, two members,
// synchronous replication), through a plain libpq host list
// (host=127.0.0.1,127.0.0.1 port=P1,P2 target_session_attrs=read-write):
// a planned switchover, the leader's node lost and its return, and a
// partitioned (frozen) leader and its return. In each, callers keep writing
// rows through one gate over one pool; every call ends within its deadline
// and slack, the permits come back, writes resume within a bound after the
// new leader is promoted, and no call reported committed has its row missing
// on the leader at the end (nor has a call reported failed or rejected its
// row there).
//
// Every test here runs a Patroni cluster of its own (patroni_cluster.hpp) and
// is tagged [direct] (the pgbouncer pass would run the same cluster again,
// with nothing of PgBouncer's in the path) and [patroni] (run alone: a
// failover's timing is Patroni's loop and lease, which a busy neighbour
// stretches). Each scenario prints one "patroni: ..." line with its figures
// (docs/cluster.md quotes them).
#include "patroni_cluster.hpp"
#include "pg_helpers.hpp"
#include "pqxx_compat.hpp"

#include "catch.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <typeinfo>
#include <utility>
#include <vector>

using namespace bulkhead_test;
using namespace std::chrono_literals;

namespace {

using patroni_gate = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;
using clock_type = std::chrono::steady_clock;

/// Callers writing at once, each through the one gate (as many permits).
constexpr int callers = 4;
/// Each call's deadline.
constexpr auto call_deadline = 3s;
/// What a call may take beyond its deadline: the pool's deadline_slack
/// (250 ms, the watchdog's) and a lost COMMIT's lookup within it, plus
/// scheduling on a busy machine.
constexpr auto call_slack = 250ms + 1500ms;

/// How one call ended.
enum class outcome { committed, commit_unknown, rejected, failed };

struct call_record {
    int caller = 0;
    int seq = 0;
    outcome how = outcome::failed;
    std::string what;  // the exception's type and message
    clock_type::time_point start;
    clock_type::time_point end;
};

/// The dynamic type of `failure`, demangled.
std::string type_name(const std::exception& failure) {
    int status = 0;
    char* name = abi::__cxa_demangle(typeid(failure).name(), nullptr, nullptr, &status);
    std::string result = status == 0 && name != nullptr ? name : typeid(failure).name();
    std::free(name);  // NOLINT(cppcoreguidelines-no-malloc): __cxa_demangle's buffer
    return result;
}

/// `callers` threads, each inserting rows (scenario, caller, seq) through the
/// gate one call after another until stop(), recording every call.
class write_load {
public:
    write_load(patroni_gate& gate, int scenario) : m_gate(gate), m_scenario(scenario) {
        for (int caller = 0; caller < callers; ++caller) {
            m_threads.emplace_back([this, caller] { run(caller); });
        }
    }
    write_load(const write_load&) = delete;
    write_load& operator=(const write_load&) = delete;
    ~write_load() { stop(); }

    void stop() {
        m_stop = true;
        for (std::thread& thread : m_threads) {
            if (thread.joinable()) {
                thread.join();
            }
        }
    }

    /// Calls committed that ended after `since`.
    [[nodiscard]] int committed_since(clock_type::time_point since) const {
        const std::lock_guard lock(m_mutex);
        return static_cast<int>(std::count_if(m_records.begin(), m_records.end(), [&](const call_record& record) {
            return record.how == outcome::committed && record.end > since;
        }));
    }

    /// Every call so far (all of them once stop() returned).
    [[nodiscard]] std::vector<call_record> records() const {
        const std::lock_guard lock(m_mutex);
        return m_records;
    }

private:
    void run(int caller) {
        for (int seq = 0; !m_stop; ++seq) {
            call_record record;
            record.caller = caller;
            record.seq = seq;
            record.start = clock_type::now();
            try {
                m_gate.transaction(
                    {.queue_wait = 1s, .deadline = record.start + call_deadline}, [&](pqxx::dbtransaction& tx) {
                        exec_no_rows(tx, "INSERT INTO patroni_rows VALUES (" + std::to_string(m_scenario) + ", " +
                                             std::to_string(caller) + ", " + std::to_string(seq) + ")");
                    });
                record.how = outcome::committed;
            } catch (const bulkhead::commit_unknown& unknown) {
                record.how = outcome::commit_unknown;
                record.what = type_name(unknown) + ": " + unknown.what();
            } catch (const bulkhead::rejected& rejected) {
                record.how = outcome::rejected;
                record.what = type_name(rejected) + ": " + rejected.what();
            } catch (const std::exception& failure) {
                record.how = outcome::failed;
                record.what = type_name(failure) + ": " + failure.what();
            }
            record.end = clock_type::now();
            const bool committed = record.how == outcome::committed;
            {
                const std::lock_guard lock(m_mutex);
                m_records.push_back(std::move(record));
            }
            // A client's pause before it tries again; a short one between
            // writes, so that four callers do not keep the server (and the
            // machine that runs Patroni) busy.
            std::this_thread::sleep_for(committed ? 5ms : 50ms);
        }
    }

    patroni_gate& m_gate;
    int m_scenario;
    std::atomic<bool> m_stop{false};
    mutable std::mutex m_mutex;
    std::vector<call_record> m_records;  // guarded by m_mutex
    std::vector<std::thread> m_threads;
};

/// Runs `sql` (no rows) on a connection of its own.
void run_sql(const std::string& conninfo, const std::string& sql) {
    pqxx::connection connection(conninfo);
    pqxx::nontransaction tx(connection);
    tx.exec(sql);
}

/// A pool over the cluster's host list (target_session_attrs=read-write)
/// and a gate of `callers` permits over it: what a service has.
struct service {
    explicit service(const patroni_cluster& cluster)
        : pool(bulkhead::pqxx_pool_options{
              .conninfo = cluster.conninfo() + " target_session_attrs=read-write",
              .max_size = callers,
              .min_idle = 0,
              .connection_timeout = call_deadline,
              .validation_timeout = 1s,
              .application_name = "bulkhead-i6",
          }),
          gate(pool, callers, 0) {}

    bulkhead::pqxx_pool pool;
    patroni_gate gate;
};

/// Waits until `load` has a call committed after `since` and returns when
/// that was seen; FAILs after `bound`.
clock_type::time_point wait_for_commit(const write_load& load, clock_type::time_point since, std::chrono::seconds bound,
                                       const patroni_cluster& cluster) {
    const auto give_up = clock_type::now() + bound;
    while (load.committed_since(since) == 0) {
        if (clock_type::now() > give_up) {
            FAIL("no write committed within " << bound.count() << " s\n" << cluster.logs());
        }
        std::this_thread::sleep_for(20ms);  // polls the callers' records, orders no threads
    }
    return clock_type::now();
}

long long to_ms(clock_type::duration duration) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(duration).count();
}

/// The figures of one scenario, checked and printed.
struct scenario_figures {
    int calls = 0;
    int committed = 0;
    int unknown = 0;
    int rejected = 0;
    int failed = 0;
    long long longest_ms = 0;
    long long promoted_ms = 0;   // fault to the new leader taking writes (0: no failover)
    long long write_gap_ms = 0;  // the longest stretch after the fault with no call committing
    int rows_missing = 0;        // reported committed, row absent
    int rows_unexpected = 0;     // reported rejected or failed, row present
};

/// Checks the calls of `scenario` (`name`) against the rows on the leader:
/// each call within its deadline and slack, the permits back, no row of a
/// call reported committed missing and none of a call reported rejected or
/// failed present, the write gap within `gap_bound`; prints the figures.
scenario_figures check_scenario(const char* name, int scenario, const std::vector<call_record>& records,
                                const service& server, const patroni_cluster& cluster, clock_type::time_point fault,
                                clock_type::time_point promoted, clock_type::duration gap_bound) {
    scenario_figures figures;
    std::set<std::pair<int, int>> present;
    {
        pqxx::connection leader(cluster.member_conninfo(cluster.leader()));
        pqxx::nontransaction tx(leader);
        for (const auto& row :
             tx.exec("SELECT caller, seq FROM patroni_rows WHERE scenario = " + std::to_string(scenario))) {
            present.emplace(row[0].as<int>(), row[1].as<int>());
        }
    }
    std::vector<clock_type::time_point> commits;
    std::string examples;  // one message per kind of failure, for the log
    for (const call_record& record : records) {
        ++figures.calls;
        const auto took = record.end - record.start;
        figures.longest_ms = std::max(figures.longest_ms, to_ms(took));
        if (took > call_deadline + call_slack) {
            FAIL_CHECK(name << ": caller " << record.caller << " call " << record.seq << " took " << to_ms(took)
                            << " ms: " << record.what);
        }
        const bool has_row = present.contains({record.caller, record.seq});
        switch (record.how) {
            case outcome::committed:
                ++figures.committed;
                figures.rows_missing += has_row ? 0 : 1;
                if (record.end > fault) {
                    commits.push_back(record.end);
                }
                break;
            case outcome::commit_unknown:
                ++figures.unknown;
                break;
            case outcome::rejected:
                ++figures.rejected;
                figures.rows_unexpected += has_row ? 1 : 0;
                break;
            case outcome::failed:
                ++figures.failed;
                figures.rows_unexpected += has_row ? 1 : 0;
                break;
        }
        if (record.how != outcome::committed) {
            const std::string kind = record.what.substr(0, record.what.find(':'));
            if (examples.find(kind) == std::string::npos) {
                examples += "\n  " + record.what;
            }
        }
    }
    std::sort(commits.begin(), commits.end());
    auto previous = fault;
    for (const auto commit : commits) {
        figures.write_gap_ms = std::max(figures.write_gap_ms, to_ms(commit - previous));
        previous = commit;
    }
    figures.promoted_ms = promoted > fault ? to_ms(promoted - fault) : 0;

    std::printf(
        "patroni: scenario=%s calls=%d committed=%d unknown=%d rejected=%d failed=%d longest_ms=%lld "
        "promoted_ms=%lld write_gap_ms=%lld rows_missing=%d rows_unexpected=%d\n",
        name, figures.calls, figures.committed, figures.unknown, figures.rejected, figures.failed, figures.longest_ms,
        figures.promoted_ms, figures.write_gap_ms, figures.rows_missing, figures.rows_unexpected);
    std::fflush(stdout);
    INFO(name << ": Patroni " << cluster.patroni_version() << " (" << cluster.dcs() << ", ttl " << cluster.ttl()
              << " s); failures seen:" << examples);
    CHECK(figures.rows_missing == 0);
    CHECK(figures.rows_unexpected == 0);
    CHECK(figures.committed > 0);
    CHECK(to_ms(gap_bound) >= figures.write_gap_ms);
    CHECK(server.gate.available() == callers);
    const bulkhead::gate_stats stats = server.gate.stats();
    CHECK(stats.running == 0);
    CHECK(stats.available == callers);
    return figures;
}

/// The cluster, the scenario table on its leader, and the service over it.
struct patroni_setup {
    patroni_setup() : leader(cluster.leader()) {
        run_sql(cluster.member_conninfo(leader),
                "CREATE TABLE patroni_rows (scenario int, caller int, seq int, PRIMARY KEY (scenario, caller, seq))");
        server = std::make_unique<service>(cluster);
    }
    patroni_cluster cluster;
    std::string leader;
    std::unique_ptr<service> server;
};

/// Lets the callers write for a moment and checks that they do.
void warm_up(const write_load& load, const patroni_cluster& cluster) {
    const auto since = clock_type::now();
    wait_for_commit(load, since - 1h, 30s, cluster);
    std::this_thread::sleep_for(1s);  // steady writing before the fault
    REQUIRE(load.committed_since(since) > 0);
}

}  // namespace

// No ": " in the name: Catch2 v2's console reporter indents a test's name
// after its first ": ", and asserts when that is past its width.
TEST_CASE(
    "[I6] under Patroni (a switchover, the leader's node lost and back, a partitioned leader and back) "
    "calls end by their deadlines, writes resume on the new leader, no committed row is lost",
    "[pg][I6][direct][patroni]") {
    // One cluster for the four scenarios in turn (a cluster takes 5-15 s to
    // start): each begins with a leader and a synchronous standby streaming.
    patroni_setup setup;
    patroni_cluster& cluster = setup.cluster;
    service& server = *setup.server;
    std::string leader = setup.leader;

    {
        write_load load(server.gate, 1);
        warm_up(load, cluster);
        const auto fault = clock_type::now();
        cluster.switchover();
        const std::string new_leader = cluster.wait_for_leader(leader);
        const auto promoted = clock_type::now();
        wait_for_commit(load, promoted, 30s, cluster);
        std::this_thread::sleep_for(1s);  // writes go on on the new leader
        load.stop();

        CHECK(new_leader == patroni_cluster::other(leader));
        // A switchover stops the old leader cleanly and promotes the
        // standby: writes are back within a call's deadline and 2 s of the
        // promotion.
        check_scenario("switchover", 1, load.records(), server, cluster, fault, promoted,
                       (promoted - fault) + call_deadline + 2s);
        leader = new_leader;
        cluster.wait_for_sync_standby();
    }
    {
        write_load load(server.gate, 2);
        warm_up(load, cluster);
        const auto fault = clock_type::now();
        cluster.kill(leader);
        const std::string new_leader = cluster.wait_for_leader(leader);
        const auto promoted = clock_type::now();
        wait_for_commit(load, promoted, 30s, cluster);
        std::this_thread::sleep_for(1s);
        load.stop();

        CHECK(new_leader == patroni_cluster::other(leader));
        // The lost leader's lease runs out (ttl), the synchronous standby is
        // promoted; the kernel reset the callers' connections, so new ones
        // pass over the dead first host at once.
        const auto figures = check_scenario("leader_lost", 2, load.records(), server, cluster, fault, promoted,
                                            (promoted - fault) + call_deadline + 2s);
        CHECK(figures.promoted_ms <= (cluster.ttl() + 10) * 1000LL);
    }
    {
        // The lost node comes back: its Patroni rewinds it onto the new
        // leader's timeline and it streams again, as the synchronous standby.
        const std::string lost = leader;
        leader = patroni_cluster::other(lost);
        write_load load(server.gate, 3);
        warm_up(load, cluster);
        const auto fault = clock_type::now();
        cluster.restart(lost);
        cluster.wait_for_sync_standby();
        std::this_thread::sleep_for(1s);
        load.stop();
        // Nothing fails over: writes go on throughout (a COMMIT waits for
        // the standby once it is the synchronous one).
        check_scenario("rejoin", 3, load.records(), server, cluster, fault, fault, call_deadline + 2s);
        CHECK(cluster.leader() == leader);
    }
    {
        write_load load(server.gate, 4);
        warm_up(load, cluster);
        // The leader's node stops answering: Patroni, postmaster and
        // backends frozen. The callers' connections to it stay open and
        // silent, its lease runs out, the synchronous standby is promoted.
        const auto fault = clock_type::now();
        cluster.freeze(leader);
        const std::string new_leader = cluster.wait_for_leader(leader);
        const auto promoted = clock_type::now();
        wait_for_commit(load, promoted, 30s, cluster);
        std::this_thread::sleep_for(1s);

        // The partition heals: the old leader's Patroni finds the lock
        // taken, demotes it, and it follows the new leader as its
        // synchronous standby.
        cluster.thaw(leader);
        cluster.wait_for_sync_standby();
        std::this_thread::sleep_for(1s);
        load.stop();

        CHECK(new_leader == patroni_cluster::other(leader));
        CHECK(cluster.leader() == new_leader);
        // Writes are back once the standby is promoted, the calls held by
        // the frozen leader have ended (by their deadline), and a new
        // connection has passed over the frozen host (libpq's
        // connect_timeout, 2-3 s) to the new leader.
        const auto figures = check_scenario("partition", 4, load.records(), server, cluster, fault, promoted,
                                            (promoted - fault) + 2 * call_deadline + 2s);
        CHECK(figures.promoted_ms <= (cluster.ttl() + 10) * 1000LL);
    }
}
