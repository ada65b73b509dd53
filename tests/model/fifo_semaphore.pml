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
 *     it saw waiters, hand_over() under the mutex, which moves free permits
 *     to the oldest waiters (load, then a CAS taking one permit and one
 *     waiter together, retried) while both remain;
 *   - wait(): the stop_callback registration (run inline when the stop came
 *     first), lock, the early cancelled check, take_or_enqueue(), the loop
 *     "granted? cancelled? sleep on the condition variable", the timeout
 *     decision (a grant wins), leaving the queue, and the order in which the
 *     unique_lock, the stop_callback and the node are destroyed;
 *   - cancel_waiter: run by the thread that requests the stop, under the mutex;
 *   - the condition variable: wait releases the mutex atomically; a notify
 *     reaches the waiter only while it sleeps; a timed wait may wake at any
 *     moment (the deadline is abstract time) and then reports timeout or not
 *     (libstdc++ returns timeout whenever the clock has passed the deadline,
 *     notified or not); untimed waits do not wake spuriously here, so that a
 *     lost wake-up shows as a stuck waiter (an invalid end state).
 *
 * What is checked (spin -a, pan with -DSAFETY: every reachable state):
 *   1. conservation: free + held + in flight == PERMITS in every state (no
 *      permit lost, none duplicated); "in flight" is a permit between a
 *      releaser's hands and its destination (free count or a waiter);
 *   2. a wait that ends acquired holds exactly one permit, one that ends
 *      timed_out or cancelled holds none, and never more than PERMITS
 *      callers hold one at once;
 *   3. FIFO: hand_over grants the oldest queued waiter (no waiter still in the
 *      queue has an older ticket), and nobody takes a permit outside
 *      hand_over while someone is queued (no barging);
 *   4. no waiter stuck with a permit available: "waiters > 0 and free > 0"
 *      only while a release() that saw waiters has not finished its
 *      hand_over() (in every state), and every worker finishes (a waiter that
 *      sleeps forever is an invalid end state);
 *   5. hand_over notifies a node only while its thread is still inside
 *      wait() (the node lives on that thread's stack);
 *   6. at the end: every permit free, nobody queued.
 *
 * Seeded bugs (compile with -D<NAME>; each must make the check fail):
 *   BUG_HANDOVER_FREES         hand_over leaves the permit in the free count
 *                              instead of granting it to the oldest waiter
 *   BUG_TIMEOUT_IGNORES_GRANT  a timed-out waiter leaves without checking
 *                              `granted`
 *   BUG_CANCEL_BEFORE_GRANT    the waiter checks `cancelled` before `granted`
 *   BUG_LIFO                   hand_over serves the newest waiter
 *   BUG_RELEASE_STALE_WAITERS  release() decides whether to hand over from a
 *                              load made before its fetch_add (check-then-act)
 *   BUG_NOTIFY_AFTER_UNLOCK    hand_over notifies after letting go of the mutex
 *
 * Sizes: NWORKERS threads (2 to 4, default 3), PERMITS (default 1), ROUNDS
 * acquisitions per thread (default 2; CI uses 1 with 3 threads). The kinds
 * of wait: acquire(), try_acquire_for(d), acquire(stop) and
 * try_acquire_for(d, stop); the stop kinds only in the first round (one stop
 * source per thread, whose stop a thread of its own may request at any
 * moment, or never). By default the roles are fixed (thread 0 acquire(),
 * thread 1 try_acquire_for(d), thread 2 and up either stop kind), which keeps
 * three threads to about 2 million states; with -DANY_KIND every thread
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
bool granted[NWORKERS];
bool cancelled[NWORKERS];
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
byte pending = 0;       /* releases that saw waiters and have not finished hand_over */
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
 * CI budget. */

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
    :: ok -> ok = false; hand_over(me); pending--
    :: else -> skip
    fi;
    d_step { seen_permits = 0; seen_waiters = 0 }
}

/* fifo_semaphore::hand_over(): under the mutex, seen = load; while the queue
 * is not empty and seen shows a free permit: CAS(seen, seen - one waiter - 1
 * permit), and on success pop the oldest, granted = true, notify (under the
 * mutex). Popping and granting touch only what the mutex guards, so they are
 * folded into the CAS step (see "Granularity"). */
