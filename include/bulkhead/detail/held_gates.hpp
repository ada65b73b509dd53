// bulkhead: which gates the current thread's callers are inside (for
// non-reentrancy).
//
// A gate is not reentrant: a caller that holds one of its execution permits
// and asks again would wait for itself. Each thread keeps a small record of
// the permits taken on it, so the second entry fails at once with
// std::logic_error instead of deadlocking.
//
// The mechanism.
// - An entry is (gate, task, serial). `task` names the logical caller: by
//   default null, meaning "this thread"; callers that multiplex independent
//   tasks on one thread (coroutines, fibers) pass their task's identity in
//   the gate's options, so that two tasks on one thread are never refused as
//   reentrant, and one task that enters twice still is.
// - The record is thread_local, constant-initialized and fixed-size: no
//   allocation, no lock and no guard variable on the fast path.
// - A permit may move to another thread and be released there. The
//   releasing thread cannot touch the entering thread's record (it may even
//   have exited), so it leaves a note in the gate instead (remote_releases):
//   the entering thread, when its record says it holds the gate, looks for
//   that note before refusing, and drops the entry it finds noted. Nothing is
//   poisoned, and a releasing thread's own entries are never touched, so
//   nothing is bypassed. The note is looked up only in that rare case: the
//   fast path reads the thread's own record alone.
// - Serials are unique per record and per thread lifetime: a thread takes a
//   block of 2^32 from a process-wide counter the first time it needs one,
//   so a note about a thread that has exited never matches a new thread
//   that happens to reuse its record's address.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace bulkhead::detail {

class held_gates {
public:
    /// How many permits one thread can hold at once and still be checked.
    /// Deeper nesting works, but entries beyond this are not tracked.
    static constexpr std::size_t capacity = 16;

    /// The serial of the entry for (gate, task), or 0 when there is none.
    [[nodiscard]] std::uint64_t holds(const void* gate, const void* task) const noexcept {
        for (std::size_t i = 0; i < m_count; ++i) {
            if (m_entries[i].gate == gate && m_entries[i].task == task) {
                return m_entries[i].serial;
            }
        }
        return 0;
    }

    /// Records (gate, task); returns its serial, or 0 (nothing recorded)
    /// when full.
    std::uint64_t add(const void* gate, const void* task) noexcept {
        if (m_count == capacity) {
            return 0;
        }
        if ((m_next_serial & 0xFFFF'FFFFU) == 0) {
            // relaxed: only uniqueness matters.
            m_next_serial = blocks().fetch_add(std::uint64_t{1} << 32U, std::memory_order_relaxed) + 1;
        }
        const std::uint64_t serial = m_next_serial++;
        m_entries[m_count++] = entry{gate, task, serial};
        return serial;
    }

    /// Forgets the entry with `serial`, if present.
    void remove(std::uint64_t serial) noexcept {
        for (std::size_t i = m_count; i-- > 0;) {
            if (m_entries[i].serial == serial) {
                m_entries[i] = m_entries[--m_count];
                return;
            }
        }
    }

private:
    struct entry {
        const void* gate;
        const void* task;
        std::uint64_t serial;
    };

    static std::atomic<std::uint64_t>& blocks() noexcept {
        static std::atomic<std::uint64_t> next{std::uint64_t{1} << 32U};
        return next;
    }

    std::array<entry, capacity> m_entries{};  // owned by one thread, no sharing
    std::size_t m_count = 0;                  // owned by one thread, no sharing
    std::uint64_t m_next_serial = 0;          // owned by one thread; 0 until the first add
};

/// The current thread's record.
inline thread_local held_gates this_thread_gates;

/// Notes, kept by one gate, of permits released on a thread other than the
/// one that entered: (entering thread's record, serial). Guarded by its own
/// mutex; touched only when a permit is released on another thread, or when
/// a thread's record says it already holds the gate.
class remote_releases {
public:
    /// Most notes kept; beyond that the oldest is dropped. A thread whose
    /// note was dropped keeps its entry: it is refused as reentrant when it
    /// enters that gate again, for as long as it lives. That needs more than
    /// this many permits moved away and released elsewhere while their
    /// entering threads never came back to the gate; a thread whose permit is
    /// still held elsewhere (moved, not yet released) is refused too.
    static constexpr std::size_t capacity = 4096;

    /// Notes that the permit `serial` of `record` was released elsewhere.
    void note(const held_gates* record, std::uint64_t serial) noexcept {
        const std::lock_guard lock(m_mutex);
        try {
            if (m_notes.size() == capacity) {
                m_notes.erase(m_notes.begin());
            }
            m_notes.emplace_back(record, serial);
        } catch (...) {  // out of memory: the note is lost (as above)
        }
    }

    /// True, and the note dropped, when `serial` of `record` was released
    /// elsewhere. `record` is only compared, never read.
    bool take(const held_gates* record, std::uint64_t serial) noexcept {
        const std::lock_guard lock(m_mutex);
        for (auto each = m_notes.begin(); each != m_notes.end(); ++each) {
            if (each->first == record && each->second == serial) {
                m_notes.erase(each);
                return true;
            }
        }
        return false;
    }

private:
    std::mutex m_mutex;
    std::vector<std::pair<const held_gates*, std::uint64_t>> m_notes;  // guarded by m_mutex
};

}  // namespace bulkhead::detail
