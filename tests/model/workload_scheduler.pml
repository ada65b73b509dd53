/* workload_scheduler.pml: a Promela model of bulkhead::detail::
 * workload_scheduler (include/bulkhead/workload_scheduler.hpp), the
 * execution permits of a gate with workload classes, checked exhaustively
 * with spin (tests/model/check.sh --model workload_scheduler).
 *
 * Contract: G1 (the total running across classes never exceeds B, not even
 * for an instant) and G2 (a class with waiters always gets at least its
 * reserved permits), both in every interleaving of the configurations
 * below, and that every seeded bug is found.
 *
 * What is modelled, step for step with the C++ code:
 *   - the state, all guarded by the one m_mutex: per class c (2 or 3)
 *     reserved[c], ceiling[c], prio[c] (the plan's priority), running[c],
 *     a FIFO queue of waiters (each with a global arrival ticket, m_tickets);
 *     shared_cap (m_shared: limit - sum of reserved; below shared_used while
 *     a shrink's debt is unpaid) and shared_used (m_shared_used: sum over
 *     classes of max(0, running - reserved));
 *   - can_take(c): running < reserved, or running < ceiling and
 *     shared_used < shared_cap; take(c): a shared permit counted when
 *     running >= reserved, then running + 1;
 *   - an arrival (try_acquire_for -> wait_for_grant -> take_or_enqueue):
 *     under m_mutex, its class's queue empty and can_take: take, done; else
 *     a node with the next ticket at the back of its class's queue;
 *   - the wait (detail/blocking_wait.hpp, shared with fifo_semaphore): a
 *     grant wins over a timeout seen at the same time; a timed caller may
 *     give up at any moment while not granted (its deadline or its stop:
 *     to the scheduler the two are the same); then, under m_mutex: still
 *     queued? leave (unlink, holds nothing) : a grant is on its way and wins
 *     (wait for `granted`, hold the permit, release it later); a granted
 *     waiter returns only once the granter set `handed_over`;
 *   - release(c): under m_mutex running - 1, shared_used - 1 if the class is
 *     still at or above its reservation (it held a shared permit), then
 *     serve(); the grants serve() decided are delivered with m_mutex
 *     released, one at a time, oldest grant first: `granted` (under the
 *     node's lock; the notify right after it), then `handed_over`, the
 *     granter's last touch of the node;
 *   - serve(): (1) each class with waiters below its reservation gets its
 *     own permits, oldest waiter first; (2) while shared_used < shared_cap,
 *     among the classes with waiters and running < ceiling the highest
 *     priority, ties to the class whose oldest waiter has the smaller ticket,
 *     gets one; (3) else stop;
 *   - a resizer (-DRESIZE=n, the adaptive limit; only the shared permits
 *     move): n times shrink(1) (shared_cap - 1 under m_mutex, whatever is
 *     held: a debt the releases pay) then grow(1) (shared_cap + 1 and
 *     serve(), then the grants), concurrently with every caller.
 *
 * Granularity: every critical section of m_mutex touches only what the
 * mutex guards (and model-only ghosts), so each one is a single step here
 * (Lipton's reduction, as in fifo_semaphore.pml) and the mutex needs no
 * variable: every state of the model is one in which m_mutex is free. The
 * node's condition-variable handshake (sleep, notify, spurious and timed
 * wake-ups, the stop_callback) is the same code as fifo_semaphore's and is
 * checked there; here the waiter blocks on `granted` (or gives up, if
 * timed), and the granter's notify is folded into its `handed_over` step,
 * which is where a node that died too early is caught.
 *
 * What is checked (pan -DSAFETY, every reachable state):
 *   G1  in every state the total running is at most B (LIMIT); every take
 *       leaves its class at most at its ceiling and the total at most the
 *       limit now (B - shrinks + grows) plus a shrink's unpaid debt (0
 *       without a resizer), and a shared permit is taken only while
 *       shared_used <= shared_cap after it (nobody takes a shared permit of
 *       a shrink's debt);
 *   G2  in every state no class with waiters is below its reservation;
 *       no waiter left behind a permit its class may use: in every state no
 *       class with waiters at or above its reservation has room under its
 *       ceiling while a shared permit is free (together: after every
 *       serve(), with m_mutex still held, and after every other critical
 *       section, no class with waiters can_take, so an arrival that takes a
 *       permit has taken nobody's);
 *   and shared_used == sum of max(0, running - reserved) in every state;
 *       FIFO inside a class (a class's grant goes to its oldest waiter);
 *       the order of the shared permits: each goes to the class of the
 *       highest priority among those with waiters and room under their
 *       ceiling, the one whose oldest waiter came first among equals;
 *       a waiter that gave up holds no permit, one that returns acquired
 *       holds exactly one; a granter touches a node only while it lives and
 *       only once it is unlinked; at the end every permit is back (running
 *       0 everywhere, shared_used 0, the capacity as it started, no queue),
 *       and no invalid end state (nobody stuck).
 *
 * With a resizer G1 holds against B in every state, and against the limit
 * now at every take only up to a shrink's unpaid debt: a shrink does not
 * stop a class from taking a reserved permit while shared permits held
 * beyond the new shared capacity are still out (reservations are never
 * shrunk), so the total may rise above the shrunk limit (never above B).
 * -DSTRICT_LIMIT asserts "total <= the limit now" at every take instead and
 * fails (RESIZE=1: a class-1 call holds the shared permit, shrink to B = 1,
 * class 0 takes its reserved permit: 2 running). That is the design as the
 * code has it, not a property it promises; docs/testing.md says so.
 *
 * Seeded bugs (compile with -D<NAME>; each must make the check fail):
 *   BUG_ARRIVAL_IGNORES_SHARED  an arrival checks running < ceiling only,
 *                               not whether a shared permit is free
 *   BUG_TAKE_UNCOUNTED          take() never counts the shared permit
 *                               (shared_used stays as it was)
 *   BUG_NO_RESERVATION_STEP     serve() skips step (1): it serves by
 *                               priority from the shared permits only
 *   BUG_LEAVE_UNCHECKED         a waiter that gave up unlinks itself without
 *                               checking that it is still queued
 *   BUG_TIMEOUT_IGNORES_GRANT   a waiter that gave up and is no longer
 *                               queued returns timed_out anyway
 *   BUG_RELEASE_WITHOUT_SERVE   release() returns the permit and never
 *                               serves (a stranded permit)
 *   BUG_GROW_WITHOUT_SERVE      (with RESIZE) grow() raises shared_cap and
 *                               never serves
 *   BUG_LIFO                    serve() grants a class's newest waiter
 *   BUG_NO_HANDOVER_WAIT        a granted waiter returns without waiting for
 *                               `handed_over` (its node may die while the
 *                               granter still notifies it)
 *   BUG_TIES_TO_NEWEST          serve() breaks a tie of priorities in favour
 *                               of the class whose oldest waiter came last
 *
 * Not modelled: asynchronous callers (an async_node is queued and left by
 * the same take_or_enqueue / leave under the same mutex; its grant is its
 * on_granted, checked against cancel() in fifo_semaphore.pml);
 * try_acquire(c) (the arrival's take without the enqueue); the admission
 * slots (a lock-free counter in front, never waited on); shrink and grow by
 * more than one; a resizer that grows above B (the adaptive limit stays
 * between its floor and B: here each shrink comes before its grow);
 * statistics.
 *
 * Sizes and roles (each a -D): CLASSES (2 or 3); per class c = 0, 1, 2:
 * R<c> reserved, C<c> ceiling, P<c> priority; LIMIT (B, at least the sum of
 * the reservations); NCALLERS (2 to 4) threads, caller i of class K<i>,
 * timed (may give up) when bit i of TIMED is set; ROUNDS calls per caller;
 * RESIZE shrink-then-grow cycles (0: no resizer). Defaults: 2 classes
 * (0: reserved 1, ceiling 2; 1: reserved 0, ceiling 2; equal priority),
 * B = 2, 3 callers (0 and 1 of class 0, 2 of class 1; 1 and 2 timed), one
 * call each. tests/model/CMakeLists.txt lists the configurations CI
 * checks, docs/testing.md their state counts and times.
 */

