// Runs a program as a user would, from a test: what it printed on standard
// output and how it ended.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace bulkhead_test {

struct program_result {
    std::string output;  // standard output, whole
    int status = -1;     // as waitpid reports it; -1 when it could not be run
    [[nodiscard]] bool exited_zero() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

/// Runs `program` (a path, quoted here for the shell) with `arguments`
/// (spelled for the shell as they are) and waits for it to end.
inline program_result run_program(const std::string& program, const std::string& arguments = "") {
    program_result result;
    std::string command = "'" + program + "'";
    if (!arguments.empty()) {
        command += " " + arguments;
    }
    std::FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) {
        return result;
    }
    std::array<char, 256> buffer{};
    while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe) != nullptr) {
        result.output += buffer.data();
    }
    result.status = ::pclose(pipe);
    return result;
}

}  // namespace bulkhead_test
