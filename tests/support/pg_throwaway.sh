#!/usr/bin/env bash
# pg_throwaway.sh: a private, disposable PostgreSQL server for the [pg] tests,
# the demo and the benchmarks. Nothing here touches a system cluster.
#
#   pg_throwaway.sh start        STATE_DIR   start a new server (or record BULKHEAD_TEST_DATABASE)
#   pg_throwaway.sh stop         STATE_DIR   stop it and delete STATE_DIR; fine if already stopped
#   pg_throwaway.sh stop-server  STATE_DIR   stop the server, keep its data, port and password
#   pg_throwaway.sh start-server STATE_DIR   start it again on the same port and wait until ready
#   pg_throwaway.sh env          STATE_DIR   print `export BULKHEAD_TEST_DATABASE='...'`
#   pg_throwaway.sh start-standby STATE_DIR PRIMARY_STATE_DIR [UPSTREAM_PORT]
#                                            start a streaming standby of the server in PRIMARY_STATE_DIR
#   pg_throwaway.sh promote      STATE_DIR   promote a standby and wait until it accepts writes
#   pg_throwaway.sh kill-server  STATE_DIR   stop the server at once (immediate mode: a crash), keep its data
#
# A standby is a copy made with `pg_basebackup -R` (same system identifier,
# same bulkhead role and password) on a port of its own, streaming from
# 127.0.0.1:UPSTREAM_PORT (default: the primary's port; a test puts a proxy
# there to partition the standby). It reads the password from a passfile in
# its own directory and starts with synchronous_standby_names empty, so that
# once promoted it does not wait for standbys it does not have.
# After `start`, STATE_DIR holds:
#   conninfo    libpq keyword string: host=127.0.0.1 port=N dbname=bulkhead user=bulkhead password=... connect_timeout=5
#   env         the same as a shell `export` line, and BULKHEAD_PG_SCRIPT (this script)
#   script      the absolute path of this script
#   server.log  the server's log
#   data/       the cluster (owned by `postgres` when run as root)
#   external    present only when BULKHEAD_TEST_DATABASE named the server; then no server is run
#
# As root the server runs as the `postgres` user (runuser); otherwise as the
# caller. The port is a random free one in 20000-60000. The password is random
# and is never printed. Settings favour speed over durability (fsync=off).
set -euo pipefail

readonly program="pg_throwaway.sh"
readonly marker_name=".pg_throwaway"
readonly ready_timeout_s=30
readonly start_attempts=5

usage() {
    sed -n '5,14s/^#   //p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

# shellcheck source=throwaway_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/throwaway_lib.sh"

# --- locating things ---------------------------------------------------------

find_bindir() {
    if [[ -n "${PG_BINDIR:-}" ]]; then
        [[ -x "$PG_BINDIR/postgres" ]] || die "PG_BINDIR=$PG_BINDIR has no postgres binary"
        printf '%s\n' "$PG_BINDIR"
        return
    fi
    local newest="" candidate
    # Newest major version first: sort the directory names as versions.
    while IFS= read -r candidate; do
        if [[ -x "$candidate/bin/postgres" && -x "$candidate/bin/initdb" ]]; then
            newest="$candidate/bin"
        fi
    done < <(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort -V)
    if [[ -n "$newest" ]]; then
        printf '%s\n' "$newest"
        return
    fi
    if command -v pg_config >/dev/null 2>&1; then
        candidate=$(pg_config --bindir 2>/dev/null || true)
        if [[ -n "$candidate" && -x "$candidate/postgres" && -x "$candidate/initdb" ]]; then
            printf '%s\n' "$candidate"
            return
        fi
    fi
    die "no PostgreSQL server binaries found (looked at PG_BINDIR, /usr/lib/postgresql/*/bin, pg_config --bindir);" \
        "install them with: apt-get install postgresql  (or scripts/install-deps)"
}

# --- running as the server's user -------------------------------------------

# The user that owns (or will own) the cluster: `postgres` when we are root.
server_user_for_new_cluster() { user_for_start "the server"; }

# Runs a command as $server_user: through runuser when that is not us.
as_server_user() { as_user "$server_user" "$@"; }

# --- state ------------------------------------------------------------------

# Reads STATE_DIR/state (key=value lines) into the variables the subcommands use.
load_state() {
    local key value
    [[ -f "$state_dir/state" ]] || die "$state_dir has no server state; run '$program start $state_dir' first"
    bindir="" port="" data_dir="" socket_dir="" log_file="" runtime_dir=""
    while IFS='=' read -r key value; do
        case "$key" in
            bindir) bindir=$value ;;
            port) port=$value ;;
            data_dir) data_dir=$value ;;
            socket_dir) socket_dir=$value ;;
            log_file) log_file=$value ;;
            runtime_dir) runtime_dir=$value ;;
            *) ;;
        esac
    done <"$state_dir/state"
    [[ -n "$bindir" && -n "$port" && -n "$data_dir" ]] || die "$state_dir/state is incomplete"
    server_user=$(stat -c %U "$data_dir" 2>/dev/null) || die "the data directory $data_dir is missing"
}

