// Stress and fault injection: hundreds of threads through one gate over the
// real pqxx_pool, each call picking at random how it ends, for a fixed time.
//
// Two test cases:
//   - "[stress] ... mixed outcomes": the suite's server, no faults. Checked
//     throughout (a sampler thread, a server-side monitor) and at the end:
//     never more than B callbacks run, never more than B + Q calls inside,
//     at most Q queued, every call ends in exactly one outcome of the kinds
//     its choice allows, exactly the calls reported committed left a row,
//     permits and pool back to full, no session left `idle in transaction`.
//   - "[stress][faults] ...": a private cluster of the test's own, with
//     backends terminated at random, connections refused (the server filled
//     to max_connections by outside clients) and the server restarted
//     (pg_ctl stop -m fast, then start), while the same load runs. After each
//     fault the gate and the pool must recover by themselves; the time from
//     the end of the fault until the first successful call that started after
//     it is printed ("stress: fault ...") and bounded.
//
// Duration: BULKHEAD_STRESS_SECONDS (default BULKHEAD_STRESS_DEFAULT_SECONDS,
// shorter under the sanitizers); threads: BULKHEAD_STRESS_THREADS (200). The
// fault test repeats its cycle of faults until the duration has passed (at
// least once). Figures are printed on stdout, one line each, starting with
// "stress:" (ctest keeps them in Testing/Temporary/LastTest.log).
#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include "catch.hpp"

#include "pg_test_database.hpp"
#include "pqxx_compat.hpp"
#include "test_util.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#ifndef BULKHEAD_STRESS_DEFAULT_SECONDS
#define BULKHEAD_STRESS_DEFAULT_SECONDS 15
#endif

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using gate_t = bulkhead::db_bulkhead<bulkhead::pqxx_pool>;

namespace {

// ---------------------------------------------------------------------------
// What a call chooses, and how it can end
// ---------------------------------------------------------------------------

enum class choice : std::uint8_t {
    succeed,            // insert a row, return it: commits
    throw_exception,    // insert a row, then throw a non-std exception
    sql_error,          // insert a row, then SELECT 1/0 (22012)
    statement_timeout,  // statement_timeout 20 ms, then pg_sleep(0.3) (57014)
    stop_waiting,       // a stop requested 0-3 ms after the call began (usually while queued)
    stop_working,       // a stop requested 5-25 ms after the callback began, during pg_sleep(0.3)
    queue_timeout,      // a queue wait of 0-1 ms
    commit_failure,     // a deferred foreign key that fails at COMMIT (23503)
    leave_session,      // a session advisory lock and SET statement_timeout = 250, then commit: the next
                        // borrower must see neither (a leak fails its calls with 57014 or 55P03)
    end_block,          // COMMIT from the callback, then its insert: refused (logic_error), nothing inserted
    deadline_work,      // a deadline 250 ms (+ the expected queue wait) away, a pg_sleep 200 ms past it: cut short
};
constexpr std::size_t choice_count = 11;
constexpr std::array<std::string_view, choice_count> choice_names{
    "succeed",       "throw",          "sql_error",     "statement_timeout", "stop_waiting", "stop_working",
    "queue_timeout", "commit_failure", "leave_session", "end_block",         "deadline_work"};

enum class outcome : std::uint8_t {
    ok,
    callback_exception,  // the callback's own exception, unchanged
    sql_22012,           // division by zero
    sql_57014,           // statement cancelled by statement_timeout
    sql_23503,           // the deferred foreign key at COMMIT
    sql_other,           // any other SQLSTATE (faults: 57P01 admin shutdown, ...)
    admission_full,
    admission_timeout,
    admission_cancelled,
    pool_timeout,
    deadline_exceeded,
    work_cancelled,
    work_deadline_exceeded,
    commit_unknown,
    broken_connection,  // pqxx::broken_connection (faults)
    in_doubt,           // pqxx::in_doubt_error: must never reach the caller (the pool settles it)
    other_std_exception,
    unknown_exception,
    misuse,  // std::logic_error: the callback ended the transaction block itself
};
constexpr std::size_t outcome_count = 19;
constexpr std::array<std::string_view, outcome_count> outcome_names{"ok",
                                                                    "callback_exception",
                                                                    "sql_22012",
                                                                    "sql_57014",
                                                                    "sql_23503",
                                                                    "sql_other",
                                                                    "admission_full",
                                                                    "admission_timeout",
                                                                    "admission_cancelled",
                                                                    "pool_timeout",
                                                                    "deadline_exceeded",
                                                                    "work_cancelled",
                                                                    "work_deadline_exceeded",
                                                                    "commit_unknown",
                                                                    "broken_connection",
                                                                    "in_doubt",
                                                                    "other_std_exception",
                                                                    "unknown_exception",
                                                                    "misuse"};

constexpr bool is_rejection(outcome result) {
    return result == outcome::admission_full || result == outcome::admission_timeout ||
           result == outcome::admission_cancelled || result == outcome::pool_timeout ||
           result == outcome::deadline_exceeded;
}

/// Outcomes that only a fault on the server explains.
constexpr bool is_fault_outcome(outcome result) {
    return result == outcome::pool_timeout || result == outcome::broken_connection ||
           result == outcome::commit_unknown || result == outcome::sql_other;
}

/// Whether `result` is a legitimate end for a call that chose `kind`. With
/// faults, a lost connection can end any call.
bool allowed(choice kind, outcome result, bool faults) {
    if (kind == choice::deadline_work) {
        // Cut short while it worked, or still waiting (for a permit, or for a
        // connection when faults refuse them) when the deadline came.
        return result == outcome::work_deadline_exceeded || result == outcome::deadline_exceeded ||
               result == outcome::admission_full || (faults && is_fault_outcome(result));
    }
    if (result == outcome::in_doubt || result == outcome::unknown_exception || result == outcome::other_std_exception ||
        result == outcome::deadline_exceeded || result == outcome::work_deadline_exceeded ||
        (result == outcome::misuse && kind != choice::end_block)) {
        return false;  // only deadline_work has a deadline; in_doubt must be settled by the pool
    }
    if (is_fault_outcome(result)) {
        return faults;
    }
    if (is_rejection(result) && result != outcome::admission_cancelled) {
        return true;  // full or timed out: possible for every call under this load
    }
    switch (kind) {
        case choice::succeed:
            return result == outcome::ok;
        case choice::throw_exception:
            return result == outcome::callback_exception;
        case choice::sql_error:
            return result == outcome::sql_22012;
        case choice::statement_timeout:
            return result == outcome::sql_57014;
        case choice::stop_waiting:
            // Queued or working when the stop came; or done before it (a slow
            // stopper thread under a sanitizer).
            return result == outcome::admission_cancelled || result == outcome::work_cancelled || result == outcome::ok;
        case choice::stop_working:
            // The stop is requested from the callback: never while queued.
            return result == outcome::work_cancelled || result == outcome::ok;
        case choice::queue_timeout:
            return result == outcome::ok;
        case choice::commit_failure:
            return result == outcome::sql_23503;
        case choice::leave_session:
            // Its own COMMIT runs under the 250 ms it set: a backend frozen
            // at that moment (a fault) makes it 57014.
            return result == outcome::ok || (faults && result == outcome::sql_57014);
        case choice::end_block:
            return result == outcome::misuse;
        case choice::deadline_work:
            return false;  // handled above
    }
    return false;
}

/// A non-std exception type thrown by callbacks.
struct callback_failure {
    int thread;
};

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

int env_int(const char* name, int fallback) {
    // Read on the test's thread before any other starts; nothing calls setenv.
    const char* text = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
    if (text == nullptr || *text == '\0') {
        return fallback;
    }
    return std::max(1, std::atoi(text));
}

std::string unique_name(std::string_view what) {
    return "bh_stress_" + std::string(what) + "_" + std::to_string(::getpid());
}

// ---------------------------------------------------------------------------
// The stopper: requests stops at given times, from its own thread
// ---------------------------------------------------------------------------

class stopper {
public:
    stopper() : m_thread([this] { run(); }) {}
    stopper(const stopper&) = delete;
    stopper& operator=(const stopper&) = delete;
    ~stopper() {
        {
            const std::lock_guard lock(m_mutex);
            m_closing = true;
        }
        m_wake.notify_one();
        m_thread.join();
    }

