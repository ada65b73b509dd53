#!/usr/bin/env bash
# What making the server assign a transaction id costs a transaction that
# writes nothing, and where that cost goes (docs/deadlines.md, "Commit
# outcomes").
#
#   bench/xid_cost.sh STATE_DIR [SECONDS] [ROUNDS]
#
# STATE_DIR is a server started by tests/support/pg_throwaway.sh (its
# conninfo file and data directory are read; the server must run on this
# machine, since its processes' CPU time is read from /proc). pgbench runs
# two scripts, alternating, ROUNDS times each (default 3), SECONDS each
# (default 5), 4 clients:
#   noid: BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE / SELECT 1 / COMMIT
#   id:   the same with `; SELECT pg_current_xact_id()` in the BEGIN message
#         (what the gate sent before it asked pg_current_xact_id_if_assigned()
#         at COMMIT instead)
# and prints, per script and round: transactions per second, WAL records and
# bytes per transaction (pg_stat_wal), server CPU microseconds per
# transaction (all of the cluster's processes: the postmaster's own and
# reaped children's time, plus its live children's), and what the backends
# were waiting for (pg_stat_activity sampled every 20 ms).
set -euo pipefail

state=${1:?usage: bench/xid_cost.sh STATE_DIR [SECONDS] [ROUNDS]}
seconds=${2:-5}
rounds=${3:-3}
conninfo=$(cat "${state}/conninfo")
data="${state}/data"
bin=/usr/lib/postgresql/15/bin
[[ -x ${bin}/pgbench ]] || bin=$(dirname "$(command -v pgbench)")
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

printf 'BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;\nSELECT 1;\nCOMMIT;\n' >"${work}/noid.sql"
printf 'BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE \\; SELECT pg_current_xact_id();\nSELECT 1;\nCOMMIT;\n' \
    >"${work}/id.sql"

psql_q() { psql "${conninfo}" -XAtq -c "$1"; }

# Clock ticks of the cluster, as "backends walwriter other": the children the
# postmaster reaped (every backend that exited), the WAL writer, and the rest
# (the postmaster and its other live children).
server_ticks() {
    local postmaster pid fields backends walwriter=0 other
    postmaster=$(head -1 "${data}/postmaster.pid")
    read -r -a fields < <(sed 's/.*) //' "/proc/${postmaster}/stat")
    backends=$((fields[13] + fields[14]))
    other=$((fields[11] + fields[12]))
    for pid in $(pgrep -P "${postmaster}"); do
        if read -r -a fields < <(sed 's/.*) //' "/proc/${pid}/stat" 2>/dev/null); then
            if grep -q 'walwriter' "/proc/${pid}/cmdline" 2>/dev/null; then
                walwriter=$((walwriter + fields[11] + fields[12]))
            else
                other=$((other + fields[11] + fields[12]))
            fi
        fi
    done
    echo "${backends} ${walwriter} ${other}"
}

wal() { psql_q "SELECT wal_records || ' ' || wal_bytes FROM pg_stat_wal"; }

hz=$(getconf CLK_TCK)
printf '%-5s %5s %9s %11s %9s %28s  %s\n' script round tps 'WAL rec/tx' 'WAL B/tx' \
    'server CPU us/tx: backends walwriter other' 'waits (samples)'
for ((round = 1; round <= rounds; ++round)); do
    for script in noid id; do
        read -r records_before bytes_before < <(wal)
        read -r backends_before walwriter_before other_before < <(server_ticks)
        # Wait events of the pgbench backends while it runs.
        (end=$((SECONDS + seconds)); while ((SECONDS < end)); do
            psql_q "SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu') FROM pg_stat_activity
                    WHERE application_name = 'pgbench' AND state = 'active'" || true
            sleep 0.02
        done) >"${work}/waits" &
        sampler=$!
        out=$(PGAPPNAME=pgbench "${bin}/pgbench" -n -M simple -c 4 -j 2 -T "${seconds}" -f "${work}/${script}.sql" \
            "${conninfo}" 2>&1)
        wait "${sampler}" || true
        sleep 0.2  # the backends exit and are reaped
        read -r backends_after walwriter_after other_after < <(server_ticks)
        read -r records_after bytes_after < <(wal)
        tx=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"${out}")
        tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"${out}" | tail -1)
        waits=$(sort "${work}/waits" | uniq -c | sort -rn | head -4 | awk '{printf "%s=%s ", $2, $1}')
        awk -v s="${script}" -v r="${round}" -v tps="${tps}" -v tx="${tx}" \
            -v rec=$((records_after - records_before)) -v bytes=$((bytes_after - bytes_before)) \
            -v backends=$((backends_after - backends_before)) -v walwriter=$((walwriter_after - walwriter_before)) \
            -v other=$((other_after - other_before)) -v hz="${hz}" -v waits="${waits}" \
            'BEGIN { us = 1e6 / hz / tx; printf "%-5s %5d %9.0f %11.3f %9.1f %14.1f %9.1f %9.1f  %s\n", s, r, tps,
                     rec / tx, bytes / tx, backends * us, walwriter * us, other * us, waits }'
    done
done
