// bulkhead: where a transaction ran, and whether a later answer can speak
// for it.
//
// A COMMIT whose connection is lost is settled by asking a server, on a new
// connection, what became of the transaction's id (pg_xact_status). That
// answer is about the transaction only on the server instance that ran it,
// on the timeline it ran on. Anywhere else the same id names another
// transaction or none: a promoted standby (same system identifier, a new
// timeline) has handed the id out again; a server restored from a backup, or
// restarted after a crash that lost the transaction's WAL, may have too;
// another server behind the same name never knew it. So the pool records
// which server each connection reached when it opened it, and the lookup
// asks the server that answers it the same question first: it believes an
// answer only from the same cluster, the same instance and the same
// timeline, out of recovery.
//
// - The cluster: the system identifier (pg_control_system()), shared by a
//   primary and its physical standbys, different for any other cluster.
// - The instance: its postmaster's start time, to the microsecond
//   (pg_postmaster_start_time()). A restart, a promoted standby and a
//   restored backup each have their own.
// - The timeline: the WAL insert timeline, the first eight hex digits of
//   pg_walfile_name(pg_current_wal_insert_lsn()), asked only out of
//   recovery. A promotion raises it.
// A backend stays on its instance for its life, and an instance out of
// recovery never changes its timeline (only a promotion does, which needs
// recovery), so what a connection saw when it opened holds for every
// transaction on it. A connection opened during recovery (a standby) records
// no timeline: a lost COMMIT on it is not settled.
//
// Guarantees: other_place() is empty only when every part of both places is
// known and equal and the answering server is out of recovery; anything
// unknown counts as different, and the reason says which part.
// Thread safety: free functions and plain values.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

namespace bulkhead::detail {

/// Which server a connection reached: where its transactions run, or where
/// a lookup's answer comes from.
struct server_place {
    /// pg_control_system()'s system_identifier, as text; empty when not
    /// known.
    std::string system_identifier;
    /// pg_postmaster_start_time() in microseconds since the Unix epoch; 0
    /// when not known.
    std::int64_t started_us = 0;
    /// The WAL insert timeline; 0 when not known (always in recovery).
    std::uint32_t timeline = 0;
    /// The server was in recovery (a standby) when it answered.
    bool in_recovery = false;

    /// Every part known, out of recovery.
    [[nodiscard]] bool known() const noexcept {
        return !system_identifier.empty() && started_us > 0 && timeline > 0 && !in_recovery;
    }
};

/// The timeline in a WAL file name ("000000020000000000000003": 2), or
/// nothing when `walfile` is not one.
[[nodiscard]] inline std::optional<std::uint32_t> walfile_timeline(std::string_view walfile) noexcept {
    if (walfile.size() != 24) {
        return std::nullopt;
    }
    std::uint32_t timeline = 0;
    for (const char digit : walfile.substr(0, 8)) {
        std::uint32_t value = 0;
        if (digit >= '0' && digit <= '9') {
            value = static_cast<std::uint32_t>(digit - '0');
        } else if (digit >= 'A' && digit <= 'F') {
            value = static_cast<std::uint32_t>(digit - 'A' + 10);
        } else {
            return std::nullopt;
        }
        timeline = timeline * 16 + value;
    }
    return timeline > 0 ? std::optional<std::uint32_t>(timeline) : std::nullopt;
}

/// A decimal integer that is the whole of `text`, or nothing.
[[nodiscard]] inline std::optional<std::int64_t> whole_integer(std::string_view text) noexcept {
    if (text.empty() || text.size() > 18) {
        return std::nullopt;
    }
    std::int64_t value = 0;
    for (const char digit : text) {
        if (digit < '0' || digit > '9') {
            return std::nullopt;
        }
        value = value * 10 + (digit - '0');
    }
    return value;
}

/// `microseconds` since the Unix epoch as UTC text, "2026-12-06
/// 07:01:02.123456 UTC".
[[nodiscard]] inline std::string utc_text(std::int64_t microseconds) {
    const auto seconds = static_cast<std::time_t>(microseconds / 1000000);
    std::tm parts{};
    if (gmtime_r(&seconds, &parts) == nullptr) {
        return std::to_string(microseconds) + " us";
    }
    std::string text(32, '\0');
    const std::size_t length = std::strftime(text.data(), text.size(), "%Y-%m-%d %H:%M:%S", &parts);
    text.resize(length);
    std::string fraction = std::to_string(microseconds % 1000000);
    text.append(".").append(6 - fraction.size(), '0').append(fraction).append(" UTC");
    return text;
}

/// Empty when an answer from `answered` speaks for a transaction that ran
/// at `ran`; otherwise why it does not.
[[nodiscard]] inline std::string other_place(const server_place& ran, const server_place& answered) {
    if (!ran.known()) {
        return ran.in_recovery ? "the connection was opened on a standby in recovery, so which timeline the "
                                 "transaction ran on is not known"
                               : "which server the connection reached was not learned when it opened";
    }
    const std::string timelines =
        "timeline " + std::to_string(ran.timeline) + " -> " +
        (answered.timeline > 0 ? std::to_string(answered.timeline) : std::string("not known"));
    if (answered.in_recovery) {
        return "the server that answered is a standby in recovery, not the primary the transaction ran on (" +
               timelines + ")";
    }
    if (!answered.known()) {
        return "the server that answered could not say which server and timeline it is";
    }
    if (answered.system_identifier != ran.system_identifier) {
        return "the server that answered is another cluster: system identifier " + answered.system_identifier +
               ", the transaction's " + ran.system_identifier;
    }
    if (answered.timeline != ran.timeline) {
        return "the server that answered is not the one the transaction ran on: " + timelines +
               " (a promoted standby or a restored backup, which may have given the transaction's id to another "
               "transaction)";
    }
    if (answered.started_us != ran.started_us) {
        return "the server that answered has restarted since the transaction ran, or is another copy of its "
               "cluster: it started at " +
               utc_text(answered.started_us) + ", the transaction's server at " + utc_text(ran.started_us) +
               " (a crash may have lost the transaction and given its id to another)";
    }
    return {};
}

}  // namespace bulkhead::detail