    /// Requests `source`'s stop at `when` (a copy of a stop_source shares its state).
    void schedule(std::stop_source source, steady::time_point when) {
        {
            const std::lock_guard lock(m_mutex);
            m_due.push(entry{when, std::move(source)});
        }
        m_wake.notify_one();
    }

private:
    struct entry {
        steady::time_point when;
        std::stop_source source;
        bool operator>(const entry& other) const { return when > other.when; }
    };

    void run() {
        std::unique_lock lock(m_mutex);
        while (!m_closing || !m_due.empty()) {
            if (m_due.empty()) {
                m_wake.wait(lock);
                continue;
            }
            // A copy: the wait lets go of the mutex, and a push may move the heap.
            const steady::time_point when = m_due.top().when;
            if (steady::now() < when && !m_closing) {
                m_wake.wait_until(lock, when);
                continue;
            }
            entry next = m_due.top();
            m_due.pop();
            lock.unlock();
            next.source.request_stop();  // runs the gate's stop callbacks here
            lock.lock();
        }
    }

    std::mutex m_mutex;
    std::condition_variable m_wake;
    std::priority_queue<entry, std::vector<entry>, std::greater<>> m_due;  // guarded by m_mutex
    bool m_closing = false;                                                // guarded by m_mutex
    std::thread m_thread;
};

// ---------------------------------------------------------------------------
// The load
// ---------------------------------------------------------------------------

struct load_settings {
    std::string conninfo;
    std::string application_name;
    std::string calls_table;  // (kind int): one row per call, inserted first
    std::string child_table;  // (parent int REFERENCES ... DEFERRABLE INITIALLY DEFERRED)
    int concurrent = 8;       // B
    int extra_slots = 24;     // Q
    std::size_t pool_size = 8;
    std::chrono::milliseconds connection_timeout{5000};
    int threads = 200;
    bool faults = false;
};

/// Everything the load counts. Counters are atomics updated by 200 threads;
/// they are read after the threads joined (or as snapshots by the sampler).
struct load_counts {
    std::atomic<long> calls{0};
    std::array<std::array<std::atomic<long>, outcome_count>, choice_count> by_choice{};
    std::atomic<long> unexpected{0};
    std::mutex examples_mutex;
    std::vector<std::string> examples;  // guarded by examples_mutex: the first unexpected outcomes

    std::atomic<int> running{0};  // callbacks running now
    std::atomic<int> most_running{0};
    std::atomic<int> most_inside{0};   // B + Q - available_slots(), sampled
    std::atomic<int> most_waiting{0};  // waiting(), sampled
    std::atomic<long> samples{0};
    std::atomic<long> bound_violations{0};
    std::atomic<long> server_samples{0};
    std::atomic<long> most_server_busy{0};
    std::atomic<bool> end_calls{false};  // set when the fault injector is done

