// pg_replication.hpp: a replicated cluster of the test's own, for the
// failover tests (contract section I).
//
// `replicated_cluster` is a primary and a streaming standby, each a
// private_cluster (tests/support/pg_throwaway.sh: the standby made with
// pg_basebackup -R, on a port of its own), with the standby's WAL stream
// going through a tcp_proxy of the test's so that the test can partition
// it. It can make replication synchronous, partition the standby (the proxy
// holds every byte both ways), fail over (kill the primary in immediate mode,
// sever the held stream without delivering it, promote the standby, which
// becomes the primary), and add a new standby of whichever server is the
// primary now, so one test can fail over several times.
//
// Time: a standby takes about a second to copy and start, a promotion a
// fraction of one; every wait here is bounded (the script's own 30 s, and
// wait_until_synchronous's bound). Teardown: the destructors stop and
// delete every server they started, the dead ones included, on any exit of
// the test (a failed REQUIRE unwinds through them).
//
// Not thread-safe: use it from the test's thread.
#pragma once

#include "pg_test_database.hpp"
#include "pqxx_compat.hpp"
#include "tcp_proxy.hpp"

#include "catch.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace bulkhead_test {

class replicated_cluster {
public:
    /// A new primary and a standby streaming from it through the proxy
    /// (asynchronously until make_synchronous()).
    /// \throws Catch2's test failure (FAIL) when a server cannot be started.
    replicated_cluster() : m_primary(std::make_unique<private_cluster>()) { add_standby(); }

    replicated_cluster(const replicated_cluster&) = delete;
    replicated_cluster& operator=(const replicated_cluster&) = delete;
    ~replicated_cluster() = default;

    /// The server that takes writes now.
    [[nodiscard]] private_cluster& primary() noexcept { return *m_primary; }
    /// The standby, if there is one (after fail_over() there is none until
    /// add_standby()).
    [[nodiscard]] private_cluster* standby() noexcept { return m_standby.get(); }

    /// A new standby of the primary, streaming through a new proxy.
    /// \throws std::logic_error when there is one already.
    void add_standby() {
        if (m_standby) {
            throw std::logic_error("replicated_cluster::add_standby: there is a standby already");
        }
        m_stream = std::make_unique<tcp_proxy>("127.0.0.1", m_primary->port());
        m_standby = std::make_unique<private_cluster>(*m_primary, m_stream->port());
    }

