// The deferred BEGIN's parameters written as literals (pqxx/sql_literals.hpp):
// where a $n is a parameter, and what is refused.
#include <bulkhead/pqxx/sql_literals.hpp>

#include "catch.hpp"

#include <stdexcept>
#include <string>
#include <vector>

using bulkhead::detail::bind_literals;

namespace {
std::string bound(const std::string& sql, const std::vector<std::string>& literals, bool standard = true) {
    return bind_literals(sql, literals, standard);
}
}  // namespace

TEST_CASE("bind_literals writes each $n as its literal, and only where the server sees a parameter", "[J3]") {
    const std::vector<std::string> two = {"'a''b'", "42"};
    CHECK(bound("SELECT $1, $2::int, $1", two) == "SELECT 'a''b', 42::int, 'a''b'");
    CHECK(bound("SELECT $2+$1", two) == "SELECT 42+'a''b'");
    SECTION("not inside strings, quoted names, dollar quotes or comments") {
        CHECK(bound("SELECT '$1', $1, $2", two) == "SELECT '$1', 'a''b', 42");
        CHECK(bound("SELECT 'it''s $1', $1, $2", two) == "SELECT 'it''s $1', 'a''b', 42");
        CHECK(bound("SELECT E'\\' $1', $1, $2", two) == "SELECT E'\\' $1', 'a''b', 42");
        CHECK(bound("SELECT \"$1\", \"a\"\"$1\", $1, $2", two) == "SELECT \"$1\", \"a\"\"$1\", 'a''b', 42");
        CHECK(bound("SELECT $$ $1 $$, $q$ $1 $q$, $1, $2", two) == "SELECT $$ $1 $$, $q$ $1 $q$, 'a''b', 42");
        CHECK(bound("SELECT $1 -- $2\n, $2", two) == "SELECT 'a''b' -- $2\n, 42");
        CHECK(bound("SELECT /* $1 /* nested $1 */ $1 */ $1, $2", two) ==
              "SELECT /* $1 /* nested $1 */ $1 */ 'a''b', 42");
        CHECK(bound("SELECT U&'$1', B'1', X'1F', $1, $2", two) == "SELECT U&'$1', B'1', X'1F', 'a''b', 42");
    }
    SECTION("not inside a name or a number: $ continues them") {
        CHECK(bound("SELECT a$1, x1$2 FROM t$1 WHERE $1 = $2", two) == "SELECT a$1, x1$2 FROM t$1 WHERE 'a''b' = 42");
    }
    SECTION("with standard_conforming_strings off, a backslash escapes in '...' too") {
        CHECK(bound("SELECT '\\' $1', $1, $2", two, false) == "SELECT '\\' $1', 'a''b', 42");
    }
    SECTION("a trailing semicolon and comment are one statement") {
        CHECK(bound("SELECT $1, $2; -- done\n", two) == "SELECT 'a''b', 42; -- done\n");
        CHECK(bound("SELECT 1", {}) == "SELECT 1");
    }
}

TEST_CASE("bind_literals refuses what a bound statement would not run, naming it", "[J3]") {
    const std::vector<std::string> one = {"1"};
    CHECK_THROWS_WITH(bind_literals("SELECT $1; DELETE FROM t", one, true),
                      Catch::Matchers::ContainsSubstring("must be one statement"));
    CHECK_THROWS_WITH(bind_literals("SELECT $2", one, true),
                      Catch::Matchers::ContainsSubstring("refers to parameter $2, but 1 were given"));
    CHECK_THROWS_WITH(bind_literals("SELECT $0", one, true),
                      Catch::Matchers::ContainsSubstring("refers to parameter $0"));
    CHECK_THROWS_WITH(bind_literals("SELECT $99999999999999999999", one, true),
                      Catch::Matchers::ContainsSubstring("refers to parameter $99999999999999999999"));
    CHECK_THROWS_WITH(bind_literals("SELECT 1", one, true),
                      Catch::Matchers::ContainsSubstring("parameter $1 was given but the statement never refers"));
    CHECK_THROWS_WITH(bind_literals("SELECT '$1", one, true),
                      Catch::Matchers::ContainsSubstring("a string constant that never closes"));
    CHECK_THROWS_WITH(bind_literals("SELECT \"$1", one, true),
                      Catch::Matchers::ContainsSubstring("a quoted identifier that never closes"));
    CHECK_THROWS_WITH(bind_literals("SELECT $x$ $1", one, true),
                      Catch::Matchers::ContainsSubstring("a dollar-quoted string that never closes"));
}