    // Recovery: the earliest completion of a successful call that started
    // at or after `fault_end_ns` (steady_clock nanoseconds since epoch).
    std::atomic<std::int64_t> fault_end_ns{std::numeric_limits<std::int64_t>::max()};
    std::atomic<std::int64_t> first_ok_after_ns{std::numeric_limits<std::int64_t>::max()};
    // ... and of any successful call that completed after it (it may have
    // started, and queued, before).
    std::atomic<std::int64_t> first_ok_any_ns{std::numeric_limits<std::int64_t>::max()};

    [[nodiscard]] long total(outcome result) const {
        long sum = 0;
        for (const auto& row : by_choice) {
            sum += row[static_cast<std::size_t>(result)].load();
        }
        return sum;
    }
    [[nodiscard]] long outcomes() const {
        long sum = 0;
        for (const auto& row : by_choice) {
            for (const auto& cell : row) {
                sum += cell.load();
            }
        }
        return sum;
    }
    [[nodiscard]] long count(choice kind, outcome result) const {
        return by_choice[static_cast<std::size_t>(kind)][static_cast<std::size_t>(result)].load();
    }
};

std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch()).count();
}

/// Keeps `counts.running` right on every exit of a callback.
class running_scope {
public:
    explicit running_scope(load_counts& counts) : m_counts(counts) {
        const int now = ++m_counts.running;
        bulkhead_test::raise_max(m_counts.most_running, now);
    }
    running_scope(const running_scope&) = delete;
    running_scope& operator=(const running_scope&) = delete;
    ~running_scope() { --m_counts.running; }

private:
    load_counts& m_counts;
};

/// One thread's calls until `until`.
class caller {
public:
    caller(int id, gate_t& gate, const load_settings& settings, load_counts& counts, stopper& stops)
        : m_id(id),
          m_gate(gate),
          m_settings(settings),
          m_counts(counts),
          m_stops(stops),
          m_random(static_cast<unsigned>(id) * 7919U + static_cast<unsigned>(::getpid())) {}

    void run(steady::time_point until) {
        while (steady::now() < until && !m_counts.end_calls.load()) {
            const auto kind = static_cast<choice>(m_random() % choice_count);
            const std::int64_t started = now_ns();
            ++m_counts.calls;
            std::string detail;
            const outcome result = call(kind, detail);
            record(kind, result, detail, started);
            if (result == outcome::admission_full || result == outcome::pool_timeout) {
                // A client backing off (5-25 ms). Keeps 200 threads from
                // spinning on 2 cores, where they would starve the calls that
                // were admitted (and, under a sanitizer, the server).
                std::this_thread::sleep_for(std::chrono::milliseconds(5 + m_random() % 21));
            }
        }
    }

private:
    outcome call(choice kind, std::string& detail) {
        gate_t::options options{.queue_wait = 500ms};
        std::stop_source source;
        switch (kind) {
            case choice::statement_timeout:
                options.transaction.statement_timeout = 20ms;
                break;
            case choice::stop_waiting:
                options.queue_wait = 2s;
                options.stop = source.get_token();
                m_stops.schedule(source, steady::now() + std::chrono::microseconds(m_random() % 3000));
                break;
            case choice::stop_working:
                // The stop is scheduled by the callback once it runs (below):
                // timed from the call's start, it fell while the call was
                // still queued whenever the queue was long, and on a fast
                // machine no call of this kind was stopped while working.
                options.queue_wait = 2s;
                options.stop = source.get_token();
                break;
            case choice::queue_timeout:
                options.queue_wait = std::chrono::microseconds(m_random() % 1000);
                break;
            case choice::deadline_work:
                // 250 ms of work time; for half of the calls plus the gate's
                // expected queue wait, so that they pass its early refusal
                // (G8) and are cut while they work, however long the queue
                // (a fixed 100 ms once let none through under a sanitizer on
                // a slow machine). The other half meet the early refusal as
                // the queue allows. The callback sleeps past the deadline.
                // The queue wait outlasts the deadline: the deadline ends
                // the wait, never the queue wait.
                options.queue_wait = 2s;
                options.deadline = steady::now() + 250ms;
                if ((m_random() & 1U) != 0U) {
                    options.deadline += std::min<std::chrono::nanoseconds>(m_gate.expected_queue_wait(), 1500ms);
                }
                break;
            default:
                break;
        }
        const std::string insert =
            "INSERT INTO " + m_settings.calls_table + " (kind) VALUES (" + std::to_string(static_cast<int>(kind)) + ")";
        auto work = [&](pqxx::dbtransaction& tx) -> int {
            const running_scope scope(m_counts);
            if (kind == choice::stop_working) {
                m_stops.schedule(source, steady::now() + std::chrono::milliseconds(5 + m_random() % 20));
            }
            if (kind == choice::end_block) {
                tx.exec("COMMIT");  // ends the gate's transaction block: from here nothing may reach the server
            }
            bulkhead_test::exec_no_rows(tx, insert);
            switch (kind) {
                case choice::throw_exception:
                    throw callback_failure{m_id};
                case choice::sql_error:
                    tx.exec("SELECT 1/0");
                    break;
                case choice::statement_timeout:
                case choice::stop_working:
                    tx.exec("SELECT pg_sleep(0.3)");
                    break;
                case choice::commit_failure:
                    bulkhead_test::exec_no_rows(tx, "INSERT INTO " + m_settings.child_table + " (parent) VALUES (-1)");
                    break;
                case choice::leave_session:
                    // Session-level state the pool must reset before the next borrower.
                    tx.exec("SET LOCAL lock_timeout = '1s'");
                    tx.exec("SELECT pg_advisory_lock(77)");
                    // Last: it applies to this session from here on (COMMIT included). A
                    // leak would fail the next borrower's pg_sleep(0.3) with 57014.
                    tx.exec("SET statement_timeout = 250");
                    break;
                case choice::deadline_work: {
                    // 200 ms past the deadline: only the deadline ends it.
                    const auto left = std::chrono::duration<double>(options.deadline - steady::now()).count();
                    tx.exec("SELECT pg_sleep(" + std::to_string(std::max(0.0, left) + 0.2) + ")");
                    break;
                }
                default:
                    tx.exec("SELECT pg_sleep(0.001)");
                    break;
            }
            return m_id;
        };
        try {
            // Half of the plain calls go through the non-throwing entry point.
            if (kind == choice::succeed && (m_random() & 1U) != 0U) {
                auto answer = m_gate.try_transaction(options, work);
                if (!answer) {
                    return from_reason(answer.error());
                }
                return *answer == m_id ? outcome::ok : outcome::other_std_exception;
            }
            return m_gate.transaction(options, work) == m_id ? outcome::ok : outcome::other_std_exception;
        } catch (const callback_failure& failure) {
            return failure.thread == m_id ? outcome::callback_exception : outcome::unknown_exception;
        } catch (const bulkhead::rejected& rejection) {
            return from_reason(rejection.reason());
        } catch (const bulkhead::work_cancelled&) {
            return outcome::work_cancelled;
        } catch (const bulkhead::work_deadline_exceeded&) {
            return outcome::work_deadline_exceeded;
        } catch (const bulkhead::commit_unknown&) {
            return outcome::commit_unknown;
        } catch (const pqxx::in_doubt_error& failure) {
            detail = failure.what();
            return outcome::in_doubt;
        } catch (const pqxx::broken_connection& failure) {
            detail = failure.what();
            return outcome::broken_connection;
        } catch (const pqxx::sql_error& failure) {
            const std::string& state = failure.sqlstate();
            if (state == "22012") {
                return outcome::sql_22012;
            }
            if (state == "57014") {
                detail = failure.what();  // which cancel: the timeout's, or a request's
                return outcome::sql_57014;
            }
            if (state == "23503") {
                return outcome::sql_23503;
            }
            detail = state + ": " + failure.what();
            return outcome::sql_other;
        } catch (const std::logic_error& failure) {
            detail = failure.what();
            return outcome::misuse;
        } catch (const std::exception& failure) {
            detail = failure.what();
            return outcome::other_std_exception;
        } catch (...) {
            return outcome::unknown_exception;
        }
    }

