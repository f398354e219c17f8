#!/usr/bin/env bash
# tuner search throughput over the GPUs of one host, and two hosts sharing one PostgreSQL study
# set (4 or 8 H200s: about 8 minutes).
#   bash scripts/gpu/search_scaling.sh        (log: $OUT/scale.log, a short table last)
# Rows it produces in BENCHMARKS.md: none yet (not run on a multi-GPU host with the current tree).
#   1. scaling: the same shape set (the bundled example's 5 decode GEMV shapes, --graph-captured,
#      --sampler grid, a fresh Triton cache and a fresh SQLite storage each time) searched with
#      1, 2, 4 (and 8) GPUs for SCALE_S seconds each; trials per minute from the storage (measured
#      trials between the first trial's start and the last one's end: process start, budget and
#      baselines excluded; compilation, parity and cold-L2 timing included);
#   2. two supervisors, each owning half of the GPUs, on one PostgreSQL server started here from
#      the carried Debian packages (.debs/postgres, from scripts/gpu/fetch_postgres_debs.sh), as two
#      hosts would share it: supervisor A is killed with kill -9 mid-run and started again; then
#      every (study, config) must have been measured once, nothing left RUNNING, A's killed trials
#      retried, and both supervisors must report the same studies finished.
# Carry `.whl` (optuna and its needs, psycopg, psycopg-binary) and `.debs`; the wheels are
# installed with pip --no-index into /tmp/site.
# CPU check of the orchestration (fake objective, fake GPU ids, the local debs):
#   SCALE_OBJECTIVE=test_search:make_fake SCALE_GPUS=4 FAKE_SLEEP=0.3 SCALE_S=20 \
#     PYTHONPATH=$PWD/tests OUT=/tmp/out bash scripts/gpu/search_scaling.sh
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0;; esac
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOG="$OUT/scale.log"
: > "$LOG"
WORK=$(mktemp -d /tmp/tuner-scale.XXXXXX)
export PYTHONUNBUFFERED=1
SCALE_S=${SCALE_S:-60}          # seconds of search per GPU count
PG_TRIALS=${PG_TRIALS:-30}      # --trials per shape in the two-supervisor run
PG_PORT=${PG_PORT:-54329}
SHAPES=shapes/examples/qwen25_05b_b4_decode.parquet
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || echo "wheel install failed" | tee -a "$LOG"
fi
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
OBJ=()
if [ -n "${SCALE_OBJECTIVE:-}" ]; then OBJ=(--objective "$SCALE_OBJECTIVE"); fi
NGPU=${SCALE_GPUS:-$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}
COUNTS=(1 2 4 8)
RESULTS="$WORK/results.tsv"; : > "$RESULTS"

log() { echo "$@" | tee -a "$LOG"; }
ids() { seq -s, "$1" "$2"; }  # ids 0 3 -> 0,1,2,3

cat > "$WORK/count.py" <<'PY'
"""Measured trials of the tuner studies in a storage, and the span they took."""
import json, sys
import optuna
from tuner import search

url = sys.argv[1]
storage = search.make_storage(url, None, None)
out = {"measured": 0, "first": None, "last": None, "running": 0, "twice": 0, "studies": 0,
       "retried": 0, "stale": 0, "statuses": {}}
for s in storage.get_all_studies():
    trials = optuna.load_study(study_name=s.study_name, storage=storage).get_trials(deepcopy=False)
    out["studies"] += 1
    seen = {}
    for t in trials:
        out["running"] += t.state.name == "RUNNING"
        failure = str(t.user_attrs.get("failure", ""))
        if t.state.name == "FAIL" and "failure" not in t.user_attrs:
            out["stale"] += 1  # its worker vanished (kill -9): failed by the heartbeat check
            out["retried"] += any(r.user_attrs.get("retry_of") == t.number for r in trials)
            continue
        if (t.state.name not in ("COMPLETE", "FAIL") or "duplicate_of" in t.user_attrs
                or failure.startswith(("skipped:", "worker died"))):
            continue
        out["measured"] += 1
        key = search.config_key(t.user_attrs.get("config") or {})
        seen[key] = seen.get(key, 0) + 1
        start, end = t.datetime_start.timestamp(), t.datetime_complete.timestamp()
        out["first"] = start if out["first"] is None else min(out["first"], start)
        out["last"] = end if out["last"] is None else max(out["last"], end)
    out["twice"] += sum(n - 1 for n in seen.values())
