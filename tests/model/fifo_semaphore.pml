/* fifo_semaphore.pml: a Promela model of bulkhead::fifo_semaphore
 * (include/bulkhead/fifo_semaphore.hpp, detail/wait_queue.hpp), checked
 * exhaustively with spin.
 *
 * Two kinds of caller share ONE queue, in one arrival order: threads that
 * block (worker: detail::waiter nodes on their stacks) and asynchronous
 * callers (async_waiter: fifo_semaphore::async_node, with a canceller each).
 * Node ids: threads 0 .. NWORKERS-1, async nodes NWORKERS .. NNODES-1.
 * Optionally (-DRESIZE=n) a resizer changes the limit while they run.
 *
 * What is modelled, step for step with the C++ code:
 *   - m_state, the packed word "free permits | waiters << 32": two variables
 *     that are only ever changed together inside one atomic block, which is a
 *     compare-and-swap against the values the thread loaded earlier (the load
 *     and the CAS are separate steps, so other threads run in between), or a
 *     fetch_add / fetch_sub; the free count is signed (the code stores it
 *     with a bias of 2^31): below zero while a shrink's debt is unpaid;
 *   - try_acquire(): the lock-free fast path (fails while anyone waits or
 *     while the free count is not above zero);
 *   - release(): one fetch_add of the permit, whatever the word holds; if
 *     it saw waiters, hand_over(): under m_mutex it picks the oldest waiters
 *     of either kind while free permits remain (load, then a CAS taking one
 *     permit and one waiter together, retried) and unlinks them (`queued` =
 *     false); then, with m_mutex released, calls each one's grant, reading
 *     the node's `next` first: a thread's (waiter::wake_granted) is `granted`
 *     under the node's lock, notify with no lock held, `handed_over` as its
 *     last touch of the node; an async node's (async_node::deliver) runs the
 *     owner's on_granted, modelled as the releaser setting the node's
 *     async_granted flag, its only touch of the node;
 *   - wait(): the stop_callback registration (run inline when the stop came
 *     first), the early cancelled check under the node's lock,
 *     take_or_enqueue() under m_mutex, the sleep loop under the node's lock
 *     ("granted? cancelled? sleep on the condition variable", the timeout
 *     decision: a grant wins), and for a waiter that gave up: m_mutex,
 *     "still queued? leave : wait for the grant on its way"; a granted waiter
 *     returns only once `handed_over`; then the stop_callback and the node
 *     are destroyed, in that order;
 *   - cancel_waiter: run by the thread that requests the stop: `cancelled`
 *     under the node's lock, then notify with no lock held;
 *   - acquire_or_enqueue(node): try_acquire(), else under m_mutex the same
 *     take_or_enqueue() as a thread's (take a permit, or count the node in
 *     and link it behind everyone queued), returning at once; a queued async
 *     caller then waits (holding no thread) for on_granted or for its
 *     canceller's cancel(node) == true, whichever comes first; with a permit
 *     it does its work and releases (in the code on a work thread);
 *   - cancel(node), by the canceller (the operation's timer or stop, another
 *     thread), at any moment after acquire_or_enqueue() returned false, or
 *     never: under m_mutex, still queued? remove it, one waiter less, true
 *     (the call holds nothing) : false (a hand_over has unlinked it, its
 *     on_granted has run or is about to, the permit is the caller's);
 *   - the resizer (-DRESIZE=n, for an adaptive limit), concurrently with
 *     every caller: n times, shrink by one and grow back by one, in either
 *     order (chosen each time, so a grow may come before its shrink).
 *     shrink(1) is its one relaxed fetch_sub of the free count, whatever it
 *     holds (it may go negative: a debt that the next fetch_adds pay before
 *     any waiter is served); growing is release(1) by a thread that holds no
 *     permit, step for step the releaser's path: the fetch_add, then, if it
 *     saw waiters, hand_over() under m_mutex. With 1 permit the capacity
 *     goes down to 0 (callers queue until the grow) and up to 2;
 *   - the condition variable: wait releases the node's lock atomically; a
 *     notify reaches the waiter only while it sleeps; a timed wait may wake
 *     at any moment (the deadline is abstract time) and then reports timeout
 *     or not (libstdc++ returns timeout whenever the clock has passed the
 *     deadline, notified or not); untimed waits do not wake spuriously here,
 *     so that a lost wake-up shows as a stuck waiter (an invalid end state).
 *
 * What is checked (spin -a, pan with -DSAFETY: every reachable state):
 *   1. conservation: free + held + in flight == capacity in every state (no
 *      permit lost, none duplicated), and so at quiescence; "in flight" is a
 *      permit between a releaser's hands and the free count; a permit
 *      belongs to a waiter of either kind from the moment hand_over unlinks
 *      it; the capacity is PERMITS - shrinks + grows so far, a variable of
 *      the model changed in the same step as the shrink's fetch_sub and the
 *      grow's fetch_add (without a resizer it stays PERMITS); the free count
 *      is negative exactly when the permits held or in flight outnumber the
 *      capacity (a shrink took permits that were not free);
 *   2. a wait that ends acquired holds exactly one permit, one that ends
 *      timed_out or cancelled holds none, and never more than MAX_CAPACITY
 *      (PERMITS, or PERMITS + 1 with a resizer) callers hold one at once;
 *      likewise for an async caller: granted (or taken at once) holds one,
 *      cancelled while queued holds none; the limit: every take of a permit
 *      (try_acquire, take_or_enqueue, a hand_over's grant) leaves at most
 *      `capacity` permits held, granted ones included, so after a shrink
 *      nobody acquires until the holders are below the new capacity (nobody
 *      takes a permit of the debt);
 *   3. FIFO across both kinds: hand_over grants the oldest queued node,
 *      thread or async (no node still in the queue has an older ticket), a
 *      node is unlinked before it is granted, and nobody takes a permit
 *      outside hand_over while someone is queued (no barging);
 *   4. no waiter stuck with a permit available: "waiters > 0 and free > 0"
 *      only while a release() that saw waiters (a caller's or a grow) has
 *      not yet let go of m_mutex in its hand_over() (in every state), and
 *      every caller finishes (a thread that sleeps forever, or an async node
 *      that is never granted nor cancelled, is an invalid end state; with a
 *      resizer too: each shrink's grow comes, so a caller left waiting is a
 *      bug, not a capacity that stayed at 0);
 *   5. the waiter count equals the queue's length (in every state of the
 *      model, which folds the two changes into one step under m_mutex);
 *   6. a releaser touches a node (granted, notify, handed_over; on_granted)
 *      only while it is alive (a thread still inside wait(); an async node
 *      until its canceller is done with it);
 *   7. every queued async node gets exactly one of: on_granted (once), or
 *      cancel(node) == true; cancel(node) == false only for a node a
 *      hand_over has unlinked (its grant has come or is coming);
 *   8. at the end: the capacity back to PERMITS and every permit free (free
 *      == capacity: every debt paid), nobody queued, every caller and the
 *      resizer finished.
 *
 * Seeded bugs (compile with -D<NAME>; each must make the check fail):
 *   BUG_HANDOVER_FREES         hand_over leaves the permit in the free count
 *                              instead of granting it to the oldest waiter
 *   BUG_TIMEOUT_IGNORES_GRANT  a waiter that gave up and is no longer queued
 *                              reports timed_out / cancelled anyway, instead
 *                              of waiting for the grant on its way
 *   BUG_LEAVE_UNCHECKED        a waiter that gave up unlinks itself without
 *                              checking that it is still queued
 *   BUG_LIFO                   hand_over serves the newest waiter
 *   BUG_RELEASE_STALE_WAITERS  release() decides whether to hand over from a
 *                              load made before its fetch_add (check-then-act)
 *   BUG_NO_HANDOVER_WAIT       a granted waiter returns without waiting for
 *                              `handed_over` (its node may vanish while the
 *                              releaser still notifies it)
 *   BUG_CANCEL_UNCHECKED       cancel(node) removes the node without checking
 *                              `queued` (it may have been unlinked by a
 *                              hand_over already)
 *   BUG_CANCEL_ALWAYS_WINS     cancel(node) reports true (cancelled, holds
 *                              nothing) also for a node a hand_over has
 *                              unlinked: the granted permit is dropped
 *   BUG_GRANT_KEEPS_LINKED     hand_over grants an async node (takes its
 *                              permit and its waiter count) without unlinking
 *                              it: it stays in the queue and `queued`
 *   BUG_GROW_WITHOUT_HANDOVER  (with RESIZE) a grow adds its permit (the
 *                              fetch_add) but never hand_over()s to the
 *                              waiters it saw
 *   BUG_TAKE_IN_DEBT           (with RESIZE) try_acquire() treats only
 *                              free == 0 as "no permit" (the test of the code
 *                              before the free count could go negative), so
 *                              it takes a permit from a negative free count
 *
 * Not modelled: release(count > 1), and so a grow by more than one;
 * shrink(count > 1), and a debt of more than one permit at a time (with 1
 * permit and one shrink at a time the free count goes down to -1); a
 * resizer that shrinks for good (the model's every shrink is followed by
 * its grow, or preceded by it); shrink()'s debug-only load before its
 * fetch_sub (an assertion, it decides nothing); memory orders (every
 * access here is sequentially consistent); a lock that throws (the C++ code
 * terminates then: wait_queued(), release() and hand_over() are noexcept);
 * stop_possible() == false (the same as not passing a token). node_alive is
 * per thread, not per node: a releaser touching a node after its thread
 * started its next wait() would not be caught (the code reads and writes a
 * node only before handed_over, and the waiter returns only after it). For
 * async nodes: what on_granted does beyond taking the permit (asio.hpp hands
 * the call to a work thread, which releases: here the async_waiter itself
 * releases); an on_granted that destroys its node inside the call (the
 * model's async node lives until its canceller is done; hand_over does not
 * touch a node after its grant, having read `next` first); cancel(node)
 * before acquire_or_enqueue() has returned (asio.hpp's stop callback may do
 * that, gets false and, seeing the stop after acquire_or_enqueue() returns,
 * cancels again: that re-check is asio.hpp's, not the semaphore's); one
 * call per async waiter, one cancel per node.
 *
 * Sizes: NWORKERS threads (1 to 4, default 3), NASYNC async waiters (0 to 3,
 * default 0: the thread-only configurations are exactly what they were
 * before async nodes existed), PERMITS (default 1), ROUNDS acquisitions per
 * thread (default 2; CI uses 1 with 3 threads), RESIZE shrink-and-grow
 * cycles of the resizer (0 to 2, default 0: no resizer, and every
 * configuration has exactly the states it had before the resizer existed;
 * with it PERMITS must be 1, as hand_over's list of grantees holds two).
 * The kinds of wait: acquire(), try_acquire_for(d), acquire(stop) and
 * try_acquire_for(d, stop); the stop kinds only in the first round (one
 * stop source per thread, whose stop a thread of its own may request at any
 * moment, or never). By default
 * the roles are fixed (thread 0 acquire(), thread 1 try_acquire_for(d),
 * threads STOPPABLE_FROM (default 2) and up either stop kind; with
 * -DSTOPPABLE_FROM=1 thread 1 takes any of try_acquire_for(d) and the two
 * stop kinds), which keeps three threads to a few million states; with
 * -DANY_KIND every thread picks any kind in every round (CI runs that with 2
 * threads, 2 rounds); with -DPLAIN_ONLY every thread calls acquire(). Each
 * async waiter makes one acquire_or_enqueue() call; its canceller cancels it
 * at any moment while it may be queued, or never.
 * tests/model/CMakeLists.txt lists the configurations CI checks, and
 * docs/testing.md their state counts and times.
 */