    static void lower_to(std::atomic<std::int64_t>& least, std::int64_t value) {
        std::int64_t seen = least.load();
        while (value < seen && !least.compare_exchange_weak(seen, value)) {
        }
    }

    static outcome from_reason(bulkhead::reject_reason reason) {
        switch (reason) {
            case bulkhead::reject_reason::admission_full:
                return outcome::admission_full;
            case bulkhead::reject_reason::admission_timeout:
                return outcome::admission_timeout;
            case bulkhead::reject_reason::admission_cancelled:
                return outcome::admission_cancelled;
            case bulkhead::reject_reason::pool_timeout:
                return outcome::pool_timeout;
            case bulkhead::reject_reason::deadline_exceeded:
                return outcome::deadline_exceeded;
            case bulkhead::reject_reason::closed:
                break;  // the stress never closes its gate
        }
        return outcome::unknown_exception;
    }

    void record(choice kind, outcome result, const std::string& detail, std::int64_t started) {
        ++m_counts.by_choice[static_cast<std::size_t>(kind)][static_cast<std::size_t>(result)];
        if (result == outcome::ok) {
            const std::int64_t fault_end = m_counts.fault_end_ns.load();
            const std::int64_t done = now_ns();
            if (done >= fault_end) {
                lower_to(m_counts.first_ok_any_ns, done);
            }
            if (started >= fault_end) {
                lower_to(m_counts.first_ok_after_ns, done);
            }
        }
        if (!allowed(kind, result, m_settings.faults)) {
            ++m_counts.unexpected;
            const std::lock_guard lock(m_counts.examples_mutex);
            if (m_counts.examples.size() < 10) {
                m_counts.examples.push_back(std::string(choice_names[static_cast<std::size_t>(kind)]) + " -> " +
                                            std::string(outcome_names[static_cast<std::size_t>(result)]) + " after " +
                                            std::to_string((now_ns() - started) / 1000000) + " ms" +
                                            (detail.empty() ? "" : " (" + bulkhead::redact_conninfo(detail) + ")"));
            }
        }
    }

    int m_id;
    gate_t& m_gate;
    const load_settings& m_settings;
    load_counts& m_counts;
    stopper& m_stops;
    std::minstd_rand m_random;
};

/// Samples the gate and the pool while the load runs: the bounds must hold in
/// every sample.
void sample_bounds(const gate_t& gate, const bulkhead::pqxx_pool& pool, const load_settings& settings,
                   load_counts& counts, const std::atomic<bool>& done) {
    const int concurrent = settings.concurrent;
    const int extra = settings.extra_slots;
    while (!done.load()) {
        const int running = counts.running.load();
        const int available = gate.available();
        const int slots = gate.available_slots();
        const int waiting = gate.waiting();
        const std::size_t in_use = pool.in_use();
        const std::size_t size = pool.size();
        const int inside = concurrent + extra - slots;
        bulkhead_test::raise_max(counts.most_inside, inside);
        bulkhead_test::raise_max(counts.most_waiting, waiting);
        if (running > concurrent || running < 0 || available < 0 || available > concurrent || slots < 0 ||
            slots > concurrent + extra || waiting < 0 || waiting > extra || in_use > settings.pool_size ||
            size > settings.pool_size) {
            ++counts.bound_violations;
            std::printf("stress: BOUND VIOLATED running=%d available=%d slots=%d waiting=%d in_use=%zu size=%zu\n",
                        running, available, slots, waiting, in_use, size);
        }
        ++counts.samples;
        std::this_thread::sleep_for(200us);
    }
}

