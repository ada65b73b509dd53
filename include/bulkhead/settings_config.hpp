// bulkhead: a gate's settings as text, for configuration files and the
// environment (K7), in the syntax of workload plans (workload_config.hpp).
//
// The format: key=value pairs, separated by spaces, tabs, line ends or ';',
// each key at most once; a '#' comments to the end of its line:
//
//   concurrent=16 extra_slots=32        # B and Q
//   adaptive_floor=2 adaptive_interval=250ms
//
// A value is a word (no space, ';', '#' or quote), or text in single quotes,
// where '' stands for one quote: application_name='orders api'. The gate's
// keys, each defaulting to gate_settings' own default:
//
//   concurrent       B: a whole number
//   extra_slots      Q: a whole number
//   adaptive_floor, adaptive_min_samples                     whole numbers
//   adaptive_interval                                        a duration: 250ms
//   adaptive_tolerance, adaptive_headroom, adaptive_error_rate,
//   adaptive_queue_allowance                                 decimals: 1.5
//
// Any adaptive_ key makes the limit adaptive (adaptive_options, its other
// fields at their defaults). Durations are a whole number and a unit (ns us
// ms s min); numbers are decimal. Workload classes come from their own text
// (workloads_from_env); the pool's settings from pqxx/pool_config.hpp.
//
// Guarantees: the readers accept only what they document; anything else is
// a std::invalid_argument naming the line and the key, quoting at most 16
// characters of a value (the pool's conninfo never). A value out of range
// for the gate (B below 1, say) is the gate's to refuse, as from code. They
// read the text once, in linear time, and stop at the first error.
// Thread safety: pure functions, but for gate_settings_from_env(), which
// reads the environment: call it while no other thread changes it.
#pragma once

