// bulkhead: where a call was made, for the pool's leak reports
// (pqxx_pool_options::leak_threshold). Taken for free: the file, line and
// function of the expression that made it, filled in by the compiler, or a
// label the caller gives.
#pragma once

#include <string>

namespace bulkhead {

/// Where a lease was taken: a caller's label, or the file, line and function
/// of the call. Made implicitly at the call site: `pool.acquire()` records
/// the line of that call, `pool.acquire(deadline, {}, "nightly rollup")` the
/// label; a gate's options record the line where they were initialized
/// (`gate.transaction({.queue_wait = 20ms}, work)`), or `.site = "label"`.
/// The compiler's __builtin_LINE() and kin fill it in, as
/// std::source_location::current() would; they also serve where the
/// standard library's std::source_location does not (libstdc++ 12 with a
/// clang older than 15).
struct call_site {
    // NOLINTNEXTLINE(google-explicit-constructor): made at the call site on purpose
    call_site(unsigned at_line = __builtin_LINE(), const char* in_file = __builtin_FILE(),
              const char* in_function = __builtin_FUNCTION()) noexcept
        : file(in_file), line(at_line), function(in_function) {}
    // NOLINTNEXTLINE(google-explicit-constructor): a label in place of a call_site
    call_site(const char* name, unsigned at_line = __builtin_LINE(), const char* in_file = __builtin_FILE(),
              const char* in_function = __builtin_FUNCTION()) noexcept
        : label(name), file(in_file), line(at_line), function(in_function) {}

    const char* label = nullptr;  ///< the caller's, a string that outlives the call; null: none
    const char* file;             ///< the call's source file
    unsigned line;                ///< and line
    const char* function;         ///< and function

    /// The label, or "file:line (function)".
    [[nodiscard]] std::string describe() const {
        if (label != nullptr) {
            return label;
        }
        return std::string(file) + ":" + std::to_string(line) + " (" + function + ")";
    }
};

}  // namespace bulkhead
