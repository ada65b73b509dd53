#!/usr/bin/env bash
# pgbouncer_throwaway.sh: a private PgBouncer in transaction pooling mode in
# front of the throwaway PostgreSQL server (pg_throwaway.sh), for the
# [pgbouncer] pass of the [pg] tests. Nothing here touches a system PgBouncer
# (Debian's pgbouncer package ships one, not started here).
#
#   pgbouncer_throwaway.sh start STATE_DIR PG_STATE_DIR   start PgBouncer before the server of PG_STATE_DIR
#   pgbouncer_throwaway.sh stop  STATE_DIR                stop it and delete STATE_DIR; fine if already stopped
#   pgbouncer_throwaway.sh env   STATE_DIR                print `export BULKHEAD_TEST_DATABASE='...'` (through PgBouncer)
#   pgbouncer_throwaway.sh stop-bouncer  STATE_DIR        stop PgBouncer (SIGTERM), keep its port and files
#   pgbouncer_throwaway.sh start-bouncer STATE_DIR        start it again on the same port, wait until it answers
#
# PG_STATE_DIR is a directory that `pg_throwaway.sh start` made: its conninfo
# names the server (the throwaway one, or BULKHEAD_TEST_DATABASE's, which must
# be in keyword form with host, port, dbname, user and password).
#
# After `start`, STATE_DIR holds:
#   conninfo         libpq keyword string through PgBouncer: host=127.0.0.1 port=N dbname user password connect_timeout=5
#   server_conninfo  the server's own conninfo (PG_STATE_DIR's), for checks that must see the backends
#   single_dbname    a database name that PgBouncer maps onto the same database with a pool of ONE server
#                    connection: clients of it take turns on one backend (tests of what carries over)
#   pgbouncer        PgBouncer's version (e.g. 1.18.0); its presence tells a test it runs through PgBouncer
#   script           the absolute path of pg_throwaway.sh (for tests that start a private cluster)
#   env              conninfo as a shell `export` line, and BULKHEAD_PG_SCRIPT
#   state            port, pid file, runtime directory, for `stop`
#   pgbouncer.log    PgBouncer's log (a link into the runtime directory)
#
# PgBouncer's own files (pgbouncer.ini, the auth_file with the password, the
# pid file and the log) live in a fresh /tmp/bulkhead-pgbouncer.XXXXXXXX
# readable only by the user PgBouncer runs as. PgBouncer refuses to run as
# root: as root it runs as the `postgres` user (runuser), otherwise as the
# caller. It listens on 127.0.0.1 only, on a random free port in
# 20000-60000, with no Unix socket. The password is never printed.
#
# The settings (docs/pgbouncer.md explains each):
#   pool_mode = transaction, server_reset_query = '' (transaction mode resets
#   nothing between clients), auth_type = scram-sha-256 with the password in
#   the auth_file, default_pool_size = 20 server connections per database and
#   user (BULKHEAD_PGBOUNCER_POOL_SIZE at `start` sets another),
#   max_client_conn = 500, server_login_retry = 1 s, query_wait_timeout = 30 s.
set -euo pipefail

readonly program="pgbouncer_throwaway.sh"
readonly marker_name=".pgbouncer_throwaway"
readonly ready_timeout_s=20
readonly start_attempts=5
readonly default_pool_size=${BULKHEAD_PGBOUNCER_POOL_SIZE:-20}
readonly max_client_conn=500

