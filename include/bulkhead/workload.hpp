// bulkhead: workload classes, the budgets one gate gives its kinds of work.
//
// A gate of B execution permits can serve several named classes of work (for
// example `interactive` and `batch`), so that a batch job or an expensive
// query cannot take every connection. Each class states:
//
//   reserved    permits that only this class may use (0: none);
//   ceiling     the most permits it may hold at once (0: B);
//   queue       how many of its callers may wait for a permit beyond those
//               running: its admission slots are ceiling + queue, tried
//               without blocking, as the plain gate's B + Q;
//   queue_wait  the longest any of its calls waits for a permit, whatever the
//               call asks (nanoseconds::max(): the call's own wait);
//   priority    its rank for the shared permits (higher first);
//   adaptive_floor  0: the ceiling is fixed; from 1, the class's ceiling
//               adapts between this floor and `ceiling` from its own calls.
//
// The shared permits are B minus the sum of the reservations. A class takes
// a reserved permit while it runs fewer than its reservation, else a shared
// one while it runs below its ceiling and a shared one is free. Waiters are
// served in this order, on every release: first any class below its
// reservation (its own permits), then the shared permits by strict priority,
// the oldest waiter first among classes of equal priority; inside a class,
// strict FIFO. So the total running never exceeds B (G1), and a class with
// waiters always gets its reserved permits, however many shared ones others
// hold (G2). A newcomer never overtakes a waiter that could be served.
//
// checked_workload_plan() resolves and checks a plan against B; a gate
// refuses a plan whose reservations do not fit inside B, with the sum (G10).
// workload_config.hpp reads and prints plans as text. docs/workloads.md has
// the policy, the costs and examples.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bulkhead {

/// The most classes one gate serves.
inline constexpr int max_workloads = 16;

/// One class of work and its budget. See the file comment.
struct workload_class {
    /// Its name: 1-32 characters of [A-Za-z0-9_-], unique in its plan.
    std::string name;
    /// Permits only this class may use. At least 0.
    int reserved = 0;
    /// The most permits it holds at once; 0 means B. At least `reserved`.
    int ceiling = 0;
    /// Its callers that may wait for a permit beyond those running. At least 0.
    int queue = 0;
    /// The longest a call of this class waits for a permit: the call waits
    /// min(its own queue_wait, this). Not negative.
    std::chrono::nanoseconds queue_wait = std::chrono::nanoseconds::max();
    /// Its rank for the shared permits: a higher priority is served first.
    int priority = 0;
    /// 0: the ceiling is fixed. From 1: the class's ceiling adapts, as a
    /// gate's adaptive limit does (adaptive_limit.hpp, default settings),
    /// between this floor and `ceiling`, from the class's own calls: its
    /// holds, its waits, its failures. At least the reservation (a class
    /// always gets its reserved permits) and at most the ceiling.
    int adaptive_floor = 0;

    friend bool operator==(const workload_class&, const workload_class&) = default;
};

/// The classes of one gate, in the order their ids number them (0, 1, ...).
struct workload_plan {
    std::vector<workload_class> classes;

    friend bool operator==(const workload_plan&, const workload_plan&) = default;
};

/// Names a class of a gate: from db_bulkhead::workload(name). The default
/// names the first class (the only one of a plain gate).
struct workload_id {
    int index = 0;

    friend bool operator==(workload_id, workload_id) = default;
};

namespace detail {

[[noreturn]] inline void refuse_plan(const std::string& what) {
    throw std::invalid_argument("bulkhead workload plan: " + what);
}

inline bool valid_workload_name(std::string_view name) noexcept {
    constexpr std::size_t longest = 32;
    if (name.empty() || name.size() > longest) {
        return false;
    }
    for (const char c : name) {
        const bool ok =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) {
            return false;
        }
    }
    return true;
}

}  // namespace detail

