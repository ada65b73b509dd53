// bulkhead: workload plans as text, for configuration files and the
// environment, and the start-up printout of a gate's budgets (G10).
//
// The format, one class per line or per ';':
//
//   # name         key=value ...            (a '#' comments to the end of the line)
//   interactive    reserved=4 queue=32 priority=10
//   batch          ceiling=6 queue=4 queue_wait=2s
//   reports reserved=1 ceiling=2; audit queue=1
//
// Each class is its name (1-32 characters of A-Z a-z 0-9 _ -, unique) and
// then any of the keys below, each at most once, as key=value with no space
// around the '=' (spaces and tabs separate the pairs). A key left out takes
// workload_class's default:
//
//   reserved    a whole number, at least 0              (default 0)
//   ceiling     a whole number, at least 0; 0 means B   (default 0)
//   queue       a whole number, at least 0              (default 0)
//   queue_wait  a whole number and a unit, ns us ms s min (50ms, 2s, 1min),
//               or none: no cap of the class's own      (default none)
//   priority    a whole number, may be negative         (default 0)
//   adaptive_floor  a whole number, at least 0; 0: a fixed ceiling, from 1
//               the ceiling adapts between it and `ceiling` (default 0)
//
// Blank lines, blank classes (";;") and comments are skipped; a comment runs
// to the end of its line, past any ';'. Keys, units and `none` are lower
// case. The numbers are decimal, without '+' or fractions; only priority
// takes a '-'.
//
// Guarantees:
// - parse_workloads() accepts only what it documents: anything else is a
//   std::invalid_argument whose message gives the line, the class, the key
//   and what is wrong, and quotes at most 40 characters of the text (at most
//   16 of a value, 24 of a name), with anything outside printable ASCII
//   shown as '?'. It reads the text once, in linear time, and stops at the
//   first error; a class beyond max_workloads is one.
// - A plan it returns has valid, unique names, counts and waits that are not
//   negative, and at most max_workloads classes; it is NOT checked against
//   any B: checked_workload_plan() (workload.hpp) does that, as a gate does.
// - parse_workloads(format_workloads(p)) == p for every plan p that
//   parse_workloads can return; format_workloads() refuses any other plan.
// - describe_workloads(plan, B) refuses exactly what a gate of B built with
//   `plan` refuses, with the same exception and message (both call
//   checked_workload_plan()), but for a B below 1, which the gate refuses
//   before it reads the plan, in its own words. Its text reads back through
//   parse_workloads() as checked_workload_plan(plan, B).
//
// Thread safety: every function here is pure but for workloads_from_env(),
// which reads the environment with std::getenv: call it while no other
// thread changes the environment (at start-up, as a rule).
//
// docs/workloads.md has the policy these budgets feed and the printout.
#pragma once

#include <bulkhead/workload.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <vector>

