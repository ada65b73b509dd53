// bulkhead micro benchmarks: what every benchmark file shares.
//
//   - thread_probe: what the calling thread did, read from the kernel and from
//     the allocation counter: operator new calls, voluntary and involuntary
//     context switches (getrusage(RUSAGE_THREAD)), syscalls and futex wakes
//     (perf tracepoints, when the kernel lets us open them; see below).
//   - report_probe(): an untimed pass after a benchmark's timed loop that runs
//     the same operation again between two probe reads, and reports
//     allocs/syscalls/context switches per operation as exact counts.
//   - run_contended(): the threaded variants of a blocking acquire: in the
//     timed loop, per-acquire wait samples and context switches and wakes per
//     acquire; after it, untimed, a fixed window of wall time in which every
//     thread keeps acquiring, for Jain's fairness index over the per-thread
//     acquisition counts.
//   - cv_semaphore (a mutex + condition_variable semaphore) and null_pool (a
//     pool that does nothing), the two reference points the issue asks for.
//
// Tracepoints. Syscall and wake counts come from perf_event_open on the
// tracepoints raw_syscalls:sys_enter and syscalls:sys_exit_futex (filtered on
// the return value: a FUTEX_WAKE returns how many threads it woke; every
// other futex operation returns 0 or an error). That needs tracefs and
// CAP_PERFMON (or root, or kernel.perf_event_paranoid <= -1). Without them
// those counters are left out of the report; the rusage and allocation
// counters are always there. `strace -f -c` is the manual fallback.
#pragma once

#include "null_pool.hpp"

#include <bulkhead/db_bulkhead.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <latch>
#include <limits>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace bulkhead_bench {

// ---------------------------------------------------------------------------
// Counting what a thread does
// ---------------------------------------------------------------------------

/// operator new calls made by the calling thread so far (all forms; the
/// replacement lives in alloc_counter.cpp). Memory the C++ runtime takes with
/// malloc directly, such as the exception object of a throw
/// (__cxa_allocate_exception), is not counted.
std::uint64_t allocations_on_this_thread() noexcept;

/// What one thread has done, as counted by thread_probe.
struct thread_counts {
    std::uint64_t allocations = 0;          // operator new calls
    std::int64_t voluntary_switches = 0;    // ru_nvcsw: the thread blocked
    std::int64_t involuntary_switches = 0;  // ru_nivcsw: the thread was preempted
    std::uint64_t syscalls = 0;             // raw_syscalls:sys_enter (when traced)
    std::uint64_t futex_wakes = 0;          // futex calls that woke >= 1 thread (when traced)
    std::uint64_t futex_multi_wakes = 0;    // futex calls that woke >= 2 threads (when traced)

    friend thread_counts operator-(const thread_counts& after, const thread_counts& before) noexcept {
        return {after.allocations - before.allocations,
                after.voluntary_switches - before.voluntary_switches,
                after.involuntary_switches - before.involuntary_switches,
                after.syscalls - before.syscalls,
                after.futex_wakes - before.futex_wakes,
                after.futex_multi_wakes - before.futex_multi_wakes};
    }
    thread_counts& operator+=(const thread_counts& other) noexcept {
        allocations += other.allocations;
        voluntary_switches += other.voluntary_switches;
        involuntary_switches += other.involuntary_switches;
        syscalls += other.syscalls;
        futex_wakes += other.futex_wakes;
        futex_multi_wakes += other.futex_multi_wakes;
        return *this;
    }
};

namespace detail {

/// The id of tracepoint `event` ("raw_syscalls/sys_enter"), or -1.
inline long tracepoint_id(const char* event) {
    for (const char* root : {"/sys/kernel/tracing/events/", "/sys/kernel/debug/tracing/events/"}) {
        std::ifstream file(std::string(root) + event + "/id");
        long id = -1;
        if (file >> id) {
            return id;
        }
    }
    return -1;
}

struct tracepoint_ids {
    long syscalls = tracepoint_id("raw_syscalls/sys_enter");
    long futex_exit = tracepoint_id("syscalls/sys_exit_futex");
};

/// Looked up once, on first use (thread-safe static initialization).
inline const tracepoint_ids& tracepoints() {
    static const tracepoint_ids ids;
    return ids;
}

}  // namespace detail