/// Counts the pool's busy sessions on the server ('active' or inside a
/// transaction) every 100 ms: never more than B. Tolerates a lost connection
/// (faults): it reconnects on the next round.
void sample_server(const load_settings& settings, load_counts& counts, const std::atomic<bool>& done) {
    std::unique_ptr<pqxx::connection> monitor;
    while (!done.load()) {
        try {
            if (!monitor) {
                monitor = std::make_unique<pqxx::connection>(settings.conninfo);
            }
            pqxx::nontransaction tx(*monitor);
            const long busy =
                bulkhead_test::exec_one_row(tx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = " +
                                                    tx.quote(settings.application_name) +
                                                    " AND state IN ('active', 'idle in transaction', "
                                                    "'idle in transaction (aborted)')")[0]
                    .as<long>();
            bulkhead_test::raise_max(counts.most_server_busy, busy);
            ++counts.server_samples;
        } catch (const std::exception&) {
            monitor.reset();  // the server went away (a fault); try again later
        }
        std::this_thread::sleep_for(100ms);
    }
}

/// Runs `threads` callers through `gate` until `until`, with the samplers.
/// `during` runs on the test's thread meanwhile (the fault injector), and
/// must return by `until`.
void run_load(gate_t& gate, bulkhead::pqxx_pool& pool, const load_settings& settings, load_counts& counts,
              steady::time_point until, const std::function<void()>& during) {
    std::atomic<bool> done{false};
    std::atomic<int> finished{0};
    stopper stops;
    std::thread bounds([&] { sample_bounds(gate, pool, settings, counts, done); });
    std::thread server([&] { sample_server(settings, counts, done); });
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(settings.threads));
    for (int id = 0; id < settings.threads; ++id) {
        threads.emplace_back([&, id] {
            caller(id, gate, settings, counts, stops).run(until);
            ++finished;
        });
    }
    std::exception_ptr failure;
    if (during) {
        try {
            during();
        } catch (...) {  // a failed check or a fault that could not be injected: end the load first
            failure = std::current_exception();
        }
        counts.end_calls = true;
    }
    // Every call must end: a call still running 60 s after the end is a hang.
    const auto give_up = until + 60s;
    while (finished.load() < settings.threads) {
        if (steady::now() > give_up) {
            std::printf(
                "stress: HANG: %d of %d threads still inside a call; available=%d slots=%d waiting=%d "
                "pool in_use=%zu waiting=%zu\n",
                settings.threads - finished.load(), settings.threads, gate.available(), gate.available_slots(),
                gate.waiting(), pool.in_use(), pool.waiting());
            std::fflush(stdout);
            std::abort();
        }
        std::this_thread::sleep_for(10ms);
    }
    for (auto& thread : threads) {
        thread.join();
    }
    done = true;
    bounds.join();
    server.join();
    if (failure) {
        std::rethrow_exception(failure);
    }
}

/// Appends " name=count" to `line`. Appended piece by piece: g++ 12 at -O2
/// and above warns (-Wrestrict, a false positive inside std::string,
/// GCC bug 105651) on `" " + std::string(name) + ...`.
void append_count(std::string& line, std::string_view name, long count) {
    line.append(" ").append(name).append("=").append(std::to_string(count));
}

void print_counts(std::string_view label, const load_counts& counts, double seconds) {
    std::printf("stress: %.*s: %ld calls in %.1f s (%.0f/s), bound samples %ld, server samples %ld\n",
                static_cast<int>(label.size()), label.data(), counts.calls.load(), seconds,
                static_cast<double>(counts.calls.load()) / seconds, counts.samples.load(),
                counts.server_samples.load());
    std::printf(
        "stress: %.*s: most running callbacks %d, most inside %d, most queued %d, most busy server sessions "
        "%ld\n",
        static_cast<int>(label.size()), label.data(), counts.most_running.load(), counts.most_inside.load(),
        counts.most_waiting.load(), counts.most_server_busy.load());
    std::string line;
    for (std::size_t result = 0; result < outcome_count; ++result) {
        const long total = counts.total(static_cast<outcome>(result));
        if (total != 0) {
            append_count(line, outcome_names[result], total);
        }
    }
    std::printf("stress: %.*s: outcomes:%s\n", static_cast<int>(label.size()), label.data(), line.c_str());
    for (std::size_t kind = 0; kind < choice_count; ++kind) {
        std::string row;
        long calls = 0;
        for (std::size_t result = 0; result < outcome_count; ++result) {
            const long n = counts.by_choice[kind][result].load();
            calls += n;
            if (n != 0) {
                append_count(row, outcome_names[result], n);
            }
        }
        std::printf("stress: %.*s:   %-17.*s %6ld:%s\n", static_cast<int>(label.size()), label.data(),
                    static_cast<int>(choice_names[kind].size()), choice_names[kind].data(), calls, row.c_str());
    }
    std::fflush(stdout);
}