#ifndef CLASSES
#define CLASSES 2
#endif
#ifndef R0
#define R0 1
#endif
#ifndef C0
#define C0 2
#endif
#ifndef P0
#define P0 0
#endif
#ifndef R1
#define R1 0
#endif
#ifndef C1
#define C1 2
#endif
#ifndef P1
#define P1 0
#endif
#ifndef R2
#define R2 0
#endif
#ifndef C2
#define C2 0
#endif
#ifndef P2
#define P2 0
#endif
#ifndef LIMIT
#define LIMIT 2
#endif
#ifndef NCALLERS
#define NCALLERS 3
#endif
#ifndef K0
#define K0 0
#endif
#ifndef K1
#define K1 0
#endif
#ifndef K2
#define K2 1
#endif
#ifndef K3
#define K3 1
#endif
#ifndef TIMED
#define TIMED 6
#endif
#ifndef ROUNDS
#define ROUNDS 1
#endif
#ifndef RESIZE
#define RESIZE 0
#endif

#if CLASSES < 2 || CLASSES > 3 || NCALLERS < 2 || NCALLERS > 4 || RESIZE < 0 || RESIZE > 2
#error "CLASSES must be 2 or 3, NCALLERS 2 to 4, RESIZE 0 to 2"
#endif
#if CLASSES == 2 && (R2 != 0 || C2 != 0)
#error "a third class's R2/C2 need CLASSES=3"
#endif
#define RESERVED_SUM (R0 + R1 + R2)
#if RESERVED_SUM > LIMIT || C0 > LIMIT || C1 > LIMIT || C2 > LIMIT || C0 < R0 || C1 < R1 || C2 < R2
#error "the plan must be valid (checked_workload_plan): reservations within B, reserved <= ceiling <= B"
#endif
#if RESIZE > 0
#define NRESIZERS 1
#else
#define NRESIZERS 0
#endif

