/* fifo_semaphore.pml: a Promela model of bulkhead::fifo_semaphore
 * (include/bulkhead/fifo_semaphore.hpp, detail/wait_queue.hpp), checked
 * exhaustively with spin.
 *
 * What is modelled, step for step with the C++ code:
 *   - m_state, the packed word "free permits | waiters << 32": two variables
 *     that are only ever changed together inside one atomic block, which is a
 *     compare-and-swap against the values the thread loaded earlier (the load
 *     and the CAS are separate steps, so other threads run in between);
 *   - try_acquire(): the lock-free fast path (fails while anyone waits);
 *   - release(): one fetch_add of the permit, whatever the word holds; if
 *     it saw waiters, hand_over(): under m_mutex it picks the oldest waiters
 *     while free permits remain (load, then a CAS taking one permit and one
 *     waiter together, retried) and unlinks them (`queued` = false); then,
 *     with m_mutex released, for each: `granted` under the node's lock,
 *     notify with no lock held, `handed_over` as its last touch of the node;
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
 *   - the condition variable: wait releases the node's lock atomically; a
 *     notify reaches the waiter only while it sleeps; a timed wait may wake
 *     at any moment (the deadline is abstract time) and then reports timeout
 *     or not (libstdc++ returns timeout whenever the clock has passed the
 *     deadline, notified or not); untimed waits do not wake spuriously here,
 *     so that a lost wake-up shows as a stuck waiter (an invalid end state).
 *
 * What is checked (spin -a, pan with -DSAFETY: every reachable state):
 *   1. conservation: free + held + in flight == PERMITS in every state (no
 *      permit lost, none duplicated); "in flight" is a permit between a
 *      releaser's hands and the free count; a permit belongs to a waiter
 *      from the moment hand_over unlinks it;
 *   2. a wait that ends acquired holds exactly one permit, one that ends
 *      timed_out or cancelled holds none, and never more than PERMITS
 *      callers hold one at once;
 *   3. FIFO: hand_over grants the oldest queued waiter (no waiter still in the
 *      queue has an older ticket), and nobody takes a permit outside
 *      hand_over while someone is queued (no barging);
 *   4. no waiter stuck with a permit available: "waiters > 0 and free > 0"
 *      only while a release() that saw waiters has not yet let go of m_mutex
 *      in its hand_over() (in every state), and every worker finishes (a
 *      waiter that sleeps forever is an invalid end state);
 *   5. a releaser touches a node (granted, notify, handed_over) only while
 *      its thread is still inside wait() (the node lives on that stack);
 *   6. at the end: every permit free, nobody queued.
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
 *
 * Not modelled: release(count > 1); a lock that throws (the C++ code
 * terminates then: wait_queued(), release() and hand_over() are noexcept);
 * stop_possible() == false (the same as not passing a token). node_alive is
 * per thread, not per node: a releaser touching a node after its thread
 * started its next wait() would not be caught (the code reads and writes a
 * node only before handed_over, and the waiter returns only after it).
 *
 * Sizes: NWORKERS threads (2 to 4, default 3), PERMITS (default 1), ROUNDS
 * acquisitions per thread (default 2; CI uses 1 with 3 threads). The kinds
 * of wait: acquire(), try_acquire_for(d), acquire(stop) and
 * try_acquire_for(d, stop); the stop kinds only in the first round (one stop
 * source per thread, whose stop a thread of its own may request at any
 * moment, or never). By default the roles are fixed (thread 0 acquire(),
 * thread 1 try_acquire_for(d), thread 2 and up either stop kind), which keeps
 * three threads to a few million states; with -DANY_KIND every thread
 * picks any kind in every round (CI runs that with 2 threads, 2 rounds).
 * tests/model/CMakeLists.txt lists the configurations CI checks, and
 * docs/reliability.md their state counts.
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

#define NOBODY 255

#define ACQUIRED  0
#define TIMED_OUT 1
#define CANCELLED 2
#define WAITING   3

/* ---- the semaphore ---------------------------------------------------- */

byte permits = PERMITS;  /* m_state, low half: free permits  */
byte waiters = 0;        /* m_state, high half: queued waiters */

byte mutex_owner = NOBODY;  /* m_mutex: a thread id, or NOBODY */

/* detail::waiter, one node per worker (on its stack while it waits) */
bool queued[NWORKERS];       /* guarded by m_mutex: linked in the queue */
bool granted[NWORKERS];      /* guarded by the node's lock */
bool cancelled[NWORKERS];    /* guarded by the node's lock */
bool handed_over[NWORKERS];  /* atomic: the releaser is done with the node */
bool node_alive[NWORKERS];  /* model only: the node exists (thread is inside wait()) */
bool sleeping[NWORKERS];    /* model only: blocked in wake.wait / wait_until */
bool notified[NWORKERS];    /* model only: a notify_one reached the sleeper */

/* detail::wait_queue: oldest first */
byte queue[NWORKERS];
byte qlen = 0;

/* ---- the environment -------------------------------------------------- */