/// The tables the load writes: one row per call (inserted first in every
/// callback), and a child with a deferred foreign key for commit failures.
void create_tables(const std::string& conninfo, const load_settings& settings) {
    pqxx::connection connection(conninfo);
    pqxx::work tx(connection);
    bulkhead_test::exec_no_rows(tx, "DROP TABLE IF EXISTS " + settings.child_table);
    bulkhead_test::exec_no_rows(tx, "DROP TABLE IF EXISTS " + settings.calls_table);
    bulkhead_test::exec_no_rows(tx, "DROP TABLE IF EXISTS " + settings.child_table + "_parent");
    bulkhead_test::exec_no_rows(
        tx, "CREATE TABLE " + settings.calls_table + " (id bigserial PRIMARY KEY, kind int NOT NULL)");
    bulkhead_test::exec_no_rows(tx, "CREATE TABLE " + settings.child_table + "_parent (id int PRIMARY KEY)");
    bulkhead_test::exec_no_rows(tx, "CREATE TABLE " + settings.child_table +
                                        " (id bigserial PRIMARY KEY, parent int REFERENCES " + settings.child_table +
                                        "_parent(id) DEFERRABLE INITIALLY DEFERRED)");
    tx.commit();
}

void drop_tables(const std::string& conninfo, const load_settings& settings) {
    try {
        pqxx::connection connection(conninfo);
        pqxx::work tx(connection);
        bulkhead_test::exec_no_rows(tx, "DROP TABLE IF EXISTS " + settings.child_table);
        bulkhead_test::exec_no_rows(tx, "DROP TABLE IF EXISTS " + settings.calls_table);
        bulkhead_test::exec_no_rows(tx, "DROP TABLE IF EXISTS " + settings.child_table + "_parent");
        tx.commit();
    } catch (...) {  // best effort: the next run drops them first
    }
}

/// Rows in the calls table per choice.
std::array<long, choice_count> rows_by_choice(const std::string& conninfo, const load_settings& settings) {
    std::array<long, choice_count> rows{};
    pqxx::connection connection(conninfo);
    pqxx::nontransaction tx(connection);
    for (const auto& row : tx.exec("SELECT kind, count(*) FROM " + settings.calls_table + " GROUP BY kind")) {
        rows.at(row[0].as<std::size_t>()) = row[1].as<long>();
    }
    return rows;
}

/// Sessions of the pool on the server in states other than plain 'idle'.
long unfinished_sessions(const std::string& conninfo, const std::string& application_name, const std::string& states) {
    pqxx::connection connection(conninfo);
    pqxx::nontransaction tx(connection);
    return bulkhead_test::exec_one_row(tx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = " +
                                               tx.quote(application_name) + " AND state IN (" + states + ")")[0]
        .as<long>();
}

/// Checks what must hold once the load has stopped.
void check_back_to_full(gate_t& gate, bulkhead::pqxx_pool& pool, const load_settings& settings,
                        const load_counts& counts) {
    INFO("first unexpected outcomes: " << [&] {
        std::string all;
        for (const auto& each : counts.examples) {
            all += "\n  " + each;
        }
        return all;
    }());
    CHECK(counts.unexpected.load() == 0);
    // Every call ended in exactly one outcome.
    CHECK(counts.outcomes() == counts.calls.load());
    CHECK(counts.calls.load() > 0);
    CHECK(counts.bound_violations.load() == 0);
    CHECK(counts.most_running.load() <= settings.concurrent);
    CHECK(counts.most_inside.load() <= settings.concurrent + settings.extra_slots);
    CHECK(counts.most_waiting.load() <= settings.extra_slots);
    // With faults, a backend frozen mid-statement whose connection the pool's
    // watchdog cut off still counts as active on the server until it runs
    // again and notices: the server may then see more than B at once, the
    // gate never does (most_running above).
    if (!settings.faults) {
        CHECK(counts.most_server_busy.load() <= settings.concurrent);
    }
    CHECK(counts.total(outcome::in_doubt) == 0);
    // Permits and pool back to full.
    CHECK(gate.available() == settings.concurrent);
    CHECK(gate.available_slots() == settings.concurrent + settings.extra_slots);
    CHECK(gate.waiting() == 0);
    CHECK(pool.in_use() == 0);
    CHECK(pool.waiting() == 0);
    CHECK(pool.size() <= settings.pool_size);
    // No session left inside a transaction, none still running a statement.
    // (A cancelled pg_sleep may take a moment to leave 'active'.)
    const auto give_up = steady::now() + 5s;
    long unfinished = 0;
    do {
        unfinished = unfinished_sessions(settings.conninfo, settings.application_name,
                                         "'active', 'idle in transaction', 'idle in transaction (aborted)'");
        if (unfinished == 0) {
            break;
        }
        std::this_thread::sleep_for(50ms);
    } while (steady::now() < give_up);
    CHECK(unfinished == 0);
    // And it still works.
    CHECK(gate.transaction(5s, [](pqxx::dbtransaction& tx) {
        return bulkhead_test::exec_one_row(tx, "SELECT 42")[0].as<int>();
    }) == 42);
    CHECK(gate.available() == settings.concurrent);
    CHECK(pool.in_use() == 0);
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

/// Terminates every server session of `application_name`; returns how many.
long terminate_sessions(pqxx::connection& monitor, const std::string& application_name) {
    pqxx::nontransaction tx(monitor);
    return bulkhead_test::exec_one_row(
               tx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = " +
                       tx.quote(application_name))[0]
        .as<long>();
}

/// Opens outside connections until the server refuses them for `settle`
/// in a row (slots freed by terminated sessions are taken as they free up).
/// Returns the refusal message seen.
std::string fill_server(const std::string& conninfo, std::vector<std::unique_ptr<pqxx::connection>>& fillers,
                        std::chrono::milliseconds settle) {
    std::string refusal;
    auto refused_since = steady::time_point::max();
    const auto give_up = steady::now() + 10s;
    while (steady::now() < give_up && fillers.size() < 400) {
        try {
            fillers.push_back(std::make_unique<pqxx::connection>(conninfo + " application_name=bh_stress_filler"));
            refused_since = steady::time_point::max();
        } catch (const pqxx::broken_connection& failure) {
            refusal = bulkhead::redact_conninfo(failure.what());
            if (refused_since == steady::time_point::max()) {
                refused_since = steady::now();
            }
            if (steady::now() - refused_since >= settle) {
                break;
            }
            std::this_thread::sleep_for(10ms);
        }
    }
    return refusal;
}

struct fault_figure {
    std::string name;
    double fault_ms = 0;     // how long the fault lasted
    double recovery_ms = 0;  // end of the fault to the first successful call that started after it
    double first_ok_ms = 0;  // end of the fault to the first successful call of any (it may have queued before)
};

/// Marks the end of a fault now, waits until a call that started afterwards
/// succeeded (or `limit` passed), and fills in the recovery times in ms
/// (negative when it did not recover in time).
void await_recovery(load_counts& counts, std::chrono::milliseconds limit, fault_figure& figure) {
    constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();
    counts.first_ok_after_ns = never;
    counts.first_ok_any_ns = never;
    const std::int64_t end = now_ns();
    counts.fault_end_ns = end;
    const auto give_up = steady::now() + limit;
    while (counts.first_ok_after_ns.load() == never && steady::now() < give_up) {
        std::this_thread::sleep_for(1ms);
    }
    const std::int64_t after = counts.first_ok_after_ns.load();
    const std::int64_t any = counts.first_ok_any_ns.load();
    counts.fault_end_ns = never;
    figure.recovery_ms = after == never ? -1 : static_cast<double>(after - end) / 1e6;
    figure.first_ok_ms = any == never ? -1 : static_cast<double>(any - end) / 1e6;
}

}  // namespace

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

