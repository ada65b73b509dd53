// bulkhead: the asynchronous front end's code, for either Asio. Not a
// header to include: bulkhead/asio.hpp (standalone Asio) and
// bulkhead/boost_asio.hpp (Boost.Asio) each include it once, after their
// Asio's headers, with BULKHEAD_DETAIL_ASIO_ABI naming the inline
// namespace that holds it (standalone_asio, boost_asio) and, in it, `net`
// naming their Asio (::asio, ::boost::asio) and `error_code` the error code
// of its completions (std::error_code, boost::system::error_code: each
// Asio's use_awaitable and use_future throw only that type). The inline
// namespace keeps the two builds of this code distinct entities. No
// include guard: the two headers' own, and their #error against each
// other, see that it is read once.

#include <atomic>
#include <concepts>
#include <exception>
#include <memory>
#include <optional>
#include <stop_token>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

namespace bulkhead::detail {
inline namespace BULKHEAD_DETAIL_ASIO_ABI {

/// The event loop of every queue-wait timer in the process: one thread,
/// started on first use, stopped and joined at exit (when no call may be in
/// flight). The handler's own executor cannot serve: it may belong to no
/// event loop at all (use_future's, a plain callback's system_executor). An
/// expiry only takes the node out of the queue and posts the completion to
/// the handler's executor; nothing else runs here.
class queue_wait_clock_thread {
public:
    queue_wait_clock_thread() : m_thread([this] { m_context.run(); }) {}
    queue_wait_clock_thread(const queue_wait_clock_thread&) = delete;
    queue_wait_clock_thread& operator=(const queue_wait_clock_thread&) = delete;
    ~queue_wait_clock_thread() {
        m_guard.reset();
        m_context.stop();
        m_thread.join();
        // A timer cancelled just before exit has its handler ready but not
        // yet run, and that handler may hold its operation's last
        // reference: run what is ready, so the operation is freed rather
        // than dropped with the context (which destroys handlers unrun).
        // Only timers of calls still waiting, which no caller may leave
        // behind at exit, are left pending.
        try {
            m_context.restart();
            m_context.poll();
        } catch (...) {
            // The handlers do not throw; a failure of the reactor leaves
            // what remains to the context's destructor.
        }
    }
    [[nodiscard]] net::io_context& context() noexcept { return m_context; }

private:
    net::io_context m_context{1};
    net::executor_work_guard<net::io_context::executor_type> m_guard{m_context.get_executor()};
    std::thread m_thread;
};

/// The process's queue-wait timer loop.
/// \throws std::system_error when its thread cannot be started.
inline net::io_context& queue_wait_clock() {
    static queue_wait_clock_thread clock;
    return clock.context();
}

/// The completion signature for a callback returning T.
template <class T>
struct async_signature {
    static_assert(std::default_initializable<T>,
                  "bulkhead: async_transaction's callback must return void or a default-constructible type (an "
                  "error completes with T{})");
    using type = void(error_code, T);
};
template <>
struct async_signature<void> {
    using type = void(error_code);
};

/// A handler bound to its arguments, for post(): keeps the handler's
/// associated allocator, so posting uses it too.
template <class Handler, class... Args>
struct bound_completion {
    Handler handler;
    std::tuple<Args...> args;
    std::exception_ptr* failure_out = nullptr;  // handed `failure` just before the handler runs
    std::exception_ptr failure;

    using allocator_type = net::associated_allocator_t<Handler>;
    [[nodiscard]] allocator_type get_allocator() const noexcept { return net::get_associated_allocator(handler); }

    void operator()() {
        if (failure_out != nullptr) {
            *failure_out = std::move(failure);
        }
        std::apply(std::move(handler), std::move(args));
    }
};

/// One asynchronous call in flight: its queue node, its job for a work
/// thread, the handler, the copied options and callback, and the outcome.
/// Allocated once with the handler's associated allocator; freed before the
/// handler is invoked unless the queue-wait timer's handler has yet to run
/// (a reference count, two at most, says who frees it).
template <class Gate, class Work, class Handler>
class transaction_operation final : public fifo_semaphore::async_node, public work_job {
public:
    using options = typename Gate::options;
    using value_type = async_access::work_result_t<Gate, Work>;
    using executor_type = net::associated_executor_t<Handler>;
    using allocator_type = net::associated_allocator_t<Handler>;
    using times_type = admission_times;
    using limit_type = permit_wait_limit;

    /// Starts a call: admission now (a rejection is posted at once), then
    /// the permit now or the queue.
    static void start(Gate& gate, const options& call, Work&& work, std::exception_ptr* failure, Handler&& handler) {
        auto limit = async_access::core(gate).take_slot(call);
        if (!limit) {
            std::exception_ptr rejection;
            if (failure != nullptr) {
                rejection = make_rejection(limit.error(), async_access::core(gate).retry_delay(call.workload.index),
                                           async_access::outage_cause(gate, limit.error()));
            }
            post_rejection(std::move(handler), make_error_code(limit.error()), failure, std::move(rejection));
            return;
        }
        times_type times;
        times.admitted = times.permitted = Gate::clock::now();
        transaction_operation* self = nullptr;
        try {
            self = create(gate, call, std::move(work), failure, std::move(handler), times, *limit);
        } catch (...) {
            async_access::core(gate).release_slot(*limit);  // nothing else was taken
            throw;
        }
        self->enter_queue();
    }

private:
    [[nodiscard]] gate_core& core() noexcept { return async_access::core(m_gate); }

    // On the timer loop's own executor type: neither the timer nor its
    // wait carries a type-erased executor (48 bytes less for each).
    using queue_timer =
        net::basic_waitable_timer<std::chrono::steady_clock, net::wait_traits<std::chrono::steady_clock>,
                                  net::io_context::executor_type>;
    using operation_allocator =
        typename std::allocator_traits<allocator_type>::template rebind_alloc<transaction_operation>;

    /// Cancellation slot handler: any cancellation type stops the call.
    struct cancel_on_signal {
        transaction_operation* self;
        void operator()(net::cancellation_type_t type) const noexcept {
            if (type != net::cancellation_type::none) {
                self->m_stop.request_stop();
            }
        }
    };

    /// A stop request while queued: leave the queue, if no grant came first.
    struct leave_on_stop {
        transaction_operation* self;
        void operator()() const noexcept { self->leave_queue(wait_status::cancelled); }
    };

    /// A stop of the caller's token, or the gate's close(), stops the
    /// operation's own stop source. Only that: once the call is no longer
    /// queued, a stop must not reach the gate, which may be gone.
    struct forward_stop {
        std::stop_source* target;
        void operator()() const noexcept { target->request_stop(); }
    };

    /// The completion, posted to the handler's executor; owns the operation.
    struct completion {
        transaction_operation* self;

        explicit completion(transaction_operation* op) noexcept : self(op) {}
        completion(completion&& other) noexcept : self(std::exchange(other.self, nullptr)) {}
        completion& operator=(completion&&) = delete;
        completion(const completion&) = delete;
        completion& operator=(const completion&) = delete;
        ~completion() {
            if (self != nullptr) {
                self->drop_reference();  // never run (the executor's context shut down): the handler goes with it
            }
        }

        using allocator_type = transaction_operation::allocator_type;
        [[nodiscard]] allocator_type get_allocator() const noexcept { return self->m_allocator; }

        void operator()() { std::exchange(self, nullptr)->complete(); }
    };

    transaction_operation(Gate& gate, const options& call, Work&& work, std::exception_ptr* failure, Handler&& handler,
                          const times_type& times, const limit_type& limit)
        : fifo_semaphore::async_node(&on_granted),
          work_job(&on_work_thread),
          m_gate(gate),
          m_call(call),
          m_work(std::move(work)),
          m_failure_out(failure),
          m_handler(std::move(handler)),
          m_allocator(net::get_associated_allocator(m_handler)),
          m_work_guard(net::get_associated_executor(m_handler)),
          m_times(times),
          m_limit(limit) {
        m_call.stop = m_stop.get_token();  // the work sees every kind of stop through this one
        if (call.stop.stop_possible()) {
            m_forward_stop.emplace(call.stop, forward_stop{&m_stop});
        }
        m_forward_close.emplace(core().cancellation().get_token(), forward_stop{&m_stop});
        auto slot = net::get_associated_cancellation_slot(m_handler);
        if (slot.is_connected()) {
            slot.template emplace<cancel_on_signal>(cancel_on_signal{this});
        }
    }

    static transaction_operation* create(Gate& gate, const options& call, Work&& work, std::exception_ptr* failure,
                                         Handler&& handler, const times_type& times, const limit_type& limit) {
        operation_allocator allocator(net::get_associated_allocator(handler));
        transaction_operation* memory = std::allocator_traits<operation_allocator>::allocate(allocator, 1);
        try {
            return ::new (static_cast<void*>(memory))
                transaction_operation(gate, call, std::move(work), failure, std::move(handler), times, limit);
        } catch (...) {
            std::allocator_traits<operation_allocator>::deallocate(allocator, memory, 1);
            throw;
        }
    }

    /// Frees the operation (with a copy of its allocator, as Asio's own do).
    void destroy() noexcept {
        operation_allocator allocator(m_allocator);
        this->~transaction_operation();
        std::allocator_traits<operation_allocator>::deallocate(allocator, this, 1);
    }

    void drop_reference() noexcept {
        // acq_rel: the last owner sees everything the other did to the operation.
        if (m_references.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            destroy();
        }
    }

    /// Posts a rejection at admission; `failure_out`, when the caller asked
    /// for the exception, receives `rejection` on the handler's executor.
    static void post_rejection(Handler&& handler, std::error_code code, std::exception_ptr* failure_out,
                               std::exception_ptr rejection) {
        auto executor = net::get_associated_executor(handler);
        if constexpr (std::is_void_v<value_type>) {
            net::post(executor, bound_completion<Handler, error_code>{
                                    std::move(handler), {error_code(code)}, failure_out, std::move(rejection)});
        } else {
            net::post(executor,
                      bound_completion<Handler, error_code, value_type>{
                          std::move(handler), {error_code(code), value_type{}}, failure_out, std::move(rejection)});
        }
    }

    /// On the calling thread: the permit now, or the queue. The stop
    /// callback and the timer are set up before the node is linked; once it
    /// is, a release may grant it and a work thread run and complete the
    /// call at any moment. The initiating thread keeps a reference until it
    /// is done here, so that it can still look once more: a stop or an
    /// expiry that came before the node was linked found nothing to take
    /// out of the queue, and is acted on now.
    /// \note noexcept: a failure to allocate the timer's wait here (after
    /// the slot was taken and the handler moved in) terminates.
    void enter_queue() noexcept {
        if (core().try_acquire(m_limit)) {
            schedule_work();
            return;
        }
        core().no_permit_free(m_limit.workload);
        if (m_stop.stop_requested()) {
            finish_waiting(wait_status::cancelled);
            return;
        }
        if (m_limit.wait <= m_limit.wait.zero()) {
            finish_waiting(wait_status::timed_out);
            return;
        }
        if (core().deadline_unreachable(m_call, m_limit)) {
            // It would wait only to fail: refused now, no wait recorded.
            std::string cause = refusal_cause();
            refuse(core().refuse_unreachable_deadline(m_limit), std::move(cause));
            post_completion();
            return;
        }
        // relaxed: nobody else holds the operation yet.
        m_references.fetch_add(1, std::memory_order_relaxed);  // this thread's, until the end of this function
        if (m_limit.wait < std::chrono::hours(24 * 365)) {
            try {
                arm_timer();
            } catch (...) {
                // No memory for the timer's wait (the only thing here that
                // can fail): the slot is held and the handler moved in, and
                // there is no way left to complete the call.
                std::terminate();
            }
        }
        m_leave_on_stop.emplace(m_stop.get_token(), leave_on_stop{this});
        if (core().acquire_or_enqueue(m_limit, *this)) {
            m_times.permitted = Gate::clock::now();
            schedule_work();
        } else if (m_stop.stop_requested()) {
            leave_queue(wait_status::cancelled);
        } else if (m_timer && Gate::clock::now() >= m_wait_until) {
            leave_queue(wait_status::timed_out);
        }
        drop_reference();
    }

    /// The queue wait's timer, on the process's timer loop; its handler
    /// holds a reference.
    void arm_timer() {
        m_wait_until = Gate::clock::now() + m_limit.wait;
        m_timer.emplace(queue_wait_clock().get_executor(), m_wait_until);
        m_references.fetch_add(1, std::memory_order_relaxed);  // nobody else holds the operation yet
        m_timer->async_wait([this](const error_code& error) {
            if (!error) {
                leave_queue(wait_status::timed_out);
            }
            drop_reference();
        });
    }

    /// Ends the queue wait's timer, if any: its handler runs soon with
    /// operation_aborted and drops its reference, so neither the operation
    /// nor the timer outlives the call by the rest of the wait. Called once,
    /// by whoever ended the wait (a grant, a stop, an expiry); the timer's
    /// handler never touches the timer itself.
    void cancel_timer() noexcept {
        if (m_timer) {
            try {
                m_timer->cancel();
            } catch (...) {
                // Not cancelled (Asio reports a failure of its reactor): the
                // timer fires when due, finds the node gone, and drops its
                // reference then.
            }
        }
    }

    /// A release granted the permit (on the releasing thread).
    static void on_granted(fifo_semaphore::async_node& node) noexcept {
        auto& self = static_cast<transaction_operation&>(node);
        self.m_times.permitted = Gate::clock::now();
        self.core().workers().push(self);
    }

    void schedule_work() noexcept { core().workers().push(*this); }

    /// A timeout or a stop while queued: if the node is still queued, the
    /// call ends here without a permit; otherwise a grant is on its way.
    void leave_queue(wait_status why) noexcept {
        if (core().cancel(m_limit, *this)) {
            finish_waiting(why);
        }
    }

    /// Ends a call that got no permit: the slot goes back, the reason is
    /// counted, the completion is posted.
    void finish_waiting(wait_status why) noexcept {
        // The stop callback goes first: once the slot is back, close() may
        // report the gate drained and the gate be destroyed, and a later
        // stop must not reach it. Destroyed from inside itself (a stop
        // that ended the wait) it does not wait; from elsewhere it waits
        // for a run in progress, which finds the node gone.
        m_leave_on_stop.reset();
        cancel_timer();
        m_times.permitted = Gate::clock::now();
        core().record_permit_wait(m_limit, m_times.permitted - m_times.admitted);
        std::string cause = why == wait_status::timed_out ? refusal_cause() : std::string();
        refuse(core().refuse_after_slot(why, m_limit), std::move(cause));
        post_completion();
    }

    /// The call ends refused before its work started: the reason as the
    /// error code and, for a caller that asked for the exception, the
    /// rejection with its retry delay, as transaction() would throw it.
    void refuse(reject_reason reason, std::string cause) noexcept {
        m_code = make_error_code(reason);
        if (m_failure_out != nullptr) {
            m_failure = make_rejection(reason, core().retry_delay(m_limit.workload), cause);
        }
    }

    /// For a caller that asked for the exception of a refusal after a wait
    /// (a timeout, deadline_exceeded or admission_timeout): the pool's last
    /// connection error, or empty. Read before the slot goes back, since
    /// the gate and its pool may be gone after.
    [[nodiscard]] std::string refusal_cause() noexcept {
        return m_failure_out != nullptr ? async_access::outage_cause(m_gate, reject_reason::admission_timeout)
                                        : std::string();
    }

    /// Posts the completion from whatever thread ended the call (a work
    /// thread, the timer thread, a stopping thread). This thread holds a
    /// work count of its own on the executor until post() has returned:
    /// otherwise the handler could run, the context finish and be destroyed
    /// while post() was still signalling it (Asio unlocks before it
    /// signals). Releasing that count is the last touch, under the
    /// context's own lock: this thread's copy of the executor goes before
    /// it, since dropping the last reference to a strand locks the strand
    /// service, which dies with the context. A standard executor is copied
    /// once, with the count (outstanding_work.tracked): a strand then drops
    /// its state before its inner executor, which holds the count.
    void post_completion() noexcept {
        try {
            if constexpr (net::execution::is_executor<executor_type>::value) {
                // copied: the operation may be gone once posted
                const auto executor =
                    net::prefer(m_work_guard.get_executor(), net::execution::outstanding_work.tracked);
                net::post(executor, completion(this));
            } else {
                // A legacy executor (io_context::strand and the like): its
                // copies own nothing that dies with the context.
                const executor_type executor = m_work_guard.get_executor();
                const net::executor_work_guard<executor_type> keep_running(executor);
                net::post(executor, completion(this));
            }
        } catch (...) {
            // Posting allocates; with no memory for it the call cannot be
            // completed. Dropping it silently would hang the caller forever.
            std::terminate();
        }
    }

    /// On a work thread: the rest of the call, as transaction() runs it.
    static void on_work_thread(work_job& job) noexcept {
        auto& self = static_cast<transaction_operation&>(job);
        self.run_work();
        self.post_completion();
    }

    void run_work() noexcept {
        // No queue wait is left to end: the stop callback (waiting for one
        // running elsewhere, which finds the node gone from the queue) and the
        // timer go now.
        m_leave_on_stop.reset();
        cancel_timer();
        core().record_permit_wait(m_limit, m_times.permitted - m_times.admitted);
        bool started = false;
        try {
            if constexpr (std::is_void_v<value_type>) {
                async_access::run_adopted(m_gate, m_call, m_work, m_times, &started);
            } else {
                m_value.emplace(async_access::run_adopted(m_gate, m_call, m_work, m_times, &started));
            }
        } catch (const rejected& rejection) {
            if (started) {
                fail(work_error::work_failed);  // from the callback itself: not the gate's rejection
            } else {
                m_code = make_error_code(rejection.reason());
                m_failure = std::current_exception();  // thrown with its retry delay
            }
        } catch (const work_cancelled&) {
            fail(work_error::work_cancelled);
        } catch (const work_deadline_exceeded&) {
            fail(work_error::work_deadline_exceeded);
        } catch (const commit_unknown&) {
            fail(work_error::commit_unknown);
        } catch (...) {
            fail(work_error::work_failed);
        }
    }

    /// Inside a catch handler.
    void fail(work_error error) noexcept {
        m_code = make_error_code(error);
        m_failure = std::current_exception();
    }

    /// On the handler's executor: hands the outcome to the handler.
    void complete() {
        auto slot = net::get_associated_cancellation_slot(m_handler);
        if (slot.is_connected()) {
            slot.clear();
        }
        if (m_failure_out != nullptr) {
            *m_failure_out = std::move(m_failure);
        }
        Handler handler(std::move(m_handler));
        // A default error_code for success: Boost's, built from a
        // std::error_code, would hold it wrapped and not compare equal to
        // error_code{}.
        const error_code code = m_code ? error_code(m_code) : error_code();
        auto work_guard = std::move(m_work_guard);  // keeps the context running until the handler has run
        if constexpr (std::is_void_v<value_type>) {
            drop_reference();
            std::move(handler)(code);
        } else {
            value_type value = m_value ? std::move(*m_value) : value_type{};
            drop_reference();
            std::move(handler)(code, std::move(value));
        }
    }

    Gate& m_gate;
    options m_call;  // the caller's, with `stop` replaced by m_stop's token
    Work m_work;
    std::exception_ptr* m_failure_out;
    Handler m_handler;
    [[no_unique_address]] allocator_type m_allocator;
    net::executor_work_guard<executor_type> m_work_guard;  // the handler's executor, kept running
    times_type m_times;  // `permitted` written by whoever grants, before the job is queued
    limit_type m_limit;
    std::stop_source m_stop;  // Asio cancellation, the caller's stop and nothing else stop this
    std::optional<std::stop_callback<forward_stop>> m_forward_stop;
    std::optional<std::stop_callback<forward_stop>> m_forward_close;   // the gate's close() stops the call too
    std::optional<std::stop_callback<leave_on_stop>> m_leave_on_stop;  // while queued
    std::optional<queue_timer> m_timer;                                // while queued with a finite wait
    typename Gate::clock::time_point m_wait_until{};                   // the timer's expiry, when there is one
    std::atomic<int> m_references{1};  // the call; the timer's handler; the initiating thread, briefly
    std::error_code m_code;            // the outcome, set before completion
    std::exception_ptr m_failure;
    std::optional<std::conditional_t<std::is_void_v<value_type>, char, value_type>> m_value;
};

/// The initiation Asio calls (at once, or when a deferred operation is
/// launched).
template <class Gate>
struct initiate_transaction {
    Gate* gate;

    template <class Handler, class Work>
    void operator()(Handler&& handler, const typename Gate::options& call, Work&& work,
                    std::exception_ptr* failure) const {
        using operation = transaction_operation<Gate, std::decay_t<Work>, std::decay_t<Handler>>;
        std::decay_t<Work> owned(std::forward<Work>(work));
        std::decay_t<Handler> owned_handler(std::forward<Handler>(handler));
        operation::start(*gate, call, std::move(owned), failure, std::move(owned_handler));
    }
};

/// Starts one call: the checks that throw, then Asio's initiation.
struct asio_frontend {
    template <class Gate, class Work, class CompletionToken>
    static auto initiate(Gate& gate, const typename Gate::options& call, Work&& work, std::exception_ptr* failure,
                         CompletionToken&& token) {
        async_access::check_call(gate, call, work);
        (void)queue_wait_clock();  // started here, where a failure can still be thrown
        using value_type = async_access::work_result_t<Gate, std::decay_t<Work>>;
        using signature = typename async_signature<value_type>::type;
        return net::async_initiate<CompletionToken, signature>(initiate_transaction<Gate>{&gate}, token, call,
                                                               std::forward<Work>(work), failure);
    }
};

}  // namespace BULKHEAD_DETAIL_ASIO_ABI

/// What db_bulkhead::async_transaction() calls, for every completion token:
/// this translation unit's Asio.
template <class Token>
struct async_frontend : BULKHEAD_DETAIL_ASIO_ABI::asio_frontend {};

}  // namespace bulkhead::detail
