// bulkhead: the core, in one include.
//
// Everything but the libpqxx pool: the FIFO semaphore, the admission counter,
// the error family, db_bulkhead<Pool>, its workload classes and their text
// format. Needs nothing but a C++20 compiler
// and the standard library. For the libpqxx-backed pool include
// <bulkhead/pqxx_pool.hpp> as well.
#pragma once

#include <bulkhead/admission_counter.hpp>
#include <bulkhead/db_bulkhead.hpp>
#include <bulkhead/error.hpp>
#include <bulkhead/fifo_semaphore.hpp>
#include <bulkhead/result.hpp>
#include <bulkhead/settings_config.hpp>
#include <bulkhead/version.hpp>
#include <bulkhead/workload.hpp>
#include <bulkhead/workload_config.hpp>