#define ACQUIRED  0
#define TIMED_OUT 1
#define WAITING   2
#define NOBODY 255

/* ---- the scheduler (all guarded by m_mutex) --------------------------- */

byte reserved[3];
byte ceiling[3];
byte prio[3];  /* the priority */
byte running[3];
short shared_cap = LIMIT - RESERVED_SUM;  /* m_shared: may be < shared_used (a debt) */
short shared_used = 0;                    /* m_shared_used */
byte next_ticket = 1;                     /* m_tickets (+ 1) */

/* the class queues: class c's waiters, oldest first, in
 * queue[c * NCALLERS .. c * NCALLERS + qlen[c] - 1] */
byte queue[3 * NCALLERS];
byte qlen[3];

/* detail::waiter, one per caller (on its stack while it waits) */
bool queued[NCALLERS];       /* guarded by m_mutex: linked in its class's queue */
byte ticket[NCALLERS];       /* guarded by m_mutex: arrival order */
bool granted[NCALLERS];      /* guarded by the node's lock */
bool handed_over[NCALLERS];  /* atomic: the granter is done with the node */

/* ---- model-only ghosts ------------------------------------------------ */

byte owned[NCALLERS];     /* permits each caller holds (from its take, or from
                           * the serve() that unlinked its node) */
bool node_alive[NCALLERS];  /* the caller is inside its wait (its node exists) */
byte capacity = LIMIT;    /* the limit now: B - shrinks + grows */
byte finished = 0;