/// Counts what the calling thread does. Construct it on the thread to be
/// measured; read() it on that same thread.
/// \note read() itself makes two syscalls (getrusage, then one read of the
/// perf group); a difference of two reads includes them, and
/// syscalls_between() subtracts them.
class thread_probe {
public:
    /// Syscalls one read() adds to the difference of two reads.
    static constexpr std::uint64_t own_syscalls = 2;

    thread_probe() noexcept { open_tracepoints(); }
    ~thread_probe() {
        for (const int fd : m_fds) {
            if (fd >= 0) {
                ::close(fd);
            }
        }
    }
    thread_probe(const thread_probe&) = delete;
    thread_probe& operator=(const thread_probe&) = delete;

    /// True when syscalls and futex wakes are counted.
    [[nodiscard]] bool traced() const noexcept { return m_fds[0] >= 0; }

    /// A snapshot of the calling thread's counts.
    [[nodiscard]] thread_counts read() const noexcept {
        thread_counts counts;
        counts.allocations = allocations_on_this_thread();
        rusage usage{};
        if (::getrusage(RUSAGE_THREAD, &usage) == 0) {
            counts.voluntary_switches = usage.ru_nvcsw;
            counts.involuntary_switches = usage.ru_nivcsw;
        }
        if (traced()) {
            // PERF_FORMAT_GROUP: the number of events, then one value each.
            std::array<std::uint64_t, 1 + group_size> values{};
            if (::read(m_fds[0], values.data(), sizeof values) > 0) {
                counts.syscalls = values[1];
                counts.futex_wakes = values[2];
                counts.futex_multi_wakes = values[3];
            }
        }
        return counts;
    }

    /// Whether tracepoints can be opened on this machine (asks once).
    static bool tracing_available() {
        static const bool available = [] {
            const thread_probe probe;
            return probe.traced();
        }();
        return available;
    }

private:
    static constexpr std::size_t group_size = 3;

    void open_tracepoints() noexcept {
        const auto& ids = detail::tracepoints();
        if (ids.syscalls < 0 || ids.futex_exit < 0) {
            return;
        }
        const std::array<std::pair<long, const char*>, group_size> events{{
            {ids.syscalls, nullptr},
            {ids.futex_exit, "ret > 0"},
            {ids.futex_exit, "ret > 1"},
        }};
        for (std::size_t i = 0; i < group_size; ++i) {
            perf_event_attr attr{};
            attr.type = PERF_TYPE_TRACEPOINT;
            attr.size = sizeof attr;
            attr.config = static_cast<std::uint64_t>(events[i].first);
            attr.read_format = PERF_FORMAT_GROUP;
            // pid 0, cpu -1: this thread, on whichever CPU it runs.
            const long fd = ::syscall(SYS_perf_event_open, &attr, 0, -1, i == 0 ? -1 : m_fds[0], PERF_FLAG_FD_CLOEXEC);
            m_fds[i] = static_cast<int>(fd);
            if (fd < 0 ||
                (events[i].second != nullptr && ::ioctl(m_fds[i], PERF_EVENT_IOC_SET_FILTER, events[i].second) != 0)) {
                close_all();
                return;
            }
        }
    }

    void close_all() noexcept {
        for (int& fd : m_fds) {
            if (fd >= 0) {
                ::close(fd);
            }
            fd = -1;
        }
    }

    std::array<int, group_size> m_fds{-1, -1, -1};  // group leader first; owned by this object
};

/// Syscalls made between two reads of a probe, not counting the reads.
[[nodiscard]] inline std::uint64_t syscalls_between(const thread_counts& delta) noexcept {
    return delta.syscalls >= thread_probe::own_syscalls ? delta.syscalls - thread_probe::own_syscalls : 0;
}

/// Per-operation counters of `delta` over `operations` operations, under the
/// names the report script reads.
inline void set_per_op_counters(benchmark::State& state, const thread_counts& delta, std::uint64_t syscalls,
                                double operations, bool traced, bool with_allocations) {
    if (with_allocations) {
        state.counters["allocs/op"] = static_cast<double>(delta.allocations) / operations;
    }
    state.counters["vcsw/op"] = static_cast<double>(delta.voluntary_switches) / operations;
    state.counters["ivcsw/op"] = static_cast<double>(delta.involuntary_switches) / operations;
    if (traced) {
        state.counters["syscalls/op"] = static_cast<double>(syscalls) / operations;
        state.counters["wakes/op"] = static_cast<double>(delta.futex_wakes) / operations;
        state.counters["multiwakes/op"] = static_cast<double>(delta.futex_multi_wakes) / operations;
    }
}