write_state() {
    {
        printf 'bindir=%s\n' "$bindir"
        printf 'port=%s\n' "$port"
        printf 'data_dir=%s\n' "$data_dir"
        printf 'socket_dir=%s\n' "$socket_dir"
        printf 'log_file=%s\n' "$log_file"
        printf 'runtime_dir=%s\n' "$runtime_dir"
    } >"$state_dir/state"
}

# Writes STATE_DIR/conninfo and STATE_DIR/env, readable only by us: they hold
# a password. The env file also names this script, for tests that start a
# private cluster of their own.
write_conninfo() {
    local conninfo=$1
    (
        umask 077
        printf '%s\n' "$conninfo" >"$state_dir/conninfo"
        {
            printf 'export BULKHEAD_TEST_DATABASE=%s\n' "$(shell_single_quote "$conninfo")"
            printf 'export BULKHEAD_PG_SCRIPT=%s\n' "$(shell_single_quote "$script_path")"
        } >"$state_dir/env"
    )
    printf '%s\n' "$script_path" >"$state_dir/script"
}

# --- the server -------------------------------------------------------------

# Settings for tests: fast, loud enough to debug, reachable only from this machine.
write_server_conf() {
    as_server_user tee "$data_dir/throwaway.conf" >/dev/null <<EOF
# Written by $program; rewritten on every start attempt.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$socket_dir'
max_connections = 300
shared_buffers = 32MB
fsync = off
synchronous_commit = off
full_page_writes = off
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
EOF
}

tail_log() {
    if [[ -s "$log_file" ]]; then
        say "last lines of $log_file:"
        tail -n 20 "$log_file" | mask_password >&2 || true
    fi
}

server_is_running() {
    [[ -f "$data_dir/postmaster.pid" ]] && as_server_user "$bindir/pg_ctl" status -D "$data_dir" >/dev/null 2>&1
}

# Starts the server on $port and waits for it. Returns 3 when the port was
# taken between picking it and binding it, 1 on any other failure.
start_server_once() {
    local log_size_before=0 output
    [[ -f "$log_file" ]] && log_size_before=$(stat -c %s "$log_file")
    if output=$(as_server_user "$bindir/pg_ctl" start -D "$data_dir" -l "$log_file" \
        -w -t "$ready_timeout_s" -s 2>&1); then
        return 0
    fi
    # Only what this attempt logged counts.
    if tail -c +"$((log_size_before + 1))" "$log_file" 2>/dev/null | grep -q 'Address already in use'; then
        return 3
    fi
    [[ -z "$output" ]] || printf '%s\n' "$output" >&2
    return 1
}

wait_until_ready() {
    local deadline=$((SECONDS + ready_timeout_s))
    until "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -d postgres -t 2; do
        if ((SECONDS >= deadline)); then
            tail_log
            die "the server on port $port did not accept connections within ${ready_timeout_s}s"
        fi
        sleep 0.2
    done
}

stop_server_if_running() {
    if [[ -f "$data_dir/postmaster.pid" ]]; then
        if ! as_server_user "$bindir/pg_ctl" stop -D "$data_dir" -m fast -w -t 60 -s >/dev/null 2>&1; then
            # Not running after all (a stale pid file), or stuck: make sure it is gone.
            as_server_user "$bindir/pg_ctl" stop -D "$data_dir" -m immediate -w -t 30 -s >/dev/null 2>&1 || true
        fi
    fi
}

# The EXIT trap of `start`: a start that fails after the server came up must
# not leave it running. Its files stay for a look until `stop`.
stop_if_start_failed() {
    if ((started_server)); then
        stop_server_if_running
    fi
}

# --- subcommands ------------------------------------------------------------

