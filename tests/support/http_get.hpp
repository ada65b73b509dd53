// A minimal HTTP client for the tests that run the examples' servers
// (tests/pg/examples_test.cpp, tests/pg/http_service_test.cpp).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace bulkhead_test {

/// One HTTP answer: status, head (status line and headers) and body.
struct http_answer {
    int status = 0;
    std::string head;
    std::string body;
};

/// GET `path` from 127.0.0.1:port on a connection of its own (Connection:
/// close, a 10 s receive timeout); nothing when the exchange failed or the
/// answer is not HTTP/1.x. No Catch2 assertions: callable from any thread.
inline std::optional<http_answer> http_get(int port, const std::string& path) {
    const int socket = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (socket < 0) {
        return std::nullopt;
    }
    const timeval limit{10, 0};
    ::setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    std::string raw;
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::connect(socket, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
        ::send(socket, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
        std::array<char, 4096> buffer{};
        for (ssize_t got; (got = ::recv(socket, buffer.data(), buffer.size(), 0)) > 0;) {
            raw.append(buffer.data(), static_cast<std::size_t>(got));
        }
    }
    ::close(socket);
    const auto head_end = raw.find("\r\n\r\n");
    if (!raw.starts_with("HTTP/1.") || raw.size() < 12 || raw[8] != ' ' || head_end == std::string::npos) {
        return std::nullopt;
    }
    http_answer answer;
    answer.status = std::atoi(raw.substr(9, 3).c_str());
    answer.head = raw.substr(0, head_end + 2);
    answer.body = raw.substr(head_end + 4);
    return answer;
}

}  // namespace bulkhead_test