/// After a timed loop: runs `operation` again, untimed, as many times as the
/// timed loop did (at least 1,000, at most 100,000), between two probe reads,
/// and reports allocations, syscalls and context switches per operation.
/// The counts are exact: nothing of the benchmark library runs in between.
template <class Operation>
void report_probe(benchmark::State& state, Operation&& operation) {
    const std::int64_t runs = std::clamp<std::int64_t>(static_cast<std::int64_t>(state.iterations()), 1000, 100000);
    const thread_probe probe;
    const thread_counts before = probe.read();
    for (std::int64_t i = 0; i < runs; ++i) {
        operation();
    }
    const thread_counts delta = probe.read() - before;
    set_per_op_counters(state, delta, syscalls_between(delta), static_cast<double>(runs), probe.traced(), true);
}

// ---------------------------------------------------------------------------
// Contended runs: wait percentiles, switches and wakes, Jain's index
// ---------------------------------------------------------------------------

/// Nanoseconds on the steady clock.
[[nodiscard]] inline std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/// The fairness phase of a contended run: after every thread has passed a
/// barrier, acquisitions are counted during a fixed window of wall time that
/// opens once every thread has had time to get going. In it each thread
/// holds the permit across a short sleep, a stand-in for a transaction that
/// waits on the database: the holder leaves the CPU, so every other thread
/// gets to run and queue, and the count measures who the semaphore lets in,
/// not who the CPU scheduler lets run (with an empty critical section on an
/// oversubscribed machine it would mostly be the latter). The thread's timer
/// slack is cut to 1 ns meanwhile (Linux rounds a sleep up by 50 us by
/// default), so the window holds enough acquisitions per thread for the
/// index not to be dominated by rounding (64 threads: about 30 each).
inline constexpr std::int64_t fairness_settle_ns = 10'000'000;
inline constexpr std::int64_t fairness_window_ns = 40'000'000;
inline constexpr std::int64_t fairness_hold_ns = 10'000;

/// How long this thread holds a permit: 0 in timed loops, fairness_hold_ns
/// in the fairness phase.
inline thread_local std::int64_t t_hold_ns = 0;  // owned by its thread

/// Holds a permit for t_hold_ns, asleep (does nothing in timed loops).
inline void hold_permit() {
    if (t_hold_ns > 0) {
        std::this_thread::sleep_for(std::chrono::nanoseconds(t_hold_ns));
    }
}

/// Where a contended benchmark holds its permit in the fairness phase:
/// between its acquire and release calls, or inside its acquire call (a
/// gate transaction, whose callback calls hold_permit()).
enum class hold_inside : bool { between, acquire };

/// One thread's record of one threaded run. The sample buffer is sized (and
/// touched) before the timed loop, so recording never allocates or
/// page-faults.
class thread_samples {
public:
    /// At most this many wait samples over all threads of a run (8 bytes each).
    static constexpr std::int64_t total_capacity = std::int64_t{1} << 21;

    /// For a run without wait samples (non-blocking operations).
    thread_samples() = default;

    thread_samples(std::int64_t iterations, int threads) {
        const std::int64_t capacity =
            std::max<std::int64_t>(1, std::min<std::int64_t>(iterations, total_capacity / threads));
        m_stride = (iterations + capacity - 1) / capacity;
        m_waited.resize(static_cast<std::size_t>(capacity));
    }

    /// The timed loop's first iteration started, or its last one ended.
    void started(std::int64_t at) noexcept { m_started_at = at; }
    void finished(std::int64_t at, std::int64_t operations) noexcept {
        m_finished_at = at;
        m_operations = operations;
    }

    /// One acquisition that waited `waited` ns. Every acquisition counts for
    /// the maximum; one in m_stride is kept for the percentiles.
    void add(std::int64_t waited) noexcept {
        m_max_wait = std::max(m_max_wait, waited);
        if (--m_countdown == 0 && m_count < m_waited.size()) {
            m_countdown = m_stride;
            m_waited[m_count++] = waited;
        }
    }

    /// The probe difference over the timed loop.
    void set_counts(const thread_counts& counts, bool traced) noexcept {
        m_counts = counts;
        m_traced = traced;
    }

    /// Acquisitions made inside the fairness window.
    void set_window_acquisitions(std::int64_t acquisitions) noexcept { m_window_acquisitions = acquisitions; }

private:
    friend class contention_report;

