// bulkhead: the intrusive FIFO of waiting threads behind fifo_semaphore.
//
// Each waiting thread is a node that lives on its own stack for exactly as
// long as it waits, so waiting never allocates; an asynchronous caller's node
// lives in its operation's state, which its completion token allocated. The queue only links nodes; it
// owns none of them. The queue's members, and each node's links and `queued`,
// are guarded by the owning semaphore's mutex.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace bulkhead::detail {

/// A hint to the CPU inside a spin-wait loop (x86 `pause`): saves power and
/// lets a sibling hyper-thread run. Nothing elsewhere.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/// One entry of fifo_semaphore's queue: a blocked thread (`waiter`) or an
/// asynchronous caller (fifo_semaphore::async_node), told apart only by
/// `grant`. The links and `queued` are guarded by the semaphore's mutex.
struct queue_node {
    /// How a release hands this node its permit. Called once, by the
    /// releasing thread, with no lock held, after the node left the queue;
    /// the node may be gone as soon as it returns.
    using grant_function = void (*)(queue_node& node) noexcept;

    explicit queue_node(grant_function on_grant) noexcept : grant(on_grant) {}

    queue_node* prev = nullptr;  // guarded by the semaphore's mutex
    queue_node* next = nullptr;  // guarded by the semaphore's mutex; a releaser's list once popped
    bool queued = false;         // guarded by the semaphore's mutex: linked in the queue
    std::uint64_t ticket = 0;    // guarded by the owner's mutex: arrival order (workload_scheduler only)
    grant_function grant;        // set once, at construction
};

/// One thread waiting for a permit. Lives on the waiting thread's stack.
///
/// Two locks guard it, never held together: the semaphore's mutex guards the
/// links and `queued` (the queue's state), the node's own `lock` guards
/// `granted` and `cancelled` (what the waiter sleeps on). A releaser decides
/// under the semaphore's mutex whom to grant, lets go of it, then sets
/// `granted` under the node's lock and notifies with no lock held, so the
/// woken thread never blocks again on a lock its waker still holds: one wake
/// per handoff. `handed_over` is the releaser's last touch of the node; a
/// granted waiter returns only once it is set, so the node outlives the
/// notify.
struct waiter : queue_node {
    waiter() noexcept : queue_node(&wake_granted) {}

    std::mutex lock;                       // guards granted and cancelled
    bool granted = false;                  // guarded by lock; set by a release, once popped
    bool cancelled = false;                // guarded by lock; set by a stop callback
    std::condition_variable wake;          // waited on with lock; notified with no lock held
    std::atomic<bool> handed_over{false};  // set by the granting releaser after its notify: done with the node

private:
    /// The grant of a blocked thread: marks it granted, wakes it, then lets
    /// it go (release: the waiter may return, and its node vanish, as soon as
    /// it sees handed_over).
    static void wake_granted(queue_node& base) noexcept {
        auto& node = static_cast<waiter&>(base);
        {
            const std::lock_guard node_lock(node.lock);
            node.granted = true;  // the permit is the waiter's from here
        }
        node.wake.notify_one();
        node.handed_over.store(true, std::memory_order_release);
    }
};

/// A doubly linked FIFO of nodes that live elsewhere (on their waiting
/// threads' stacks): O(1) push at either end, pop and removal from the
/// middle (a waiter that gives up leaves from wherever it is). Owns none of
/// them. `Node` has `Node* prev`, `Node* next` and `bool queued`, all
/// guarded by whatever guards the queue. Serves fifo_semaphore (`waiter`)
/// and the pqxx pool (`pool_waiter`).
template <class Node>
class intrusive_fifo {
public:
    [[nodiscard]] bool empty() const noexcept { return m_head == nullptr; }

    /// The oldest node, or null.
    [[nodiscard]] Node* front() const noexcept { return m_head; }

    void push_back(Node& node) noexcept {
        node.queued = true;
        node.prev = m_tail;
        node.next = nullptr;
        (m_tail != nullptr ? m_tail->next : m_head) = &node;
        m_tail = &node;
    }

    /// Links `node` as the oldest (a waiter that keeps its turn).
    void push_front(Node& node) noexcept {
        node.queued = true;
        node.prev = nullptr;
        node.next = m_head;
        (m_head != nullptr ? m_head->prev : m_tail) = &node;
        m_head = &node;
    }

    /// Unlinks and returns the oldest node. Precondition: !empty().
    Node& pop_front() noexcept {
        Node& node = *m_head;
        remove(node);
        return node;
    }

    /// Unlinks `node`, which must be in this queue.
    void remove(Node& node) noexcept {
        (node.prev != nullptr ? node.prev->next : m_head) = node.next;
        (node.next != nullptr ? node.next->prev : m_tail) = node.prev;
        node.prev = nullptr;
        node.next = nullptr;
        node.queued = false;
    }

private:
    Node* m_head = nullptr;
    Node* m_tail = nullptr;
};

/// The queue of fifo_semaphore: threads and asynchronous callers in one
/// arrival order.
using wait_queue = intrusive_fifo<queue_node>;

}  // namespace bulkhead::detail
