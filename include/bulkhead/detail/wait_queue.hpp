// bulkhead: the intrusive FIFO of waiting threads behind fifo_semaphore.
//
// Each waiter is a node that lives on its own thread's stack for exactly as
// long as it waits, so waiting never allocates. The queue only links nodes; it
// owns none of them. Every member is guarded by the owning semaphore's mutex.
#pragma once

#include <condition_variable>

namespace bulkhead::detail {

/// One thread waiting for a permit. Lives on the waiting thread's stack.
struct waiter {
    waiter* prev = nullptr;        // guarded by the semaphore's mutex
    waiter* next = nullptr;        // guarded by the semaphore's mutex
    bool granted = false;          // guarded by the semaphore's mutex; set by release()
    bool cancelled = false;        // guarded by the semaphore's mutex; set by a stop callback
    std::condition_variable wake;  // notified (under the mutex) when granted or cancelled
};

/// A doubly linked FIFO of waiters: O(1) push, pop and removal from the middle
/// (a waiter that gives up leaves from wherever it is).
class wait_queue {
public:
    [[nodiscard]] bool empty() const noexcept { return m_head == nullptr; }

    void push_back(waiter& node) noexcept {
        node.prev = m_tail;
        node.next = nullptr;
        if (m_tail != nullptr) {
            m_tail->next = &node;
        } else {
            m_head = &node;
        }
        m_tail = &node;
    }

    /// Unlinks and returns the oldest waiter. Precondition: !empty().
    waiter& pop_front() noexcept {
        waiter& node = *m_head;
        remove(node);
        return node;
    }

    /// Unlinks `node`, which must be in this queue.
    void remove(waiter& node) noexcept {
        (node.prev != nullptr ? node.prev->next : m_head) = node.next;
        (node.next != nullptr ? node.next->prev : m_tail) = node.prev;
        node.prev = nullptr;
        node.next = nullptr;
    }

private:
    waiter* m_head = nullptr;
    waiter* m_tail = nullptr;
};

}  // namespace bulkhead::detail