    std::vector<std::int64_t> m_waited;  // ns, one in m_stride acquisitions
    std::size_t m_count = 0;             // samples stored
    std::int64_t m_stride = 1;
    std::int64_t m_countdown = 1;
    std::int64_t m_max_wait = 0;
    std::int64_t m_started_at = 0;   // steady clock ns
    std::int64_t m_finished_at = 0;  // steady clock ns
    std::int64_t m_operations = 0;   // iterations of the timed loop
    thread_counts m_counts{};
    bool m_traced = false;
    std::int64_t m_window_acquisitions = -1;  // -1: no fairness phase
};

/// Collects the thread_samples of one threaded run and turns them into
/// counters. One static instance per benchmark function.
///
/// Wall time. Google Benchmark's real time for a threaded run is the mean of
/// the threads' own loop times divided by the total iterations. When the
/// threads do not all run at once (more threads than cores), that is not the
/// wall time per operation, so the report adds its own: from the first
/// thread's first iteration to the last thread's last, over all iterations
/// ("wall_ns/op").
///
/// Synchronization: thread 0 calls begin_run() before its timed loop; Google
/// Benchmark's start barrier makes that happen-before any thread leaves its
/// loop, and only then does a thread touch the fairness barrier or call
/// deposit(). The fairness barrier's completion step writes the window
/// bounds, which every thread reads after arrive_and_wait() returns. In
/// deposit() (under m_mutex) the last thread computes the counters and sets
/// them on its own State; the others set none, so the library's per-thread
/// sum is that value.
class contention_report {
public:
    void begin_run(const benchmark::State& state) {
        if (state.thread_index() == 0) {
            const std::lock_guard lock(m_mutex);
            m_runs.clear();
            m_runs.reserve(static_cast<std::size_t>(state.threads()));
            m_phase = std::make_unique<std::barrier<open_window>>(state.threads(), open_window{this});
        }
    }

    /// After the timed loop, untimed: every thread of the run acquires, holds
    /// and releases until the window closes. Returns the acquisitions this
    /// thread made inside the window.
    template <class Acquire, class Release>
    std::int64_t fairness_phase(hold_inside hold, Acquire& acquire, Release& release) {
        m_phase->arrive_and_wait();
        const std::int64_t window_begin = m_window_begin;
        const std::int64_t window_end = m_window_end;
        std::int64_t acquisitions = 0;
        t_hold_ns = fairness_hold_ns;
        const int slack = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        for (;;) {
            acquire();
            const std::int64_t at = now_ns();
            if (hold == hold_inside::between) {
                hold_permit();
            }
            release();
            if (at >= window_end) {
                break;
            }
            if (at >= window_begin) {
                ++acquisitions;
            }
        }
        t_hold_ns = 0;
        if (slack > 0) {
            (void)::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack), 0UL, 0UL, 0UL);
        }
        return acquisitions;
    }

    void deposit(benchmark::State& state, thread_samples&& samples) {
        const std::lock_guard lock(m_mutex);
        m_runs.push_back(std::move(samples));
        if (m_runs.size() == static_cast<std::size_t>(state.threads())) {
            publish(state);
            m_runs.clear();
        }
    }

