// bulkhead: the threads that run asynchronous callers' database work.
//
// libpqxx blocks, so a coroutine's transaction cannot run on its event-loop
// thread. A gate's async front end (asio.hpp) hands each admitted call, once
// it holds an execution permit, to one of these threads. There are exactly B
// of them (the gate's execution permits), started together on the gate's
// first asynchronous call: a job is queued only by a caller that holds a
// permit, so at most B jobs exist at once and none waits here for long. The
// gate's FIFO decides the order; this queue only keeps it.
//
// A job is an intrusive node in its operation's state: queueing allocates
// nothing. A thread that queues a job while it is one of these threads (a
// worker releasing its permit to the next asynchronous waiter) does not wake
// another: it takes the job itself when it comes back for more, so a
// handoff from one coroutine's work to the next costs no wake at all. It
// claims one job so, per job it runs: a second one queued in the same run
// (an adaptive limit that grew there and granted the new permit too) wakes
// an idle thread. Without that, every job granted on a work thread after a
// growth queued behind the one worker that granted it, and the calls ran one
// at a time whatever the limit (seen: an async gate whose limit went 1 -> 2
// ran one callback at a time, its permit holds doubled, and its latency rule
// took the limit back to 1, over and over).
//
// Thread safety: push() may be called from any thread; start() from any,
// and only the first call starts threads. The destructor asks the threads to
// finish and joins them; no job may be queued or running then (the gate
// must outlive every call, which says the same).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace bulkhead::detail {

/// One piece of work for a work thread; lives in its owner's state.
struct work_job {
    /// Runs the job on a work thread; the node may be destroyed inside.
    using run_function = void (*)(work_job& job) noexcept;

    explicit work_job(run_function run) noexcept : m_run(run) {}

    work_job* m_next = nullptr;  // guarded by the work_threads' mutex while queued
    run_function m_run;          // set once
};

/// B threads that run work_jobs in the order they were queued.
class work_threads {
public:
    explicit work_threads(int count) noexcept : m_count(count) {}
    work_threads(const work_threads&) = delete;
    work_threads& operator=(const work_threads&) = delete;

    ~work_threads() {
        {
            const std::lock_guard lock(m_mutex);
            m_stopping = true;
        }
        m_wake.notify_all();
        for (std::thread& thread : m_threads) {
            thread.join();
        }
    }

    /// Starts the threads, once; later calls return at once.
    /// \throws std::system_error when a thread cannot be started (those
    /// started so far keep serving; the next call tries again for the rest).
    void start() {
        // acquire: pairs with the release store below; once true, nothing here is needed.
        if (m_started.load(std::memory_order_acquire)) {
            return;
        }
        const std::lock_guard lock(m_mutex);
        if (m_threads.size() == static_cast<std::size_t>(m_count)) {
            return;
        }
        m_threads.reserve(static_cast<std::size_t>(m_count));
        while (m_threads.size() < static_cast<std::size_t>(m_count)) {
            m_threads.emplace_back([this] { serve(); });
        }
        m_started.store(true, std::memory_order_release);
    }

    /// Queues `job` behind those already queued. Never blocks for long,
    /// never allocates. Precondition: start() has succeeded at least once.
    void push(work_job& job) noexcept {
        bool wake = false;
        {
            const std::lock_guard lock(m_mutex);
            job.m_next = nullptr;
            (m_tail != nullptr ? m_tail->m_next : m_head) = &job;
            m_tail = &job;
            // A worker queueing work takes one job itself when it comes back.
            if (current_set() == this && !claimed_one()) {
                claimed_one() = true;  // this thread takes a job when it comes back
            } else {
                wake = m_idle > 0;
            }
        }
        if (wake) {
            m_wake.notify_one();
        }
    }

    /// Threads started: an observation.
    [[nodiscard]] std::size_t started() const {
        const std::lock_guard lock(m_mutex);
        return m_threads.size();
    }

    /// Threads parked with nothing to do: an observation. When it equals
    /// started(), no job runs and no completion is being posted.
    [[nodiscard]] int idle() const {
        const std::lock_guard lock(m_mutex);
        return m_idle;
    }

    /// True on one of this set's threads.
    [[nodiscard]] bool on_work_thread() const noexcept { return current_set() == this; }

private:
    static const work_threads*& current_set() noexcept {
        thread_local const work_threads* set = nullptr;
        return set;
    }

    /// True on a work thread that has queued a job during the job it runs:
    /// it will take one when it comes back, so a second one needs a wake.
    static bool& claimed_one() noexcept {
        thread_local bool claimed = false;
        return claimed;
    }

    void serve() noexcept {
        current_set() = this;
        std::unique_lock lock(m_mutex);
        for (;;) {
            while (m_head == nullptr && !m_stopping) {
                ++m_idle;
                m_wake.wait(lock);
                --m_idle;
            }
            if (m_head == nullptr) {
                return;  // stopping, and nothing left
            }
            work_job& job = *m_head;
            m_head = job.m_next;
            if (m_head == nullptr) {
                m_tail = nullptr;
            }
            lock.unlock();
            job.m_run(job);
            lock.lock();
            claimed_one() = false;  // back at the queue: the claim is honoured from here
        }
    }

    const int m_count;
    std::atomic<bool> m_started{false};  // every thread started: start() returns without the lock
    mutable std::mutex m_mutex;          // guards everything below
    std::condition_variable m_wake;      // idle threads wait here
    std::vector<std::thread> m_threads;  // guarded by m_mutex
    work_job* m_head = nullptr;          // guarded by m_mutex
    work_job* m_tail = nullptr;          // guarded by m_mutex
    int m_idle = 0;                      // guarded by m_mutex: threads waiting on m_wake
    bool m_stopping = false;             // guarded by m_mutex
};

}  // namespace bulkhead::detail
