// bulkhead: a gate's admission slots and execution permits, by class.
//
// Every gate has workload classes: those of its workload_plan, or one,
// "default" (id 0), whose ceiling is B and whose queue is Q. permit_engine
// gives a call of class c an admission slot (tried, never waited on) and an
// execution permit (FIFO inside the class, timed, cancellable, for threads
// and asynchronous callers alike), and keeps the class's figures. gate_core
// calls it one way whatever the plan: no caller knows which of its two
// representations serves.
//
// The slots are the same for every gate: an admission_counter per class
// (ceiling + queue; B + Q without a plan), beside the class's queue-wait
// bound. The permits have two representations, chosen once, by the
// settings:
// - no plan: one fifo_semaphore. Taking and giving back are one atomic
//   operation each, no lock, and the class's figures are the gate's own
//   (nothing is counted twice);
// - a plan: workload_scheduler (reserved and shared permits, ceilings,
//   priorities), whose permits sit under one mutex, and per-class figures.
// Why two: the scheduler's mutex costs an enter and a leave about two thirds
// more than the semaphore's atomic word (bench/micro gate/enter_leave
// against gate_classes/enter_leave, docs/performance.md), and a gate
// without a plan needs none of what the mutex protects. Each representation is
// model-checked on its own (tests/model: fifo_semaphore.pml,
// workload_scheduler.pml, with seeded bugs); this class only routes to the
// one it holds.
//
// Thread safety: all members may be called concurrently, except the
// constructor.
#pragma once

#include <bulkhead/admission_counter.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/fifo_semaphore.hpp>
#include <bulkhead/gate_stats.hpp>
#include <bulkhead/histogram.hpp>
#include <bulkhead/workload.hpp>
#include <bulkhead/workload_scheduler.hpp>

#include <algorithm>
#include <array>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

namespace bulkhead::detail {

/// See the file comment.
class permit_engine {
public:
    /// B permits and B + Q slots in one class; or `plan`'s classes (checked
    /// by checked_workload_plan()), `limit` permits in circulation.
    permit_engine(int concurrent, int extra_slots, const std::optional<workload_plan>& plan, int limit)
        : m_classes(plan ? static_cast<int>(plan->classes.size()) : 1),
          m_scheduler(plan ? std::make_unique<workload_scheduler>(*plan, limit) : nullptr),
          m_running(plan ? 0 : limit) {
        if (!plan) {
            m_admission[0].slots.emplace(static_cast<std::int64_t>(concurrent) + extra_slots);
            return;
        }
        for (int c = 0; c < m_classes; ++c) {
            const workload_class& config = plan->classes[static_cast<std::size_t>(c)];
            m_admission[static_cast<std::size_t>(c)].slots.emplace(static_cast<std::int64_t>(config.ceiling) +
                                                                   config.queue);
            m_admission[static_cast<std::size_t>(c)].queue_wait = config.queue_wait;
        }
    }

    permit_engine(const permit_engine&) = delete;
    permit_engine& operator=(const permit_engine&) = delete;

    /// True when the classes come from a workload plan.
    [[nodiscard]] bool has_plan() const noexcept { return m_scheduler != nullptr; }

    [[nodiscard]] int classes() const noexcept { return m_classes; }

    /// The class named `name`, if there is one.
    [[nodiscard]] std::optional<int> find(std::string_view name) const noexcept {
        if (!m_scheduler) {
            return name == default_name ? std::optional<int>(0) : std::nullopt;
        }
        const int found = m_scheduler->find(name);
        return found >= 0 ? std::optional<int>(found) : std::nullopt;
    }

    [[nodiscard]] std::vector<std::string> names() const {
        std::vector<std::string> out;
        out.reserve(static_cast<std::size_t>(classes()));
        for (int c = 0; c < classes(); ++c) {
            out.emplace_back(m_scheduler ? m_scheduler->config(c).name : std::string(default_name));
        }
        return out;
    }

    /// A plan's class c, as the plan has it.
    [[nodiscard]] const workload_class& config(int c) const noexcept { return m_scheduler->config(c); }

