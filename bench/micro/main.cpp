// The micro benchmark driver: Google Benchmark's usual main, plus a few lines
// of context in the report (library versions, whether syscalls and futex wakes
// could be counted, the load when the run started) so a JSON file says what
// produced it.
//
// It starts (and joins) one thread before any benchmark runs. glibc takes a
// shortcut in pthread_mutex_lock/unlock (plain instead of atomic operations)
// while a process has never had a second thread; a server never runs like
// that, and without this line the mutex-based reference would look cheaper
// or dearer depending on whether a threaded benchmark happened to run first.
#include "bench_support.hpp"

#include <bulkhead/version.hpp>

#include <benchmark/benchmark.h>

#include <fstream>
#include <string>
#include <thread>

namespace {

std::string first_line_of(const char* path) {
    std::ifstream file(path);
    std::string line;
    std::getline(file, line);
    return line;
}

}  // namespace

int main(int argc, char** argv) {
    std::thread([] {}).join();  // the process is multi-threaded from here on, as a server is
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
        return 1;
    }
    benchmark::AddCustomContext("bulkhead_version", bulkhead::version_string);
    benchmark::AddCustomContext("compiler", "GCC " __VERSION__);
    benchmark::AddCustomContext("libstdcxx", std::to_string(_GLIBCXX_RELEASE));
    benchmark::AddCustomContext("loadavg_at_start", first_line_of("/proc/loadavg"));
    benchmark::AddCustomContext("tracepoints", bulkhead_bench::thread_probe::tracing_available()
                                                   ? "yes (syscalls/op, wakes/op, multiwakes/op counted)"
                                                   : "no (syscalls/op, wakes/op, multiwakes/op not reported)");
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