    /// COMMIT on the primary waits until the standby has flushed it
    /// (synchronous_standby_names = '*', synchronous_commit = on), from the
    /// next session on; returns once the standby streams as the synchronous
    /// one, a new session sees the settings, and the standby has replayed
    /// all the primary wrote before (wait_until_replayed).
    /// \throws Catch2's test failure (FAIL) when that does not happen in 30 s.
    void make_synchronous() {
        {
            pqxx::connection admin(m_primary->conninfo());
            pqxx::nontransaction tx(admin);
            tx.exec("ALTER SYSTEM SET synchronous_standby_names = '*'");
            tx.exec("ALTER SYSTEM SET synchronous_commit = on");
            tx.exec("SELECT pg_reload_conf()");
        }
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        for (;;) {
            pqxx::connection check(m_primary->conninfo());
            pqxx::nontransaction tx(check);
            const pqxx::row row = exec_one_row(
                tx,
                "SELECT current_setting('synchronous_commit'), "
                "(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync')");
            if (row[0].as<std::string>() == "on" && row[1].as<long>() == 1) {
                break;
            }
            if (std::chrono::steady_clock::now() > give_up) {
                FAIL("the standby did not become synchronous within 30 s");
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls the server's state, orders no threads
        }
        wait_until_replayed();
    }

    /// Returns once the standby has replayed everything the primary has
    /// written so far (its throwaway settings commit asynchronously, so a
    /// commit reaches the standby only once the WAL writer has flushed it).
    /// \throws Catch2's test failure (FAIL) when that takes over 30 s.
    void wait_until_replayed() {
        if (!m_standby) {
            FAIL("replicated_cluster::wait_until_replayed: there is no standby");
        }
        std::string written;
        {
            pqxx::connection primary(m_primary->conninfo());
            pqxx::nontransaction tx(primary);
            written = exec_one_row(tx, "SELECT pg_current_wal_insert_lsn()")[0].as<std::string>();
        }
        pqxx::connection standby(m_standby->conninfo());
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        for (;;) {
            pqxx::nontransaction tx(standby);
            if (exec_one_row(tx, "SELECT pg_last_wal_replay_lsn() >= " + tx.quote(written) + "::pg_lsn")[0]
                    .as<bool>()) {
                return;
            }
            if (std::chrono::steady_clock::now() > give_up) {
                FAIL("the standby did not replay the primary's WAL up to " << written << " within 30 s");
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls the server's state, orders no threads
        }
    }

    /// From now on the standby hears nothing from the primary and the
    /// primary nothing from it: the proxy holds every byte, the connection
    /// stays open (a network that stopped answering).
    void partition() noexcept { m_stream->silence(true); }

    /// The primary dies at once (immediate shutdown, as in a crash), the
    /// standby's stream is cut without delivering what a partition held, and
    /// the standby is promoted: it is the primary from now on, with no
    /// standby. The dead primary's directory is deleted.
    /// \throws Catch2's test failure (FAIL) when there is no standby, or a
    ///         step fails.
    void fail_over() {
        lose_primary();
        promote_standby();
    }

    /// The first half of fail_over(): the primary dies at once and the
    /// standby's stream is cut; the standby is not promoted yet (an outage:
    /// nothing takes writes). Its directory is kept until promote_standby().
    /// \throws Catch2's test failure (FAIL) when there is no standby.
    void lose_primary() {
        if (!m_standby) {
            FAIL("replicated_cluster::lose_primary: there is no standby to promote");
        }
        m_primary->kill_server();
        m_stream->sever();
    }

    /// The second half of fail_over(): the standby is promoted and is the
    /// primary from now on, with no standby; the dead primary's directory
    /// is deleted.
    /// \throws Catch2's test failure (FAIL) when there is no standby.
    void promote_standby() {
        if (!m_standby) {
            FAIL("replicated_cluster::promote_standby: there is no standby to promote");
        }
        m_standby->promote();
        m_primary = std::move(m_standby);
        m_stream.reset();
    }

    /// A conninfo that lists the primary, then the standby (host=H,H
    /// port=P,S), with the suite's database, user and password, then
    /// `extra` (e.g. "target_session_attrs=read-write").
    /// \throws std::logic_error when there is no standby.
    [[nodiscard]] std::string both_hosts(std::string_view extra) const {
        if (!m_standby) {
            throw std::logic_error("replicated_cluster::both_hosts: there is no standby");
        }
        return host_list(m_primary->port(), m_standby->port(), extra);
    }

    /// As both_hosts(), with the standby listed first.
    /// \throws std::logic_error when there is no standby.
    [[nodiscard]] std::string standby_first(std::string_view extra) const {
        if (!m_standby) {
            throw std::logic_error("replicated_cluster::standby_first: there is no standby");
        }
        return host_list(m_standby->port(), m_primary->port(), extra);
    }

private:
    [[nodiscard]] std::string host_list(int first, int second, std::string_view extra) const {
        return m_primary->conninfo() + " host=127.0.0.1,127.0.0.1 port=" + std::to_string(first) + "," +
               std::to_string(second) + " " + std::string(extra);
    }

    // Declared in this order so that the proxy outlives the standby that
    // streams through it, and both go before the primary.
    std::unique_ptr<private_cluster> m_primary;
    std::unique_ptr<tcp_proxy> m_stream;  // the standby's WAL stream passes here
    std::unique_ptr<private_cluster> m_standby;
};

}  // namespace bulkhead_test