TEST_CASE("[A9] [A11] [C9] [C10] hundreds of threads through one gate over the real pool, every way a call can end",
          "[pg][stress][mixed]") {
    const int seconds = env_int("BULKHEAD_STRESS_SECONDS", BULKHEAD_STRESS_DEFAULT_SECONDS);
    load_settings settings;
    settings.conninfo = bulkhead_test::conninfo();
    settings.application_name = unique_name("mixed");
    settings.calls_table = unique_name("calls");
    settings.child_table = unique_name("child");
    settings.threads = env_int("BULKHEAD_STRESS_THREADS", 200);
    create_tables(settings.conninfo, settings);

    // Every connection opened up front (min_idle): the load measures the
    // gate, not how fast 8 sessions can be authenticated on a busy machine.
    bulkhead::pqxx_pool pool({.conninfo = settings.conninfo,
                              .max_size = settings.pool_size,
                              .min_idle = settings.pool_size,
                              .connection_timeout = settings.connection_timeout,
                              .application_name = settings.application_name});
    REQUIRE(pool.size() == settings.pool_size);
    gate_t gate(pool, settings.concurrent, settings.extra_slots);
    load_counts counts;
    const auto start = steady::now();
    run_load(gate, pool, settings, counts, start + std::chrono::seconds(seconds), {});
    const double elapsed = std::chrono::duration<double>(steady::now() - start).count();
    print_counts("mixed", counts, elapsed);

    check_back_to_full(gate, pool, settings, counts);
    // Exactly the calls reported committed left their row; nothing else did.
    const auto rows = rows_by_choice(settings.conninfo, settings);
    for (std::size_t kind = 0; kind < choice_count; ++kind) {
        INFO("choice " << choice_names[kind]);
        CHECK(rows.at(kind) == counts.count(static_cast<choice>(kind), outcome::ok));
    }
    // Every way of ending happened at least once.
    for (const outcome result :
         {outcome::ok, outcome::callback_exception, outcome::sql_22012, outcome::sql_57014, outcome::sql_23503,
          outcome::admission_full, outcome::admission_cancelled, outcome::work_cancelled, outcome::admission_timeout,
          outcome::misuse, outcome::work_deadline_exceeded}) {
        INFO("outcome " << outcome_names[static_cast<std::size_t>(result)]);
        CHECK(counts.total(result) > 0);
    }
    drop_tables(settings.conninfo, settings);
}