#define TOTAL (running[0] + running[1] + running[2])
#define ABOVE(c) (running[c] > reserved[c] -> running[c] - reserved[c] : 0)
#define SHARED_USED_OF_RUNNING (ABOVE(0) + ABOVE(1) + ABOVE(2))
#define CAN_TAKE(c) (running[c] < reserved[c] || (running[c] < ceiling[c] && shared_used < shared_cap))
/* G2: a class with waiters is never below its reservation */
#define RESERVATION_SERVED(c) (!(qlen[c] > 0 && running[c] < reserved[c]))
/* no waiter behind a shared permit its class may use */
#define NO_SHARED_STRANDED(c) (!(qlen[c] > 0 && running[c] < ceiling[c] && shared_used < shared_cap))

/* ---- the invariants, checked in every reachable state ----------------- */

active proctype g1_total_within_b() {
end:
    atomic { !(TOTAL <= LIMIT) -> assert(TOTAL <= LIMIT) }  /* G1 */
}

active proctype g2_reservations_served() {
end:
    atomic {
        !(RESERVATION_SERVED(0) && RESERVATION_SERVED(1) && RESERVATION_SERVED(2)) ->
            assert(RESERVATION_SERVED(0)); assert(RESERVATION_SERVED(1)); assert(RESERVATION_SERVED(2))
    }
}

active proctype no_permit_stranded() {
end:
    atomic {
        !(NO_SHARED_STRANDED(0) && NO_SHARED_STRANDED(1) && NO_SHARED_STRANDED(2)) ->
            assert(NO_SHARED_STRANDED(0)); assert(NO_SHARED_STRANDED(1)); assert(NO_SHARED_STRANDED(2))
    }
}

active proctype shared_count_matches() {
end:
    atomic { shared_used != SHARED_USED_OF_RUNNING -> assert(shared_used == SHARED_USED_OF_RUNNING) }
}

active proctype at_the_end() {
end:
    (finished == NCALLERS + NRESIZERS) ->
        assert(TOTAL == 0 && qlen[0] == 0 && qlen[1] == 0 && qlen[2] == 0 &&
               capacity == LIMIT && shared_cap == LIMIT - RESERVED_SUM)
}

/* ---- building blocks (each used inside one step under m_mutex) -------- */

/* take(c) for caller `who`: the permit is its caller's from here. */
inline take(c, who) {
    if
    :: running[c] >= reserved[c] ->
#ifndef BUG_TAKE_UNCOUNTED
        shared_used++;
#endif
        assert(shared_used <= shared_cap)  /* G1: a shared permit only while one is free (none of a debt) */
    :: else -> skip
    fi;
    running[c]++;
    owned[who]++;
    assert(running[c] <= ceiling[c]);  /* a class never exceeds its ceiling */
#ifndef STRICT_LIMIT
    assert(TOTAL <= capacity + debt_at_take)  /* G1 at the take: within the limit now, plus a shrink's unpaid debt */
#else
    assert(TOTAL <= capacity)  /* (not a property of the design: see STRICT_LIMIT above) */
#endif
}

inline push_back(c, who) {
    queue[c * NCALLERS + qlen[c]] = who;
    qlen[c]++;
    queued[who] = true;
    ticket[who] = next_ticket;
    next_ticket++
}

/* intrusive_fifo::remove: unlinks `who`, which must be in class c's queue. */
inline remove(c, who) {
    k = 0;
    do
    :: k < qlen[c] && queue[c * NCALLERS + k] != who -> k++
    :: else -> break
    od;
    assert(k < qlen[c]);  /* the node was in its class's queue */
    do
    :: k + 1 < qlen[c] -> queue[c * NCALLERS + k] = queue[c * NCALLERS + k + 1]; k++
    :: else -> break
    od;
    qlen[c]--;
    queued[who] = false;
    k = 0
}

/* serve()'s pop(c): the oldest waiter of class c (seeded: the newest) is
 * unlinked, takes its permit and goes on the list of grantees. */