#ifndef NWORKERS
#define NWORKERS 3
#endif
#ifndef PERMITS
#define PERMITS 1
#endif
#ifndef ROUNDS
#define ROUNDS 2
#endif
#ifndef NASYNC
#define NASYNC 0
#endif
#ifndef STOPPABLE_FROM
#define STOPPABLE_FROM 2
#endif
#ifndef RESIZE
#define RESIZE 0
#endif

/* Node ids: threads 0 .. NWORKERS-1, async nodes NWORKERS .. NNODES-1. */
#define NNODES (NWORKERS + NASYNC)
#define IS_ASYNC(node) ((node) >= NWORKERS && (node) < NNODES)
/* The id under which the canceller of async node `node` takes m_mutex. */
#define CANCELLER(node) (100 + (node))

#define NOBODY 255
/* The id under which the resizer takes m_mutex (in its grows' hand_over). */
#define RESIZER_ID 90

/* The resizer's processes: one with RESIZE > 0, none without. Every shrink
 * is undone by a grow, so the capacity is PERMITS again at the end, and at
 * most PERMITS + 1 in between (a grow before its shrink). */
#if RESIZE > 0
#define NRESIZERS 1
#define MAX_CAPACITY (PERMITS + 1)
#else
#define NRESIZERS 0
#define MAX_CAPACITY PERMITS
#endif

