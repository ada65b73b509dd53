// Contract E, the parts that need no database: the non-reentrancy record
// when permits move between threads and tasks share a thread (E4), the
// commit refused past the deadline (E10, with the fake pool), every admitted
// call counted once (E14), and the connection-string rules that keep every
// password out of messages (E11: pqxx/conninfo.hpp needs no libpq), and the
// wait at exit for the threads the libpqxx layer does not join (E2).
#include "fake_pool.hpp"
#include "test_util.hpp"

#include <bulkhead/bulkhead.hpp>
#include <bulkhead/detail/detached_threads.hpp>
#include <bulkhead/pqxx/conninfo.hpp>

#include "catch.hpp"

#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using bulkhead_test::fake_pool;
using gate_t = bulkhead::db_bulkhead<fake_pool>;

namespace {

/// Every call counted exactly once: committed, failed, or one rejection.
std::uint64_t outcomes(const bulkhead::gate_stats& stats) {
    return stats.completed + stats.failed +
           std::accumulate(stats.rejected.begin(), stats.rejected.end(), std::uint64_t{0});
}

}  // namespace

// --- E4 ------------------------------------------------------------------------
TEST_CASE("[E4] a permit moved to another thread and released there neither poisons nor bypasses the check",
          "[gate][E4]") {
    fake_pool pool;
    gate_t gate(pool, 2, 0);
    SECTION("the entering thread may enter again once its permit was released elsewhere") {
        bulkhead::permit held = gate.enter();
        CHECK_THROWS_AS(gate.enter(), std::logic_error);  // still inside: refused
        std::thread([moved = std::move(held)]() mutable { moved.release(); }).join();
        CHECK(gate.available() == 2);
        bulkhead::permit again;
        CHECK_NOTHROW(again = gate.enter());              // not poisoned
        CHECK_THROWS_AS(gate.enter(), std::logic_error);  // and tracked again
    }
    SECTION("a thread that releases another's permit keeps its own standing") {
        bulkhead::permit mine = gate.enter();
        bool refused = false;
        std::thread([&] {
            bulkhead::permit theirs = gate.enter();
            bulkhead::permit given = std::move(mine);  // moved here, released here
            given.release();
            try {
                (void)gate.enter();
            } catch (const std::logic_error&) {
                refused = true;  // this thread still holds `theirs`: no bypass
            }
        }).join();
        CHECK(refused);
        CHECK(gate.available() == 2);
        CHECK_NOTHROW(gate.transaction(0ms, [](fake_pool::work&) {}));
    }
    SECTION("many permits moved and released elsewhere, in every order") {
        for (int round = 0; round < 200; ++round) {
            bulkhead::permit first = gate.enter({.task = &round});
            bulkhead::permit second = gate.enter();
            std::thread([a = std::move(first), b = std::move(second)]() mutable {
                b.release();
                a.release();
            }).join();
        }
        CHECK_NOTHROW(gate.transaction(0ms, [](fake_pool::work&) {}));
    }
    CHECK(gate.available() == 2);
    CHECK(gate.available_slots() == 2);
}

TEST_CASE("[E4] independent tasks sharing a thread are not refused as reentrant, one task entering twice is",
          "[gate][E4]") {
    fake_pool pool;
    gate_t gate(pool, 2, 0);
    int task_a = 0;
    int task_b = 0;
    bulkhead::permit a = gate.enter({.task = &task_a});
    bulkhead::permit b;
    CHECK_NOTHROW(b = gate.enter({.task = &task_b}));  // another task on this thread
    CHECK_THROWS_AS(gate.enter({.task = &task_a}), std::logic_error);
    CHECK_THROWS_AS(gate.transaction({.queue_wait = 1s, .task = &task_b}, [](fake_pool::work&) {}), std::logic_error);
    a.release();
    CHECK_NOTHROW(gate.transaction({.task = &task_a}, [](fake_pool::work&) {}));
    b.release();
    CHECK(gate.available() == 2);
}

