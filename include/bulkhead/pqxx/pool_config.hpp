// bulkhead: a pqxx_pool's settings as text, for configuration files and the
// environment (K7), in the syntax of the gate's (settings_config.hpp):
//
//   conninfo='host=db dbname=shop user=app' max_size=24 min_idle=4
//   connection_timeout=500ms keepalive_time=60s application_name=orders
//
// The keys are pqxx_pool_options' fields of those names: conninfo and
// application_name (text, quoted when it holds a space), max_size and
// min_idle (whole numbers), connection_timeout, validation_timeout,
// idle_timeout, max_lifetime, keepalive_time, validate_after_idle,
// deadline_slack and leak_threshold (durations: a whole number of milliseconds and a unit, 0ms
// for "never" where the field allows it), reset_session and
// connection_affinity (true or false), budget_check (off, warn or refuse).
// What the text leaves out keeps the value of `base`. The hooks (on_close,
// on_connect, on_budget_warning, on_leak) and the fleet plan are code's to set.
//
// Guarantees: as settings_config.hpp's, and the conninfo's value is never
// quoted in a message (it may hold a password). Ranges are the pool's to
// check: pqxx_pool's constructor refuses what is out of range, naming the
// field, as for options set in code.
// Thread safety: pure, but for pool_settings_from_env(), which reads the
// environment: call it while no other thread changes it.
#pragma once

#include <bulkhead/pqxx/options.hpp>
#include <bulkhead/settings_config.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace bulkhead {

namespace detail {

/// parse_pool_settings(), with `origin` named in its errors.
[[nodiscard]] inline pqxx_pool_options parse_pool_settings_from(std::string_view text, pqxx_pool_options base,
                                                                std::string_view origin) {
    read_settings(
        text, config_place{.origin = origin, .line = 1, .name = {}, .subject = "pool settings"},
        [&](std::string_view key, std::string_view value, const config_place& place) {
            const auto whole = [&] { return static_cast<std::size_t>(parse_config_int(value, key, false, place)); };
            const auto duration = [&] { return parse_config_milliseconds(value, key, place); };
            const auto flag = [&] {
                if (value != "true" && value != "false") {
                    refuse_config(place,
                                  {key, " ", config_excerpt(value, config_value_excerpt), " is not true or false"});
                }
                return value == "true";
            };
            if (key == "conninfo") {
                base.conninfo = value;  // never quoted back: it may hold a password
            } else if (key == "application_name") {
                base.application_name = value;
            } else if (key == "max_size") {
                base.max_size = whole();
            } else if (key == "min_idle") {
                base.min_idle = whole();
            } else if (key == "connection_timeout") {
                base.connection_timeout = duration();
            } else if (key == "validation_timeout") {
                base.validation_timeout = duration();
            } else if (key == "idle_timeout") {
                base.idle_timeout = duration();
            } else if (key == "max_lifetime") {
                base.max_lifetime = duration();
            } else if (key == "fallback_lifetime") {
                base.fallback_lifetime = duration();
            } else if (key == "keepalive_time") {
                base.keepalive_time = duration();
            } else if (key == "validate_after_idle") {
                base.validate_after_idle = duration();
            } else if (key == "deadline_slack") {
                base.deadline_slack = duration();
            } else if (key == "leak_threshold") {
                base.leak_threshold = duration();
            } else if (key == "reset_session") {
                base.reset_session = flag();
            } else if (key == "connection_affinity") {
                base.connection_affinity = flag();
            } else if (key == "budget_check") {
                if (value == "off") {
                    base.budget_check = budget_check_mode::off;
                } else if (value == "warn") {
                    base.budget_check = budget_check_mode::warn;
                } else if (value == "refuse") {
                    base.budget_check = budget_check_mode::refuse;
                } else {
                    refuse_config(
                        place, {key, " ", config_excerpt(value, config_value_excerpt), " is not off, warn or refuse"});
                }
            } else {
                refuse_unknown_setting(
                    key,
                    "conninfo, application_name, max_size, min_idle, connection_timeout, "
                    "validation_timeout, idle_timeout, max_lifetime, fallback_lifetime, keepalive_time, "
                    "validate_after_idle, deadline_slack, leak_threshold, reset_session, "
                    "connection_affinity, budget_check",
                    place);
            }
        });
    return base;
}

}  // namespace detail

/// A pool's options from `text` (see the file comment), over `base`.
/// \throws std::invalid_argument naming the line and key of what is wrong,
///         never quoting the conninfo.
[[nodiscard]] inline pqxx_pool_options parse_pool_settings(std::string_view text, pqxx_pool_options base = {}) {
    return detail::parse_pool_settings_from(text, std::move(base), {});
}

/// parse_pool_settings() of environment variable `variable` over `base`, or
/// `base` when it is unset. Errors name the variable.
/// \throws std::invalid_argument as parse_pool_settings().
[[nodiscard]] inline pqxx_pool_options pool_settings_from_env(const char* variable = "BULKHEAD_POOL",
                                                              pqxx_pool_options base = {}) {
    const char* const value = detail::config_from_env(variable, "pool settings");
    if (value == nullptr) {
        return base;
    }
    return detail::parse_pool_settings_from(value, std::move(base), variable);
}

}  // namespace bulkhead