inline pop(c) {
#ifdef BUG_LIFO
    node = queue[c * NCALLERS + qlen[c] - 1];
#else
    node = queue[c * NCALLERS];
#endif
    remove(c, node);
    /* FIFO inside the class: nobody still queued in it came before `node` */
    k = 0;
    do
    :: k < qlen[c] -> assert(ticket[queue[c * NCALLERS + k]] > ticket[node]); k++
    :: else -> break
    od;
    k = 0;
    debt_at_take = (shared_used > shared_cap -> shared_used - shared_cap : 0);
    take(c, node);
    debt_at_take = 0;
    assert(ngrants < 3);
    grantees[ngrants] = node;
    ngrants++;
    node = 0
}

/* serve(): decides every grant, with m_mutex held; the grants are delivered
 * by deliver_grants() after it is released. */
inline serve() {
    ngrants = 0;
#ifndef BUG_NO_RESERVATION_STEP
    /* (1) reserved permits first: they are no one else's */
    c2 = 0;
    do
    :: c2 < CLASSES ->
        do
        :: qlen[c2] > 0 && running[c2] < reserved[c2] -> pop(c2)
        :: else -> break
        od;
        c2++
    :: else -> break
    od;
#endif
    /* (2) then the shared ones: the highest priority, then the oldest head */
    do
    :: shared_used < shared_cap ->
        best = NOBODY;
        c2 = 0;
        do
        :: c2 < CLASSES ->
            if
            :: qlen[c2] > 0 && running[c2] < ceiling[c2] &&
               (best == NOBODY || prio[c2] > prio[best] ||
#ifndef BUG_TIES_TO_NEWEST
                (prio[c2] == prio[best] && ticket[queue[c2 * NCALLERS]] < ticket[queue[best * NCALLERS]])) ->
#else
                (prio[c2] == prio[best] && ticket[queue[c2 * NCALLERS]] > ticket[queue[best * NCALLERS]])) ->
#endif
                best = c2
            :: else -> skip
            fi;
            c2++
        :: else -> break
        od;
        if
        :: best == NOBODY -> break
        :: else ->
            /* the order: no other class that may take a shared permit has a
             * higher priority, or the same one and an older head */
            c2 = 0;
            do
            :: c2 < CLASSES ->
                assert(!(c2 != best && qlen[c2] > 0 && running[c2] < ceiling[c2] &&
                         (prio[c2] > prio[best] ||
                          (prio[c2] == prio[best] && ticket[queue[c2 * NCALLERS]] < ticket[queue[best * NCALLERS]]))));
                c2++
            :: else -> break
            od;
            pop(best)
        fi
    :: else -> break  /* (3) */
    od;
    best = 0;
    c2 = 0;
    /* after serve(), still under m_mutex: no class with waiters can_take */
    assert(RESERVATION_SERVED(0) && RESERVATION_SERVED(1) && RESERVATION_SERVED(2));
    assert(NO_SHARED_STRANDED(0) && NO_SHARED_STRANDED(1) && NO_SHARED_STRANDED(2))
}

/* grant(): with m_mutex released, oldest grant first: waiter::wake_granted
 * (`granted` under the node's lock, notify, `handed_over`). */
inline deliver_grants() {
    i = 0;
    do
    :: i < ngrants ->
        d_step {
            node = grantees[i];
            assert(node_alive[node] && !queued[node]);  /* a live node, unlinked */
            granted[node] = true
        }
        d_step {
            node = grantees[i];
            assert(node_alive[node]);  /* notify, then the last touch */
            handed_over[node] = true;
            grantees[i] = 0;
            node = 0;
            i++
        }
    :: else -> break
    od;
    atomic { i = 0; ngrants = 0 }
}

/* ---- the threads ------------------------------------------------------ */