// --- E10 (the gate's side) -----------------------------------------------------
TEST_CASE("[E10] past the deadline when the callback returns, the gate rolls back and throws work_deadline_exceeded",
          "[gate][E10]") {
    fake_pool pool;
    gate_t gate(pool, 1, 0);
    const auto deadline = std::chrono::steady_clock::now() + 50ms;
    CHECK_THROWS_AS(gate.transaction({.deadline = deadline},
                                     [&](fake_pool::work& tx) {
                                         tx.write(7);
                                         std::this_thread::sleep_until(deadline + 5ms);  // the work overruns
                                     }),
                    bulkhead::work_deadline_exceeded);
    CHECK(pool.commits == 0);
    CHECK(pool.rollbacks == 1);
    CHECK(pool.committed_values().empty());
    const bulkhead::gate_stats stats = gate.stats();
    CHECK(stats.completed == 0);
    CHECK(stats.work_deadline_exceeded == 1);
    CHECK(gate.available() == 1);
}

// --- E14 ---------------------------------------------------------------------------
TEST_CASE("[E14] every admitted call ends in exactly one counted outcome, a pool that fails otherwise included",
          "[gate][E14]") {
    fake_pool pool;
    gate_t gate(pool, 2, 1);
    int calls = 0;
    const auto call = [&](auto&& knob) {
        ++calls;
        knob = true;
        try {
            gate.transaction(0ms, [](fake_pool::work&) {});
        } catch (...) {  // each failure mode has its own test; here only the counts matter
        }
        knob = false;
    };
    call(pool.acquire_breaks);  // not a bulkhead::rejected: was counted nowhere
    call(pool.fail_acquire);
    call(pool.fail_begin);
    call(pool.fail_commit);
    call(pool.fail_rollback);
    ++calls;
    gate.transaction(0ms, [](fake_pool::work&) {});
    const bulkhead::gate_stats stats = gate.stats();
    CHECK(outcomes(stats) == static_cast<std::uint64_t>(calls));
    CHECK(stats.admitted == static_cast<std::uint64_t>(calls));
    CHECK(stats.failed >= 1);
    CHECK(gate.available() == 2);
}

// --- E11 (no server needed) ---------------------------------------------------------
namespace {

/// Passwords from the whole printable ASCII range, fixed seed.
std::vector<std::string> generated_passwords() {
    std::mt19937 random(20261201);
    std::uniform_int_distribution<int> printable(0x20, 0x7e);
    std::vector<std::string> passwords;
    for (int i = 0; i < 300; ++i) {
        std::string password;
        for (int c = 0; c < 14; ++c) {
            password += static_cast<char>(printable(random));
        }
        passwords.push_back(password);
    }
    // The characters that break each form, on purpose.
    passwords.emplace_back("pa/ss@w?rd#1");
    passwords.emplace_back("with space's\\and quote");
    passwords.emplace_back("%41%2F-encoded-looking");
    return passwords;
}

/// True when `text` holds any 4-character piece of `password` that is not
/// also in `allowed` (text that was there without the password).
bool leaks(const std::string& text, const std::string& password, const std::string& allowed) {
    for (std::size_t at = 0; at + 4 <= password.size(); ++at) {
        const std::string piece = password.substr(at, 4);
        if (text.find(piece) != std::string::npos && allowed.find(piece) == std::string::npos) {
            return true;
        }
    }
    return false;
}

}  // namespace

TEST_CASE("[E11] redaction hides every generated password, whatever characters it holds, in URI and keyword form",
          "[conninfo][E11]") {
    using bulkhead::detail::percent_encode;
    using bulkhead::detail::quote_keyword_value;
    const std::string scaffold = "host=db.example port=5432 user=app dbname=shop";
    int checked = 0;
    for (const std::string& password : generated_passwords()) {
        const std::vector<std::string> forms{
            scaffold + " password=" + quote_keyword_value(password),
            "password=" + quote_keyword_value(password) + " " + scaffold,
            "postgresql://app:" + percent_encode(password) + "@db.example:5432/shop?sslmode=disable",
            "postgresql://app@db.example/shop?password=" + percent_encode(password),
        };
        std::vector<std::string> all = forms;
        if (password.find(' ') ==
            std::string::npos) {  // a URI ends at whitespace (and the pool refuses one that holds it)
            all.push_back("postgresql://app:" + password +
                          "@db.example/shop");  // unencoded, as a careless user writes it
        }
        for (const std::string& conninfo : all) {
            const std::string redacted = bulkhead::redact_conninfo(conninfo);
            INFO(redacted);
            CHECK_FALSE(leaks(redacted, password, scaffold + "postgresql://app@db.example:5432/shop?sslmode=disable"));
            ++checked;
        }
    }
    CHECK(checked > 1400);
}

