// bulkhead: counters that many threads bump without sharing a cache line.
//
// A gate counts every admission and every rejection. One atomic counter per
// event would cost each call a locked read-modify-write (about 4-5 ns here)
// and, with many threads rejecting at once, a cache line that bounces between
// cores at exactly the moment rejections are all the gate does. Instead each
// counter set has one cache-line stripe per thread slot:
//
// - A thread gets a slot the first time it counts anything (in any gate) and
//   keeps it until it exits; then the slot goes back for reuse. Slots are
//   claimed and returned in one process-wide 64-bit mask, lock-free.
// - Slots 0 to 62 are exclusive: only the owning thread writes its stripe, so
//   a bump is a plain relaxed load and store (no locked instruction).
// - A thread whose first count finds all 63 taken uses the last stripe, shared,
//   with fetch_add (as a single shared counter would), for the rest of its
//   life: slots are claimed once per thread, and a thread keeps its slot
//   until it exits, busy or not. With more than 63 long-lived threads
//   counting, the ones that came last share a line.
// - One copy of the slot mask per program: built into two shared libraries
//   with -fvisibility=hidden, each library would get its own mask (and its
//   own slots) for the same gate; keep bulkhead's symbols visible there.
//
// Readers (stats()) sum the stripes with relaxed loads: every count they see
// was really reached, and a counter never goes down. A slot's next owner
// continues from its stripe's value: the claim (acquire) synchronizes with
// the previous owner's return (release), so no count is lost across owners.
//
// Memory: 64 stripes of one cache line each (4 KiB) per counter set.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace bulkhead::detail {

/// The current thread's stripe slot.
class stripe_slot {
public:
    /// Stripes per counter set.
    static constexpr std::size_t count = 64;
    /// The slot of threads that found no exclusive one free.
    static constexpr std::size_t shared = count - 1;

    /// This thread's slot: exclusive (below `shared`) or `shared`.
    [[nodiscard]] static std::size_t current() noexcept {
        const std::size_t held = t_slot;  // 0: none yet; otherwise slot + 1
        return held != 0 ? held - 1 : claim();
    }

private:
    /// Gives an exclusive slot back when its thread exits. Constructed only
    /// by a thread that claimed one, on that first claim.
    struct returner {
        std::size_t slot = shared;
        returner() = default;
        returner(const returner&) = delete;
        returner& operator=(const returner&) = delete;
        ~returner() {
            if (slot != shared) {
                // release: the stripe's last writes happen-before the next
                // owner's first.
                g_taken.fetch_and(~(std::uint64_t{1} << slot), std::memory_order_release);
            }
            // Counting from a destructor that runs after this one (another
            // thread_local) goes to the shared stripe from now on.
            t_slot = shared + 1;
        }
    };

    static std::size_t claim() noexcept {
        constexpr std::uint64_t exclusive_slots = (std::uint64_t{1} << shared) - 1;
        std::uint64_t taken = g_taken.load(std::memory_order_relaxed);
        std::size_t slot = shared;
        while ((taken & exclusive_slots) != exclusive_slots) {
            const auto free_slot = static_cast<std::size_t>(std::countr_one(taken));
            // acquire: pairs with the previous owner's release in ~returner.
            if (g_taken.compare_exchange_weak(taken, taken | (std::uint64_t{1} << free_slot), std::memory_order_acquire,
                                              std::memory_order_relaxed)) {
                slot = free_slot;
                break;
            }
        }
        t_slot = slot + 1;
        if (slot != shared) {
            thread_local returner on_exit;  // constructed here, once per thread
            on_exit.slot = slot;
        }
        return slot;
    }

    // Bit i set: exclusive slot i is owned by a live thread. Constant-initialized
    // and trivially destructible: usable by threads that exit after main().
    inline static constinit std::atomic<std::uint64_t> g_taken{0};
    // Constant-initialized, trivially destructible: no TLS guard on the fast path.
    inline static constinit thread_local std::size_t t_slot = 0;
};

/// N counters, striped per thread slot.
template <std::size_t N>
class striped_counters {
public:
    /// Adds one to counter `which` (< N).
    void bump(std::size_t which) noexcept {
        const std::size_t slot = stripe_slot::current();
        std::atomic<std::uint64_t>& counter = m_stripes[slot].values[which];
        if (slot == stripe_slot::shared) {
            counter.fetch_add(1, std::memory_order_relaxed);  // several writers
        } else {
            // One writer (this thread); relaxed: the counts order nothing.
            counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        }
    }

    /// The total of counter `which` over all stripes.
    [[nodiscard]] std::uint64_t sum(std::size_t which) const noexcept {
        std::uint64_t total = 0;
        for (const stripe& each : m_stripes) {
            total += each.values[which].load(std::memory_order_relaxed);
        }
        return total;
    }

private:
    struct alignas(64) stripe {
        std::array<std::atomic<std::uint64_t>, N> values{};
    };
    static_assert(sizeof(stripe) == 64, "bulkhead: a stripe must fit one cache line");

    std::array<stripe, stripe_slot::count> m_stripes{};
};

}  // namespace bulkhead::detail