    /// The longest permit wait class c allows (its plan's queue_wait).
    [[nodiscard]] std::chrono::nanoseconds queue_wait(int c) const noexcept { return admission(c).queue_wait; }

    // --- admission slots -----------------------------------------------------

    [[nodiscard]] bool try_take_slot(int c) noexcept { return admission(c).slots->try_acquire(); }

    void release_slot(int c) noexcept { admission(c).slots->release(); }

    // --- execution permits ---------------------------------------------------

    /// A permit now, if one is free to take (nobody of class c queued).
    [[nodiscard]] bool try_acquire(int c) noexcept {
        return m_scheduler ? m_scheduler->try_acquire(c) : m_running.try_acquire();
    }

    /// Waits at most `wait` for a permit, giving up on `stop`.
    [[nodiscard]] wait_status try_acquire_for(int c, std::chrono::nanoseconds wait, const std::stop_token& stop) {
        return m_scheduler ? m_scheduler->try_acquire_for(c, wait, stop) : m_running.try_acquire_for(wait, stop);
    }

    /// A permit now, or `node` queued for one (its on_granted runs on the
    /// granting thread).
    [[nodiscard]] bool acquire_or_enqueue(int c, fifo_semaphore::async_node& node) noexcept {
        return m_scheduler ? m_scheduler->acquire_or_enqueue(c, node) : m_running.acquire_or_enqueue(node);
    }

    /// Takes a queued `node` out, unless a grant has reached it.
    [[nodiscard]] bool cancel(int c, fifo_semaphore::async_node& node) noexcept {
        return m_scheduler ? m_scheduler->cancel(c, node) : m_running.cancel(node);
    }

    /// Gives back a permit, then a slot, of class c.
    void leave(int c) noexcept {
        if (m_scheduler) [[unlikely]] {
            m_scheduler->release(c);
        } else {
            m_running.release();
        }
        release_slot(c);
    }

    /// The permits in circulation, as an adaptive limit resizes them
    /// (adaptive_gate::maybe_update): `limit` is the current one.
    struct circulation {
        permit_engine& engine;
        int limit;
        [[nodiscard]] std::int64_t balance() const noexcept {
            return engine.m_scheduler ? limit - engine.m_scheduler->total().running : engine.m_running.balance();
        }
        void release(std::int64_t count) const noexcept {
            if (engine.m_scheduler) {
                engine.m_scheduler->grow(count);
            } else {
                engine.m_running.release(count);
            }
        }
        void shrink(std::int64_t count) const noexcept {
            if (engine.m_scheduler) {
                engine.m_scheduler->shrink(count);
            } else {
                engine.m_running.shrink(count);
            }
        }
    };

    /// Class c's ceiling, as its adaptive limit resizes it (a plan's class:
    /// only those adapt).
    struct ceiling {
        workload_scheduler& scheduler;
        int c;
        int limit;
        [[nodiscard]] std::int64_t balance() const noexcept { return limit - scheduler.of(c).running; }
        void release(std::int64_t count) const noexcept { scheduler.grow_ceiling(c, count); }
        void shrink(std::int64_t count) const noexcept { scheduler.shrink_ceiling(c, count); }
    };
    [[nodiscard]] ceiling ceiling_of(int c, int limit) noexcept { return ceiling{*m_scheduler, c, limit}; }

    // --- observations (stale as soon as they return) -------------------------

    /// Permits free now, of `limit` in circulation.
    [[nodiscard]] int available(int limit) const noexcept {
        return m_scheduler ? std::max(limit - m_scheduler->total().running, 0)
                           : static_cast<int>(m_running.available());
    }

    [[nodiscard]] int available_slots() const noexcept {
        std::int64_t free = 0;
        for (int c = 0; c < m_classes; ++c) {
            free += free_slots(c);
        }
        return static_cast<int>(free);
    }

    /// Admission slots taken: the calls in the gate, queued or running.
    [[nodiscard]] int slots_held() const noexcept {
        std::int64_t held = 0;
        for (int c = 0; c < m_classes; ++c) {
            const admission_counter& slots = *admission(c).slots;
            held += slots.capacity() - slots.available();
        }
        return static_cast<int>(held);
    }

