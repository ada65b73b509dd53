// Contract G10, configuration side (workload_config.hpp): workload plans read
// from text and from the environment, written back, and described for the
// start-up log. No gate runs work here; a gate over the test-double pool is
// built only to compare its refusals with describe_workloads()'s.
#include "fake_pool.hpp"
#include "test_util.hpp"

#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/workload_config.hpp>

#include "catch.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

using namespace std::chrono_literals;
using bulkhead::workload_class;
using bulkhead::workload_plan;
using bulkhead_test::fake_pool;
using bulkhead_test::scoped_env;
using gate_t = bulkhead::db_bulkhead<fake_pool>;
using std::chrono::nanoseconds;

namespace {

constexpr int int_max = std::numeric_limits<int>::max();
constexpr int int_min = std::numeric_limits<int>::min();

/// The message parse_workloads() throws for `text`, or "accepted".
std::string refusal_of(std::string_view text) {
    try {
        static_cast<void>(bulkhead::parse_workloads(text));
    } catch (const std::invalid_argument& error) {
        return error.what();
    }
    return "accepted";
}

/// The longest run of `c` in `text`.
std::size_t longest_run(std::string_view text, char c) {
    std::size_t longest = 0;
    std::size_t run = 0;
    for (const char here : text) {
        run = here == c ? run + 1 : 0;
        longest = std::max(longest, run);
    }
    return longest;
}

/// A random plan that parse_workloads() can return: 0 to max_workloads
/// classes, names of 1-32 characters, counts and waits at their extremes as
/// well as in between.
workload_plan random_plan(std::mt19937_64& random) {
    constexpr std::string_view name_characters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";
    const auto below = [&](std::uint64_t bound) { return random() % bound; };
    const auto count = [&]() -> int {
        switch (below(4)) {
            case 0:
                return 0;
            case 1:
                return static_cast<int>(below(10));
            case 2:
                return static_cast<int>(below(static_cast<std::uint64_t>(int_max) + 1));
            default:
                return int_max;
        }
    };
    const auto wait = [&]() -> nanoseconds {
        constexpr std::int64_t longest = std::numeric_limits<std::int64_t>::max();
        constexpr std::array<std::int64_t, 5> units{1, 1'000, 1'000'000, 1'000'000'000, 60'000'000'000};
        switch (below(5)) {
            case 0:
                return nanoseconds::max();
            case 1:
                return nanoseconds::zero();
            case 2: {
                const std::int64_t unit = units.at(below(units.size()));
                return nanoseconds(static_cast<std::int64_t>(below(1'000'000)) * unit);
            }
            case 3: {
                const std::int64_t unit = units.at(below(units.size()));
                return nanoseconds(static_cast<std::int64_t>(below(static_cast<std::uint64_t>(longest / unit) + 1)) *
                                   unit);
            }
            default:
                return nanoseconds(longest - static_cast<std::int64_t>(below(3)));
        }
    };
    workload_plan plan;
    const auto classes = static_cast<int>(below(bulkhead::max_workloads + 1));
    while (static_cast<int>(plan.classes.size()) < classes) {
        std::string name;
        const std::uint64_t length = 1 + below(32);
        for (std::uint64_t i = 0; i < length; ++i) {
            name += name_characters.at(below(name_characters.size()));
        }
        bool taken = false;
        for (const workload_class& earlier : plan.classes) {
            taken = taken || earlier.name == name;
        }
        if (taken) {
            continue;
        }
        workload_class c{.name = name, .reserved = count(), .ceiling = count(), .queue = count(), .queue_wait = wait()};
        switch (below(4)) {
            case 0:
                c.priority = int_min;
                break;
            case 1:
                c.priority = int_max;
                break;
            default:
                c.priority = static_cast<int>(below(2001)) - 1000;
                break;
        }
        c.adaptive_floor = below(2) == 0 ? 0 : count();
        plan.classes.push_back(c);
    }
    return plan;
}

/// max_workloads + 1 classes, named c0, c1, ...
workload_plan one_class_too_many() {
    workload_plan plan;
    plan.classes.resize(bulkhead::max_workloads + 1);
    for (std::size_t i = 0; i < plan.classes.size(); ++i) {
        plan.classes[i].name = "c";
        plan.classes[i].name += std::to_string(i);
    }
    return plan;
}

/// What `make` throws: its type and message, or "accepted".
std::string thrown_by(const std::function<void()>& make) {
    try {
        make();
    } catch (const std::exception& error) {
        std::string thrown = typeid(error).name();
        thrown += ": ";
        thrown += error.what();
        return thrown;
    }
    return "accepted";
}

}  // namespace

TEST_CASE("[G10] the documented example reads as the plan it describes", "[G10][config]") {
    const workload_plan parsed = bulkhead::parse_workloads(
        "# name         key=value ...\n"
        "interactive    reserved=4 queue=32 priority=10\n"
        "\n"
        "batch\tceiling=6 queue=4 queue_wait=2s adaptive_floor=2  # at most 2 s in the queue\r\n"
        "reports reserved=1 ceiling=2; audit queue=1 priority=-3 ;;\n");
    const workload_plan expected{{
        workload_class{.name = "interactive", .reserved = 4, .queue = 32, .priority = 10},
        workload_class{.name = "batch", .ceiling = 6, .queue = 4, .queue_wait = 2s, .adaptive_floor = 2},
        workload_class{.name = "reports", .reserved = 1, .ceiling = 2},
        workload_class{.name = "audit", .queue = 1, .priority = -3},
    }};
    CHECK(parsed == expected);
}

TEST_CASE("[G10] text with no class reads as a plan with no class", "[G10][config]") {
    CHECK(bulkhead::parse_workloads("").classes.empty());
    CHECK(bulkhead::parse_workloads(" \t\n\n ; ;\r\n").classes.empty());
    CHECK(bulkhead::parse_workloads("# only a comment; not a class\n#another").classes.empty());
}

TEST_CASE("[G10] a comment runs to the end of its line, separators included", "[G10][config]") {
    const workload_plan parsed = bulkhead::parse_workloads("a reserved=1 # b queue=3; c\nd#e");
    REQUIRE(parsed.classes.size() == 2);
    CHECK(parsed.classes[0] == workload_class{.name = "a", .reserved = 1});
    CHECK(parsed.classes[1] == workload_class{.name = "d"});
}

TEST_CASE("[G10] every queue_wait unit reads as its number of nanoseconds", "[G10][config]") {
    const auto wait_of = [](const std::string& value) {
        std::string text = "a queue_wait=";
        text += value;
        return bulkhead::parse_workloads(text).classes.at(0).queue_wait;
    };
    CHECK(wait_of("7ns") == 7ns);
    CHECK(wait_of("7us") == 7us);
    CHECK(wait_of("7ms") == 7ms);
    CHECK(wait_of("7s") == 7s);
    CHECK(wait_of("7min") == 7min);
    CHECK(wait_of("0ms") == 0ns);
    CHECK(wait_of("none") == nanoseconds::max());
    CHECK(wait_of("9223372036854775807ns") == nanoseconds::max());
    CHECK(wait_of("153722867min") == 153'722'867min);
    CHECK(bulkhead::parse_workloads("a").classes.at(0).queue_wait == nanoseconds::max());
}

TEST_CASE("[G10] format writes every key, queue_wait in its largest exact unit", "[G10][config]") {
    const workload_plan plan{{
        workload_class{.name = "a", .queue_wait = 2min},
        workload_class{.name = "b", .queue_wait = 90s},
        workload_class{.name = "c", .queue_wait = 1500ms},
        workload_class{.name = "d", .queue_wait = 1001us},
        workload_class{.name = "e", .queue_wait = 1001ns},
        workload_class{.name = "f", .queue_wait = 0ns},
        workload_class{.name = "g", .reserved = 1, .ceiling = 2, .queue = 3, .priority = -4, .adaptive_floor = 2},
    }};
    CHECK(bulkhead::format_workloads(plan) ==
          "a reserved=0 ceiling=0 queue=0 queue_wait=2min priority=0 adaptive_floor=0\n"
          "b reserved=0 ceiling=0 queue=0 queue_wait=90s priority=0 adaptive_floor=0\n"
          "c reserved=0 ceiling=0 queue=0 queue_wait=1500ms priority=0 adaptive_floor=0\n"
          "d reserved=0 ceiling=0 queue=0 queue_wait=1001us priority=0 adaptive_floor=0\n"
          "e reserved=0 ceiling=0 queue=0 queue_wait=1001ns priority=0 adaptive_floor=0\n"
          "f reserved=0 ceiling=0 queue=0 queue_wait=0s priority=0 adaptive_floor=0\n"
          "g reserved=1 ceiling=2 queue=3 queue_wait=none priority=-4 adaptive_floor=2\n");
    CHECK(bulkhead::format_workloads(workload_plan{}).empty());
}

TEST_CASE("[G10] a random plan written and read back is the same plan", "[G10][config]") {
    const auto seed = GENERATE(1U, 2U, 3U, 4U);
    CAPTURE(seed);
    std::mt19937_64 random(seed);
    for (int round = 0; round < 250; ++round) {
        const workload_plan plan = random_plan(random);
        const std::string text = bulkhead::format_workloads(plan);
        CAPTURE(round, text);
        REQUIRE(bulkhead::parse_workloads(text) == plan);
        // The same classes on one line, as an environment variable holds them.
        std::string one_line;
        for (const char c : text) {
            if (c == '\n') {
                one_line += "; ";
            } else {
                one_line += c;
            }
        }
        REQUIRE(bulkhead::parse_workloads(one_line) == plan);
    }
}

TEST_CASE("[G10] format refuses a plan that parse could not return", "[G10][config]") {
    const auto refused = [](const workload_plan& plan, const std::string& expected) {
        CAPTURE(expected);
        const std::string thrown = thrown_by([&] { static_cast<void>(bulkhead::format_workloads(plan)); });
        CHECK_THAT(thrown, Catch::Matchers::ContainsSubstring(expected));
        CHECK_THAT(thrown, Catch::Matchers::ContainsSubstring("invalid_argument"));
    };
    refused(workload_plan{{workload_class{.name = "a b"}}}, "the name \"a b\" must be 1-32 characters");
    refused(workload_plan{{workload_class{.name = ""}}}, "the name \"\" must be");
    refused(workload_plan{{workload_class{.name = "a"}, workload_class{.name = "a"}}},
            "the name \"a\" is already used by an earlier class");
    refused(workload_plan{{workload_class{.name = "a", .reserved = -1}}}, "class \"a\": a negative");
    refused(workload_plan{{workload_class{.name = "a", .ceiling = -1}}}, "class \"a\": a negative");
    refused(workload_plan{{workload_class{.name = "a", .queue = -1}}}, "class \"a\": a negative");
    refused(workload_plan{{workload_class{.name = "a", .queue_wait = -1ns}}}, "class \"a\": a negative");
    refused(workload_plan{{workload_class{.name = "a", .adaptive_floor = -1}}}, "class \"a\": a negative");
    refused(one_class_too_many(), "17 classes; at most 16");
}

TEST_CASE("[G10] bad text is refused with its line, its class, the key and what is wrong", "[G10][config]") {
    struct bad_text {
        std::string text;
        std::string expected;
    };
    std::string seventeen;
    for (const workload_class& c : one_class_too_many().classes) {
        seventeen += c.name;
        seventeen += ';';
    }
    const std::vector<bad_text> cases{
        {"a reserved=1 colour=red", R"(line 1, class "a": unknown key "colour": )"
                                    R"(the keys are reserved, ceiling, queue, queue_wait, priority, adaptive_floor)"},
        {"a Reserved=1", R"(line 1, class "a": unknown key "Reserved")"},
        {"a queue=1 queue=2", R"(line 1, class "a": queue is given twice)"},
        {"a reserved=four", R"(line 1, class "a": reserved "four" is not a number)"},
        {"a reserved=+4", R"(line 1, class "a": reserved "+4" is not a number)"},
        {"a reserved=4x", R"(line 1, class "a": reserved "4x" is not a whole number)"},
        {"a queue=2.5", R"(line 1, class "a": queue "2.5" is not a whole number)"},
        {"a ceiling=2147483648", R"(line 1, class "a": ceiling "2147483648" is out of int range (at most 2147483647))"},
        {"a priority=-2147483649",
         R"(line 1, class "a": priority "-2147483649" is out of int range (-2147483648 to 2147483647))"},
        {"a queue=-1", R"(line 1, class "a": queue "-1" must not be negative)"},
        {"a adaptive_floor=-2", R"(line 1, class "a": adaptive_floor "-2" must not be negative)"},
        {"a reserved=-0", R"(line 1, class "a": reserved "-0" must not be negative)"},
        {"a queue_wait=50",
         R"(line 1, class "a": queue_wait "50" has no unit: add one of ns, us, ms, s or min, as in 50ms)"},
        {"a queue_wait=5h", R"(line 1, class "a": queue_wait "5h" has an unknown unit "h": use ns, us, ms, s or min)"},
        {"a queue_wait=5MS", R"(queue_wait "5MS" has an unknown unit "MS")"},
        {"a queue_wait=1.5s", R"(queue_wait "1.5s" is not a whole number: use a smaller unit (1500ms, not 1.5s))"},
        {"a queue_wait=-5ms", R"(line 1, class "a": queue_wait "-5ms" must not be negative)"},
        {"a queue_wait=ms", R"(queue_wait "ms" is not a duration: write a whole number and a unit)"},
        {"a queue_wait=None", R"(queue_wait "None" is not a duration)"},
        {"a queue_wait=153722868min", R"(queue_wait "153722868min" is too long: nanoseconds hold about 292 years)"},
        {"a queue_wait=99999999999999999999ns", R"(queue_wait "9999999999999999"... is too long)"},
        {"reserved=4 queue=1", R"(line 1: the class has no name: it starts with "reserved=4")"},
        {"x;=4", R"(line 1: the class has no name: it starts with "=4")"},
        {"bad.name reserved=1", R"(line 1: the name "bad.name" must be 1-32 characters of A-Z a-z 0-9 _ -)"},
        {"a\n\nb; a", R"(line 3: the name "a" is already used by an earlier class)"},
        {"a reserved 4", R"(line 1, class "a": "reserved" is not key=value (no spaces around the '='))"},
        {"a reserved= 4", R"(line 1, class "a": reserved has no value after its '=')"},
        {"a =4", R"(line 1, class "a": "=4" has no key before its '=')"},
        {"# header\nok reserved=1\n\nb queue=x", R"(line 4, class "b": queue "x" is not a number)"},
        {seventeen, "line 1: more than 16 classes (max_workloads)"},
    };
    for (const bad_text& bad : cases) {
        const std::string message = refusal_of(bad.text);
        CAPTURE(bad.text, message);
        CHECK(message.starts_with("bulkhead workloads: line "));
        CHECK(message.find(bad.expected) != std::string::npos);
    }
}

TEST_CASE("[G10] an error message quotes at most 40 characters of the text", "[G10][config]") {
    const std::string long_run(10'000, 'x');
    // Built by appending: g++ 12 -O3 warns, falsely, of "lit" + string (GCC bug 105329).
    const auto joined = [](std::initializer_list<std::string_view> parts) {
        std::string text;
        for (const std::string_view part : parts) {
            text += part;
        }
        return text;
    };
    const std::vector<std::string> hostile{
        long_run,                                             // a name far too long
        joined({"a reserved=", long_run}),                    // a value
        joined({"a ", long_run, "=1"}),                       // a key
        joined({"a queue_wait=1", long_run}),                 // a unit
        joined({"a ", long_run}),                             // not key=value
        joined({long_run, "=1"}),                             // no name
        joined({std::string(31, 'x'), " ", long_run, "=1"}),  // a long valid name and a long key
    };
    for (const std::string& text : hostile) {
        const std::string message = refusal_of(text);
        CAPTURE(message);
        REQUIRE(message != "accepted");
        CHECK(longest_run(message, 'x') <= 24);
        std::size_t quoted = 0;
        for (const char c : message) {
            quoted += c == 'x' ? 1 : 0;
        }
        CHECK(quoted <= 40);
        CHECK(message.size() < 220);
    }
    // Control characters and bytes outside ASCII are not echoed.
    const std::string message = refusal_of("a\x1b[31m\xc3\xa9 reserved=1");
    CAPTURE(message);
    CHECK(message.find("the name \"a?[31m??\" must be") != std::string::npos);
    CHECK(message.find('\x1b') == std::string::npos);
}

TEST_CASE("[G10] workloads_from_env reads its variable, and unset or blank means no plan", "[G10][config]") {
    constexpr const char* variable = "BULKHEAD_WORKLOADS_G10_TEST";
    const scoped_env env(variable, nullptr);
    CHECK_FALSE(bulkhead::workloads_from_env(variable).has_value());
    env.set("");
    CHECK_FALSE(bulkhead::workloads_from_env(variable).has_value());
    env.set("  # nothing yet\n");
    CHECK_FALSE(bulkhead::workloads_from_env(variable).has_value());
    env.set("interactive reserved=2 queue=8; batch ceiling=6 queue_wait=2s");
    const std::optional<workload_plan> plan = bulkhead::workloads_from_env(variable);
    REQUIRE(plan.has_value());
    CHECK(*plan == workload_plan{{
                       workload_class{.name = "interactive", .reserved = 2, .queue = 8},
                       workload_class{.name = "batch", .ceiling = 6, .queue_wait = 2s},
                   }});

    const scoped_env default_variable("BULKHEAD_WORKLOADS", "only queue=1");
    CHECK(bulkhead::workloads_from_env() == workload_plan{{workload_class{.name = "only", .queue = 1}}});
    default_variable.set(nullptr);
    CHECK_FALSE(bulkhead::workloads_from_env().has_value());
}

TEST_CASE("[G10] an error in the environment variable names the variable", "[G10][config]") {
    constexpr const char* variable = "BULKHEAD_WORKLOADS_G10_TEST";
    const scoped_env env(variable, "interactive reserved=2; batch queue=lots");
    CHECK_THROWS_MATCHES(bulkhead::workloads_from_env(variable), std::invalid_argument,
                         Catch::Matchers::Message("bulkhead workloads in BULKHEAD_WORKLOADS_G10_TEST: line 1, class "
                                                  "\"batch\": queue \"lots\" is not a number: write a whole number, "
                                                  "as in queue=4"));
    CHECK_THROWS_AS(bulkhead::workloads_from_env(nullptr), std::invalid_argument);
    CHECK_THROWS_AS(bulkhead::workloads_from_env(""), std::invalid_argument);
}

TEST_CASE("[G10] describe shows B, the reserved sum, the shared permits and each class's budget", "[G10][config]") {
    const workload_plan plan{{
        workload_class{.name = "interactive", .reserved = 4, .queue = 32, .priority = 10},
        workload_class{.name = "reports", .reserved = 1, .ceiling = 2, .queue_wait = 1500ms},
        workload_class{.name = "batch", .ceiling = 6, .queue = 4, .queue_wait = 2s, .adaptive_floor = 2},
    }};
    const std::string described = bulkhead::describe_workloads(plan, 10);
    CHECK(described ==
          "# bulkhead workloads: B = 10 permits, 5 reserved (interactive 4 + reports 1), 5 shared\n"
          "interactive reserved=4 ceiling=10 queue=32 queue_wait=none   priority=10 adaptive_floor=0  # admission "
          "slots 42\n"
          "reports     reserved=1 ceiling=2  queue=0  queue_wait=1500ms priority=0  adaptive_floor=0  # admission "
          "slots 2\n"
          "batch       reserved=0 ceiling=6  queue=4  queue_wait=2s     priority=0  adaptive_floor=2  # admission "
          "slots 10\n");
    CHECK(bulkhead::parse_workloads(described) == bulkhead::checked_workload_plan(plan, 10));

    const std::string no_reservation =
        bulkhead::describe_workloads(workload_plan{{workload_class{.name = "only", .queue = 3}}}, 4);
    CHECK(no_reservation ==
          "# bulkhead workloads: B = 4 permits, 0 reserved, 4 shared\n"
          "only reserved=0 ceiling=4 queue=3 queue_wait=none priority=0 adaptive_floor=0  # admission slots 7\n");
}

TEST_CASE("[G10] describe of a random plan reads back as the checked plan", "[G10][config]") {
    std::mt19937_64 random(42);
    for (int round = 0; round < 300; ++round) {
        workload_plan plan = random_plan(random);
        if (plan.classes.empty()) {
            continue;
        }
        // Fit it inside a random B: what is refused is covered below.
        const int concurrent = 1 + static_cast<int>(random() % 64);
        int left = concurrent;
        for (workload_class& c : plan.classes) {
            c.reserved = left > 0 ? static_cast<int>(random() % static_cast<std::uint64_t>(left + 1)) : 0;
            left -= c.reserved;
            c.ceiling =
                c.ceiling == 0
                    ? 0
                    : c.reserved + static_cast<int>(random() % static_cast<std::uint64_t>(concurrent - c.reserved + 1));
            c.queue = static_cast<int>(random() % 1000);
            // 0, or inside [max(1, reserved), the ceiling with 0 meaning B].
            const int lowest = std::max(c.reserved, 1);
            const int highest = c.ceiling == 0 ? concurrent : c.ceiling;
            c.adaptive_floor =
                random() % 2 == 0 || highest < lowest
                    ? 0
                    : lowest + static_cast<int>(random() % static_cast<std::uint64_t>(highest - lowest + 1));
        }
        const std::string described = bulkhead::describe_workloads(plan, concurrent);
        CAPTURE(round, described);
        REQUIRE(bulkhead::parse_workloads(described) == bulkhead::checked_workload_plan(plan, concurrent));
    }
}

TEST_CASE("[G10] describe refuses reservations that do not fit inside B, with the sum shown", "[G10][config]") {
    const workload_plan plan{{
        workload_class{.name = "interactive", .reserved = 3},
        workload_class{.name = "batch", .reserved = 2},
    }};
    CHECK_THROWS_MATCHES(bulkhead::describe_workloads(plan, 4), std::invalid_argument,
                         Catch::Matchers::Message("bulkhead workload plan: the reserved permits 3 (interactive) + 2 "
                                                  "(batch) = 5 do not fit inside B = 4"));
    CHECK_NOTHROW(bulkhead::describe_workloads(plan, 5));
}

TEST_CASE("[G10] describe refuses exactly what a gate of the same B refuses, with its message", "[G10][config]") {
    struct bad_plan {
        workload_plan plan;
        int concurrent;
    };
    const std::vector<bad_plan> cases{
        {workload_plan{}, 4},
        {workload_plan{{workload_class{.name = "a", .reserved = 3}, workload_class{.name = "b", .reserved = 2}}}, 4},
        {workload_plan{{workload_class{.name = "a", .ceiling = 5}}}, 4},
        {workload_plan{{workload_class{.name = "a", .reserved = 3, .ceiling = 2}}}, 4},
        {workload_plan{{workload_class{.name = "a", .queue = -1}}}, 4},
        {workload_plan{{workload_class{.name = "a", .queue_wait = -1ms}}}, 4},
        {workload_plan{{workload_class{.name = "a b"}}}, 4},
        {workload_plan{{workload_class{.name = "a"}, workload_class{.name = "a"}}}, 4},
        {workload_plan{{workload_class{.name = "a", .ceiling = 2, .queue = int_max}}}, 4},
        {workload_plan{{workload_class{.name = "a", .reserved = 2, .adaptive_floor = 1}}}, 4},
        {workload_plan{{workload_class{.name = "a", .ceiling = 3, .adaptive_floor = 4}}}, 4},
    };
    fake_pool pool;
    for (const bad_plan& bad : cases) {
        const std::string by_gate =
            thrown_by([&] { const gate_t gate(pool, {.concurrent = bad.concurrent, .workloads = bad.plan}); });
        const std::string by_describe =
            thrown_by([&] { static_cast<void>(bulkhead::describe_workloads(bad.plan, bad.concurrent)); });
        CAPTURE(by_gate);
        CHECK(by_gate != "accepted");
        CHECK(by_describe == by_gate);
    }
    // A B below 1 is refused by both, as std::invalid_argument, but the gate
    // checks B before its plan, in its own words.
    for (const int concurrent : {0, -1, int_min}) {
        const workload_plan plan{{workload_class{.name = "a"}}};
        const std::string by_gate =
            thrown_by([&] { const gate_t gate(pool, {.concurrent = concurrent, .workloads = plan}); });
        const std::string by_describe =
            thrown_by([&] { static_cast<void>(bulkhead::describe_workloads(plan, concurrent)); });
        CAPTURE(by_gate, by_describe);
        CHECK(by_gate.starts_with("St16invalid_argument: "));
        CHECK(by_describe.starts_with("St16invalid_argument: "));
        CHECK_THAT(by_gate, Catch::Matchers::ContainsSubstring("concurrent (B) must be at least 1"));
        CHECK_THAT(by_describe, Catch::Matchers::ContainsSubstring("concurrent (B) must be at least 1"));
    }
}
