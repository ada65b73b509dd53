#!/usr/bin/env bash
# Checks a Promela model of tests/model exhaustively with spin.
#
#   tests/model/check.sh [--model NAME] [-D NAME[=VALUE]]... [--expect-violation]
#
# --model NAME checks tests/model/NAME.pml: fifo_semaphore (the default) or
# workload_scheduler.
# Generates the verifier (spin -a) in a temporary directory, compiles it
# (-DSAFETY: assertions and invalid end states, every reachable state),
# runs it and prints its report. Without --expect-violation it exits 0 only
# when the search completed with no error. With --expect-violation (for the
# seeded bugs) it exits 0 only when pan found an error, and prints the first
# lines of the counterexample.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model_name=fifo_semaphore
defines=()
expect_violation=0
while (($#)); do
    case "$1" in
        -D) defines+=("-D$2"); shift 2 ;;
        -D*) defines+=("$1"); shift ;;
        --expect-violation) expect_violation=1; shift ;;
        --model) model_name="$2"; shift 2 ;;
        --model=*) model_name="${1#--model=}"; shift ;;
        *) printf 'check.sh: unknown argument %s\n' "$1" >&2; exit 2 ;;
    esac
done
model="${here}/${model_name}.pml"
if [[ "${model_name}" == */* || ! -f "${model}" ]]; then
    printf 'check.sh: no model %s in %s\n' "${model_name}" "${here}" >&2
    exit 2
fi
for tool in spin cc; do
    if ! command -v "${tool}" >/dev/null 2>&1; then
        printf 'check.sh: %s not found; install it with scripts/install-deps (Debian package spin)\n' "${tool}" >&2
        exit 2
    fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/bulkhead-model.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
cp "${model}" "${work}/model.pml"
cd "${work}"
printf 'model: %s %s\n' "${model}" "${defines[*]:-}"
spin "${defines[@]}" -a model.pml >spin.log 2>&1 || { cat spin.log; exit 2; }
# -DSAFETY: safety properties only (assertions, invalid end states).
# Exhaustive: no hash compaction, no bitstate. -DCOLLAPSE stores states
# compressed, losslessly (the 4-thread run: 1.6 GB instead of 4.6 GB).
# -O2 for a search that must visit every state. A seeded bug's search stops
# at its first error, within a second either way: -O0 saves the 2.5 s that
# -O2 adds to compiling pan.c.
optimize=-O2
if ((expect_violation)); then
    optimize=-O0
fi
cc "${optimize}" -w -DSAFETY -DCOLLAPSE -o pan pan.c
start_ns=$(date +%s%N)
# -m: search depth bound, large enough that it is never reached (checked below).
timeout "${BULKHEAD_MODEL_TIMEOUT:-300}" ./pan -m200000 >pan.log 2>&1 || true
end_ns=$(date +%s%N)
cat pan.log
printf 'time: %d ms\n' "$(((end_ns - start_ns) / 1000000))"

errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.log | head -n1)
if [[ -z "${errors}" ]]; then
    printf 'check.sh: pan printed no error count\n' >&2
    exit 2
fi
if grep -q 'max search depth too small' pan.log; then
    printf 'check.sh: the search was cut by the depth bound; raise -m\n' >&2
    exit 2
fi
if ((expect_violation)); then
    if ((errors == 0)); then
        printf 'check.sh: RESULT: the seeded bug was NOT found\n'
        exit 1
    fi
    printf 'check.sh: RESULT: violation found, as expected; counterexample (its last steps):\n'
    spin "${defines[@]}" -t -p -g model.pml 2>&1 | grep -E 'assertion violated|invalid end state|proc +[0-9]+ \((worker|stopper|async_waiter|canceller|resizer|caller):' | tail -n 25 || true
    exit 0
fi
if ((errors != 0)); then
    printf 'check.sh: RESULT: %s error(s); counterexample:\n' "${errors}"
    spin "${defines[@]}" -t -p -g model.pml 2>&1 | tail -n 60 || true
    exit 1
fi
printf 'check.sh: RESULT: no error in the whole state space\n'