#define ACQUIRED  0
#define TIMED_OUT 1
#define CANCELLED 2
#define WAITING   3

/* ---- the semaphore ---------------------------------------------------- */

short permits = PERMITS;  /* m_state, low half: free permits; signed: negative while a
                           * shrink's debt is unpaid (the code's bias of 2^31) */
byte waiters = 0;         /* m_state, high half: queued waiters */

byte mutex_owner = NOBODY;  /* m_mutex: a thread id, or NOBODY */

/* detail::queue_node, the part both kinds share: one per worker thread
 * (a detail::waiter, on its stack while it waits) and one per async waiter
 * (an async_node, in its operation's state) */
bool queued[NNODES];        /* guarded by m_mutex: linked in the queue */
bool node_alive[NNODES];    /* model only: the node exists (a thread is inside wait(); an
                             * async node until its canceller is done with it) */

/* detail::waiter, the thread's own part */
bool granted[NWORKERS];      /* guarded by the node's lock */
bool cancelled[NWORKERS];    /* guarded by the node's lock */
bool handed_over[NWORKERS];  /* atomic: the releaser is done with the node */
bool sleeping[NWORKERS];    /* model only: blocked in wake.wait / wait_until */
bool notified[NWORKERS];    /* model only: a notify_one reached the sleeper */

/* fifo_semaphore::async_node, the asynchronous caller's part (indexed by
 * node id; the entries of thread ids stay unused) */
bool enqueued[NNODES];        /* model only: acquire_or_enqueue() returned false */
bool async_granted[NNODES];   /* model only: a releaser ran its on_granted */
bool left_queue[NNODES];      /* model only: cancel(node) returned true */
bool canceller_done[NNODES];  /* model only: the canceller will not touch the node again */
bool popped[NNODES];          /* model only: unlinked by a hand_over (the permit is the node's) */

/* detail::wait_queue: oldest first, threads and async nodes in one order */
byte queue[NNODES];
byte qlen = 0;

/* ---- the environment -------------------------------------------------- */