bool stop_requested[NWORKERS];  /* std::stop_source, one per worker */
bool cb_registered[NWORKERS];   /* std::stop_callback<cancel_waiter> registered */
bool cb_running[NWORKERS];      /* ... and running in the stopper's thread */
bool uses_stop[NWORKERS];       /* model only: the worker's current call takes the stop_token */

/* ---- model-only accounting -------------------------------------------- */

byte owned[NWORKERS];   /* permits each worker holds */
byte in_flight = 0;     /* released, not yet free or granted */
byte pending = 0;       /* releases that saw waiters and whose hand_over still holds or awaits m_mutex */
byte holding = 0;       /* workers between acquire and release */
byte ticket[NWORKERS];  /* arrival order into the queue */
byte next_ticket = 1;
byte finished = 0;

#if NWORKERS == 2
#define OWNED (owned[0] + owned[1])
#elif NWORKERS == 3
#define OWNED (owned[0] + owned[1] + owned[2])
#elif NWORKERS == 4
#define OWNED (owned[0] + owned[1] + owned[2] + owned[3])
#else
#error "NWORKERS must be 2, 3 or 4"
#endif

/* ---- the invariants, checked in every reachable state ----------------- */

active proctype conservation() {
end:
    atomic {
        (permits + OWNED + in_flight != PERMITS) ->
            assert(permits + OWNED + in_flight == PERMITS)  /* no permit lost or duplicated */
    }
}

active proctype nobody_waits_while_a_permit_is_free() {
end:
    atomic {
        (waiters > 0 && permits > 0 && pending == 0) ->
            assert(!(waiters > 0 && permits > 0 && pending == 0))  /* a waiter stuck with a permit available */
    }
}

active proctype queue_matches_waiter_count() {
end:
    atomic { (qlen > waiters) -> assert(qlen <= waiters) }
}

active proctype at_the_end() {
end:
    (finished == NWORKERS) ->
        assert(permits == PERMITS && waiters == 0 && qlen == 0 && in_flight == 0 && pending == 0 &&
               mutex_owner == NOBODY)
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
#else
    node = queue[0];
    k = 0;
    do
    :: k + 1 < qlen -> queue[k] = queue[k + 1]; k++
    :: else -> break
    od;
    qlen--;
#endif
    queued[node] = false;
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
    :: atomic { seen_waiters != 0 || seen_permits == 0 -> seen_permits = 0; seen_waiters = 0; break }
    :: atomic {
           seen_waiters == 0 && seen_permits != 0 ->
           if
           :: CAS_MATCHES ->
               assert(qlen == 0);  /* no barging past a queued waiter */
               permits--;
               owned[me]++;
               ok = true;
               seen_permits = 0; seen_waiters = 0;
               break
           :: else -> RELOAD
           fi
       }
    od
}

/* fifo_semaphore::release(1): before = fetch_add(1); if waiters_of(before)
 * != 0, hand_over(). */
inline release(me) {
    d_step { assert(owned[me] == 1); owned[me]--; in_flight++ }
#ifdef BUG_RELEASE_STALE_WAITERS
    atomic { RELOAD }  /* a load of the word, then the fetch_add */
    atomic { permits++; in_flight-- ; ok = (seen_waiters != 0); if :: ok -> pending++ :: else -> skip fi }
#else
    atomic { ok = (waiters != 0); permits++; in_flight--; if :: ok -> pending++ :: else -> skip fi }
#endif
    if
    :: ok -> ok = false; hand_over(me)  /* pending-- when it lets go of m_mutex */
    :: else -> skip
    fi;
    d_step { seen_permits = 0; seen_waiters = 0 }
}

/* fifo_semaphore::hand_over(). Under m_mutex: seen = load; while the queue
 * is not empty and seen shows a free permit: CAS(seen, seen - one waiter - 1
 * permit), and on success seen = the value written, and pop the oldest onto
 * the end of the list of grantees (the permit is the waiter's from here).
 * Then, with m_mutex released, oldest first: granted = true (under its
 * lock), notify, handed_over = true. The list holds at most PERMITS (<= 2)
 * nodes: first and second. */
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
    :: first != NOBODY ->
        d_step {
            next = first;
            first = second;  /* node.next, read before the node is handed over */
            second = NOBODY;
            assert(node_alive[next]);
            granted[next] = true  /* under the node's lock */
        }
        atomic { notify(next) }  /* no lock held */
        d_step { assert(node_alive[next]); handed_over[next] = true }  /* the last touch */
    od;
    next = 0
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
        atomic { seen_permits = 0; seen_waiters = 0; took = false; assert(mutex_owner == me); mutex_owner = NOBODY }
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
    byte outcome, seen_permits, seen_waiters, count, next, k, first, second;
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
        :: me >= 2 && round == 0 -> stoppable = true; if :: timed = false :: timed = true fi
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
            d_step { holding++; assert(holding <= PERMITS) }
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

init {
    byte i = 0;
    atomic {
        do
        :: i < NWORKERS -> run worker(i); run stopper(i); i++
        :: else -> break
        od
    }
}
