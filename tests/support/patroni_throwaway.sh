#!/usr/bin/env bash
# patroni_throwaway.sh: a private, disposable Patroni cluster for the [I6]
# tests (tests/pg/patroni_test.cpp, through tests/support/patroni_cluster.hpp).
# One etcd and two PostgreSQL members managed by Patroni, on free loopback
# ports, in STATE_DIR. Nothing here touches a system cluster or service.
#
#   patroni_throwaway.sh start       STATE_DIR         start etcd and both members; wait for a leader
#                                                      that takes writes and a synchronous standby
#   patroni_throwaway.sh stop        STATE_DIR         stop everything and delete STATE_DIR
#   patroni_throwaway.sh leader      STATE_DIR         print the leader's member name (node1, node2)
#   patroni_throwaway.sh wait-leader STATE_DIR [NOT]   wait until a leader (other than NOT) takes writes
#   patroni_throwaway.sh wait-sync   STATE_DIR         wait until a synchronous standby streams (and
#                                                      Patroni has it as such: it may be promoted)
#   patroni_throwaway.sh switchover  STATE_DIR         patronictl switchover to the other member
#   patroni_throwaway.sh kill        STATE_DIR MEMBER  SIGKILL the member's Patroni, postmaster and backends
#   patroni_throwaway.sh freeze      STATE_DIR MEMBER  SIGSTOP the member's Patroni, postmaster and backends
#   patroni_throwaway.sh thaw        STATE_DIR MEMBER  SIGCONT them again
#   patroni_throwaway.sh restart     STATE_DIR MEMBER  start the member's Patroni again (it rejoins)
#   patroni_throwaway.sh logs        STATE_DIR         print the end of every log
#
# After `start`, STATE_DIR holds:
#   conninfo          libpq keyword string naming both members in order:
#                     host=127.0.0.1,127.0.0.1 port=P1,P2 dbname=bulkhead user=bulkhead password=...
#   node1.conninfo, node2.conninfo   the same for one member
#   settings          ttl=, loop_wait=, retry_timeout=, patroni= (its version)
#   etcd/, node1/, node2/   each process's files and logs (etcd.log, patroni.log, log/postgresql.log)
#
# The DCS timings are short so that a lost leader fails over in seconds:
# ttl 8, loop_wait 1, retry_timeout 3 (loop_wait + 2 x retry_timeout <= ttl).
# Patroni 3.1 and later raise a ttl below 20 to 20, so there ttl is 20.
# Patroni talks to etcd's v3 API (etcd3:), except before 3.0.3 (Debian 12
# has 3.0.2), whose etcd3 code renews a lapsed leader key with an
# unconditional put (patroni/patroni#2689): a leader paused past its ttl
# takes the key back from the leader promoted meanwhile, which is then
# demoted and rewound, its acknowledged writes lost. There the v2 API
# (etcd:, compare-and-swap on the key) is used instead.
# Replication is synchronous (synchronous_mode: true): a COMMIT returns only
# once the standby has the transaction, so a failover loses no acknowledged
# write. Settings favour speed over durability (fsync=off).
#
# As root every process runs as the `postgres` user (setpriv, so that the
# recorded PID is Patroni's own); otherwise as the caller. Every wait is
# bounded. The passwords are random and never printed. With
# BULKHEAD_PATRONI_OWNER=PID, `start` leaves a process behind that runs
# `stop` once PID has exited: the cluster goes with the test, however it ends.
set -euo pipefail

readonly program="patroni_throwaway.sh"
# shellcheck disable=SC2034  # read by throwaway_lib.sh (claim_state_dir)
readonly marker_name=".patroni_throwaway"
readonly members=(node1 node2)
readonly start_timeout_s=60
readonly failover_timeout_s=60
readonly stop_timeout_s=15
readonly start_attempts=3