bool stop_requested[NWORKERS];  /* std::stop_source, one per worker */
bool cb_registered[NWORKERS];   /* std::stop_callback<cancel_waiter> registered */
bool cb_running[NWORKERS];      /* ... and running in the stopper's thread */
bool uses_stop[NWORKERS];       /* model only: the worker's current call takes the stop_token */

/* ---- model-only accounting -------------------------------------------- */

byte owned[NNODES];     /* permits each node's caller holds */
byte in_flight = 0;     /* released, not yet free or granted */
byte pending = 0;       /* releases that saw waiters and whose hand_over still holds or awaits m_mutex */
byte holding = 0;       /* callers between acquire and release */
byte ticket[NNODES];    /* arrival order into the queue */
byte next_ticket = 1;
byte finished = 0;
byte capacity = PERMITS;  /* PERMITS - shrinks + grows so far: changed in the step of the
                           * shrink's fetch_sub and of the grow's fetch_add */

#if NWORKERS < 1 || NWORKERS > 4 || NASYNC < 0 || NASYNC > 3
#error "NWORKERS must be 1 to 4, NASYNC 0 to 3"
#endif
#if RESIZE < 0 || RESIZE > 2 || MAX_CAPACITY > 2
#error "RESIZE must be 0 to 2, and PERMITS (+ 1 with RESIZE) at most 2: hand_over's list of grantees holds two"
#endif
#if NNODES == 2
#define OWNED (owned[0] + owned[1])
#elif NNODES == 3
#define OWNED (owned[0] + owned[1] + owned[2])
#elif NNODES == 4
#define OWNED (owned[0] + owned[1] + owned[2] + owned[3])
#elif NNODES == 5
#define OWNED (owned[0] + owned[1] + owned[2] + owned[3] + owned[4])
#elif NNODES == 6
#define OWNED (owned[0] + owned[1] + owned[2] + owned[3] + owned[4] + owned[5])
#else
#error "NWORKERS + NASYNC must be 2 to 6"
#endif

/* ---- the invariants, checked in every reachable state ----------------- */

active proctype conservation() {
end:
    atomic {
        (permits + OWNED + in_flight != capacity) ->
            assert(permits + OWNED + in_flight == capacity)  /* no permit lost or duplicated */
    }
}

active proctype nobody_waits_while_a_permit_is_free() {
end:
    atomic {
        (waiters > 0 && permits > 0 && pending == 0) ->
            assert(!(waiters > 0 && permits > 0 && pending == 0))  /* a waiter stuck with a permit available */
    }
}

/* The code changes the count (a CAS on m_state) and the queue one after the
 * other, both under m_mutex; the model folds the two into one step, so here
 * they must agree in every state, which is the code's "equal whenever
 * m_mutex is free". */
active proctype queue_matches_waiter_count() {
end:
    atomic { (qlen != waiters) -> assert(qlen == waiters) }
}

active proctype at_the_end() {
end:
    (finished == NNODES + NRESIZERS) ->
        assert(capacity == PERMITS && permits == capacity && waiters == 0 && qlen == 0 && in_flight == 0 &&
               pending == 0 && mutex_owner == NOBODY)
}

/* ---- building blocks -------------------------------------------------- */

/* Granularity. Each atomic block below is one step of the interleaving. The
 * model keeps every access to m_state (a load, a CAS, a fetch_add/sub) a step
 * of its own, and so is every sleep and wake-up on a condition variable and
 * every stop request. Work done under m_mutex that touches only what the
 * mutex guards (the queue and the nodes' flags) is folded into a neighbouring
 * step of the same critical section: no other thread can see it happen (the
 * mutex excludes them), so folding it loses no behaviour (Lipton's reduction:
 * the lock is a right mover, the unlock a left mover, guarded accesses move
 * both ways). Without this the state space of three threads is beyond a
 * CI budget. Every critical section of a node's own lock touches only what
 * that lock guards and is one step here, so the lock itself needs no
 * variable: no step boundary ever falls inside it. */

inline lock(who) {
    atomic { mutex_owner == NOBODY -> mutex_owner = who }
}

inline unlock(who) {
    d_step { assert(mutex_owner == who); mutex_owner = NOBODY }
}

/* notify_one on the node's condition variable: reaches it only if it sleeps. */
inline notify(node) {
    assert(node_alive[node]);  /* the node is still on its thread's stack */
    if
    :: sleeping[node] -> notified[node] = true
    :: else -> skip
    fi
}

inline push_back(node) {
    queue[qlen] = node;
    qlen++;
    queued[node] = true;
    ticket[node] = next_ticket;
    next_ticket++
}

/* wait_queue::remove: unlinks `node`, which must be in the queue. */
inline remove(node) {
    k = 0;
    do
    :: k < qlen && queue[k] != node -> k++
    :: else -> break
    od;
    assert(k < qlen);  /* the node was in the queue */
    do
    :: k + 1 < qlen -> queue[k] = queue[k + 1]; k++
    :: else -> break
    od;
    qlen--;
    queued[node] = false;
    k = 0
}