namespace bulkhead {

namespace detail {

/// Up to `limit` characters of `text` for an error message, quoted: any
/// character outside printable ASCII shown as '?', and "..." where cut.
[[nodiscard]] inline std::string config_excerpt(std::string_view text, std::size_t limit) {
    std::string quoted = "\"";
    for (std::size_t i = 0; i < text.size() && i < limit; ++i) {
        const char c = text[i];
        quoted += (c >= ' ' && c <= '~') ? c : '?';
    }
    quoted += '"';
    if (text.size() > limit) {
        quoted += "...";
    }
    return quoted;
}

/// How much of a value or a key an error message quotes.
inline constexpr std::size_t config_value_excerpt = 16;
/// How much of a class name an error message quotes.
inline constexpr std::size_t config_name_excerpt = 24;

/// Where the reader is, for its error messages.
struct config_place {
    std::string_view origin;  // the environment variable, or empty
    std::size_t line = 1;
    std::string_view name;                   // the class being read, or empty before its name
    std::string_view subject = "workloads";  // what is read: workloads, gate settings, pool settings
};

/// Throws std::invalid_argument: "bulkhead SUBJECT[ in VARIABLE]: line N[,
/// class "NAME"]: " and the parts of `what`, appended (not `"..." + string`:
/// g++ 12 -O3 warns of that falsely, GCC bug 105329).
[[noreturn]] inline void refuse_config(const config_place& place, std::initializer_list<std::string_view> what) {
    std::string message = "bulkhead ";
    message += place.subject;
    if (!place.origin.empty()) {
        message += " in ";
        message += place.origin;
    }
    message += ": line ";
    message += std::to_string(place.line);
    if (!place.name.empty()) {
        message += ", class ";
        message += config_excerpt(place.name, config_name_excerpt);
    }
    message += ": ";
    for (const std::string_view part : what) {
        message += part;
    }
    throw std::invalid_argument(message);
}

/// Why `name` cannot name a class after those of `before`, or empty when it can.
[[nodiscard]] inline std::string workload_name_problem(std::string_view name, const workload_plan& before) {
    if (!valid_workload_name(name)) {
        std::string problem = "the name ";
        problem += config_excerpt(name, config_name_excerpt);
        problem += " must be 1-32 characters of A-Z a-z 0-9 _ -";
        return problem;
    }
    for (const workload_class& earlier : before.classes) {
        if (earlier.name == name) {
            std::string problem = "the name ";
            problem += config_excerpt(name, config_name_excerpt);
            problem += " is already used by an earlier class";
            return problem;
        }
    }
    return {};
}

/// The keys of a class, in the order format_workloads() writes them.
inline constexpr std::array<std::string_view, 6> workload_keys{"reserved",   "ceiling",  "queue",
                                                               "queue_wait", "priority", "adaptive_floor"};

/// The queue_wait units, largest first, with their length in nanoseconds.
struct duration_unit {
    std::string_view suffix;
    std::int64_t nanoseconds;
};
inline constexpr std::array<duration_unit, 5> duration_units{{
    {"min", 60'000'000'000},
    {"s", 1'000'000'000},
    {"ms", 1'000'000},
    {"us", 1'000},
    {"ns", 1},
}};

[[nodiscard]] inline bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

/// `value` of `key` as an int: decimal digits, with a leading '-' only when
/// `may_be_negative`.
[[nodiscard]] inline int parse_config_int(std::string_view value, std::string_view key, bool may_be_negative,
                                          const config_place& place) {
    std::string head(key);
    head += ' ';
    head += config_excerpt(value, config_value_excerpt);
    const bool negative = !value.empty() && value.front() == '-';
    const std::string_view digits = negative ? value.substr(1) : value;
    if (digits.empty() || !is_digit(digits.front())) {
        refuse_config(place, {head, " is not a number: write a whole number, as in ", key, "=4"});
    }
    if (negative && !may_be_negative) {
        refuse_config(place, {head, " must not be negative"});
    }
    int parsed = 0;
    const char* const last = value.data() + value.size();
    const auto [end, error] = std::from_chars(value.data(), last, parsed);
    if (error == std::errc::result_out_of_range) {
        std::string what = head + " is out of int range (";
        if (may_be_negative) {
            what += std::to_string(std::numeric_limits<int>::min());
            what += " to ";
        } else {
            what += "at most ";
        }
        what += std::to_string(std::numeric_limits<int>::max());
        what += ')';
        refuse_config(place, {what});
    }
    if (error != std::errc{} || end != last) {
        refuse_config(place, {head, " is not a whole number"});
    }
    return parsed;
}

/// `value` of `key` (queue_wait unless given): a whole number and a unit,
/// or, with `none_allowed`, `none` (nanoseconds::max()).
[[nodiscard]] inline std::chrono::nanoseconds parse_config_duration(std::string_view value, const config_place& place,
                                                                    std::string_view key = "queue_wait",
                                                                    bool none_allowed = true) {
    if (none_allowed && value == "none") {
        return std::chrono::nanoseconds::max();
    }
    std::string head(key);
    head += ' ';
    head += config_excerpt(value, config_value_excerpt);
    constexpr std::string_view units = "ns, us, ms, s or min";
    if (!value.empty() && value.front() == '-') {
        refuse_config(place, {head, " must not be negative"});
    }
    std::size_t digits = 0;
    while (digits < value.size() && is_digit(value[digits])) {
        ++digits;
    }
    if (digits == 0) {
        refuse_config(place, {head, " is not a duration: write a whole number and a unit (", units, "), as in 50ms",
                              none_allowed ? ", or none" : ""});
    }
    const std::string_view suffix = value.substr(digits);
    if (suffix.empty()) {
        refuse_config(place, {head, " has no unit: add one of ", units, ", as in 50ms"});
    }
    if (suffix.front() == '.' || suffix.front() == ',') {
        refuse_config(place, {head, " is not a whole number: use a smaller unit (1500ms, not 1.5s)"});
    }
    for (const duration_unit& unit : duration_units) {
        if (suffix != unit.suffix) {
            continue;
        }
        std::int64_t count = 0;
        const auto [end, error] = std::from_chars(value.data(), value.data() + digits, count);
        if (error != std::errc{} || end != value.data() + digits ||
            count > std::numeric_limits<std::int64_t>::max() / unit.nanoseconds) {
            refuse_config(place, {head, " is too long: nanoseconds hold about 292 years",
                                  none_allowed ? " (or write none)" : ""});
        }
        return std::chrono::nanoseconds(count * unit.nanoseconds);
    }
    refuse_config(place,
                  {head, " has an unknown unit ", config_excerpt(suffix, config_value_excerpt), ": use ", units});
}

[[nodiscard]] inline bool config_space(char c) noexcept {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/// Reads one class, `text` being its words (no separator, no comment).
[[nodiscard]] inline workload_class parse_workload_class(std::string_view text, const workload_plan& before,
                                                         config_place place) {
    workload_class parsed;
    unsigned seen = 0;  // bit i: workload_keys[i] was given
    bool named = false;
    std::size_t at = 0;
    while (true) {
        while (at < text.size() && config_space(text[at])) {
            ++at;
        }
        if (at == text.size()) {
            return parsed;
        }
        std::size_t end = at;
        while (end < text.size() && !config_space(text[end])) {
            ++end;
        }
        const std::string_view word = text.substr(at, end - at);
        at = end;
        const std::size_t equals = word.find('=');
        if (!named) {
            if (equals != std::string_view::npos) {
                refuse_config(place, {"the class has no name: it starts with ",
                                      config_excerpt(word, config_value_excerpt), "; write NAME key=value ..."});
            }
            const std::string problem = workload_name_problem(word, before);
            if (!problem.empty()) {
                refuse_config(place, {problem});
            }
            parsed.name = std::string(word);
            place.name = parsed.name;
            named = true;
            continue;
        }
        if (equals == std::string_view::npos) {
            refuse_config(place,
                          {config_excerpt(word, config_value_excerpt), " is not key=value (no spaces around the '=')"});
        }
        const std::string_view key = word.substr(0, equals);
        const std::string_view value = word.substr(equals + 1);
        if (key.empty()) {
            refuse_config(place, {config_excerpt(word, config_value_excerpt), " has no key before its '='"});
        }
        std::size_t index = 0;
        while (index < workload_keys.size() && workload_keys[index] != key) {
            ++index;
        }
        if (index == workload_keys.size()) {
            refuse_config(place, {"unknown key ", config_excerpt(key, config_value_excerpt),
                                  ": the keys are reserved, ceiling, queue, queue_wait, priority, adaptive_floor"});
        }
        const unsigned bit = 1U << index;
        if ((seen & bit) != 0) {
            refuse_config(place, {key, " is given twice"});
        }
        seen |= bit;
        if (value.empty()) {
            refuse_config(place, {key, " has no value after its '='"});
        }
        if (key == "reserved") {
            parsed.reserved = parse_config_int(value, key, false, place);
        } else if (key == "ceiling") {
            parsed.ceiling = parse_config_int(value, key, false, place);
        } else if (key == "queue") {
            parsed.queue = parse_config_int(value, key, false, place);
        } else if (key == "queue_wait") {
            parsed.queue_wait = parse_config_duration(value, place);
        } else if (key == "priority") {
            parsed.priority = parse_config_int(value, key, true, place);
        } else {
            parsed.adaptive_floor = parse_config_int(value, key, false, place);
        }
    }
}

/// parse_workloads(), its messages naming `origin` when not empty.
[[nodiscard]] inline workload_plan parse_workloads_from(std::string_view text, std::string_view origin) {
    workload_plan plan;
    config_place place{.origin = origin, .line = 1, .name = {}};
    std::size_t at = 0;
    while (at < text.size()) {
        // One class: up to the next ';' or end of line; a '#' comments out
        // the rest of the line, ';'s included.
        std::size_t end = at;
        while (end < text.size() && text[end] != ';' && text[end] != '\n' && text[end] != '#') {
            ++end;
        }
        const std::string_view words = text.substr(at, end - at);
        if (end < text.size() && text[end] == '#') {
            while (end < text.size() && text[end] != '\n') {
                ++end;
            }
        }
        bool blank = true;
        for (const char c : words) {
            blank = blank && config_space(c);
        }
        if (!blank) {
            if (plan.classes.size() == static_cast<std::size_t>(max_workloads)) {
                refuse_config(place, {"more than ", std::to_string(max_workloads), " classes (max_workloads)"});
            }
            plan.classes.push_back(parse_workload_class(words, plan, place));
        }
        if (end < text.size() && text[end] == '\n') {
            ++place.line;
        }
        at = end + 1;
    }
    return plan;
}

/// queue_wait as format_workloads() writes it: none, or in its largest exact unit.
[[nodiscard]] inline std::string format_queue_wait(std::chrono::nanoseconds wait) {
    if (wait == std::chrono::nanoseconds::max()) {
        return "none";
    }
    if (wait == std::chrono::nanoseconds::zero()) {
        return "0s";
    }
    for (const duration_unit& unit : duration_units) {
        if (wait.count() % unit.nanoseconds == 0) {
            std::string text = std::to_string(wait.count() / unit.nanoseconds);
            text += unit.suffix;
            return text;
        }
    }
    return {};  // not reached: every count is a whole number of ns
}

/// The words of one class's line: its name, then key=value for every key.
[[nodiscard]] inline std::array<std::string, 1 + workload_keys.size()> workload_words(const workload_class& c) {
    std::array<std::string, 1 + workload_keys.size()> words{c.name};
    const std::array<std::string, workload_keys.size()> values{
        std::to_string(c.reserved),      std::to_string(c.ceiling),  std::to_string(c.queue),
        format_queue_wait(c.queue_wait), std::to_string(c.priority), std::to_string(c.adaptive_floor)};
    for (std::size_t i = 0; i < workload_keys.size(); ++i) {
        words.at(i + 1) = workload_keys.at(i);
        words.at(i + 1) += '=';
        words.at(i + 1) += values.at(i);
    }
    return words;
}

}  // namespace detail

/// Reads a plan from the text format described at the top of this header.
/// The plan is not checked against any B (checked_workload_plan() does it,
/// as a gate does); text with no class gives a plan with no class.
/// \throws std::invalid_argument on anything the format does not allow,
///         naming the line, the class, the key and the problem, and quoting
///         at most 40 characters of `text`.
[[nodiscard]] inline workload_plan parse_workloads(std::string_view text) {
    return detail::parse_workloads_from(text, {});
}

/// Reads a plan from the environment variable `variable`, in the format of
/// parse_workloads(). An unset variable, or one that holds no class (empty,
/// blanks, comments only), gives std::nullopt: the program keeps the plan it
/// would have without the variable, as `${VAR:-default}` does in a shell.
/// A set variable is never ignored otherwise: any error is thrown.
/// \throws std::invalid_argument as parse_workloads(), the message naming
///         `variable`; or when `variable` is null or empty.
/// \note Reads the environment with std::getenv: not safe while another
///       thread calls setenv/putenv. Call it at start-up.
[[nodiscard]] inline std::optional<workload_plan> workloads_from_env(const char* variable = "BULKHEAD_WORKLOADS") {
    if (variable == nullptr || *variable == '\0') {
        throw std::invalid_argument("bulkhead workloads: workloads_from_env needs a variable name");
    }
    // getenv is safe here as long as no thread changes the environment at the
    // same time (the documented precondition).
    const char* const value = std::getenv(variable);  // NOLINT(concurrency-mt-unsafe): see above
    if (value == nullptr) {
        return std::nullopt;
    }
    workload_plan plan = detail::parse_workloads_from(value, variable);
    if (plan.classes.empty()) {
        return std::nullopt;
    }
    return plan;
}

/// `plan` in the text format: one line per class, in the plan's order, with
/// every key written (ceiling 0 stays 0; queue_wait none, or in its largest
/// exact unit: 2s, 1500ms, 0s). parse_workloads() reads it back equal.
/// \throws std::invalid_argument for a plan that parse_workloads() could not
///         return (a bad or repeated name, a negative count or wait, more than
///         max_workloads classes), so that what it writes always reads back.
[[nodiscard]] inline std::string format_workloads(const workload_plan& plan) {
    if (plan.classes.size() > static_cast<std::size_t>(max_workloads)) {
        detail::refuse_plan(std::to_string(plan.classes.size()) + " classes; at most " + std::to_string(max_workloads));
    }
    std::string text;
    workload_plan before;
    before.classes.reserve(plan.classes.size());
    for (const workload_class& c : plan.classes) {
        const std::string problem = detail::workload_name_problem(c.name, before);
        if (!problem.empty()) {
            detail::refuse_plan(problem);
        }
        if (c.reserved < 0 || c.ceiling < 0 || c.queue < 0 || c.adaptive_floor < 0 ||
            c.queue_wait < std::chrono::nanoseconds::zero()) {
            std::string negative = "class \"";
            negative += c.name;
            negative += "\": a negative reserved, ceiling, queue, queue_wait or adaptive_floor";
            detail::refuse_plan(negative);
        }
        before.classes.push_back(c);
        bool first = true;
        for (const std::string& word : detail::workload_words(c)) {
            if (!first) {
                text += ' ';
            }
            text += word;
            first = false;
        }
        text += '\n';
    }
    return text;
}

/// The start-up printout of `plan` on a gate of `concurrent` (B) permits: a
/// comment line with B, the reserved permits (their sum and each class's
/// share) and the shared permits (B minus the sum); then one line per class
/// with its effective budget (ceiling 0 resolved to B), aligned, and a
/// comment with its admission slots (ceiling + queue). For example:
///
///   # bulkhead workloads: B = 10 permits, 5 reserved (interactive 4 + reports 1), 5 shared
///   interactive reserved=4 ceiling=10 queue=32 queue_wait=none   priority=10 adaptive_floor=0  # admission slots 42
///   reports     reserved=1 ceiling=2  queue=0  queue_wait=1500ms priority=0  adaptive_floor=0  # admission slots 2
///   batch       reserved=0 ceiling=6  queue=4  queue_wait=2s     priority=0  adaptive_floor=2  # admission slots 10
///
/// Its text reads back through parse_workloads() as
/// checked_workload_plan(plan, concurrent).
/// \throws what checked_workload_plan(plan, concurrent) throws, the message
///         unchanged: what a gate of that B refuses, with the gate's message
///         (a B below 1 too, in other words: the gate checks B first).
[[nodiscard]] inline std::string describe_workloads(const workload_plan& plan, int concurrent) {
    const workload_plan checked = checked_workload_plan(plan, concurrent);
    const int reserved = reserved_permits(checked);
    std::string text = "# bulkhead workloads: B = ";
    text += std::to_string(concurrent);
    text += " permits, ";
    text += std::to_string(reserved);
    text += " reserved";
    std::string shares;
    for (const workload_class& c : checked.classes) {
        if (c.reserved > 0) {
            shares += shares.empty() ? " (" : " + ";
            shares += c.name;
            shares += ' ';
            shares += std::to_string(c.reserved);
        }
    }
    if (!shares.empty()) {
        shares += ')';
    }
    text += shares;
    text += ", ";
    text += std::to_string(concurrent - reserved);
    text += " shared\n";

    using line_words = decltype(detail::workload_words(checked.classes.front()));
    std::vector<line_words> lines;
    lines.reserve(checked.classes.size());
    std::array<std::size_t, std::tuple_size_v<line_words>> widths{};
    for (const workload_class& c : checked.classes) {
        lines.push_back(detail::workload_words(c));
        for (std::size_t i = 0; i < widths.size(); ++i) {
            widths.at(i) = std::max(widths.at(i), lines.back().at(i).size());
        }
    }
    for (std::size_t k = 0; k < lines.size(); ++k) {
        for (std::size_t i = 0; i < widths.size(); ++i) {
            text += lines[k].at(i);
            text.append(widths.at(i) - lines[k].at(i).size() + 1, ' ');
        }
        text += " # admission slots ";
        text += std::to_string(checked.classes[k].ceiling + checked.classes[k].queue);
        text += '\n';
    }
    return text;
}

}  // namespace bulkhead