private:
    /// The fairness barrier's completion step: runs once, before any thread
    /// is released.
    struct open_window {
        contention_report* report;
        void operator()() noexcept {
            report->m_window_begin = now_ns() + fairness_settle_ns;
            report->m_window_end = report->m_window_begin + fairness_window_ns;
        }
    };

    void publish(benchmark::State& state) const {
        std::vector<std::int64_t> waits;
        std::int64_t max_wait = 0;
        std::int64_t operations = 0;
        std::int64_t first_start = std::numeric_limits<std::int64_t>::max();
        std::int64_t last_finish = 0;
        thread_counts counts{};
        bool traced = true;
        double sum = 0;
        double sum_of_squares = 0;
        bool fairness = true;
        for (const thread_samples& run : m_runs) {
            waits.insert(waits.end(), run.m_waited.begin(),
                         run.m_waited.begin() + static_cast<std::ptrdiff_t>(run.m_count));
            max_wait = std::max(max_wait, run.m_max_wait);
            operations += run.m_operations;
            first_start = std::min(first_start, run.m_started_at);
            last_finish = std::max(last_finish, run.m_finished_at);
            counts += run.m_counts;
            traced = traced && run.m_traced;
            fairness = fairness && run.m_window_acquisitions >= 0;
            const auto acquisitions = static_cast<double>(run.m_window_acquisitions);
            sum += acquisitions;
            sum_of_squares += acquisitions * acquisitions;
        }
        if (operations == 0) {
            return;
        }
        state.counters["wall_ns/op"] = static_cast<double>(last_finish - first_start) / static_cast<double>(operations);
        if (waits.empty()) {
            return;  // a non-blocking operation: wall time only
        }
        // Wait percentiles over the samples of every thread; the maximum over
        // every acquisition.
        state.counters["wait_p50_ns"] = static_cast<double>(percentile(waits, 0.50));
        state.counters["wait_p99_ns"] = static_cast<double>(percentile(waits, 0.99));
        state.counters["wait_max_ns"] = static_cast<double>(max_wait);

        // Jain's index (sum x)^2 / (n * sum x^2) over the acquisitions each
        // thread made in the same fixed window: 1 when all got the same, 1/n
        // when one got everything.
        if (fairness) {
            const double threads = static_cast<double>(m_runs.size());
            state.counters["jain"] = sum_of_squares > 0 ? sum * sum / (threads * sum_of_squares) : 0.0;
            state.counters["window_acq/thread"] = sum / threads;
        }

        // The probe reads sit inside the timed loop (first and last
        // iteration), so the library's barriers are not counted; each
        // thread's difference includes its own two reads.
        const std::uint64_t own = thread_probe::own_syscalls * m_runs.size();
        set_per_op_counters(state, counts, counts.syscalls >= own ? counts.syscalls - own : 0,
                            static_cast<double>(operations), traced, false);
    }

    static std::int64_t percentile(std::vector<std::int64_t>& values, double fraction) {
        const auto rank = static_cast<std::size_t>(fraction * static_cast<double>(values.size() - 1));
        std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(rank), values.end());
        return values[rank];
    }

    std::mutex m_mutex;
    std::vector<thread_samples> m_runs;                  // guarded by m_mutex
    std::unique_ptr<std::barrier<open_window>> m_phase;  // made by thread 0 before each run (see above)
    std::int64_t m_window_begin = 0;                     // written by open_window
    std::int64_t m_window_end = 0;                       // written by open_window
};

/// A contended run of a blocking acquire: in the timed loop each iteration
/// times `acquire()`, then calls `release()`; then, untimed, the fairness
/// phase. Every thread of the run calls this with the same `report`.
template <class Acquire, class Release>
void run_contended(benchmark::State& state, contention_report& report, hold_inside hold, Acquire&& acquire,
                   Release&& release) {
    report.begin_run(state);
    thread_samples samples(static_cast<std::int64_t>(state.max_iterations), state.threads());
    const thread_probe probe;
    const std::int64_t last = static_cast<std::int64_t>(state.max_iterations) - 1;
    std::int64_t iteration = 0;
    thread_counts before{};
    for (auto _ : state) {
        if (iteration == 0) {
            before = probe.read();
            samples.started(now_ns());
        }
        const std::int64_t asked = now_ns();
        acquire();
        samples.add(now_ns() - asked);
        release();
        if (iteration == last) {
            samples.finished(now_ns(), iteration + 1);
            samples.set_counts(probe.read() - before, probe.traced());
        }
        ++iteration;
    }
    samples.set_window_acquisitions(report.fairness_phase(hold, acquire, release));
    report.deposit(state, std::move(samples));
}

/// A threaded run of a non-blocking operation: only the wall time per
/// operation is added (one clock read at the first and at the last
/// iteration of each thread).
template <class Operation>
void run_scaling(benchmark::State& state, contention_report& report, Operation&& operation) {
    report.begin_run(state);
    thread_samples samples;
    const std::int64_t last = static_cast<std::int64_t>(state.max_iterations) - 1;
    std::int64_t iteration = 0;
    for (auto _ : state) {
        if (iteration == 0) {
            samples.started(now_ns());
        }
        operation();
        if (iteration == last) {
            samples.finished(now_ns(), iteration + 1);
        }
        ++iteration;
    }
    report.deposit(state, std::move(samples));
}

// ---------------------------------------------------------------------------
// Registration: which thread counts and permit counts each kind of benchmark runs
// ---------------------------------------------------------------------------

/// The thread counts of every contended or scaling variant.
inline constexpr std::array<int, 4> contended_threads{2, 4, 16, 64};

/// The fastest of the repetitions: on a shared machine, noise only ever adds
/// time, so for one-thread timings the minimum is the steadiest estimate
/// (reported next to the mean and median as the aggregate "min").
inline double fastest(const std::vector<double>& values) {
    return values.empty() ? 0.0 : *std::min_element(values.begin(), values.end());
}