/* wait_queue::pop_front (or, seeded, the newest) into `node`. */
inline pop_oldest(node) {
#ifdef BUG_LIFO
    node = queue[qlen - 1];
    qlen--;
    queued[node] = false;
#else
    node = queue[0];
#ifdef BUG_GRANT_KEEPS_LINKED
    if
    :: IS_ASYNC(node) -> skip  /* granted, but left linked and `queued` */
    :: else ->
#endif
    k = 0;
    do
    :: k + 1 < qlen -> queue[k] = queue[k + 1]; k++
    :: else -> break
    od;
    qlen--;
    queued[node] = false;
#ifdef BUG_GRANT_KEEPS_LINKED
    fi;
#endif
#endif
    assert(!queued[node]);  /* unlinked before it is granted: cancel(node) must see that */
    if
    :: IS_ASYNC(node) -> popped[node] = true
    :: else -> skip
    fi;
    /* FIFO: nobody still queued came before `node` */
    k = 0;
    do
    :: k < qlen -> assert(ticket[queue[k]] > ticket[node]); k++
    :: else -> break
    od;
    k = 0
}

/* One CAS on m_state against the word seen before (seen_permits,
 * seen_waiters), replacing it with (new_permits, new_waiters); on failure
 * `seen` is reloaded, as compare_exchange_weak does. */
#define CAS_MATCHES (permits == seen_permits && waiters == seen_waiters)
#define RELOAD seen_permits = permits; seen_waiters = waiters