proctype caller(byte me; byte c; bool timed) {
    byte round = 0, outcome, k, node, best, c2, i, ngrants, debt_at_take;
    byte grantees[3];
    do
    :: round < ROUNDS ->
        /* arrival, under m_mutex: take_or_enqueue */
        d_step {
#ifdef BUG_ARRIVAL_IGNORES_SHARED
            if
            :: qlen[c] == 0 && (running[c] < reserved[c] || running[c] < ceiling[c]) ->
#else
            if
            :: qlen[c] == 0 && CAN_TAKE(c) ->
#endif
                debt_at_take = (shared_used > shared_cap -> shared_used - shared_cap : 0);
                take(c, me);
                debt_at_take = 0;
                outcome = ACQUIRED
            :: else ->
                granted[me] = false;
                handed_over[me] = false;
                node_alive[me] = true;
                push_back(c, me);
                outcome = WAITING
            fi
        }
        if
        :: outcome == WAITING ->
            /* sleep_on: a grant wins; a timed caller may give up (its
             * deadline, or its stop) at any moment while not granted */
            if
            :: atomic { granted[me] -> outcome = ACQUIRED }
            :: atomic { timed && !granted[me] -> outcome = TIMED_OUT }
            fi;
            if
            :: outcome == TIMED_OUT ->
                /* under m_mutex: still queued? leave. Else the grant wins. */
                d_step {
                    if
#ifdef BUG_LEAVE_UNCHECKED
                    :: true ->
#else
                    :: queued[me] ->
#endif
                        remove(c, me)
                    :: else ->
#ifndef BUG_TIMEOUT_IGNORES_GRANT
                        outcome = WAITING  /* the grant on its way */
#else
                        skip
#endif
                    fi
                }
                if
                :: outcome == WAITING -> atomic { granted[me] -> outcome = ACQUIRED }
                :: else -> skip
                fi
            :: else -> skip
            fi;
            if
#ifndef BUG_NO_HANDOVER_WAIT
            :: outcome == ACQUIRED -> handed_over[me]  /* await_handed_over */
#else
            :: outcome == ACQUIRED -> skip  /* returns while the granter may still touch the node */
#endif
            :: else -> skip
            fi;
            node_alive[me] = false  /* ~waiter */
        :: else -> skip
        fi;
        if
        :: outcome == ACQUIRED ->
            assert(owned[me] == 1);  /* acquired: exactly one permit */
            /* the work; then release(c), under m_mutex: */
            d_step {
                owned[me]--;
                running[c]--;
                if
                :: running[c] >= reserved[c] -> shared_used--  /* it held a shared permit */
                :: else -> skip
                fi;
#ifndef BUG_RELEASE_WITHOUT_SERVE
                serve()
#else
                ngrants = 0
#endif
            }
            deliver_grants()
        :: else ->
            assert(owned[me] == 0)  /* gave up: holds nothing */
        fi;
        d_step { outcome = 0; round++ }
    :: else -> break
    od;
    finished++
}

/* The adaptive limit, concurrently with every caller: RESIZE times
 * shrink(1), then grow(1). */
proctype resizer() {
    byte done = 0, k, node, best, c2, i, ngrants, debt_at_take;
    byte grantees[3];
    do
    :: done < RESIZE ->
        d_step { shared_cap--; capacity-- }  /* shrink(1), under m_mutex */
        d_step {                             /* grow(1), under m_mutex */
            shared_cap++;
            capacity++;
#ifndef BUG_GROW_WITHOUT_SERVE
            serve()
#else
            ngrants = 0
#endif
        }
        deliver_grants();
        done++
    :: else -> break
    od;
    finished++
}

#define TIMED_BIT(i) ((TIMED >> (i)) & 1)

init {
    atomic {
        reserved[0] = R0; ceiling[0] = C0; prio[0] = P0;
        reserved[1] = R1; ceiling[1] = C1; prio[1] = P1;
        reserved[2] = R2; ceiling[2] = C2; prio[2] = P2;
#if RESIZE > 0
        run resizer();
#endif
        run caller(0, K0, TIMED_BIT(0));
        run caller(1, K1, TIMED_BIT(1));
#if NCALLERS > 2
        run caller(2, K2, TIMED_BIT(2));
#endif
#if NCALLERS > 3
        run caller(3, K3, TIMED_BIT(3));
#endif
    }
}