print(json.dumps(out))
PY

log "== environment ($(date -u +%H:%M:%SZ))"
python3 -c "import optuna, torch, triton; print('optuna', optuna.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())" 2>&1 | tee -a "$LOG"
log "GPUs used: $NGPU${SCALE_OBJECTIVE:+ (fake ids, objective $SCALE_OBJECTIVE)}"

# ------------------------------------------------------------------------------- 1. scaling
for n in "${COUNTS[@]}"; do
  [ "$n" -le "$NGPU" ] || continue
  db="$WORK/scale-$n.db"
  log "== $n GPU(s): tuner search, grid, ${SCALE_S}s ($(date -u +%H:%M:%SZ))"
  TRITON_CACHE_DIR="$WORK/triton-$n" timeout -s INT -k 30 $((SCALE_S + 120)) \
    python3 -m tuner.cli search "$SHAPES" --family gemv --device h200 --graph-captured \
    --sampler grid --timeout "${SCALE_S}s" --storage "sqlite:///$db" --gpus "$(ids 0 $((n - 1)))" \
    --no-progress --trial-timeout 120 "${OBJ[@]}" >>"$LOG" 2>&1
  log "rc=$?"
  python3 "$WORK/count.py" "sqlite:///$db" > "$WORK/count-$n.json" 2>>"$LOG"
  python3 - "$n" "$WORK/count-$n.json" >> "$RESULTS" <<'PY'
import json, sys
n, c = int(sys.argv[1]), json.load(open(sys.argv[2]))
span = (c["last"] - c["first"]) if c["first"] is not None else 0.0
rate = 60.0 * c["measured"] / span if span > 0 else 0.0
print(f"{n}\t{c['measured']}\t{span:.1f}\t{rate:.1f}")
PY
  tail -n 1 "$RESULTS" | tee -a "$LOG"
done

