// docs/workloads.md's whole program (see snippet_readme.cpp).
#include <bulkhead/workload_config.hpp>

#include <cstdio>
#include <exception>

int main() {
    try {
        const std::optional<bulkhead::workload_plan> plan = bulkhead::workloads_from_env();
        if (!plan) {
            std::puts("BULKHEAD_WORKLOADS is not set: a plain gate");
            return 0;
        }
        std::fputs(bulkhead::describe_workloads(*plan, 10).c_str(), stdout);
    } catch (const std::exception& error) {
        std::fprintf(stderr, "%s\n", error.what());
        return 1;
    }
}