#include <bulkhead/adaptive_limit.hpp>
#include <bulkhead/detail/gate_core.hpp>
#include <bulkhead/workload_config.hpp>

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace bulkhead {

namespace detail {

[[nodiscard]] constexpr bool settings_key_char(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

[[nodiscard]] inline bool settings_separator(char c) noexcept {
    return config_space(c) || c == ';' || c == '\n' || c == '#';
}

/// Reads `text` as key=value pairs (see the file comment), calling
/// on_pair(key, value, place) for each; `place` names what is read for the
/// error messages. Refuses a malformed pair and a key given twice;
/// on_pair refuses unknown keys and bad values.
template <class OnPair>
void read_settings(std::string_view text, config_place place, OnPair&& on_pair) {
    std::vector<std::string_view> seen;
    std::size_t at = 0;
    while (at < text.size()) {
        const char c = text[at];
        if (c == '\n') {
            ++place.line;
            ++at;
            continue;
        }
        if (config_space(c) || c == ';') {
            ++at;
            continue;
        }
        if (c == '#') {
            while (at < text.size() && text[at] != '\n') {
                ++at;
            }
            continue;
        }
        const std::size_t key_start = at;
        while (at < text.size() && settings_key_char(text[at])) {
            ++at;
        }
        const std::string_view key = text.substr(key_start, at - key_start);
        if (key.empty()) {
            refuse_config(place, {"expected a key=value pair, found ", config_excerpt(text.substr(at, 1), 1)});
        }
        if (at >= text.size() || text[at] != '=') {
            refuse_config(place, {config_excerpt(key, config_value_excerpt), " has no '=' right after it: write ",
                                  config_excerpt(key, config_value_excerpt), "=value, with no space around the '='"});
        }
        ++at;
        std::string value;
        if (at < text.size() && text[at] == '\'') {
            bool closed = false;
            for (++at; at < text.size();) {
                if (text[at] == '\'') {
                    if (at + 1 < text.size() && text[at + 1] == '\'') {
                        value += '\'';
                        at += 2;
                        continue;
                    }
                    closed = true;
                    ++at;
                    break;
                }
                if (text[at] == '\n') {
                    ++place.line;
                }
                value += text[at++];
            }
            if (!closed) {
                refuse_config(place, {"the quoted value of ", key, " has no closing quote"});
            }
        } else {
            const std::size_t value_start = at;
            while (at < text.size() && !settings_separator(text[at])) {
                if (text[at] == '\'') {
                    refuse_config(place, {"the value of ", key, " has a quote inside it: quote the whole value"});
                }
                ++at;
            }
            value = text.substr(value_start, at - value_start);
            if (value.empty()) {
                refuse_config(place, {key, " has no value after its '='"});
            }
        }
        if (at < text.size() && !settings_separator(text[at])) {
            refuse_config(place, {"the value of ", key, " must be followed by a space, ';' or a line end"});
        }
        for (const std::string_view earlier : seen) {
            if (earlier == key) {
                refuse_config(place, {key, " is given twice"});
            }
        }
        seen.push_back(key);
        on_pair(key, std::string_view(value), place);
    }
}

/// Refuses `key` as unknown, listing the `known` ones.
[[noreturn]] inline void refuse_unknown_setting(std::string_view key, std::string_view known,
                                                const config_place& place) {
    refuse_config(place, {"unknown key ", config_excerpt(key, config_value_excerpt), " (known: ", known, ")"});
}

/// `value` of `key` as a decimal number: digits, and a '.' and digits
/// (1.5; no sign, no exponent; at most 15 digits in all). Read as the whole
/// digits over a power of ten, one correctly rounded division, so 1.1 reads
/// as the double nearest 1.1 (libc++ 19 has no from_chars for double).
[[nodiscard]] inline double parse_config_decimal(std::string_view value, std::string_view key,
                                                 const config_place& place) {
    std::int64_t digits = 0;
    std::int64_t scale = 1;
    int count = 0;
    bool point = false;
    bool valid = !value.empty() && is_digit(value.front()) && is_digit(value.back());
    for (std::size_t at = 0; valid && at < value.size(); ++at) {
        if (value[at] == '.' && !point) {
            point = true;
        } else if (is_digit(value[at]) && ++count <= 15) {
            digits = digits * 10 + (value[at] - '0');
            scale *= point ? 10 : 1;
        } else {
            valid = false;
        }
    }
    if (!valid) {
        refuse_config(place, {key, " ", config_excerpt(value, config_value_excerpt),
                              " is not a decimal number: write one as in ", key, "=1.5 (at most 15 digits)"});
    }
    return static_cast<double>(digits) / static_cast<double>(scale);
}

/// `value` of `key` as whole milliseconds (a whole number and a unit).
[[nodiscard]] inline std::chrono::milliseconds parse_config_milliseconds(std::string_view value, std::string_view key,
                                                                         const config_place& place) {
    const std::chrono::nanoseconds parsed = parse_config_duration(value, place, key, false);
    if (parsed % std::chrono::milliseconds(1) != std::chrono::nanoseconds::zero()) {
        refuse_config(
            place, {key, " ", config_excerpt(value, config_value_excerpt), " is not a whole number of milliseconds"});
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(parsed);
}

/// The value of environment variable `variable`, or nothing when it is unset.
/// \throws std::invalid_argument for an empty or null name (`subject` says whose).
[[nodiscard]] inline const char* config_from_env(const char* variable, std::string_view subject) {
    if (variable == nullptr || *variable == '\0') {
        throw std::invalid_argument("bulkhead " + std::string(subject) + ": reading the environment needs a name");
    }
    // getenv is safe here as long as no thread changes the environment at the
    // same time (the documented precondition).
    return std::getenv(variable);  // NOLINT(concurrency-mt-unsafe): see above
}

/// parse_gate_settings(), with `origin` named in its errors.
[[nodiscard]] inline gate_settings parse_gate_settings_from(std::string_view text, std::string_view origin) {
    gate_settings settings;
    const auto adaptive = [&]() -> adaptive_options& {
        if (!settings.adaptive) {
            settings.adaptive.emplace();
        }
        return *settings.adaptive;
    };
    read_settings(text, config_place{.origin = origin, .line = 1, .name = {}, .subject = "gate settings"},
                  [&](std::string_view key, std::string_view value, const config_place& place) {
                      if (key == "concurrent") {
                          settings.concurrent = parse_config_int(value, key, false, place);
                      } else if (key == "extra_slots") {
                          settings.extra_slots = parse_config_int(value, key, false, place);
                      } else if (key == "adaptive_floor") {
                          adaptive().floor = parse_config_int(value, key, false, place);
                      } else if (key == "adaptive_min_samples") {
                          adaptive().min_samples = parse_config_int(value, key, false, place);
                      } else if (key == "adaptive_interval") {
                          adaptive().interval = parse_config_milliseconds(value, key, place);
                      } else if (key == "adaptive_tolerance") {
                          adaptive().tolerance = parse_config_decimal(value, key, place);
                      } else if (key == "adaptive_headroom") {
                          adaptive().headroom = parse_config_decimal(value, key, place);
                      } else if (key == "adaptive_error_rate") {
                          adaptive().error_rate = parse_config_decimal(value, key, place);
                      } else if (key == "adaptive_queue_allowance") {
                          adaptive().queue_allowance = parse_config_decimal(value, key, place);
                      } else {
                          refuse_unknown_setting(key,
                                                 "concurrent, extra_slots, adaptive_floor, adaptive_interval, "
                                                 "adaptive_tolerance, adaptive_headroom, adaptive_error_rate, "
                                                 "adaptive_min_samples, adaptive_queue_allowance",
                                                 place);
                      }
                  });
    return settings;
}

}  // namespace detail

/// A gate's settings (B, Q, the adaptive limit) from `text`, in the format
/// of the file comment; what it leaves out keeps gate_settings' default.
/// \throws std::invalid_argument naming the line and key of what is wrong.
[[nodiscard]] inline gate_settings parse_gate_settings(std::string_view text) {
    return detail::parse_gate_settings_from(text, {});
}

/// parse_gate_settings() of environment variable `variable`, or nothing
/// when it is unset. Errors name the variable.
/// \throws std::invalid_argument as parse_gate_settings().
[[nodiscard]] inline std::optional<gate_settings> gate_settings_from_env(const char* variable = "BULKHEAD_GATE") {
    const char* const value = detail::config_from_env(variable, "gate settings");
    if (value == nullptr) {
        return std::nullopt;
    }
    return detail::parse_gate_settings_from(value, variable);
}

}  // namespace bulkhead
