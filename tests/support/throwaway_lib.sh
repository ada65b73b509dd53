# shellcheck shell=bash
# throwaway_lib.sh: what pg_throwaway.sh and pgbouncer_throwaway.sh share.
# Sourced, not run: each script defines `program` and `marker_name` first.
#
#   say MESSAGE, die MESSAGE   to stderr, prefixed with $program; die exits 1
#   user_for_start WHAT    the user WHAT runs as: `postgres` when we are root, else us
#   as_user USER CMD...    CMD as USER (runuser from /), or directly when USER is us
#   claim_state_dir        makes $state_dir ours (absolute, marked); clears what an aborted run left
#                          there with the script's own cmd_stop; refuses a directory not ours
#   remove_state_dir       deletes $state_dir, but only one that $program made (or an empty one)
#   mask_password          filter: masks passwords in conninfo, URLs and SQL
#   shell_single_quote V   V as one single-quoted shell word
#   absolute_dir DIR       the absolute, symlink-free path of an existing DIR
#   pick_free_port         a random TCP port in 20000-60000 that nothing listens on
#   process_alive PID      PID runs (a zombie does not: it has exited, only not been reaped yet)

# shellcheck disable=SC2154  # program and marker_name: set by the script that sources this
say() { printf '%s: %s\n' "$program" "$*" >&2; }
die() {
    say "error: $*"
    exit 1
}

# PostgreSQL and PgBouncer both refuse to run as root: as root they run as
# the `postgres` user that Debian's postgresql package creates.
user_for_start() {
    if [[ "$(id -u)" -eq 0 ]]; then
        id -u postgres >/dev/null 2>&1 ||
            die "running as root, but there is no 'postgres' user to run $1 as;" \
                "install the server with: apt-get install postgresql"
        printf 'postgres\n'
    else
        id -un
    fi
}

as_user() {
    local user=$1
    shift
    if [[ "$user" == "$(id -un)" ]]; then
        "$@"
    else
        # From /, so the user never needs to read our working directory.
        (cd / && runuser -u "$user" -- "$@")
    fi
}

claim_state_dir() {
    if [[ -e "$state_dir" ]]; then
        [[ -d "$state_dir" ]] || die "$state_dir exists and is not a directory"
        if [[ -e "$state_dir/$marker_name" ]]; then
            say "clearing stale state in $state_dir"
            cmd_stop
        elif [[ -n "$(ls -A "$state_dir")" ]]; then
            die "$state_dir is not empty and was not made by $program; give an empty or new directory"
        fi
    fi
    mkdir -p "$state_dir"
    state_dir=$(absolute_dir "$state_dir")
    touch "$state_dir/$marker_name"
}

remove_state_dir() {
    [[ -d "$state_dir" ]] || return 0
    if [[ ! -e "$state_dir/$marker_name" ]] && [[ -n "$(ls -A "$state_dir")" ]]; then
        die "$state_dir is not empty and was not made by $program; not deleting it"
    fi
    rm -rf -- "$state_dir"
}

# Masks passwords in a libpq keyword string, a URL, an SQL statement or a
# PgBouncer auth_file line ("user" "password").
mask_password() {
    sed -E -e "s/(password[[:space:]]*=[[:space:]]*)('[^']*'|[^[:space:]]*)/\1********/g" \
        -e 's#(://[^:/@]*):[^@/]*@#\1:********@#' \
        -e "s/(PASSWORD[[:space:]]+)'[^']*'?/\1'********'/g"
}

# Quotes a value for a shell single-quoted string.
shell_single_quote() {
    local value=$1
    printf "'%s'" "${value//\'/\'\\\'\'}"
}

# Absolute, symlink-free path of a directory that exists.
absolute_dir() { (cd "$1" && pwd -P); }

random_port() {
    # Two draws of $RANDOM (15 bits each) cover the range evenly enough.
    printf '%d\n' $((20000 + (RANDOM * 32768 + RANDOM) % 40001))
}

port_is_free() {
    local candidate=$1
    if command -v ss >/dev/null 2>&1; then
        [[ -z "$(ss -Hltn "sport = :$candidate" 2>/dev/null)" ]] || return 1
    fi
    # Something answering on 127.0.0.1 means the port is taken.
    ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null
}

pick_free_port() {
    local candidate tries
    for ((tries = 0; tries < 100; tries++)); do
        candidate=$(random_port)
        if port_is_free "$candidate"; then
            printf '%s\n' "$candidate"
            return
        fi
    done
    die "found no free TCP port in 20000-60000 after 100 tries"
}

# A process that has exited stays a zombie until its parent reaps it; a
# daemon's parent is the init process, which on some machines reaps only
# every two seconds or so (seen here). kill -0 succeeds on a zombie.
process_alive() {
    local state
    kill -0 "$1" 2>/dev/null || return 1
    state=$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 0
    [[ "$state" != Z ]]
}