# Chooses the server's binaries and user and makes its directories (data,
# socket, log), recorded in STATE_DIR/state with port 0.
make_server_dirs() {
    bindir=$(find_bindir)
    server_user=$(server_user_for_new_cluster)

    # Where the server's files go. As root, the server runs as `postgres`, which
    # must reach them; if it cannot reach STATE_DIR (say, a checkout under
    # /root), they go to a directory under /tmp that STATE_DIR points at.
    local server_root=$state_dir
    runtime_dir=""
    if [[ "$server_user" != "$(id -un)" ]]; then
        chmod 0755 "$state_dir"
        if ! (cd / && runuser -u "$server_user" -- test -x "$state_dir"); then
            runtime_dir=$(mktemp -d /tmp/bulkhead-pg.XXXXXXXX)
            touch "$runtime_dir/$marker_name"
            server_root=$runtime_dir
            say "user $server_user cannot reach $state_dir; keeping the server's files in $runtime_dir"
        fi
    fi
    # A Unix socket path is limited to 107 bytes: use a short directory if needed.
    socket_dir="$server_root/socket"
    if ((${#socket_dir} + 16 > 100)); then
        if [[ -z "$runtime_dir" ]]; then
            runtime_dir=$(mktemp -d /tmp/bulkhead-pg.XXXXXXXX)
            touch "$runtime_dir/$marker_name"
        fi
        socket_dir="$runtime_dir/socket"
    fi
    data_dir="$server_root/data"
    log_file="$server_root/server.log"
    mkdir -p "$data_dir" "$socket_dir"
    : >"$log_file"
    if [[ "$server_root" != "$state_dir" ]]; then
        ln -s "$data_dir" "$state_dir/data"
        ln -s "$log_file" "$state_dir/server.log"
    fi
    chmod 0700 "$data_dir"
    if [[ "$server_user" != "$(id -un)" ]]; then
        [[ -n "$runtime_dir" ]] && chmod 0755 "$runtime_dir"
        chown "$server_user": "$data_dir" "$socket_dir" "$log_file"
    fi
    port=0
    write_state

}


cmd_stop() {
    [[ -d "$state_dir" ]] || return 0
    if [[ -f "$state_dir/state" && ! -e "$state_dir/external" ]]; then
        # A half-made state (e.g. data dir gone) must not stop the cleanup.
        if (load_state 2>/dev/null); then
            load_state
            if server_is_running; then
                stop_server_if_running
                say "stopped the server on port $port"
            fi
        fi
        local extra
        extra=$(sed -n 's/^runtime_dir=//p' "$state_dir/state")
        if [[ -n "$extra" && -d "$extra" && -e "$extra/$marker_name" ]]; then
            rm -rf -- "$extra"
        fi
    fi
    remove_state_dir
}

cmd_start() {
    claim_state_dir

    if [[ -n "${BULKHEAD_TEST_DATABASE:-}" ]]; then
        write_conninfo "$BULKHEAD_TEST_DATABASE"
        touch "$state_dir/external"
        say "using BULKHEAD_TEST_DATABASE, no server started: $(printf '%s' "$BULKHEAD_TEST_DATABASE" | mask_password)"
        return 0
    fi

    make_server_dirs
    say "creating a cluster in $data_dir (PostgreSQL $("$bindir/postgres" --version | sed -E 's/^[^0-9]*([0-9.]+).*/\1/'), user $server_user)"
    if ! as_server_user "$bindir/initdb" -D "$data_dir" --username=postgres --auth-local=trust \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C --no-sync >"$state_dir/initdb.log" 2>&1; then
        cat "$state_dir/initdb.log" >&2
        die "initdb failed"
    fi
    printf "\ninclude 'throwaway.conf'\n" | as_server_user tee -a "$data_dir/postgresql.conf" >/dev/null

    start_on_free_port

    local password
    password=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    # The password goes through stdin, never through a command line.
    local psql_output
    if ! psql_output=$("$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$socket_dir" -p "$port" \
        -U postgres -d postgres 2>&1 <<EOF
CREATE ROLE bulkhead LOGIN SUPERUSER PASSWORD '$password';
CREATE DATABASE bulkhead OWNER bulkhead;
EOF
    ); then
        printf '%s\n' "$psql_output" | mask_password >&2
        tail_log
        die "could not create the bulkhead role and database"
    fi

    local conninfo="host=127.0.0.1 port=$port dbname=bulkhead user=bulkhead password=$password connect_timeout=5"
    write_conninfo "$conninfo"
    started_server=0
    printf '%s\n' "$conninfo" | mask_password
}

cmd_stop_server() {
    [[ -e "$state_dir/external" ]] && return 0
    load_state
    if ! server_is_running; then
        say "the server on port $port is not running"
        return 0
    fi
    stop_server_if_running
    say "stopped the server on port $port (data kept)"
}

cmd_start_server() {
    [[ -e "$state_dir/external" ]] && return 0
    load_state
    if server_is_running; then
        say "the server on port $port is already running"
        return 0
    fi
    local status=0
    start_server_once || status=$?
    if ((status == 3)); then
        die "port $port is now taken by another process; cannot restart on the same port"
    elif ((status != 0)); then
        tail_log
        die "the server did not start (log: $log_file)"
    fi
    wait_until_ready
    say "started the server on port $port"
}

# Picks a free port, writes the settings and starts the server, retrying on
# a port taken in between; a later failure of this run stops it again.
start_on_free_port() {
    trap stop_if_start_failed EXIT
    local attempt status
    for ((attempt = 1; attempt <= start_attempts; attempt++)); do
        port=$(pick_free_port)
        write_server_conf
        write_state
        status=0
        start_server_once || status=$?
        if ((status == 0)); then
            started_server=1
            break
        elif ((status == 3 && attempt < start_attempts)); then
            say "port $port was taken before the server could bind it; trying another"
        else
            tail_log
            die "the server did not start (log: $log_file)"
        fi
    done
    wait_until_ready
}

cmd_start_standby() {
    local primary_dir=$1 upstream_port=$2
    [[ -f "$primary_dir/state" && -f "$primary_dir/conninfo" ]] || die "$primary_dir has no server of this script's"
    [[ ! -e "$primary_dir/external" ]] || die "$primary_dir names an external server; a standby needs a throwaway one"
    local primary_port primary_bindir
    primary_port=$(sed -n 's/^port=//p' "$primary_dir/state")
    primary_bindir=$(sed -n 's/^bindir=//p' "$primary_dir/state")
    upstream_port=${upstream_port:-$primary_port}
    [[ "$upstream_port" =~ ^[0-9]+$ ]] || die "UPSTREAM_PORT must be a port number"
    local conninfo password
    conninfo=$(cat "$primary_dir/conninfo")
    password=$(printf '%s\n' "$conninfo" | sed -n 's/.* password=\([^ ]*\).*/\1/p')
    [[ -n "$password" ]] || die "no password in $primary_dir/conninfo"

    claim_state_dir
    PG_BINDIR=$primary_bindir make_server_dirs
    # The password reaches pg_basebackup and the WAL receiver through a
    # passfile of the server user's, never through a command line.
    local passfile
    passfile="$(dirname "$data_dir")/pgpass"
    (
        umask 077
        printf '127.0.0.1:*:*:bulkhead:%s\n' "$password" >"$passfile"
    )
    [[ "$server_user" == "$(id -un)" ]] || chown "$server_user": "$passfile"
    say "copying the server on port $primary_port into $data_dir (pg_basebackup)"
    if ! as_server_user env PGPASSFILE="$passfile" "$bindir/pg_basebackup" -D "$data_dir" -h 127.0.0.1 \
        -p "$primary_port" -U bulkhead -X stream -c fast -R --no-sync >"$state_dir/basebackup.log" 2>&1; then
        mask_password <"$state_dir/basebackup.log" >&2
        die "pg_basebackup failed"
    fi
    # Appended last, so these win over what -R and the primary's ALTER
    # SYSTEM wrote there.
    as_server_user tee -a "$data_dir/postgresql.auto.conf" >/dev/null <<EOF
primary_conninfo = 'host=127.0.0.1 port=$upstream_port user=bulkhead passfile=''$passfile'' application_name=bulkhead_standby'
synchronous_standby_names = ''
EOF
    start_on_free_port
    write_conninfo "${conninfo/port=$primary_port /port=$port }"
    started_server=0
    say "standby of port $primary_port on port $port, streaming from port $upstream_port"
}

cmd_promote() {
    [[ ! -e "$state_dir/external" ]] || die "$state_dir names an external server"
    load_state
    as_server_user "$bindir/pg_ctl" promote -D "$data_dir" -w -t "$ready_timeout_s" -s ||
        die "the server on port $port was not promoted within ${ready_timeout_s}s"
    say "promoted the server on port $port"
}

cmd_kill_server() {
    [[ ! -e "$state_dir/external" ]] || return 0
    load_state
    if server_is_running; then
        as_server_user "$bindir/pg_ctl" stop -D "$data_dir" -m immediate -w -t 30 -s >/dev/null 2>&1 ||
            die "the server on port $port did not stop"
    fi
    say "killed the server on port $port (immediate shutdown, data kept)"
}

cmd_env() {
    [[ -f "$state_dir/env" ]] || die "$state_dir has no env file; run '$program start $state_dir' first"
    cat "$state_dir/env"
}

main() {
    (($# >= 2)) || usage
    local command=$1
    state_dir=$2
    [[ -n "$state_dir" ]] || usage
    if [[ "$command" == start-standby ]]; then
        (($# == 3 || $# == 4)) || usage
        cmd_start_standby "$3" "${4:-}"
        return
    fi
    (($# == 2)) || usage
    case "$command" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        stop-server) cmd_stop_server ;;
        start-server) cmd_start_server ;;
        env) cmd_env ;;
        promote) cmd_promote ;;
        kill-server) cmd_kill_server ;;
        *) usage ;;
    esac
}

# Set by the subcommands; declared here so that every function sees them.
script_path=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/$(basename "${BASH_SOURCE[0]}")
readonly script_path
state_dir="" bindir="" port="" data_dir="" socket_dir="" log_file="" runtime_dir="" server_user=""
started_server=0

main "$@"