# ------------------------------------------------------- 2. two supervisors on PostgreSQL
PG_OK=0
PGROOT="$WORK/pgroot"
start_postgres() {
  ver=$(cat .debs/postgres/VERSION 2>/dev/null) || { log "no .debs/postgres: run scripts/gpu/fetch_postgres_debs.sh and carry .debs"; return 1; }
  mkdir -p "$PGROOT"
  for f in .debs/postgres/*.deb; do dpkg -x "$f" "$PGROOT" || return 1; done
  bin="$PGROOT/usr/lib/postgresql/$ver/bin"
  # the system's libraries first, the carried ones for what it lacks
  export PG_LIBS="/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:$PGROOT/lib/x86_64-linux-gnu:$PGROOT/usr/lib/x86_64-linux-gnu"
  data="$WORK/pgdata"; mkdir -p "$data"; chown nobody "$data" "$WORK"; chmod 755 "$WORK"
  as_nobody() {  # PostgreSQL refuses to run as root
    LD_LIBRARY_PATH="$PG_LIBS" TZ=GMT python3 -c 'import os, pwd, sys
u = pwd.getpwnam("nobody"); os.setgroups([]); os.setgid(u.pw_gid); os.setuid(u.pw_uid)
os.execv(sys.argv[1], sys.argv[1:])' "$@"
  }
  as_nobody "$bin/initdb" -D "$data" -U tuner --auth=trust --locale=C --encoding=UTF8 >>"$LOG" 2>&1 || return 1
  printf "timezone = 'GMT'\nlog_timezone = 'GMT'\nmax_connections = 200\nlisten_addresses = '127.0.0.1'\nport = $PG_PORT\nunix_socket_directories = '$data'\njit = off\n" >> "$data/postgresql.conf"
  as_nobody "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 start >>"$LOG" 2>&1 || { cat "$data/server.log" >>"$LOG"; return 1; }
  PG_STOP=(as_nobody "$bin/pg_ctl" -D "$data" -m fast stop)
}

run_supervisor() {  # run_supervisor NAME IDS: a tuner search in its own session, as another host
  setsid python3 -m tuner.cli search "$SHAPES" --family gemv --device h200 --graph-captured \
    --sampler grid --trials "$PG_TRIALS" --timeout 240s --storage "$PG_URL" --gpus "$2" \
    --no-progress --trial-timeout 120 --heartbeat 2 --grace 6 "${OBJ[@]}" \
    > "$WORK/sup-$1.out" 2> "$WORK/sup-$1.err" &
  SUP_PID=$!  # setsid execs in place here (not a group leader): the pid is the session's id
}

if [ "$NGPU" -ge 2 ] && start_postgres; then
  PG_URL="postgresql+psycopg://tuner@127.0.0.1:$PG_PORT/postgres"
  half=$((NGPU / 2))
  A_IDS=$(ids 0 $((half - 1))); B_IDS=$(ids "$half" $((NGPU - 1)))
  log "== two supervisors on PostgreSQL: A on GPUs $A_IDS, B on GPUs $B_IDS, --trials $PG_TRIALS ($(date -u +%H:%M:%SZ))"
  run_supervisor A "$A_IDS"; a=$SUP_PID
  run_supervisor B "$B_IDS"; b=$SUP_PID
  killed=0
  for _ in $(seq 1 600); do  # kill A once a third of the trials are measured
    sleep 0.5
    m=$(python3 "$WORK/count.py" "$PG_URL" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["measured"])' 2>/dev/null || echo 0)
    if [ "$m" -ge $((5 * PG_TRIALS / 3)) ]; then
      kill -9 -- -"$a"; killed=1; log "kill -9 supervisor A (process group $a) after $m measured trials"; break
    fi
    kill -0 "$a" 2>/dev/null || break
  done
  wait "$a" 2>/dev/null
  run_supervisor A2 "$A_IDS"; a2=$SUP_PID
  wait "$a2"; rc_a=$?; wait "$b"; rc_b=$?
  log "supervisor A again: rc=$rc_a; supervisor B: rc=$rc_b"
  cat "$WORK/sup-A.err" "$WORK/sup-A2.out" "$WORK/sup-A2.err" "$WORK/sup-B.out" "$WORK/sup-B.err" >> "$LOG"
  python3 "$WORK/count.py" "$PG_URL" > "$WORK/pg.json" 2>>"$LOG"
  status() { grep -cE " trials +\{" "$WORK/sup-$1.out" 2>/dev/null || true; }  # studies at --trials
  echo "killed=$killed rc_a=$rc_a rc_b=$rc_b done_a=$(status A2) done_b=$(status B)" > "$WORK/pg.txt"
  "${PG_STOP[@]}" >>"$LOG" 2>&1
  PG_OK=1
else
  log "two-supervisor run skipped: needs 2 GPUs and PostgreSQL from .debs/postgres"
fi

log "== results"
python3 - "$RESULTS" "$WORK/pg.json" "$WORK/pg.txt" "$PG_OK" "$PG_TRIALS" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines() if line]
print(f"{'GPUs':>4} {'measured':>8} {'span s':>7} {'trials/min':>10} {'per GPU':>8} {'vs 1 GPU':>8}")
base = None
for n, measured, span, rate in rows:
    n, rate = int(n), float(rate)
    base = base or (rate if n == 1 else None)
    scale = f"{rate / base:.2f}x" if base else "-"
    print(f"{n:>4} {measured:>8} {span:>7} {rate:>10.1f} {rate / n:>8.1f} {scale:>8}")
if sys.argv[4] == "1":
    c = json.load(open(sys.argv[2]))
    flags = dict(kv.split("=") for kv in open(sys.argv[3]).read().split())
    print(f"two supervisors on PostgreSQL: {c['studies']} studies, {c['measured']} measured trials "
          f"({5 * int(sys.argv[5])} wanted), configs measured twice {c['twice']}, left RUNNING "
          f"{c['running']}, killed trials {c['stale']} (retried {c['retried']}), kill -9 done "
          f"{flags['killed']}, exit codes A {flags['rc_a']} B {flags['rc_b']}, studies at --trials: "
          f"A {flags['done_a']} B {flags['done_b']}")
PY
rm -rf "$WORK"