TEST_CASE("[E11] a URI whose password holds an unencoded '@', '/', '?' or '#' is refused without naming it",
          "[conninfo][E11]") {
    for (const std::string& bad :
         {std::string("postgresql://app:xq/zv@host/db"), std::string("postgresql://app:xq@zv@host/db"),
          std::string("postgres://app:xq?zv@host/db"), std::string("postgresql://app:xq#zv@host"),
          std::string("postgresql://app:xq zv@host/db")}) {
        try {
            bulkhead::detail::check_uri_user_information(bad);
            FAIL("accepted: " << bulkhead::redact_conninfo(bad));
        } catch (const std::invalid_argument& refused) {
            const std::string message = refused.what();
            CHECK(message.find("percent-encode") != std::string::npos);
            CHECK(message.find("xq") == std::string::npos);
            CHECK(message.find("zv") == std::string::npos);
        }
    }
    CHECK_NOTHROW(bulkhead::detail::check_uri_user_information("postgresql://app:pa%2Fss@host/db"));
    CHECK_NOTHROW(bulkhead::detail::check_uri_user_information("postgresql://host/db?application_name=x"));
    CHECK_NOTHROW(bulkhead::detail::check_uri_user_information("host=db password=a@b/c"));
    CHECK(bulkhead::redact_conninfo("postgresql://app:pa/ss@host/db") == "postgresql://app:***@host/db");
}

TEST_CASE("[E11] a keyword password that spills past its value is noticed, so libpq's complaint is withheld",
          "[conninfo][E11]") {
    using bulkhead::detail::password_may_spill;
    CHECK(password_may_spill("host=db password=two words port=1"));
    CHECK(password_may_spill("password='ab'cd' host=db"));
    CHECK_FALSE(password_may_spill("host=db password='two words' port=1"));
    CHECK_FALSE(password_may_spill("host=db password=plain port=1"));
    CHECK_FALSE(password_may_spill("password=last"));
    CHECK_FALSE(password_may_spill("password=x port = 5"));
}

TEST_CASE("[E7] the pool's TCP defaults are added unless the connection string sets them", "[conninfo][E7]") {
    const auto target = bulkhead::detail::make_connect_target("host=db keepalives_idle=60", "app");
    CHECK(target.base.find("keepalives_idle=60") != std::string::npos);
    CHECK(target.base.find("keepalives_idle='15'") == std::string::npos);
    CHECK(target.base.find("tcp_user_timeout='30000'") != std::string::npos);
    CHECK(target.base.find("keepalives='1'") != std::string::npos);
    const auto uri = bulkhead::detail::make_connect_target("postgresql://db/app?tcp_user_timeout=5000", "");
    CHECK(uri.base.find("tcp_user_timeout=5000") != std::string::npos);
    CHECK(uri.base.find("tcp_user_timeout=30000") == std::string::npos);
    CHECK(uri.base.find("&keepalives_idle=15") != std::string::npos);
}

// --- E2: the threads nobody joins ----------------------------------------------------
TEST_CASE("[E2] a thread the library does not join is counted until it and its captures are gone", "[threads][E2]") {
    using bulkhead::detail::detached_threads;
    const std::size_t before = detached_threads::running();
    std::latch release(1);
    auto token = std::make_shared<int>(0);
    REQUIRE(detached_threads::start(std::chrono::steady_clock::now() + 60s, [&release, token] { release.wait(); }));
    CHECK(detached_threads::running() == before + 1);
    CHECK_FALSE(detached_threads::wait_until(std::chrono::steady_clock::now() + 20ms));  // still blocked
    std::thread releaser([&release] { release.count_down(); });
    CHECK(detached_threads::wait_until(std::chrono::steady_clock::now() + 10s));
    releaser.join();
    CHECK(detached_threads::running() == before);
    CHECK(token.use_count() == 1);  // the thread's copy was destroyed before it stopped counting
}

TEST_CASE("[E2] the wait for the library's threads ends at the latest time they were expected to end by",
          "[threads][E2]") {
    using bulkhead::detail::detached_threads;
    const std::size_t before = detached_threads::running();
    std::latch release(1);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(detached_threads::start(start + 100ms, [&release] { release.wait(); }));
    CHECK_FALSE(detached_threads::wait_until(std::chrono::steady_clock::time_point::max()));
    const auto waited = std::chrono::steady_clock::now() - start;
    CHECK(waited >= 100ms);
    CHECK(waited < 2s);
    release.count_down();
    while (detached_threads::running() > before) {  // the thread ends at once now
        std::this_thread::yield();
    }
}