usage() {
    sed -n '7,11s/^#   //p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

# shellcheck source=throwaway_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/throwaway_lib.sh"

# --- the user PgBouncer runs as ------------------------------------------------

# Runs a command as $bouncer_user: through runuser when that is not us.
as_bouncer_user() { as_user "$bouncer_user" "$@"; }

find_pgbouncer() {
    local candidate
    for candidate in "${PGBOUNCER:-}" "$(command -v pgbouncer 2>/dev/null || true)" /usr/sbin/pgbouncer; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then
            printf '%s\n' "$candidate"
            return
        fi
    done
    die "no pgbouncer binary found (looked at PGBOUNCER, PATH, /usr/sbin);" \
        "install it with: apt-get install pgbouncer  (or scripts/install-deps)"
}

# --- the server's conninfo -------------------------------------------------------

# Reads the libpq keyword string $1 into server_host, server_port,
# server_dbname, server_user and server_password. Values may be bare or
# single-quoted (with \' and \\ inside); a URL is refused.
parse_server_conninfo() {
    local text=$1 key value
    server_host="" server_port="5432" server_dbname="" server_user="" server_password=""
    [[ "$text" != postgres://* && "$text" != postgresql://* ]] ||
        die "the server's conninfo is a URL; PgBouncer's tests need the keyword form (host=... port=... ...)"
    while [[ -n "$text" ]]; do
        text="${text#"${text%%[![:space:]]*}"}"
        [[ -n "$text" ]] || break
        [[ "$text" =~ ^([a-z_]+)[[:space:]]*=[[:space:]]*(.*)$ ]] || die "cannot read the server's conninfo"
        key=${BASH_REMATCH[1]}
        text=${BASH_REMATCH[2]}
        value=""
        if [[ "$text" == \'* ]]; then
            text=${text#\'}
            while [[ -n "$text" && "$text" != \'* ]]; do
                if [[ "$text" == \\* ]]; then
                    text=${text#\\}
                fi
                value+=${text:0:1}
                text=${text:1}
            done
            text=${text#\'}
        else
            value=${text%%[[:space:]]*}
            text=${text:${#value}}
        fi
        case "$key" in
            host | hostaddr) server_host=$value ;;
            port) server_port=$value ;;
            dbname) server_dbname=$value ;;
            user) server_user=$value ;;
            password) server_password=$value ;;
            *) ;;
        esac
    done
    [[ -n "$server_host" && "$server_host" != /* ]] ||
        die "the server's conninfo names no TCP host; PgBouncer's tests need host=<name or address>"
    [[ -n "$server_dbname" && -n "$server_user" && -n "$server_password" ]] ||
        die "the server's conninfo needs dbname, user and password for PgBouncer's auth_file"
}

# A value for pgbouncer.ini's connection strings and the conninfo: bare
# when it needs no quotes, else refused (the throwaway server's never do).
plain_word() {
    [[ "$1" =~ ^[A-Za-z0-9_.-]+$ ]] || die "'$2' holds characters this script does not quote; use a plainer one"
    printf '%s' "$1"
}

# --- state ---------------------------------------------------------------------

load_state() {
    local key value
    port="" pid_file="" runtime_dir="" bouncer_user=""
    [[ -f "$state_dir/state" ]] || return 1
    while IFS='=' read -r key value; do
        case "$key" in
            port) port=$value ;;
            pid_file) pid_file=$value ;;
            runtime_dir) runtime_dir=$value ;;
            user) bouncer_user=$value ;;
            *) ;;
        esac
    done <"$state_dir/state"
}

write_state() {
    {
        printf 'port=%s\n' "$port"
        printf 'pid_file=%s\n' "$pid_file"
        printf 'runtime_dir=%s\n' "$runtime_dir"
        printf 'user=%s\n' "$bouncer_user"
    } >"$state_dir/state"
}

# --- PgBouncer -------------------------------------------------------------------

write_config() {
    local host port_word dbname
    host=$(plain_word "$server_host" host)
    port_word=$(plain_word "$server_port" port)
    dbname=$(plain_word "$server_dbname" dbname)
    as_bouncer_user tee "$runtime_dir/pgbouncer.ini" >/dev/null <<EOF
; Written by $program; rewritten on every start attempt.
[databases]
$dbname = host=$host port=$port_word dbname=$dbname
$single_dbname = host=$host port=$port_word dbname=$dbname pool_size=1
* = host=$host port=$port_word

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
pool_mode = transaction
server_reset_query =
auth_type = scram-sha-256
auth_file = $runtime_dir/userlist.txt
admin_users = $server_user
default_pool_size = $default_pool_size
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = $max_client_conn
server_login_retry = 1
query_wait_timeout = 30
ignore_startup_parameters = extra_float_digits
logfile = $runtime_dir/pgbouncer.log
pidfile = $pid_file
EOF
}

# The auth_file: one line, "user" "password", readable only by PgBouncer's user.
write_auth_file() {
    # shellcheck disable=SC2016  # $1 is the inner shell's
    as_bouncer_user sh -c 'umask 077 && cat >"$1"' sh "$runtime_dir/userlist.txt" <<EOF
"${server_user//\"/\"\"}" "${server_password//\"/\"\"}"
EOF
}

bouncer_pid() {
    [[ -n "$pid_file" && -s "$pid_file" ]] || return 1
    local pid
    pid=$(tr -dc '0-9' <"$pid_file")
    [[ -n "$pid" ]] && process_alive "$pid" && printf '%s\n' "$pid"
}

tail_log() {
    if [[ -s "$runtime_dir/pgbouncer.log" ]]; then
        say "last lines of $runtime_dir/pgbouncer.log:"
        tail -n 20 "$runtime_dir/pgbouncer.log" | mask_password >&2 || true
    fi
}

# Starts PgBouncer on $port. Returns 3 when the port was taken, 1 on any
# other failure, 0 once it answers a query through it.
start_once() {
    local log_size_before=0 output
    [[ -f "$runtime_dir/pgbouncer.log" ]] && log_size_before=$(stat -c %s "$runtime_dir/pgbouncer.log")
    if ! output=$(as_bouncer_user "$pgbouncer" -d -q "$runtime_dir/pgbouncer.ini" 2>&1); then
        [[ -z "$output" ]] || printf '%s\n' "$output" | mask_password >&2
        if tail -c +"$((log_size_before + 1))" "$runtime_dir/pgbouncer.log" 2>/dev/null | grep -q 'Address already in use'; then
            return 3
        fi
        return 1
    fi
    local deadline=$((SECONDS + ready_timeout_s))
    # A query through it: PgBouncer listens, authenticates the client with the
    # auth_file and logs in to the server. The password goes in the environment.
    until PGPASSWORD=$server_password PGCONNECT_TIMEOUT=2 psql -X -q -At -h 127.0.0.1 -p "$port" \
        -U "$server_user" -d "$server_dbname" -c 'SELECT 1' >/dev/null 2>&1; do
        if ! bouncer_pid >/dev/null; then
            if tail -c +"$((log_size_before + 1))" "$runtime_dir/pgbouncer.log" 2>/dev/null | grep -q 'Address already in use'; then
                return 3
            fi
            return 1
        fi
        if ((SECONDS >= deadline)); then
            say "PgBouncer on port $port answered no query within ${ready_timeout_s}s"
            return 1
        fi
        sleep 0.2
    done
}

stop_bouncer_if_running() {
    local pid waited
    pid=$(bouncer_pid) || return 0
    # SIGTERM: immediate shutdown (client and server connections closed).
    kill -TERM "$pid" 2>/dev/null || true
    for ((waited = 0; waited < 500; waited++)); do
        process_alive "$pid" || return 0
        sleep 0.02
    done
    kill -KILL "$pid" 2>/dev/null || true
}

stop_if_start_failed() {
    if ((started)); then
        stop_bouncer_if_running
    fi
}

# --- subcommands -------------------------------------------------------------------

cmd_stop() {
    [[ -d "$state_dir" ]] || return 0
    if load_state; then
        if bouncer_pid >/dev/null; then
            stop_bouncer_if_running
            say "stopped PgBouncer on port $port"
        fi
        if [[ -n "$runtime_dir" && -d "$runtime_dir" && -e "$runtime_dir/$marker_name" ]]; then
            rm -rf -- "$runtime_dir"
        fi
    fi
    remove_state_dir
}

cmd_start() {
    [[ -n "$pg_state_dir" && -s "$pg_state_dir/conninfo" ]] ||
        die "$pg_state_dir has no conninfo; start the server first (pg_throwaway.sh start $pg_state_dir)"
    [[ "$default_pool_size" =~ ^[1-9][0-9]{0,4}$ ]] ||
        die "BULKHEAD_PGBOUNCER_POOL_SIZE wants a whole number from 1 to 99999, not '${default_pool_size:0:20}'"
    claim_state_dir

    local server_conninfo
    server_conninfo=$(head -n 1 "$pg_state_dir/conninfo")
    parse_server_conninfo "$server_conninfo"
    pgbouncer=$(find_pgbouncer)
    bouncer_user=$(user_for_start "PgBouncer (it refuses root)")
    local version
    version=$("$pgbouncer" --version | sed -n -E '1s/^[^0-9]*([0-9][0-9.]*).*/\1/p')
    single_dbname="${server_dbname}_single"

    runtime_dir=$(mktemp -d /tmp/bulkhead-pgbouncer.XXXXXXXX)
    touch "$runtime_dir/$marker_name"
    pid_file="$runtime_dir/pgbouncer.pid"
    port=0
    write_state
    if [[ "$bouncer_user" != "$(id -un)" ]]; then
        chown "$bouncer_user": "$runtime_dir"
    fi
    chmod 0700 "$runtime_dir"
    as_bouncer_user touch "$runtime_dir/pgbouncer.log"
    ln -s "$runtime_dir/pgbouncer.log" "$state_dir/pgbouncer.log"
    write_auth_file

    say "starting PgBouncer $version (user $bouncer_user, pool_mode transaction) before $server_host:$server_port"
    trap stop_if_start_failed EXIT
    local attempt status
    for ((attempt = 1; attempt <= start_attempts; attempt++)); do
        port=$(pick_free_port)
        write_config
        write_state
        status=0
        start_once || status=$?
        if ((status == 0)); then
            started=1
            break
        fi
        stop_bouncer_if_running
        if ((status == 3 && attempt < start_attempts)); then
            say "port $port was taken before PgBouncer could bind it; trying another"
        else
            tail_log
            die "PgBouncer did not start (log: $runtime_dir/pgbouncer.log)"
        fi
    done

    # The server's words, PgBouncer's address: the host and port come first,
    # where the tests' fault proxies read them.
    local password_word=$server_password
    if [[ ! "$password_word" =~ ^[A-Za-z0-9_.-]+$ ]]; then
        password_word=${password_word//\\/\\\\}
        password_word="'${password_word//\'/\\\'}'"
    fi
    local user_word
    user_word=$(plain_word "$server_user" user)
    local conninfo="host=127.0.0.1 port=$port dbname=$server_dbname user=$user_word"
    conninfo+=" password=$password_word connect_timeout=5"
    (
        umask 077
        printf '%s\n' "$conninfo" >"$state_dir/conninfo"
        printf '%s\n' "$server_conninfo" >"$state_dir/server_conninfo"
        {
            printf 'export BULKHEAD_TEST_DATABASE=%s\n' "$(shell_single_quote "$conninfo")"
            printf 'export BULKHEAD_PG_SCRIPT=%s\n' "$(shell_single_quote "$(cat "$pg_state_dir/script")")"
        } >"$state_dir/env"
    )
    cp "$pg_state_dir/script" "$state_dir/script"
    printf '%s\n' "$single_dbname" >"$state_dir/single_dbname"
    printf '%s\n' "$version" >"$state_dir/pgbouncer"
    started=0
    printf '%s\n' "$conninfo" | mask_password
}

# Stops PgBouncer the way a restart does (SIGTERM: immediate shutdown, every
# client and server connection closed); the port, the configuration and the
# auth_file stay for start-bouncer.
cmd_stop_bouncer() {
    load_state || die "$state_dir holds no PgBouncer state; run '$program start' first"
    stop_bouncer_if_running
    say "stopped PgBouncer on port $port (start-bouncer starts it again)"
}

# Starts the PgBouncer of STATE_DIR again on its port with its configuration
# and waits until a query passes through it.
cmd_start_bouncer() {
    load_state || die "$state_dir holds no PgBouncer state; run '$program start' first"
    [[ -s "$state_dir/server_conninfo" ]] || die "$state_dir has no server_conninfo"
    ! bouncer_pid >/dev/null || die "PgBouncer already runs on port $port"
    parse_server_conninfo "$(head -n 1 "$state_dir/server_conninfo")"
    pgbouncer=$(find_pgbouncer)
    local status=0
    start_once || status=$?
    if ((status != 0)); then
        stop_bouncer_if_running
        tail_log
        ((status != 3)) || die "port $port was taken while PgBouncer was stopped"
        die "PgBouncer did not start again (log: $runtime_dir/pgbouncer.log)"
    fi
    say "PgBouncer answers again on port $port"
}

cmd_env() {
    [[ -f "$state_dir/env" ]] || die "$state_dir has no env file; run '$program start $state_dir PG_STATE_DIR' first"
    cat "$state_dir/env"
}

main() {
    (($# >= 2)) || usage
    local command=$1
    state_dir=$2
    [[ -n "$state_dir" ]] || usage
    case "$command" in
        start)
            (($# == 3)) || usage
            pg_state_dir=$3
            cmd_start
            ;;
        stop)
            (($# == 2)) || usage
            cmd_stop
            ;;
        env)
            (($# == 2)) || usage
            cmd_env
            ;;
        stop-bouncer)
            (($# == 2)) || usage
            cmd_stop_bouncer
            ;;
        start-bouncer)
            (($# == 2)) || usage
            cmd_start_bouncer
            ;;
        *) usage ;;
    esac
}

# Set by the subcommands; declared here so that every function sees them.
state_dir="" pg_state_dir="" port="" pid_file="" runtime_dir="" bouncer_user="" pgbouncer="" single_dbname=""
server_host="" server_port="" server_dbname="" server_user="" server_password=""
started=0

main "$@"
