// One instance of a fleet, for the [H3] multi-process test in
// fleet_budget_test.cpp: its own pool (with the start-up budget check) and
// its own gate, then a closed-loop load through the gate.
//
//   bulkhead_fleet_probe name=I prefix=P pool=N threads=T seconds=S check=off|warn|refuse
//                        instances=K overlap=PERCENT others=M go=FILE
//
// The conninfo comes from $BULKHEAD_FLEET_CONNINFO (never the command line:
// it holds a password). Prints, one line each, flushed at once:
//   warning: <the check's message on one line>        (check=warn, when it does not fit)
//   refused: <the exception's message on one line>    (check=refuse; exit 3, no load)
//   budget: fits=0|1 available=N demand=N headroom=N largest_pool=N
//   ready                                             (then waits for FILE to exist)
//   load: calls=N served=N rejected=N errors=N sqlstate_53300=N connect_failures=N permits_back=0|1
// Each of T threads runs `SELECT pg_sleep(0.02)` through the gate (B = pool
// size, Q = T) for S seconds. sqlstate_53300 counts the failures that say
// "too many connections": an sql_error with SQLSTATE 53300, or a
// connection error with the server's words for it (libpq gives no SQLSTATE
// for a refused connection). Exit 0 after the load.
#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

/// The server's words for SQLSTATE 53300 at connection time (PostgreSQL 15
/// to 17, lc_messages C).
bool says_too_many_connections(std::string_view text) {
    return text.find("too many clients already") != std::string_view::npos ||
           text.find("remaining connection slots are reserved") != std::string_view::npos ||
           text.find("53300") != std::string_view::npos;
}

void say(const std::string& line) {
    std::printf("%s\n", line.c_str());
    (void)std::fflush(stdout);
}

std::size_t number(const std::map<std::string, std::string>& arguments, const std::string& key) {
    const auto found = arguments.find(key);
    return found == arguments.end() ? 0 : static_cast<std::size_t>(std::stoul(found->second));
}

}  // namespace

int main(int argc, char** argv) {
    std::map<std::string, std::string> arguments;
    for (int i = 1; i < argc; ++i) {
        const std::string_view argument(argv[i]);  // NOLINT(cppcoreguidelines-pro-bounds-pointer-arithmetic)
        const std::size_t equals = argument.find('=');
        if (equals != std::string_view::npos) {
            arguments[std::string(argument.substr(0, equals))] = std::string(argument.substr(equals + 1));
        }
    }
    const char* conninfo = std::getenv("BULKHEAD_FLEET_CONNINFO");  // NOLINT(concurrency-mt-unsafe): one thread yet
    if (conninfo == nullptr) {
        say("no BULKHEAD_FLEET_CONNINFO");
        return 2;
    }
    const std::string check = arguments["check"];
    bulkhead::pqxx_pool_options options;
    options.conninfo = conninfo;
    options.max_size = number(arguments, "pool");
    options.connection_timeout = 2s;
    options.application_name = arguments["name"];
    options.budget_check = check == "refuse" ? bulkhead::budget_check_mode::refuse
                           : check == "warn" ? bulkhead::budget_check_mode::warn
                                             : bulkhead::budget_check_mode::off;
    options.fleet = {.instances = number(arguments, "instances"),
                     .application_prefix = arguments["prefix"],
                     .overlap_percent = number(arguments, "overlap"),
                     .other_clients = number(arguments, "others")};
    options.on_budget_warning = [](const bulkhead::budget_warning& warning) {
        say("warning: " + bulkhead::detail::one_line(warning.message));
    };
    const std::size_t threads = number(arguments, "threads");
    const auto seconds = std::chrono::seconds(number(arguments, "seconds"));
    const std::filesystem::path go = arguments["go"];

    try {
        bulkhead::pqxx_pool pool(options);
        const bulkhead::connection_budget budget = pool.read_budget();
        say("budget: fits=" + std::to_string(static_cast<int>(budget.fits())) +
            " available=" + std::to_string(budget.available()) + " demand=" + std::to_string(budget.demand()) +
            " headroom=" + std::to_string(budget.headroom()) +
            " largest_pool=" + std::to_string(budget.largest_pool_size()));
        say("ready");
        for (auto waited = 0ms; !std::filesystem::exists(go); waited += 10ms) {
            if (waited > 60s) {
                say("no go file");
                return 2;
            }
            std::this_thread::sleep_for(10ms);
        }

        const int permits = static_cast<int>(options.max_size);
        bulkhead::db_bulkhead gate(pool, permits, static_cast<int>(threads));
        std::atomic<long> calls{0};
        std::atomic<long> served{0};
        std::atomic<long> rejected{0};
        std::atomic<long> errors{0};
        std::atomic<long> too_many{0};
        const auto until = std::chrono::steady_clock::now() + seconds;
        std::vector<std::thread> workers;
        workers.reserve(threads);
        for (std::size_t t = 0; t < threads; ++t) {
            workers.emplace_back([&] {
                while (std::chrono::steady_clock::now() < until) {
                    ++calls;
                    try {
                        gate.transaction({.queue_wait = 2s},
                                         [](pqxx::dbtransaction& tx) { (void)tx.exec("SELECT pg_sleep(0.02)"); });
                        ++served;
                    } catch (const bulkhead::rejected& refusal) {
                        ++rejected;
                        too_many += says_too_many_connections(refusal.what()) ? 1 : 0;
                    } catch (const pqxx::sql_error& failure) {
                        ++errors;
                        too_many += failure.sqlstate() == "53300" || says_too_many_connections(failure.what()) ? 1 : 0;
                    } catch (const std::exception& failure) {
                        ++errors;
                        too_many += says_too_many_connections(failure.what()) ? 1 : 0;
                    }
                }
            });
        }
        for (std::thread& worker : workers) {
            worker.join();
        }
        const bool permits_back =
            gate.available() == permits && gate.running() == 0 && gate.waiting() == 0 && pool.in_use() == 0;
        say("load: calls=" + std::to_string(calls.load()) + " served=" + std::to_string(served.load()) +
            " rejected=" + std::to_string(rejected.load()) + " errors=" + std::to_string(errors.load()) +
            " sqlstate_53300=" + std::to_string(too_many.load()) +
            " connect_failures=" + std::to_string(pool.stats().connect_failures) +
            " permits_back=" + std::to_string(static_cast<int>(permits_back)));
    } catch (const bulkhead::connection_budget_exceeded& refusal) {
        say("refused: " + bulkhead::detail::one_line(refusal.what()));
        return 3;
    } catch (const std::exception& failure) {
        say("failed: " + bulkhead::detail::one_line(failure.what()));
        return 1;
    }
    return 0;
}
