// A transaction that holds its gate's execution permit on a thread of its
// own until told to go on: for tests that need the gate busy.
#pragma once

#include "fake_pool.hpp"

#include <chrono>
#include <latch>
#include <thread>

namespace bulkhead_test {

/// Runs one transaction on its own thread whose callback holds the permit
/// until go() is called.
template <class Gate>
class blocker {
public:
    explicit blocker(Gate& gate)
        : m_thread([this, &gate] {
              gate.transaction(std::chrono::nanoseconds(0), [this](fake_pool::work&) {
                  m_entered.count_down();
                  m_release.wait();
                  return 0;
              });
          }) {
        m_entered.wait();
    }
    blocker(const blocker&) = delete;
    blocker& operator=(const blocker&) = delete;
    ~blocker() { go(); }

    void go() {
        if (!m_released) {
            m_released = true;
            m_release.count_down();
            m_thread.join();
        }
    }

private:
    std::latch m_entered{1};
    std::latch m_release{1};
    bool m_released = false;
    std::thread m_thread;
};

}  // namespace bulkhead_test