TEST_CASE(
    "[B7] [C7] [C8] [E7] [E9] backends terminated or frozen, connections refused, the server restarted, and the gate "
    "and "
    "pool recover",
    "[pg][stress][faults]") {
    const int seconds = env_int("BULKHEAD_STRESS_SECONDS", BULKHEAD_STRESS_DEFAULT_SECONDS);
    bulkhead_test::private_cluster cluster;
    {
        // A small max_connections, so that outside clients can fill it.
        pqxx::connection admin(cluster.conninfo());
        pqxx::nontransaction tx(admin);
        tx.exec("ALTER SYSTEM SET max_connections = 40");
    }
    cluster.stop_server();
    cluster.start_server();

    load_settings settings;
    settings.conninfo = cluster.conninfo();
    settings.application_name = unique_name("faults");
    settings.calls_table = unique_name("fcalls");
    settings.child_table = unique_name("fchild");
    settings.threads = env_int("BULKHEAD_STRESS_THREADS", 200);
    settings.faults = true;
    settings.connection_timeout = 1000ms;
    create_tables(settings.conninfo, settings);

    bulkhead::pqxx_pool pool({.conninfo = settings.conninfo,
                              .max_size = settings.pool_size,
                              .min_idle = settings.pool_size,
                              .connection_timeout = settings.connection_timeout,
                              .validation_timeout = 500ms,
                              .application_name = settings.application_name});
    gate_t gate(pool, settings.concurrent, settings.extra_slots);
    load_counts counts;
    std::vector<fault_figure> figures;
    std::mt19937 random(static_cast<unsigned>(::getpid()));
    constexpr auto recovery_limit = 20s;

    const auto inject = [&] {
        const auto test_end = steady::now() + std::chrono::seconds(seconds);
        auto monitor = std::make_unique<pqxx::connection>(settings.conninfo);
        int cycle = 0;
        do {
            ++cycle;
            std::this_thread::sleep_for(1500ms);  // load running
            // 1. Backends terminated at random moments.
            for (int i = 0; i < 3; ++i) {
                std::this_thread::sleep_for(std::chrono::milliseconds(200 + random() % 800));
                const auto begin = steady::now();
                const long killed = terminate_sessions(*monitor, settings.application_name);
                fault_figure figure{"terminate " + std::to_string(killed) + " backends"};
                figure.fault_ms = std::chrono::duration<double, std::milli>(steady::now() - begin).count();
                await_recovery(counts, recovery_limit, figure);
                figures.push_back(figure);
            }
            // 2. Connections refused: the pool's sessions terminated while
            //    outside clients take every slot, held for 2 s.
            {
                std::vector<std::unique_ptr<pqxx::connection>> fillers;
                const auto begin = steady::now();
                std::string refusal;
                for (int round = 0; round < 3; ++round) {
                    (void)terminate_sessions(*monitor, settings.application_name);
                    refusal = fill_server(settings.conninfo, fillers, 200ms);
                }
                long pool_sessions = 0;
                {
                    pqxx::nontransaction tx(*monitor);  // a new connection would be refused now
                    pool_sessions = bulkhead_test::exec_one_row(
                                        tx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = " +
                                                tx.quote(settings.application_name))[0]
                                        .as<long>();
                }
                std::printf(
                    "stress: faults: server full with %zu outside connections, %ld pool sessions left, "
                    "refusal: %s\n",
                    fillers.size(), pool_sessions, refusal.c_str());
                std::this_thread::sleep_for(2s);
                fillers.clear();  // the fault ends
                fault_figure figure{"connections refused (max_connections)"};
                figure.fault_ms = std::chrono::duration<double, std::milli>(steady::now() - begin).count();
                await_recovery(counts, recovery_limit, figure);
                figures.push_back(figure);
            }
            // 3. Every backend of the pool frozen (SIGSTOP) for 1 s, mid-work:
            //    calls with a deadline are cut off by the pool's watchdog, the
            //    others wait; nothing may hang or leak a permit.
            {
                std::vector<int> pids;
                {
                    pqxx::nontransaction tx(*monitor);
                    const pqxx::result rows = tx.exec("SELECT pid FROM pg_stat_activity WHERE application_name = " +
                                                      tx.quote(settings.application_name));
                    for (const auto& row : rows) {
                        pids.push_back(row[0].as<int>());
                    }
                }
                const auto begin = steady::now();
                for (const int pid : pids) {
                    (void)::kill(static_cast<pid_t>(pid), SIGSTOP);
                }
                std::this_thread::sleep_for(1s);
                for (const int pid : pids) {
                    (void)::kill(static_cast<pid_t>(pid), SIGCONT);
                }
                fault_figure figure{"freeze " + std::to_string(pids.size()) + " backends (SIGSTOP 1 s)"};
                figure.fault_ms = std::chrono::duration<double, std::milli>(steady::now() - begin).count();
                await_recovery(counts, recovery_limit, figure);
                figures.push_back(figure);
            }
            // 4. The server restarted (fast shutdown), down for 1 s.
            {
                std::this_thread::sleep_for(500ms);
                const auto begin = steady::now();
                monitor.reset();
                cluster.stop_server();
                std::this_thread::sleep_for(1s);
                cluster.start_server();
                fault_figure figure{"server restart (stop -m fast, start)"};
                figure.fault_ms = std::chrono::duration<double, std::milli>(steady::now() - begin).count();
                await_recovery(counts, recovery_limit, figure);
                figures.push_back(figure);
                monitor = std::make_unique<pqxx::connection>(settings.conninfo);
            }
        } while (steady::now() < test_end);
        std::printf("stress: faults: %d cycle(s) of faults\n", cycle);
    };

    const auto start = steady::now();
    run_load(gate, pool, settings, counts, start + std::chrono::seconds(seconds) + 120s, [&] {
        inject();
        std::this_thread::sleep_for(1s);  // a tail of normal load
    });
    const double elapsed = std::chrono::duration<double>(steady::now() - start).count();
    print_counts("faults", counts, elapsed);
    double worst = 0;
    for (const fault_figure& figure : figures) {
        std::printf(
            "stress: fault %-38s lasted %7.1f ms; after its end: first success %7.1f ms, first success "
            "of a call started after it %7.1f ms\n",
            figure.name.c_str(), figure.fault_ms, figure.first_ok_ms, figure.recovery_ms);
        INFO("fault " << figure.name);
        CHECK(figure.recovery_ms >= 0);  // recovered within the limit, by itself
        worst = std::max(worst, figure.recovery_ms);
    }
    std::printf("stress: faults: %zu faults injected, worst recovery %.1f ms\n", figures.size(), worst);
    std::fflush(stdout);
    CHECK(figures.size() >= 5);

    check_back_to_full(gate, pool, settings, counts);
    // Nothing that failed committed; what succeeded did (commit_unknown may
    // have gone either way).
    const auto rows = rows_by_choice(settings.conninfo, settings);
    for (std::size_t kind = 0; kind < choice_count; ++kind) {
        INFO("choice " << choice_names[kind]);
        const long ok = counts.count(static_cast<choice>(kind), outcome::ok);
        const long unknown = counts.count(static_cast<choice>(kind), outcome::commit_unknown);
        CHECK(rows.at(kind) >= ok);
        CHECK(rows.at(kind) <= ok + unknown);
    }
    CHECK(counts.total(outcome::ok) > 0);
    drop_tables(settings.conninfo, settings);
}
