// A program that returns from main while a connection attempt it gave up on
// is still running, for the [E2] exit test in edges_test.cpp. Its "server"
// is a socket that listens and never accepts: the kernel completes the TCP
// handshake, libpq sends its first packet and waits for an answer that never
// comes, until its connect timeout (2 s, the pool's). Prints what the call
// got, then, from an exit handler registered before the pool's own (so it
// runs after it), how many of the library's detached threads were still
// running. Exits 0; anything else it prints is a failure.
#include <bulkhead/pqxx_pool.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

void report_threads() {
    std::printf("running at exit: %zu\n", bulkhead::detail::detached_threads::running());
    (void)std::fflush(stdout);
}

/// A listening socket on 127.0.0.1 that nobody accepts on; its port, or 0.
int silent_listener() {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) {
        return 0;
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    // NOLINTBEGIN(cppcoreguidelines-pro-type-reinterpret-cast): the sockets API
    if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(listener, 8) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
        return 0;
    }
    // NOLINTEND(cppcoreguidelines-pro-type-reinterpret-cast)
    return ntohs(address.sin_port);  // the socket stays open until the process ends
}

}  // namespace

int main() {
    if (std::atexit(report_threads) != 0) {
        std::puts("atexit failed");
        return 1;
    }
    const int port = silent_listener();
    if (port == 0) {
        std::puts("no listening socket");
        return 1;
    }
    try {
        bulkhead::pqxx_pool_options options;
        options.conninfo = "host=127.0.0.1 port=" + std::to_string(port) + " dbname=probe user=probe";
        options.connection_timeout = std::chrono::milliseconds(250);
        bulkhead::pqxx_pool pool(options);
        auto lease = pool.acquire(std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
        std::puts("acquire: a connection");
    } catch (const bulkhead::pool_timeout&) {
        std::puts("acquire: pool_timeout");
    } catch (const std::exception& failure) {
        std::printf("acquire: %s\n", failure.what());
    }
    return 0;
}