    [[nodiscard]] int waiting() const noexcept {
        return m_scheduler ? m_scheduler->total().queued : static_cast<int>(m_running.waiting());
    }

    /// Calls holding a permit, of `limit` in circulation.
    [[nodiscard]] int running(int limit) const noexcept {
        return m_scheduler ? m_scheduler->total().running : std::max(limit - static_cast<int>(m_running.balance()), 0);
    }

    /// Class c's callers holding a permit and queued for one.
    [[nodiscard]] workload_scheduler::figures of(int c, int limit) const noexcept {
        return m_scheduler ? m_scheduler->of(c) : workload_scheduler::figures{running(limit), waiting()};
    }

    /// Permits a call of class c could take now if none of its callers
    /// were queued.
    [[nodiscard]] int free_for(int c, int limit) const noexcept {
        return m_scheduler ? m_scheduler->free_for(c) : available(limit);
    }

    /// The most permits class c can use at once under `limit`.
    [[nodiscard]] int usable_by(int c, int limit) const noexcept {
        return m_scheduler ? m_scheduler->usable_by(c) : limit;
    }

    // --- class c's own figures: a plan's; without one, the gate's serve ------

    void admitted(int c) noexcept {
        if (m_scheduler) {
            m_scheduler->admitted(c);
        }
    }

    void rejected(int c, reject_reason reason) noexcept {
        if (m_scheduler) {
            m_scheduler->rejected(c, reason);
        }
    }

    void permit_waited(int c, std::chrono::nanoseconds waited) noexcept {
        if (m_scheduler) {
            m_scheduler->permit_wait(c).record(waited);
        }
    }

    void held(int c, std::chrono::nanoseconds hold, bool committed) noexcept {
        if (m_scheduler) {
            m_scheduler->held(c, hold);
            if (committed) {
                m_scheduler->committed(c, hold);
            }
        }
    }

    /// Class c's mean permit hold (of committed calls), or zero: none yet,
    /// or no plan (the gate's mean is the class's).
    [[nodiscard]] std::chrono::nanoseconds mean_hold(int c) const noexcept {
        return m_scheduler ? m_scheduler->mean_hold(c) : std::chrono::nanoseconds(0);
    }
    [[nodiscard]] std::chrono::nanoseconds mean_committed_hold(int c) const noexcept {
        return m_scheduler ? m_scheduler->mean_committed_hold(c) : std::chrono::nanoseconds(0);
    }

    /// A plan's class c: its configuration and counters.
    [[nodiscard]] workload_stats stats(int c) const {
        workload_stats out = m_scheduler->stats(c);
        out.available_slots = static_cast<int>(free_slots(c));
        return out;
    }

private:
    static constexpr std::string_view default_name = "default";

    /// What admission reads of a class before any permit: its slots and the
    /// longest permit wait it allows.
    struct class_admission {
        std::optional<admission_counter> slots;  // made in the constructor: ceiling + queue, or B + Q
        std::chrono::nanoseconds queue_wait = std::chrono::nanoseconds::max();
    };

    [[nodiscard]] class_admission& admission(int c) noexcept {
        assert(c >= 0 && c < m_classes);
        return m_admission[static_cast<std::size_t>(c)];
    }
    [[nodiscard]] const class_admission& admission(int c) const noexcept {
        assert(c >= 0 && c < m_classes);
        return m_admission[static_cast<std::size_t>(c)];
    }

    [[nodiscard]] std::int64_t free_slots(int c) const noexcept {
        return std::max<std::int64_t>(admission(c).slots->available(), 0);
    }

    int m_classes;
    // Inside the engine, not on the heap: the slot is then at a fixed
    // offset from the gate, one dependent load fewer before its
    // compare-and-swap (a tenth of a rejection's time, bench/micro
    // reject/gate_try_enter). The price: room for every class a plan may
    // have, a cache line or more each (about 4 KiB per gate).
    std::array<class_admission, max_workloads> m_admission{};
    // null: no plan (m_running serves).
    std::unique_ptr<workload_scheduler> m_scheduler;
    fifo_semaphore m_running;  // no plan: B, FIFO (with a plan: 0, unused)
};

}  // namespace bulkhead::detail