/* fifo_semaphore::try_acquire(): relaxed load, then CAS(seen, seen - 1). */
inline try_acquire(me, ok) {
    atomic { RELOAD; ok = false }  /* one load of the packed word */
    do
#ifdef BUG_TAKE_IN_DEBT
    /* the unbiased code's test: only free == 0 means "no permit" */
    :: atomic { seen_waiters != 0 || seen_permits == 0 -> seen_permits = 0; seen_waiters = 0; break }
    :: atomic {
           seen_waiters == 0 && seen_permits != 0 ->
#else
    :: atomic { seen_waiters != 0 || seen_permits <= 0 -> seen_permits = 0; seen_waiters = 0; break }
    :: atomic {
           seen_waiters == 0 && seen_permits > 0 ->
#endif
           if
           :: CAS_MATCHES ->
               assert(qlen == 0);  /* no barging past a queued waiter */
               permits--;
               owned[me]++;
               assert(OWNED <= capacity);  /* the limit: nobody takes a permit of a shrink's debt */
               ok = true;
               seen_permits = 0; seen_waiters = 0;
               break
           :: else -> RELOAD
           fi
       }
    od
}

/* The permit comes back (a caller's release) or into circulation (a grow:
 * capacity + 1, in the same step as the fetch_add). */
#define ADD_ONE(growing) if :: growing -> capacity++ :: else -> in_flight-- fi

/* fifo_semaphore::release(1), the part after the caller has let go of its
 * permit: before = fetch_add(1); if waiters_of(before) != 0, hand_over().
 * With `growing` it is the resizer's release(1) that raises the limit: the
 * same code, the permit a new one. */
inline fetch_add_then_hand_over(me, growing) {
#ifdef BUG_RELEASE_STALE_WAITERS
    atomic { RELOAD }  /* a load of the word, then the fetch_add */
    atomic { permits++; ADD_ONE(growing); ok = (seen_waiters != 0); if :: ok -> pending++ :: else -> skip fi }
#else
    atomic { ok = (waiters != 0); permits++; ADD_ONE(growing); if :: ok -> pending++ :: else -> skip fi }
#endif
    if
    :: ok -> ok = false; hand_over(me)  /* pending-- when it lets go of m_mutex */
    :: else -> skip
    fi;
    d_step { seen_permits = 0; seen_waiters = 0 }
}

/* fifo_semaphore::release(1) by a caller that holds a permit. */
inline release(me) {
    d_step { assert(owned[me] == 1); owned[me]--; in_flight++ }
    fetch_add_then_hand_over(me, false)
}

/* fifo_semaphore::shrink(1): one fetch_sub of the free count, whatever it
 * holds; below zero it is a debt that the next fetch_adds pay. It wakes,
 * skips and waits for nobody. */
inline shrink() {
    d_step { permits--; capacity-- }
}

/* The limit grows by one: fifo_semaphore::release(1) by the resizer, which
 * holds no permit: the fetch_add (capacity + 1 in the same step), then, if
 * it saw waiters, hand_over(), as any release. */
inline grow() {
#ifdef BUG_GROW_WITHOUT_HANDOVER
    d_step { permits++; capacity++ }  /* the permit added; the waiters it saw are left to later releases */
#else
    fetch_add_then_hand_over(RESIZER_ID, true)
#endif
}

/* fifo_semaphore::hand_over(). Under m_mutex: seen = load; while the queue
 * is not empty and seen shows a free permit: CAS(seen, seen - one waiter - 1
 * permit), and on success seen = the value written, and pop the oldest onto
 * the end of the list of grantees (the permit is the node's from here),
 * whichever kind it is. Then, with m_mutex released, oldest first, each
 * node's grant (node.next read before it): a thread's is granted = true
 * (under its lock), notify, handed_over = true; an async node's is its
 * owner's on_granted. The list holds at most MAX_CAPACITY (<= 2) nodes:
 * first and second. */
inline hand_over(me) {
    atomic { mutex_owner == NOBODY -> mutex_owner = me; RELOAD; first = NOBODY; second = NOBODY }
    do
    :: atomic { !(qlen > 0 && seen_permits > 0) -> break }
    :: atomic {
           qlen > 0 && seen_permits > 0 ->
#ifdef BUG_HANDOVER_FREES
           break  /* leaves the permit free */
#else
           if
           :: CAS_MATCHES ->
               permits--;
               waiters--;
               seen_permits--;
               seen_waiters--;  /* seen = the value written */
               pop_oldest(next);
               owned[next]++;
               assert(OWNED <= capacity);  /* the limit: nobody takes a permit of a shrink's debt */
               if
               :: first == NOBODY -> first = next
               :: else -> assert(second == NOBODY); second = next
               fi;
               next = 0
           :: else -> RELOAD
           fi
#endif
       }
    od;
    atomic { seen_permits = 0; seen_waiters = 0; assert(mutex_owner == me); mutex_owner = NOBODY; pending-- }
    do
    :: first == NOBODY -> break
    :: first != NOBODY && !IS_ASYNC(first) ->
        /* a thread's grant, waiter::wake_granted */
        d_step {
            next = first;
            first = second;  /* node.next, read before the node is handed over */
            second = NOBODY;
            assert(node_alive[next]);
            granted[next] = true  /* under the node's lock */
        }
        atomic { notify(next) }  /* no lock held */
        d_step { assert(node_alive[next]); handed_over[next] = true }  /* the last touch */
    :: first != NOBODY && IS_ASYNC(first) ->
        /* an async node's grant, async_node::deliver: the owner's on_granted,
         * on this thread, no lock held; the only touch of the node */
        d_step {
            next = first;
            first = second;  /* node.next, read before the grant */
            second = NOBODY;
            assert(node_alive[next]);
            assert(!async_granted[next]);  /* on_granted runs once */
            assert(!left_queue[next]);     /* never for a node that cancel() took out */
            async_granted[next] = true;    /* on_granted: the permit is the caller's */
            next = 0
        }
    od;
    next = 0
}

/* Under m_mutex (lock_guard): fifo_semaphore::take_or_enqueue(node). Takes
 * m_mutex and loads `seen`, then takes a free permit if nobody is queued
 * (CAS seen - 1), else counts the node in and queues it (CAS seen + one
 * waiter, then push_back), retrying on a failed CAS; lets go of m_mutex.
 * Ends with took (outcome = ACQUIRED) or joined. For an async node the
 * unlock is also acquire_or_enqueue()'s return: queued (enqueued), its
 * canceller may call cancel(node) from then on. */
inline locked_take_or_enqueue(me) {
    atomic { mutex_owner == NOBODY -> mutex_owner = me; RELOAD }
    do
    :: took || joined -> break
    :: atomic {
           !took && !joined && seen_waiters == 0 && seen_permits > 0 ->
           if
           :: CAS_MATCHES ->
               assert(qlen == 0);
               permits--;
               owned[me]++;
               assert(OWNED <= capacity);  /* the limit: nobody takes a permit of a shrink's debt */
               took = true;
               outcome = ACQUIRED
           :: else -> RELOAD
           fi
       }
    :: atomic {
           !took && !joined && !(seen_waiters == 0 && seen_permits > 0) ->
           if
           :: CAS_MATCHES ->
               waiters++;
               joined = true;
               push_back(me)
           :: else -> RELOAD
           fi
       }
    od;
    atomic {
        seen_permits = 0; seen_waiters = 0; took = false; assert(mutex_owner == me); mutex_owner = NOBODY;
        if
        :: IS_ASYNC(me) -> enqueued[me] = joined
        :: else -> skip
        fi
    }
}

/* cancel_waiter::operator(), in thread `who`, for the node of `node`:
 * cancelled = true under the node's lock, then notify with no lock held. */
inline cancel_waiter(who, node) {
    d_step { assert(node_alive[node]); cancelled[node] = true }
    atomic { notify(node) }
}

/* fifo_semaphore::wait(deadline, stop), the slow path. */
inline wait_slow(me, timed, stoppable, outcome) {
    /* detail::waiter node; std::optional<std::stop_callback> on_stop; */
    d_step {
        granted[me] = false;
        cancelled[me] = false;
        notified[me] = false;
        handed_over[me] = false;
        node_alive[me] = true
    }
    /* on_stop.emplace(*stop, cancel_waiter{&node}): registers, or runs the
     * callback here when the stop came first */
    if
    :: stoppable ->
        atomic {
            if
            :: stop_requested[me] -> run_inline = true
            :: else -> cb_registered[me] = true
            fi
        }
        if
        :: run_inline -> cancel_waiter(me, me); run_inline = false
        :: else -> skip
        fi
    :: else -> skip
    fi;
    /* under the node's lock: if (node.cancelled) return cancelled; */
    atomic {
        if
        :: cancelled[me] -> outcome = CANCELLED
        :: else -> outcome = WAITING
        fi
    }
    /* under m_mutex: take_or_enqueue(node) */
    if
    :: outcome == WAITING ->
        locked_take_or_enqueue(me)
    :: else -> skip
    fi;
    /* sleep(): under the node's lock, for (;;) { granted? cancelled? sleep } */
    do
    :: outcome != WAITING -> break
    :: atomic {
           outcome == WAITING ->
           if
           :: granted[me] -> outcome = ACQUIRED  /* a grant wins */
           :: !granted[me] && cancelled[me] -> outcome = CANCELLED
           :: !granted[me] && !cancelled[me] ->
               /* node.wake.wait / wait_until: lets go of the node's lock */
               sleeping[me] = true;
               notified[me] = false
           fi
       };
       if
       :: outcome == WAITING ->
           /* woken by notify_one, or (timed waits only) by the deadline or
            * spuriously, at any moment; wait_until then says timeout or not */
           atomic {
               (notified[me] || timed) ->
               if
               :: timed -> if :: timeout_status = true :: timeout_status = false fi
               :: else -> timeout_status = false
               fi;
               sleeping[me] = false;
               notified[me] = false
           }
           /* the wait takes the node's lock again before it returns */
           atomic {
               if
               :: timed && timeout_status && !granted[me] && !cancelled[me] -> outcome = TIMED_OUT
               :: else -> skip
               fi;
               timeout_status = false
           }
       :: else -> skip
       fi
    od;
    /* gave up: under m_mutex, still queued? leave. Else the grant on its way wins. */
    if
    :: joined && outcome != ACQUIRED ->
        atomic { mutex_owner == NOBODY -> mutex_owner = me }
        if
#ifdef BUG_LEAVE_UNCHECKED
        :: true ->
#else
        :: queued[me] ->
#endif
            d_step { remove(me); waiters--; assert(mutex_owner == me); mutex_owner = NOBODY; joined = false }
        :: else ->
            d_step { assert(mutex_owner == me); mutex_owner = NOBODY }
#ifndef BUG_TIMEOUT_IGNORES_GRANT
            /* under the node's lock: wake.wait(lock, [] { return granted; }) */
            do
            :: atomic { granted[me] -> outcome = ACQUIRED; break }
            :: atomic { !granted[me] -> sleeping[me] = true; notified[me] = false }
               atomic { notified[me] -> sleeping[me] = false; notified[me] = false }
            od
#else
            joined = false
#endif
        fi
    :: else -> skip
    fi;
    /* granted through a hand_over: wait until the releaser is done with the node */
    if
    :: joined ->
#ifndef BUG_NO_HANDOVER_WAIT
        handed_over[me];
#endif
        joined = false
    :: else -> skip
    fi;
    /* ~stop_callback: deregisters, or waits for a callback running elsewhere */
    atomic { !cb_running[me] -> cb_registered[me] = false }
    node_alive[me] = false  /* ~waiter */
}

/* ---- the threads ------------------------------------------------------ */

proctype worker(byte me) {
    byte round = 0;
    bool timed, stoppable, ok, took, joined, run_inline, timeout_status;
    byte outcome, seen_waiters, count, next, k, first, second;
    short seen_permits;
    do
    :: round < ROUNDS ->
#if defined(PLAIN_ONLY)
        /* every call acquire(): the smallest space in which 4 threads and 2
         * permits reach a hand_over that grants two waiters in one batch */
        timed = false; stoppable = false;
#elif defined(ANY_KIND)
        if
        :: timed = false; stoppable = false               /* acquire() */
        :: timed = true;  stoppable = false               /* try_acquire_for(d) */
        :: round == 0 -> timed = false; stoppable = true  /* acquire(stop) */
        :: round == 0 -> timed = true;  stoppable = true  /* try_acquire_for(d, stop) */
        fi;
#else
        /* fixed roles: 0 acquire(), 1 try_acquire_for(d), 2 acquire(stop) or
         * try_acquire_for(d, stop); later rounds acquire() or try_acquire_for(d) */
        if
        :: me == 0 || (round > 0 && me % 2 == 0) -> timed = false; stoppable = false
        :: me == 1 || (round > 0 && me % 2 == 1) -> timed = true;  stoppable = false
        :: me >= STOPPABLE_FROM && round == 0 -> stoppable = true; if :: timed = false :: timed = true fi
        :: else -> skip
        fi;
#endif
        uses_stop[me] = stoppable;
        if
        :: stoppable && stop_requested[me] -> outcome = CANCELLED  /* checked on entry */
        :: else ->
            try_acquire(me, ok);
            if
            :: ok -> outcome = ACQUIRED
            :: else -> wait_slow(me, timed, stoppable, outcome)
            fi
        fi;
        if
        :: outcome == ACQUIRED ->
            assert(owned[me] == 1);
            d_step { holding++; assert(holding <= MAX_CAPACITY) }
            holding--;  /* the work is done */
            release(me)
        :: else ->
            assert(owned[me] == 0)  /* timed out or cancelled: holds nothing */
        fi;
        round++
    :: else -> break
    od;
    finished++
}

/* Requests the stop of one worker's stop source at any moment, or never;
 * runs the registered callback in its own thread, as std::stop_source does. */
proctype stopper(byte node) {
    if
    :: skip  /* never requests a stop */
    :: true ->
end:   uses_stop[node];  /* only a call that takes the token can see the stop */
       atomic {
           stop_requested[node] = true;
           if
           :: cb_registered[node] -> cb_running[node] = true
           :: else -> skip
           fi
       };
       if
       :: cb_running[node] ->
           cancel_waiter(NWORKERS + node, node);
           cb_running[node] = false  /* request_stop() returns */
       :: else -> skip
       fi
    fi
}

/* An asynchronous caller (asio.hpp's transaction_operation, reduced to what
 * the semaphore sees): acquire_or_enqueue(node), then, if queued, whichever
 * comes first of its on_granted (run by a releaser) and its canceller's
 * cancel(node) == true; with the permit it does its work and releases (in
 * the code a work thread does that; to the semaphore it is the same). */
proctype async_waiter(byte me) {
    bool ok, took, joined;
    byte outcome, seen_waiters, next, k, first, second;
    short seen_permits;
    /* acquire_or_enqueue(node): try_acquire() first */
    try_acquire(me, ok);
    if
    :: ok -> outcome = ACQUIRED
    :: else ->
        /* else under m_mutex: take_or_enqueue(node) */
        outcome = WAITING;
        locked_take_or_enqueue(me)
    fi;
    if
    :: joined ->
        /* queued: the grant or the cancel, whichever comes first; never both */
        atomic {
            async_granted[me] || left_queue[me] ->
            if
            :: async_granted[me] -> outcome = ACQUIRED
            :: else -> outcome = CANCELLED
            fi
        }
    :: else -> skip
    fi;
    if
    :: outcome == ACQUIRED ->
        assert(owned[me] == 1);
        d_step { holding++; assert(holding <= MAX_CAPACITY) }
        holding--;  /* the work is done */
        release(me)
    :: else ->
        assert(owned[me] == 0)  /* cancelled while queued: holds nothing */
    fi;
    if
    :: joined ->
        /* the operation (and its node) lives until its canceller is done */
        d_step {
            canceller_done[me];
            /* exactly one of: granted, cancelled while queued */
            assert(async_granted[me] != left_queue[me]);
            joined = false
        }
    :: else -> skip
    fi;
    d_step { node_alive[me] = false; outcome = 0 }
    finished++
}

/* cancel(node) on an async node, by another thread (its timer, a stop), at
 * any moment after acquire_or_enqueue() has queued it, or never. Under
 * m_mutex: still queued? leave (remove, one waiter less): the call is over
 * and holds nothing. Else a release has unlinked it: its on_granted has run
 * or is about to, and the permit is the caller's. */
proctype canceller(byte node) {
    bool result;
    byte k;
    /* only a queued node can be cancelled; whether it ever will be is
     * decided then (in the same step: the choice itself is invisible) */
end:
    atomic {
        enqueued[node] ->
        if
        :: canceller_done[node] = true  /* never cancels */
        :: result = true
        fi
    };
    if
    :: !result -> skip
    :: result ->
        lock(CANCELLER(node));
        d_step {
            if
#ifdef BUG_CANCEL_UNCHECKED
            :: true ->
#else
            :: queued[node] ->
#endif
                remove(node);
                waiters--;  /* fetch_sub(one_waiter) */
                result = true
            :: else -> result = false
            fi;
#ifdef BUG_CANCEL_ALWAYS_WINS
            result = true;  /* reports "cancelled" also when a grant is on its way */
#endif
            assert(mutex_owner == CANCELLER(node)); mutex_owner = NOBODY;
            /* what the owner does with the answer (model: folded in, it
             * touches only the owner's own state) */
            if
            :: result ->
                assert(owned[node] == 0);  /* taken out while queued: holds nothing */
                left_queue[node] = true
            :: else ->
                assert(popped[node])  /* a release took it: its grant has come or is on its way */
            fi;
            result = false;
            canceller_done[node] = true
        }
    fi
}

/* The adaptive limit: RESIZE times, shrink by one and grow back by one, in
 * either order (chosen each time), concurrently with every caller. The grow
 * that follows each shrink always comes, so nobody is left waiting behind a
 * capacity that stays lower; in between, callers may wait at capacity 0. */
proctype resizer() {
    bool ok;
    short seen_permits;
    byte seen_waiters, next, k, first, second, done = 0;
    do
    :: done < RESIZE ->
        if
        :: shrink(); grow()
        :: grow(); shrink()
        fi;
        done++
    :: else -> break
    od;
    finished++
}

init {
    byte i = 0;
    atomic {
#if RESIZE > 0
        run resizer();
#endif
        do
        :: i < NWORKERS -> run worker(i); run stopper(i); i++
        :: else -> break
        od;
        do
        :: i < NNODES -> node_alive[i] = true; run async_waiter(i); run canceller(i); i++
        :: else -> break
        od
    }
}