/// Real time, and the "min" aggregate: every benchmark gets these.
inline benchmark::internal::Benchmark* common(benchmark::internal::Benchmark* bench) {
    return bench->UseRealTime()->ComputeStatistics("min", fastest);
}

/// A one-thread benchmark (the reject paths).
inline void one_thread(benchmark::internal::Benchmark* bench) { common(bench); }

/// A blocking acquire, uncontended: one thread, with 16 permits and with 1
/// (std::counting_semaphore's release takes a slower path when the count was
/// zero, so both are shown).
inline void uncontended_semaphore(benchmark::internal::Benchmark* bench) {
    common(bench)->ArgName("permits")->Arg(16)->Arg(1);
}

/// A gate call, uncontended: one thread, B = 1.
inline void uncontended_gate(benchmark::internal::Benchmark* bench) { common(bench)->ArgName("permits")->Arg(1); }

/// A blocking acquire under contention: one permit, 2 to 64 threads. The
/// run reports wait percentiles, Jain's index, switches and wakes.
inline void contended(benchmark::internal::Benchmark* bench) {
    common(bench)->ArgName("permits")->Arg(1);
    for (const int threads : contended_threads) {
        bench->Threads(threads);
    }
}

/// A non-blocking operation on one shared word, from 1 to 64 threads.
inline void scaling(benchmark::internal::Benchmark* bench) {
    common(bench)->Threads(1);
    for (const int threads : contended_threads) {
        bench->Threads(threads);
    }
}

// ---------------------------------------------------------------------------
// Reference points
// ---------------------------------------------------------------------------

/// The textbook semaphore: a count under a mutex, a condition variable to wait
/// on. Not fair (a releaser, or a newcomer, can take the permit before the
/// thread it woke); notifies after unlocking, and only when someone waits.
class cv_semaphore {
public:
    explicit cv_semaphore(std::int64_t permits) : m_permits(permits) {}

    void acquire() {
        std::unique_lock lock(m_mutex);
        ++m_waiting;
        m_wake.wait(lock, [this] { return m_permits > 0; });
        --m_waiting;
        --m_permits;
    }

    [[nodiscard]] bool try_acquire() {
        const std::lock_guard lock(m_mutex);
        if (m_permits == 0) {
            return false;
        }
        --m_permits;
        return true;
    }

    void release() {
        bool wake = false;
        {
            const std::lock_guard lock(m_mutex);
            ++m_permits;
            wake = m_waiting > 0;
        }
        if (wake) {
            m_wake.notify_one();
        }
    }

private:
    std::mutex m_mutex;
    std::condition_variable m_wake;  // waited on under m_mutex
    std::int64_t m_permits;          // guarded by m_mutex
    std::int64_t m_waiting = 0;      // guarded by m_mutex
};

/// A gate (B = 1, Q = 0) over a null_pool whose one permit is held by a
/// thread of its own (a permit is released on the thread that entered), so
/// every call from a benchmark thread is turned away with admission_full.
template <class Observer = bulkhead::null_observer>
class full_gate {
public:
    using gate_type = bulkhead::db_bulkhead<null_pool, Observer>;

    full_gate() : m_gate(m_pool, 1, 0) {
        std::latch entered(1);
        m_holder = std::jthread([this, &entered](const std::stop_token& stop) {
            const bulkhead::permit held = m_gate.enter();
            entered.count_down();
            std::mutex mutex;
            std::condition_variable_any until_stopped;
            std::unique_lock lock(mutex);
            until_stopped.wait(lock, stop, [] { return false; });
        });
        entered.wait();
    }

    gate_type& operator*() noexcept { return m_gate; }
    gate_type* operator->() noexcept { return &m_gate; }

private:
    null_pool m_pool;
    gate_type m_gate;
    std::jthread m_holder;  // destroyed first: stops, releases its permit, joins
};

/// The callback of the gate benchmarks: touches nothing.
inline constexpr auto do_nothing = [](null_pool::work& work) { benchmark::DoNotOptimize(&work); };

/// The callback of the contended gate benchmarks: nothing in the timed loop,
/// the fairness phase's busy work after it.
inline constexpr auto hold_work = [](null_pool::work& work) {
    benchmark::DoNotOptimize(&work);
    hold_permit();
};

}  // namespace bulkhead_bench