inline hand_over(me) {
    atomic { mutex_owner == NOBODY -> mutex_owner = me; RELOAD; next = NOBODY }
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
               pop_oldest(next);
               granted[next] = true;  /* the permit is the waiter's from here */
               owned[next]++;
#ifndef BUG_NOTIFY_AFTER_UNLOCK
               notify(next);
#endif
               RELOAD  /* compare_exchange_weak leaves `seen` as it was; the next CAS fails and reloads */
           :: else -> RELOAD
           fi
#endif
       }
    od;
    unlock(me);
#ifdef BUG_NOTIFY_AFTER_UNLOCK
    if
    :: next != NOBODY -> notify(next)  /* the node may be gone by now */
    :: else -> skip
    fi;
#endif
    next = 0
}

/* cancel_waiter::operator(), in thread `who`, for the node of `node`: one
 * critical section touching only guarded state and the node's condvar. */
inline cancel_waiter(who, node) {
    atomic {
        mutex_owner == NOBODY ->
        assert(node_alive[node]);
        cancelled[node] = true;
        notify(node)
        /* the mutex is let go at the end of the block */
    }
}

/* fifo_semaphore::wait(deadline, stop), the slow path. */
inline wait_slow(me, timed, stoppable, outcome) {
    /* detail::waiter node; std::optional<std::stop_callback> on_stop; */
    d_step {
        granted[me] = false;
        cancelled[me] = false;
        notified[me] = false;
        node_alive[me] = true
    }
    /* on_stop.emplace(*stop, cancel_waiter{this, &node}): registers, or runs
     * the callback here when the stop came first */
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
    /* std::unique_lock lock(m_mutex); if (node.cancelled) return cancelled; */
    atomic {
        mutex_owner == NOBODY -> mutex_owner = me;
        if
        :: cancelled[me] -> outcome = CANCELLED
        :: else -> outcome = WAITING; RELOAD
        fi
    }
    /* take_or_enqueue(node), under the mutex */
    do
    :: outcome != WAITING || took || joined -> break
    :: atomic {
           outcome == WAITING && !took && !joined && seen_waiters == 0 && seen_permits > 0 ->
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
           outcome == WAITING && !took && !joined && !(seen_waiters == 0 && seen_permits > 0) ->
           if
           :: CAS_MATCHES ->
               waiters++;
               joined = true;
               push_back(me)
           :: else -> RELOAD
           fi
       }
    od;
    atomic { seen_permits = 0; seen_waiters = 0; took = false }
    /* for (;;) { granted? cancelled? sleep } */
    do
    :: outcome != WAITING -> break
    :: atomic {
           outcome == WAITING ->
           assert(mutex_owner == me);
#ifdef BUG_CANCEL_BEFORE_GRANT
           if
           :: cancelled[me] -> outcome = CANCELLED
           :: !cancelled[me] && granted[me] -> outcome = ACQUIRED
#else
           if
           :: granted[me] -> outcome = ACQUIRED  /* a grant wins */
           :: !granted[me] && cancelled[me] -> outcome = CANCELLED
#endif
           :: !granted[me] && !cancelled[me] ->
               /* node.wake.wait(lock) / wait_until(lock, deadline): lets go of the mutex */
               mutex_owner = NOBODY;
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
           /* the wait takes the mutex again before it returns */
           atomic {
               mutex_owner == NOBODY -> mutex_owner = me;
#ifdef BUG_TIMEOUT_IGNORES_GRANT
               if
               :: timed && timeout_status -> outcome = TIMED_OUT
               :: else -> skip
               fi;
#else
               if
               :: timed && timeout_status && !granted[me] && !cancelled[me] -> outcome = TIMED_OUT
               :: else -> skip
               fi;
#endif
               timeout_status = false
           }
       :: else -> skip
       fi
    od;
    if
    :: joined && outcome != ACQUIRED ->
        /* not granted, so still queued: m_queue.remove(node), then
         * m_state.fetch_sub(one_waiter); the unique_lock lets go */
        d_step { remove(me); waiters--; assert(mutex_owner == me); mutex_owner = NOBODY; joined = false }
    :: else -> d_step { assert(mutex_owner == me); mutex_owner = NOBODY; joined = false }  /* ~unique_lock */
    fi;
    /* ~stop_callback: deregisters, or waits for a callback running elsewhere */
    atomic { !cb_running[me] -> cb_registered[me] = false }
    node_alive[me] = false  /* ~waiter */
}

/* ---- the threads ------------------------------------------------------ */

proctype worker(byte me) {
    byte round = 0;
    bool timed, stoppable, ok, took, joined, run_inline, timeout_status;
    byte outcome, seen_permits, seen_waiters, count, next, k;
    do
    :: round < ROUNDS ->
#ifdef ANY_KIND
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
