// Contract I1, the rule alone: which answers a lost COMMIT's lookup may
// believe (include/bulkhead/pqxx/commit_origin.hpp). The [pg] tests in
// tests/pg/failover_test.cpp show it on real servers.
#include <bulkhead/pqxx/commit_origin.hpp>

#include "catch.hpp"

#include <string>

using bulkhead::detail::other_place;
using bulkhead::detail::server_place;

namespace {

/// A primary of cluster 7001, started at 1,000,000,000 s, on timeline 1.
server_place origin_primary() {
    server_place place;
    place.system_identifier = "7001";
    place.started_us = 1'000'000'000'000'000;
    place.timeline = 1;
    return place;
}

}  // namespace

TEST_CASE("[I1] only the server instance and timeline a transaction ran on may settle its lost COMMIT", "[I1]") {
    const server_place ran = origin_primary();

    SECTION("the same server, not restarted, out of recovery: believed") { CHECK(other_place(ran, ran).empty()); }
    SECTION("a promoted standby: same cluster, a new timeline and start") {
        server_place promoted = ran;
        promoted.timeline = 2;
        promoted.started_us += 5'000'000;
        CHECK_THAT(other_place(ran, promoted), Catch::Matchers::ContainsSubstring("timeline 1 -> 2"));
    }
    SECTION("the same server after a restart (a crash may have lost the transaction and reused its id)") {
        server_place restarted = ran;
        restarted.started_us += 1;
        const std::string why = other_place(ran, restarted);
        CHECK_THAT(why, Catch::Matchers::ContainsSubstring("has restarted since the transaction ran"));
        CHECK_THAT(why, Catch::Matchers::ContainsSubstring("2001-09-09 01:46:40.000000 UTC"));
        CHECK_THAT(why, Catch::Matchers::ContainsSubstring("2001-09-09 01:46:40.000001 UTC"));
    }
    SECTION("another cluster, whatever its timeline and start") {
        server_place other = ran;
        other.system_identifier = "9002";
        CHECK_THAT(other_place(ran, other), Catch::Matchers::ContainsSubstring(
                                                "another cluster: system identifier 9002, the transaction's 7001"));
    }
    SECTION("a standby in recovery, even of the same cluster and timeline") {
        server_place standby = ran;
        standby.in_recovery = true;
        standby.timeline = 0;  // not asked during recovery
        CHECK_THAT(other_place(ran, standby), Catch::Matchers::ContainsSubstring("a standby in recovery"));
        standby.timeline = 1;
        CHECK_FALSE(other_place(ran, standby).empty());
    }
    SECTION("a server that cannot say which it is") {
        CHECK_THAT(other_place(ran, server_place{}),
                   Catch::Matchers::ContainsSubstring("could not say which server and timeline"));
        server_place no_identifier = ran;
        no_identifier.system_identifier.clear();
        CHECK_FALSE(other_place(ran, no_identifier).empty());
    }
    SECTION("a connection that never learned where it was, or opened on a standby") {
        CHECK_THAT(other_place(server_place{}, ran), Catch::Matchers::ContainsSubstring("was not learned"));
        server_place opened_on_standby = ran;
        opened_on_standby.in_recovery = true;
        opened_on_standby.timeline = 0;
        CHECK_THAT(other_place(opened_on_standby, ran),
                   Catch::Matchers::ContainsSubstring("opened on a standby in recovery"));
    }
}

TEST_CASE("[I1] the parts of a server's place are read strictly", "[I1]") {
    using bulkhead::detail::walfile_timeline;
    using bulkhead::detail::whole_integer;
    CHECK(walfile_timeline("000000010000000000000003") == 1U);
    CHECK(walfile_timeline("0000000A0000000000000003") == 10U);
    CHECK(walfile_timeline("FFFFFFFF0000000000000003") == 0xFFFFFFFFU);
    CHECK_FALSE(walfile_timeline("000000000000000000000003"));  // timelines start at 1
    CHECK_FALSE(walfile_timeline("0000000a0000000000000003"));  // the server writes upper case
    CHECK_FALSE(walfile_timeline("00000001"));
    CHECK_FALSE(walfile_timeline(""));
    CHECK(whole_integer("1796538692313880") == 1796538692313880);
    CHECK_FALSE(whole_integer("-5"));
    CHECK_FALSE(whole_integer("12a"));
    CHECK_FALSE(whole_integer(""));
    CHECK_FALSE(whole_integer("1234567890123456789"));  // past what it reads
}