/// `plan` checked against a gate of `concurrent` (B) permits, with every
/// ceiling of 0 replaced by B. The sum of the reservations is checked before
/// any ceiling, so that a plan that does not fit says so first (G10).
/// \throws std::invalid_argument naming the class and the setting that is
///         wrong: no class, more than max_workloads, a bad or repeated name,
///         a negative count or wait, a ceiling above B or below the
///         reservation, reservations that together exceed B (the message
///         shows the sum); std::overflow_error when a class's ceiling + queue
///         does not fit an int.
[[nodiscard]] inline workload_plan checked_workload_plan(workload_plan plan, int concurrent) {
    using detail::refuse_plan;
    if (concurrent < 1) {
        refuse_plan("concurrent (B) must be at least 1, not " + std::to_string(concurrent));
    }
    if (plan.classes.empty()) {
        refuse_plan("it has no class; a gate needs at least one");
    }
    if (plan.classes.size() > static_cast<std::size_t>(max_workloads)) {
        refuse_plan(std::to_string(plan.classes.size()) + " classes; at most " + std::to_string(max_workloads));
    }
    std::int64_t reserved_sum = 0;
    std::string reserved_terms;
    for (std::size_t i = 0; i < plan.classes.size(); ++i) {
        const workload_class& c = plan.classes[i];
        if (!detail::valid_workload_name(c.name)) {
            refuse_plan("class " + std::to_string(i) + ": the name \"" + c.name.substr(0, 40) +
                        "\" must be 1-32 characters of A-Z a-z 0-9 _ -");
        }
        for (std::size_t j = 0; j < i; ++j) {
            if (plan.classes[j].name == c.name) {
                refuse_plan("the class name \"" + c.name + "\" appears twice");
            }
        }
        if (c.reserved < 0) {
            refuse_plan("class \"" + c.name + "\": reserved must not be negative, not " + std::to_string(c.reserved));
        }
        if (c.queue < 0) {
            refuse_plan("class \"" + c.name + "\": queue must not be negative, not " + std::to_string(c.queue));
        }
        if (c.queue_wait < std::chrono::nanoseconds::zero()) {
            refuse_plan("class \"" + c.name + "\": queue_wait must not be negative");
        }
        reserved_sum += c.reserved;
        if (!reserved_terms.empty()) {
            reserved_terms += " + ";
        }
        reserved_terms += std::to_string(c.reserved);
        reserved_terms += " (";
        reserved_terms += c.name;
        reserved_terms += ')';
    }
    if (reserved_sum > concurrent) {
        refuse_plan("the reserved permits " + reserved_terms + " = " + std::to_string(reserved_sum) +
                    " do not fit inside B = " + std::to_string(concurrent));
    }
    for (workload_class& c : plan.classes) {
        if (c.ceiling < 0 || c.ceiling > concurrent) {
            refuse_plan("class \"" + c.name + "\": ceiling " + std::to_string(c.ceiling) +
                        " is outside [0, B = " + std::to_string(concurrent) + "] (0 means B)");
        }
        if (c.ceiling == 0) {
            c.ceiling = concurrent;
        }
        if (c.ceiling < c.reserved) {
            refuse_plan("class \"" + c.name + "\": ceiling " + std::to_string(c.ceiling) + " is below its reserved " +
                        std::to_string(c.reserved));
        }
        if (c.adaptive_floor != 0 && (c.adaptive_floor < std::max(c.reserved, 1) || c.adaptive_floor > c.ceiling)) {
            refuse_plan("class \"" + c.name + "\": adaptive_floor " + std::to_string(c.adaptive_floor) +
                        " is outside [max(1, reserved " + std::to_string(c.reserved) + "), ceiling " +
                        std::to_string(c.ceiling) + "] (0: a fixed ceiling)");
        }
        if (c.queue > std::numeric_limits<int>::max() - c.ceiling) {
            throw std::overflow_error("bulkhead workload plan: class \"" + c.name +
                                      "\": ceiling + queue overflows int");
        }
    }
    return plan;
}

/// The sum of the plan's reservations.
[[nodiscard]] inline int reserved_permits(const workload_plan& plan) noexcept {
    int sum = 0;
    for (const workload_class& c : plan.classes) {
        sum += c.reserved;
    }
    return sum;
}

}  // namespace bulkhead