usage() {
    sed -n '7,19s/^#   //p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

# shellcheck source=throwaway_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/throwaway_lib.sh"

# --- running as the processes' user ------------------------------------------

# Replaces this (sub)shell by CMD... run as $run_user with HOME set:
# `(exec_as_run_user patroni cfg) &` leaves Patroni's own PID in $!
# (runuser would stay in between, and SIGKILL Patroni 2 s after a SIGTERM).
exec_as_run_user() {
    if [[ "$run_user" == "$(id -un)" ]]; then
        exec env HOME="$state_dir" "$@"
    fi
    exec setpriv --reuid="$run_user" --regid="$run_user" --init-groups env HOME="$state_dir" "$@"
}

# Patroni's python3 (Debian's /usr/bin/python3 has psycopg2; one earlier on
# PATH may not).
readonly patroni_python=/usr/bin/python3

# --- locating things ---------------------------------------------------------

# The newest PostgreSQL server binaries installed.
find_bindir() {
    local newest="" candidate
    while IFS= read -r candidate; do
        [[ -x "$candidate/bin/postgres" && -x "$candidate/bin/pg_rewind" ]] && newest="$candidate/bin"
    done < <(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort -V)
    [[ -n "$newest" ]] || die "no PostgreSQL server binaries under /usr/lib/postgresql; install: apt-get install postgresql"
    printf '%s\n' "$newest"
}

check_packages() {
    local missing=()
    command -v patroni >/dev/null 2>&1 || missing+=(patroni)
    command -v patronictl >/dev/null 2>&1 || missing+=(patroni)
    command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
    "$patroni_python" -c 'import etcd' 2>/dev/null || missing+=(python3-etcd)
    if ((${#missing[@]} > 0)); then
        die "Patroni's tests need the packages: ${missing[*]}; install them with scripts/install-deps" \
            "(or: apt-get install patroni etcd-server python3-etcd)"
    fi
}

# --- state ---------------------------------------------------------------------

# STATE_DIR/state: key=value lines (etcd_port, etcd_pid, NODE_pg_port,
# NODE_api_port, NODE_pid, bindir, run_user).
state_get() { sed -n "s/^$1=//p" "$state_dir/state" | tail -n 1; }
state_set() { printf '%s=%s\n' "$1" "$2" >>"$state_dir/state"; }

require_state() {
    [[ -f "$state_dir/state" ]] || die "$state_dir has no cluster; run '$program start $state_dir' first"
    run_user=$(state_get run_user)
    bindir=$(state_get bindir)
}

require_member() {
    local member=$1 known
    for known in "${members[@]}"; do
        [[ "$member" == "$known" ]] && return 0
    done
    die "no member named '$member' (members: ${members[*]})"
}

# --- HTTP without curl: Patroni's REST API and etcd's health ---------------------

# The HTTP status of GET 127.0.0.1:PORT/PATH, or 000 when there is no answer
# within 4 s. A frozen Patroni accepts connections into its small backlog
# and says nothing; once the backlog is full the kernel drops the handshake
# and connect() retries for about two minutes: `timeout` bounds the whole
# probe, the connect included.
http_status() {
    local port=$1 path=$2
    # shellcheck disable=SC2016  # expanded by the inner bash
    timeout -k 1 4 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" "$2" >&3
        if IFS= read -r -t 2 line <&3; then
            printf "%s\n" "$line"
            # The rest, so that the server does not write into a closed socket.
            timeout 1 cat <&3 >/dev/null || true
        fi' _ "$port" "$path" 2>/dev/null |
        awk '{ print ($2 ~ /^[0-9][0-9][0-9]$/) ? $2 : "000"; found = 1 } END { if (!found) print "000" }'
}

# The member whose REST API says it is the primary, or nothing; never NOT
# (a member being failed over from: it may be frozen, and asking it costs
# the probe's whole timeout).
current_leader() {
    local not=${1:-} member
    for member in "${members[@]}"; do
        [[ "$member" != "$not" ]] || continue
        if [[ "$(http_status "$(state_get "${member}_api_port")" /primary)" == 200 ]]; then
            printf '%s\n' "$member"
            return 0
        fi
    done
}

# --- the leader's server -------------------------------------------------------

# Runs SQL on MEMBER's server as the superuser, over its Unix socket.
member_psql() {
    local member=$1
    shift
    # Bounded: the member may be frozen.
    as_user "$run_user" env PGCONNECT_TIMEOUT=5 timeout -k 1 15 "$bindir/psql" -X -q -A -t -v ON_ERROR_STOP=1 \
        -h "$state_dir/$member" \
        -p "$(state_get "${member}_pg_port")" -U postgres -d postgres "$@"
}

# True when MEMBER accepts a write transaction now.
member_takes_writes() {
    [[ "$(member_psql "$1" -c 'SELECT NOT pg_is_in_recovery()' 2>/dev/null)" == t ]]
}

# --- logs ----------------------------------------------------------------------

print_logs() {
    local file
    for file in "$state_dir/etcd/etcd.log" "$state_dir"/node*/patroni.log "$state_dir"/node*/log/*.log; do
        [[ -s "$file" ]] || continue
        printf -- '--- last lines of %s:\n' "$file" >&2
        tail -n 25 "$file" | mask_password >&2 || true
    done
}

# A process that exited at once, most likely because its port was taken
# between picking and binding it: exit status 3, and `start` tries again.
fail_early() {
    say "$*"
    print_logs
    logs_printed=1
    exit 3
}

# A free port below the kernel's range for outgoing connections' local
# ports: one in that range may be taken by a connection between the check
# and the bind (seen with etcd). Anywhere in 20000-60000 if the range leaves
# no room below it.
pick_listen_port() {
    local low candidate tries
    low=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true)
    if [[ "$low" =~ ^[0-9]+$ ]] && ((low > 21000)); then
        for ((tries = 0; tries < 100; tries++)); do
            candidate=$((20000 + (RANDOM * 32768 + RANDOM) % (low - 20000)))
            if port_is_free "$candidate"; then
                printf '%s\n' "$candidate"
                return
            fi
        done
    fi
    pick_free_port
}

fail_with_logs() {
    say "error: $*"
    print_logs
    logs_printed=1
    exit 1
}

# --- configuration -------------------------------------------------------------

# True when version $1 is $2 or later.
version_at_least() { [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" == "$2" ]]; }

# DCS timings valid for the installed Patroni, and its API (see the banner).
choose_timings() {
    local version
    version=$(patroni --version 2>/dev/null | awk '{ print $NF }')
    [[ -n "$version" ]] || die "patroni --version printed nothing"
    ttl=8 loop_wait=1 retry_timeout=3 dcs=etcd3
    if version_at_least "$version" 3.1; then
        ttl=20
    fi
    if ! version_at_least "$version" 3.0.3; then
        dcs=etcd
    fi
    {
        printf 'ttl=%s\nloop_wait=%s\nretry_timeout=%s\npatroni=%s\ndcs=%s\n' "$ttl" "$loop_wait" "$retry_timeout" \
            "$version" "$dcs"
    } >"$state_dir/settings"
}

# Writes STATE_DIR/MEMBER/patroni.yml.
write_member_config() {
    local member=$1 dir="$state_dir/$1"
    local pg_port api_port
    pg_port=$(state_get "${member}_pg_port")
    api_port=$(state_get "${member}_api_port")
    (
        umask 077
        cat >"$dir/patroni.yml" <<EOF
# Written by $program.
scope: $scope
namespace: /bulkhead/
name: $member
restapi:
  listen: 127.0.0.1:$api_port
  connect_address: 127.0.0.1:$api_port
$dcs:
  hosts: 127.0.0.1:$(state_get etcd_port)
watchdog:
  mode: off
bootstrap:
  dcs:
    ttl: $ttl
    loop_wait: $loop_wait
    retry_timeout: $retry_timeout
    maximum_lag_on_failover: 1048576
    # COMMIT waits for the synchronous standby: no acknowledged write is
    # lost when the leader is. Not strict: a leader alone still takes writes.
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 100
        wal_log_hints: 'on'
        fsync: 'off'
        full_page_writes: 'on'
  initdb:
    - encoding: UTF8
    - locale: C
    - auth-host: scram-sha-256
    - auth-local: trust
postgresql:
  listen: 127.0.0.1:$pg_port
  connect_address: 127.0.0.1:$pg_port
  data_dir: $dir/data
  bin_dir: $bindir
  pgpass: $dir/pgpass
  use_unix_socket: true
  # A new standby's copy starts with a checkpoint now, not a spread one.
  basebackup:
    - checkpoint: 'fast'
  authentication:
    superuser:
      username: postgres
      password: '$superuser_password'
    replication:
      username: replicator
      password: '$replication_password'
    rewind:
      username: rewinder
      password: '$rewind_password'
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
  parameters:
    unix_socket_directories: '$dir'
    logging_collector: 'on'
    log_directory: '$dir/log'
    log_filename: 'postgresql.log'
    log_line_prefix: '%m [%p] %q%u@%d '
EOF
    )
}

# Starts MEMBER's Patroni in the background and records its PID.
start_member() {
    local member=$1 dir="$state_dir/$1" pid
    (
        cd /
        exec </dev/null >>"$dir/patroni.log" 2>&1
        exec_as_run_user "$patroni_python" /usr/bin/patroni "$dir/patroni.yml"
    ) &
    pid=$!
    state_set "${member}_pid" "$pid"
}

# The PIDs whose parent is PID, from /proc (a minimal system may have no
# ps); no process forked per entry, so that it is quick.
children_of() {
    local parent=$1 stat line fields
    for stat in /proc/[0-9]*/stat; do
        IFS= read -r line 2>/dev/null <"$stat" || continue
        # After the command name in parentheses: state, then the parent's PID.
        read -r -a fields <<<"${line##*) }"
        [[ "${fields[1]:-}" == "$parent" ]] && printf '%s\n' "${line%% *}"
    done
    return 0
}

# The PID of MEMBER's postmaster, if it runs.
postmaster_pid() {
    local pid_file="$state_dir/$1/data/postmaster.pid" postmaster
    [[ -f "$pid_file" ]] || return 0
    postmaster=$(head -n 1 "$pid_file" 2>/dev/null || true)
    if [[ "$postmaster" =~ ^[0-9]+$ ]] && process_alive "$postmaster"; then
        printf '%s\n' "$postmaster"
    fi
    return 0
}

# Sends SIGNAL to MEMBER's Patroni (when it runs), then its postmaster, then
# the postmaster's children. The postmaster is stopped first so that it forks
# no backend between the listing and the signal.
signal_member() {
    local member=$1 signal=$2 patroni_pid postmaster=""
    patroni_pid=$(state_get "${member}_pid")
    [[ -n "$patroni_pid" ]] && process_alive "$patroni_pid" && kill "-$signal" "$patroni_pid" 2>/dev/null
    postmaster=$(postmaster_pid "$member")
    if [[ -n "$postmaster" ]]; then
        kill -STOP "$postmaster" 2>/dev/null || true
        local children
        children=$(children_of "$postmaster")
        # shellcheck disable=SC2086  # one PID a word
        [[ -z "$children" ]] || kill "-$signal" $children 2>/dev/null || true
        [[ "$signal" == STOP ]] || kill "-$signal" "$postmaster" 2>/dev/null || true
    fi
}

# --- subcommands -----------------------------------------------------------------

cmd_start() {
    check_packages
    claim_state_dir
    trap 'status=$?; if ((status != 0)); then ((logs_printed)) || print_logs; cmd_stop; fi' EXIT
    run_user=$(user_for_start "Patroni and PostgreSQL")
    bindir=$(find_bindir)
    chmod 0755 "$state_dir"
    if [[ "$run_user" != "$(id -un)" ]] && ! (cd / && runuser -u "$run_user" -- test -x "$state_dir"); then
        die "user $run_user cannot reach $state_dir: give a directory under /tmp"
    fi
    : >"$state_dir/state"
    state_set run_user "$run_user"
    state_set bindir "$bindir"
    choose_timings
    scope="bulkhead-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    superuser_password=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    replication_password=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    rewind_password=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    local password
    password=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

    # Ports: etcd's client and peer ports, each member's PostgreSQL and REST API.
    local used=" " port member
    for member in etcd etcd_peer "${members[@]/%/_pg}" "${members[@]/%/_api}"; do
        port=$(pick_listen_port)
        while [[ "$used" == *" $port "* ]]; do port=$(pick_listen_port); done
        used+="$port "
        state_set "${member}_port" "$port"
    done

    # etcd, one member; the v2 API only for Patroni's `etcd:` (see the banner).
    local etcd_v2=""
    [[ "$dcs" == etcd3 ]] || etcd_v2=--enable-v2
    mkdir -p "$state_dir/etcd"
    [[ "$run_user" == "$(id -un)" ]] || chown "$run_user": "$state_dir/etcd"
    chmod 0700 "$state_dir/etcd"
    local etcd_port etcd_peer_port
    etcd_port=$(state_get etcd_port)
    etcd_peer_port=$(state_get etcd_peer_port)
    (
        cd /
        exec </dev/null >>"$state_dir/etcd/etcd.log" 2>&1
        exec_as_run_user etcd --name bulkhead --data-dir "$state_dir/etcd/data" \
            --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
            --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
            --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
            --initial-cluster "bulkhead=http://127.0.0.1:$etcd_peer_port" --initial-cluster-state new \
            ${etcd_v2:+"$etcd_v2"}
    ) &
    state_set etcd_pid "$!"
    local deadline=$((SECONDS + start_timeout_s))
    until [[ "$(http_status "$etcd_port" /health)" == 200 ]]; do
        ((SECONDS < deadline)) || fail_with_logs "etcd did not become healthy within ${start_timeout_s}s"
        process_alive "$(state_get etcd_pid)" || fail_early "etcd exited"
        sleep 0.1
    done

    for member in "${members[@]}"; do
        mkdir -p "$state_dir/$member"
        write_member_config "$member"
        [[ "$run_user" == "$(id -un)" ]] || chown -R "$run_user": "$state_dir/$member"
        chmod 0700 "$state_dir/$member"
    done
    # The first member bootstraps the cluster; the second copies it once
    # there is a leader.
    start_member node1
    deadline=$((SECONDS + start_timeout_s))
    until [[ "$(current_leader)" == node1 ]] && member_takes_writes node1; do
        ((SECONDS < deadline)) || fail_with_logs "no leader took writes within ${start_timeout_s}s"
        process_alive "$(state_get node1_pid)" || fail_early "node1's Patroni exited"
        sleep 0.2
    done
    start_member node2
    # The tests' role and database. The password goes through stdin.
    member_psql node1 >/dev/null 2> >(mask_password >&2) <<EOF || fail_with_logs "could not create the role and database"
CREATE ROLE bulkhead LOGIN SUPERUSER PASSWORD '$password';
CREATE DATABASE bulkhead OWNER bulkhead;
EOF
    wait_sync

    (
        umask 077
        local ports="" node_conninfo
        for member in "${members[@]}"; do
            ports+="${ports:+,}$(state_get "${member}_pg_port")"
            node_conninfo="host=127.0.0.1 port=$(state_get "${member}_pg_port") dbname=bulkhead user=bulkhead"
            printf '%s password=%s connect_timeout=5\n' "$node_conninfo" "$password" >"$state_dir/$member.conninfo"
        done
        printf 'host=127.0.0.1,127.0.0.1 port=%s dbname=bulkhead user=bulkhead password=%s\n' "$ports" "$password" \
            >"$state_dir/conninfo"
    )
    start_reaper
    trap - EXIT
    say "Patroni $(state_get_setting patroni) cluster $scope: leader node1, synchronous standby node2 (ttl $ttl s)"
}

state_get_setting() { sed -n "s/^$1=//p" "$state_dir/settings"; }

# Waits until the leader has a synchronous standby that streams, and the
# standby's Patroni knows it is the synchronous one (the /sync key in the
# DCS, which Patroni writes after the standby streams as such): only then
# may it be promoted when the leader is lost.
wait_sync() {
    local deadline=$((SECONDS + start_timeout_s)) leader="" member standby
    for (( ; ; )); do
        leader=$(current_leader)
        if [[ -n "$leader" ]] && [[ "$(member_psql "$leader" -c \
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'" \
            2>/dev/null)" == 1 ]]; then
            for member in "${members[@]}"; do
                [[ "$member" == "$leader" ]] || standby=$member
            done
            [[ "$(http_status "$(state_get "${standby}_api_port")" /sync)" == 200 ]] && return 0
        fi
        ((SECONDS < deadline)) || fail_with_logs "no synchronous standby streamed within ${start_timeout_s}s"
        sleep 0.2
    done
}

cmd_wait_sync() {
    require_state
    wait_sync
}

cmd_leader() {
    require_state
    local leader
    leader=$(current_leader)
    [[ -n "$leader" ]] || die "no member says it is the leader"
    printf '%s\n' "$leader"
}

cmd_wait_leader() {
    local not=$1 leader="" deadline=$((SECONDS + failover_timeout_s))
    require_state
    for (( ; ; )); do
        leader=$(current_leader "$not")
        if [[ -n "$leader" ]] && member_takes_writes "$leader"; then
            printf '%s\n' "$leader"
            return 0
        fi
        ((SECONDS < deadline)) || fail_with_logs "no leader${not:+ other than $not} took writes within ${failover_timeout_s}s"
        sleep 0.1
    done
}

cmd_switchover() {
    require_state
    local leader candidate member
    leader=$(current_leader)
    [[ -n "$leader" ]] || fail_with_logs "no leader to switch over from"
    for member in "${members[@]}"; do
        [[ "$member" == "$leader" ]] || candidate=$member
    done
    as_user "$run_user" env HOME="$state_dir" timeout -k 5 90 "$patroni_python" /usr/bin/patronictl \
        -c "$state_dir/$leader/patroni.yml" switchover --leader "$leader" --candidate "$candidate" --force \
        >"$state_dir/switchover.log" 2>&1 || {
        cat "$state_dir/switchover.log" >&2
        fail_with_logs "patronictl switchover failed"
    }
}

cmd_kill() {
    local member=$1
    require_state
    require_member "$member"
    signal_member "$member" KILL
}

cmd_freeze() {
    local member=$1
    require_state
    require_member "$member"
    signal_member "$member" STOP
}

cmd_thaw() {
    local member=$1
    require_state
    require_member "$member"
    signal_member "$member" CONT
}

cmd_restart() {
    local member=$1 pid
    require_state
    require_member "$member"
    pid=$(state_get "${member}_pid")
    if [[ -n "$pid" ]] && process_alive "$pid"; then
        die "$member's Patroni still runs (PID $pid)"
    fi
    start_member "$member"
}

# Stops PID with SIGTERM, waiting up to stop_timeout_s, then SIGKILL.
stop_process() {
    local pid=$1 deadline=$((SECONDS + stop_timeout_s))
    [[ -n "$pid" ]] && process_alive "$pid" || return 0
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    while process_alive "$pid"; do
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
}

# With BULKHEAD_PATRONI_OWNER set to a PID (the test's), a process in the
# background stops the cluster once that process is gone, however it ended
# (a crash, an abort, a CTest timeout's SIGKILL): no destructor runs then.
start_reaper() {
    local owner=${BULKHEAD_PATRONI_OWNER:-}
    [[ "$owner" =~ ^[0-9]+$ ]] || return 0
    (
        cd /
        exec </dev/null >/dev/null 2>&1
        while kill -0 "$owner" 2>/dev/null; do sleep 1; done
        exec bash "$script_path" stop "$state_dir"
    ) &
    state_set reaper_pid "$!"
}

cmd_stop() {
    [[ -d "$state_dir" ]] || return 0
    if [[ -f "$state_dir/state" ]]; then
        local reaper
        reaper=$(state_get reaper_pid)
        # Not when the reaper itself is stopping the cluster.
        [[ -z "$reaper" || "$reaper" == "$PPID" || "$reaper" == "$$" ]] || kill "$reaper" 2>/dev/null || true
        run_user=$(state_get run_user)
        bindir=$(state_get bindir)
        local member pid
        # A frozen member is thawed first: it must hear the signals.
        for member in "${members[@]}"; do
            signal_member "$member" CONT 2>/dev/null || true
        done
        # Patroni stops its PostgreSQL itself; both at once.
        for member in "${members[@]}"; do
            pid=$(state_get "${member}_pid")
            if [[ -n "$pid" ]] && process_alive "$pid"; then
                kill -TERM "$pid" 2>/dev/null || true
            fi
        done
        for member in "${members[@]}"; do
            stop_process "$(state_get "${member}_pid")"
        done
        # A postmaster that outlived its Patroni (reparented to init): stop it.
        for member in "${members[@]}"; do
            if [[ -n "$(postmaster_pid "$member")" && -n "$bindir" ]]; then
                as_user "$run_user" "$bindir/pg_ctl" stop -D "$state_dir/$member/data" -m immediate -w -t 30 -s \
                    >/dev/null 2>&1 || true
                pid=$(postmaster_pid "$member")
                [[ -z "$pid" ]] || kill -KILL "$pid" 2>/dev/null || true
            fi
        done
        stop_process "$(state_get etcd_pid)"
    fi
    remove_state_dir
}

cmd_logs() {
    require_state
    print_logs
}

main() {
    (($# >= 2)) || usage
    local command=$1
    state_dir=$2
    [[ -n "$state_dir" ]] || usage
    case "$command" in
        start | stop | leader | switchover | logs | wait-sync)
            (($# == 2)) || usage
            ;;
        wait-leader)
            (($# == 2 || $# == 3)) || usage
            ;;
        kill | freeze | thaw | restart)
            (($# == 3)) || usage
            ;;
        *) usage ;;
    esac
    if [[ "$command" != start ]]; then
        [[ -d "$state_dir" ]] || { [[ "$command" == stop ]] && return 0; } || die "$state_dir does not exist"
        state_dir=$(absolute_dir "$state_dir")
    fi
    case "$command" in
        start)
            local attempt status
            for ((attempt = 1; ; attempt++)); do
                status=0
                (cmd_start) || status=$?
                ((status == 3 && attempt < start_attempts)) || return "$status"
                say "starting again ($attempt of $start_attempts attempts failed)"
            done
            ;;
        stop) cmd_stop ;;
        leader) cmd_leader ;;
        wait-leader) cmd_wait_leader "${3:-}" ;;
        wait-sync) cmd_wait_sync ;;
        switchover) cmd_switchover ;;
        kill) cmd_kill "$3" ;;
        freeze) cmd_freeze "$3" ;;
        thaw) cmd_thaw "$3" ;;
        restart) cmd_restart "$3" ;;
        logs) cmd_logs ;;
        *) usage ;;
    esac
}

script_path=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/$(basename "${BASH_SOURCE[0]}")
readonly script_path
state_dir="" run_user="" bindir="" scope="" ttl="" loop_wait="" retry_timeout="" dcs=""
# shellcheck disable=SC2034  # logs_printed: read by cmd_start's EXIT trap
superuser_password="" replication_password="" rewind_password="" logs_printed=0

main "$@"
