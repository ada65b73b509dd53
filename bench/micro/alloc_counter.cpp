// The benchmark binary's global operator new and delete: malloc and free, plus
// a per-thread count of allocations, so a benchmark can show that a path
// allocates nothing (bench_support.hpp: thread_probe, report_probe).
//
// The count is a plain thread_local integer: no atomic, no lock, nothing
// shared, so counting costs the measured code (almost) nothing. The array and
// nothrow forms of operator new in libstdc++ call these, so they are counted
// too; sized and array deletes end in these deletes.
#include "bench_support.hpp"

#include <cstdlib>
#include <new>

namespace {

thread_local std::uint64_t t_allocations = 0;  // owned by its thread

void* counted_allocation(std::size_t size) {
    ++t_allocations;
    if (void* memory = std::malloc(size == 0 ? 1 : size)) {
        return memory;
    }
    throw std::bad_alloc();
}

void* counted_aligned_allocation(std::size_t size, std::align_val_t alignment) {
    ++t_allocations;
    const auto align = static_cast<std::size_t>(alignment);
    // aligned_alloc wants a size that is a multiple of the alignment.
    const std::size_t rounded = (std::max<std::size_t>(size, 1) + align - 1) / align * align;
    if (void* memory = std::aligned_alloc(align, rounded)) {
        return memory;
    }
    throw std::bad_alloc();
}

}  // namespace

std::uint64_t bulkhead_bench::allocations_on_this_thread() noexcept { return t_allocations; }

void* operator new(std::size_t size) { return counted_allocation(size); }
void* operator new[](std::size_t size) { return counted_allocation(size); }
void* operator new(std::size_t size, std::align_val_t alignment) { return counted_aligned_allocation(size, alignment); }
void* operator new[](std::size_t size, std::align_val_t alignment) {
    return counted_aligned_allocation(size, alignment);
}

void operator delete(void* memory) noexcept { std::free(memory); }
void operator delete[](void* memory) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t /*size*/) noexcept { std::free(memory); }
void operator delete[](void* memory, std::size_t /*size*/) noexcept { std::free(memory); }
void operator delete(void* memory, std::align_val_t /*alignment*/) noexcept { std::free(memory); }
void operator delete[](void* memory, std::align_val_t /*alignment*/) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t /*size*/, std::align_val_t /*alignment*/) noexcept { std::free(memory); }
void operator delete[](void* memory, std::size_t /*size*/, std::align_val_t /*alignment*/) noexcept {
    std::free(memory);
}
