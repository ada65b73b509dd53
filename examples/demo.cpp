// The reference demo: pool size 2, B = 1, Q = 0. A first transaction runs
// SELECT 42 on a worker thread and holds its permit until told to go on; a
// second operation is refused at once. Standard output is exactly
//
//   overload=rejected
//   query=42
//   available=1
//
// The connection string comes from DB_URL (a libpq keyword string or URI; a
// "jdbc:" prefix is ignored), with DB_USER and DB_PASSWORD added when set.
// scripts/demo starts a throwaway PostgreSQL and sets DB_URL for you.
#include <bulkhead/bulkhead.hpp>
#include <bulkhead/pqxx_pool.hpp>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>

using namespace std::chrono_literals;

namespace {

std::string env(const char* name) {
    // NOLINTNEXTLINE(concurrency-mt-unsafe): main() reads its settings before it starts any thread
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
}

/// Quotes a value for a libpq keyword string: 'it''s' style, backslash-escaped.
std::string keyword_value(std::string_view value) {
    std::string quoted = "'";
    for (const char c : value) {
        if (c == '\'' || c == '\\') {
            quoted += '\\';
        }
        quoted += c;
    }
    return quoted + "'";
}

/// Percent-encodes a URI userinfo component.
std::string uri_component(std::string_view value) {
    static constexpr std::string_view hex = "0123456789ABCDEF";
    std::string encoded;
    for (const char c : value) {
        const auto byte = static_cast<unsigned char>(c);
        if ((std::isalnum(byte) != 0) || c == '-' || c == '.' || c == '_' || c == '~') {
            encoded += c;
        } else {
            encoded += '%';
            encoded += hex[byte >> 4U];
            encoded += hex[byte & 0xFU];
        }
    }
    return encoded;
}

/// DB_URL plus DB_USER / DB_PASSWORD, as one libpq connection string.
std::string connection_string() {
    std::string url = env("DB_URL");
    if (url.empty()) {
        throw std::invalid_argument("DB_URL is not set (a libpq connection string or postgresql:// URI)");
    }
    if (url.starts_with("jdbc:")) {
        url.erase(0, 5);
    }
    const std::string user = env("DB_USER");
    const std::string password = env("DB_PASSWORD");
    if (user.empty() && password.empty()) {
        return url;
    }
    const bool is_uri = url.starts_with("postgresql://") || url.starts_with("postgres://");
    if (!is_uri) {
        std::string result = url;
        if (!user.empty()) {
            result += " user=" + keyword_value(user);
        }
        if (!password.empty()) {
            result += " password=" + keyword_value(password);
        }
        return result;
    }
    const auto authority = url.find("://") + 3;
    std::string userinfo = uri_component(user);
    if (!password.empty()) {
        userinfo += ":" + uri_component(password);
    }
    return url.insert(authority, userinfo + "@");
}

}  // namespace

int main() {
    try {
        bulkhead::pqxx_pool pool({
            .conninfo = connection_string(),
            .max_size = 2,
            .min_idle = 0,
            .connection_timeout = 500ms,
            .validation_timeout = 250ms,
            .application_name = "bulkhead-demo",
        });
        bulkhead::db_bulkhead gate(pool, /*concurrent=*/1, /*extra_slots=*/0);

        std::promise<void> entered;
        std::promise<void> release;
        auto go_on = release.get_future().share();
        auto first = std::async(std::launch::async, [&] {
            return gate.transaction(0ms, [&](pqxx::dbtransaction& tx) {
                const int value = tx.exec("SELECT 42")[0][0].as<int>();
                entered.set_value();
                if (go_on.wait_for(5s) != std::future_status::ready) {
                    throw std::runtime_error("demo coordination timed out");
                }
                return value;
            });
        });
        auto release_first = [&, released = false]() mutable {
            if (!released) {
                released = true;
                release.set_value();
            }
        };
        try {
            if (entered.get_future().wait_for(5s) != std::future_status::ready) {
                throw std::runtime_error("the first transaction did not start within 5 s");
            }
            auto second =
                std::async(std::launch::async, [&] { return gate.transaction(0ms, [](auto&) { return 0; }); });
            if (second.wait_for(5s) != std::future_status::ready) {
                throw std::runtime_error("the second operation was neither run nor rejected within 5 s");
            }
            try {
                (void)second.get();
                throw std::runtime_error("the second operation was admitted; it must be rejected");
            } catch (const bulkhead::rejected&) {
                std::cout << "overload=rejected\n";
            }
        } catch (...) {
            release_first();
            (void)first.wait_for(5s);
            throw;
        }
        release_first();
        if (first.wait_for(5s) != std::future_status::ready) {
            throw std::runtime_error("the first transaction did not finish within 5 s");
        }
        std::cout << "query=" << first.get() << '\n';
        std::cout << "available=" << gate.available() << '\n';
        return 0;
    } catch (const std::exception& failure) {
        std::cerr << "demo: " << failure.what() << '\n';
        return 1;
    }
}
