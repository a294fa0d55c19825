#!/usr/bin/env bash
# persevere's queue beside graphile-worker 0.18 on one throwaway PostgreSQL cluster: enqueue,
# execute and pick-up latency, interleaved, ROUNDS rounds; prints one markdown table (see
# README.md beside this file). Not part of .ci/run.
#
#   bash queue/peer-bench/run.sh                # ROUNDS=5 by default
#   ROUNDS=3 TASKS=20000 bash queue/peer-bench/run.sh
#
# Environment: ROUNDS (5), TASKS (20000), SAMPLES (200 latency samples), INTERVAL_MS (20),
# PEER_BENCH_DIR (/tmp/persevere-peer-bench: the cluster, graphile-worker's npm install, SQLite
# files, raw results), PERSEVERE_PG_PORT (54339), CARGO_TARGET_DIR (the workspace's target).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
rounds=${ROUNDS:-5}
tasks=${TASKS:-20000}
samples=${SAMPLES:-200}
interval_ms=${INTERVAL_MS:-20}
work=${PEER_BENCH_DIR:-/tmp/persevere-peer-bench}
export PERSEVERE_PG_PORT=${PERSEVERE_PG_PORT:-54339}
port=$PERSEVERE_PG_PORT
pgdir=$work/pg
node_dir=$work/node
sqlite_dir=$work/sqlite
started_at=$(date +%s)
results=$work/results-$(date +%Y%m%d-%H%M%S).jsonl

log() { echo "[peer-bench $(date +%H:%M:%S)] $*" >&2; }

mkdir -p "$work" "$sqlite_dir"

# graphile-worker 0.18 from npm, into a directory of its own (never into the repository).
if [ "$(node -p 'try { require(process.argv[1]).version } catch { "" }' "$node_dir/node_modules/graphile-worker/package.json" 2>/dev/null)" != 0.18.0 ]; then
  log "installing graphile-worker@0.18 into $node_dir"
  mkdir -p "$node_dir"
  [ -f "$node_dir/package.json" ] || echo '{ "private": true }' >"$node_dir/package.json"
  (cd "$node_dir" && npm install --no-audit --no-fund --loglevel=error graphile-worker@0.18 >&2)
fi
export PEER_BENCH_NODE_DIR=$node_dir
graphile_version=$(node -p 'require(process.argv[1]).version' "$node_dir/node_modules/graphile-worker/package.json")

# persevere's side, in release.
log "building the peer_bench example (release)"
(cd "$repo" && cargo build --quiet --release -p persevere-queue --example peer_bench --features postgres,tokio)
target=${CARGO_TARGET_DIR:-$(cd "$repo" && cargo metadata --format-version 1 --no-deps | node -e \
  'let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => console.log(JSON.parse(s).target_directory))')}
bench=$target/release/examples/peer_bench

# The cluster, stopped whatever happens.
cleanup() {
  "$repo/.ci/postgres" stop "$pgdir" >/dev/null 2>&1 || true
  rm -rf "$sqlite_dir"
}
trap cleanup EXIT
log "starting PostgreSQL in $pgdir on port $port"
"$repo/.ci/postgres" start "$pgdir" >/dev/null
pg_version=$(psql -h "$pgdir" -p "$port" -U persevere -d persevere -XAtqc "SHOW server_version")

psql_admin() { PGOPTIONS="-c client_min_messages=warning" psql -h "$pgdir" -p "$port" -U persevere -d persevere -XAtq -v ON_ERROR_STOP=1 "$@"; }

# A fresh database for each measurement: its pg_stat_database row counts its commits alone.
fresh_db() {
  psql_admin -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" >/dev/null
}

# The cluster's WAL bytes and the database's commits, once every backend of the measured run has
# gone (a backend flushes its statistics as it exits).
pg_stats() {
  local db=$1 waited=0
  while [ "$(psql_admin -c "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db' AND backend_type = 'client backend'")" != 0 ]; do
    sleep 0.05
    waited=$((waited + 1))
    [ $waited -lt 200 ] || { log "backends of $db did not exit"; break; }
  done
  sleep 0.2
  psql_admin -F ' ' -c "SELECT w.wal_bytes, w.wal_sync, d.xact_commit FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = '$db'"
}

pg_params() { echo "host=$pgdir port=$port user=persevere dbname=$1"; }
pg_url() { echo "postgresql://persevere@$(node -p 'encodeURIComponent(process.argv[1])' "$pgdir"):$port/$1"; }

# run ROUND KEY STATS-DB -- COMMAND...: runs the command (which prints one JSON line) and appends
# it to the results with the round, the row's key and, with a STATS-DB, the WAL written and the
# commits made while it ran.
run() {
  local round=$1 key=$2 db=$3
  shift 4
  local before after line
  [ "$db" = - ] || before=$(pg_stats "$db")
  line=$("$@")
  [ "$db" = - ] || after=$(pg_stats "$db")
  local stats=""
  if [ "$db" != - ]; then
    read -r wb0 ws0 xc0 <<<"$before"
    read -r wb1 ws1 xc1 <<<"$after"
    stats=",\"wal_bytes\":$((wb1 - wb0)),\"wal_syncs\":$((ws1 - ws0)),\"commits\":$((xc1 - xc0))"
  fi
  # The machine's load average as the run ends: a flagged round on a shared machine often
  # coincides with someone else's build.
  local load
  load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo null)
  echo "{\"round\":$round,\"key\":\"$key\",\"load\":$load,\"result\":$line$stats}" >>"$results"
  log "round $round $key: $line"
}

persevere_pg() { "$bench" "$1" --store "postgres:$(pg_params "$2")" "${@:3}"; }
persevere_sqlite() { "$bench" "$1" --store "sqlite:$sqlite_dir/$2.sqlite3" "${@:3}"; }
graphile() { node "$here/graphile.mjs" "$1" --db "$(pg_url "$2")" "${@:3}"; }

fresh_sqlite() { rm -f "$sqlite_dir/$1.sqlite3" "$sqlite_dir/$1.sqlite3-wal" "$sqlite_dir/$1.sqlite3-shm"; }

# One measurement of one system. Each starts from an empty database or file with the system's
# schema (its own migration); an execute run's tasks are enqueued as one batch first, outside
# the measurement. Then a checkpoint, so that the WAL of every run starts just after one (no
# full-page images left to chance, and no timed checkpoint in the middle of a run).
measure() {
  local round=$1 system=$2 what=$3 c=${4:-}
  local db="r${round}_${system//-/_}_${what//-/_}${c:+_c$c}"
  local key="$system $what${c:+ c$c}"
  case $system in
    persevere-pg* | graphile-*) fresh_db "$db" ;;
    persevere-sqlite) fresh_sqlite "$db" ;;
  esac
  # How each system runs tasks: graphile-worker's defaults, or batched (its local queue of 500
  # jobs, completions and failures written in batches); persevere's Runner with its defaults
  # (a buffer of as many jobs as handlers, finished rows kept a day), or batched: a buffer of
  # 500 like graphile-worker's local queue, and each finished row deleted with its completion
  # as graphile-worker deletes its jobs (`retention(Some(Duration::ZERO))`; on SQLite always).
  # persevere's handlers are async functions on one tokio thread (`Runner::run`), as
  # graphile-worker's are on node's event loop.
  local side preset=()
  case $system in
    persevere-pg) side=persevere_pg preset=(--handlers async) ;;
    persevere-pg-buffered) side=persevere_pg preset=(--handlers async --buffer 500 --retention-s 0) ;;
    persevere-sqlite) side=persevere_sqlite preset=(--handlers async --buffer 500 --retention-s 0) ;;
    graphile-default) side=graphile preset=(--preset default) ;;
    graphile-batched) side=graphile preset=(--preset batched) ;;
  esac
  local stats_db=$db
  [ "$system" != persevere-sqlite ] || stats_db=-
  case $what in
    enqueue-single | enqueue-batch)
      $side migrate "$db" >/dev/null
      [ "$stats_db" = - ] || psql_admin -c CHECKPOINT
      run "$round" "$key" "$stats_db" -- $side "$what" "$db" --tasks "$tasks"
      ;;
    execute)
      $side enqueue-batch "$db" --tasks "$tasks" >/dev/null
      [ "$stats_db" = - ] || psql_admin -c CHECKPOINT
      run "$round" "$key" "$stats_db" -- $side execute "$db" --tasks "$tasks" --concurrency "$c" "${preset[@]}"
      ;;
    latency)
      $side migrate "$db" >/dev/null
      [ "$stats_db" = - ] || psql_admin -c CHECKPOINT
      run "$round" "$key" "$stats_db" -- $side latency "$db" --samples "$samples" --interval-ms "$interval_ms"
      ;;
  esac
  case $system in
    persevere-sqlite) fresh_sqlite "$db" ;;
    *) psql_admin -c "DROP DATABASE $db" >/dev/null ;;
  esac
}

# Interleaved: every round measures each row on each system back to back; odd rounds start with
# persevere, even rounds with graphile-worker.
ordered() {
  local round=$1
  shift
  if [ $((round % 2)) = 1 ]; then printf '%s\n' "$@"; else printf '%s\n' "$@" | tac; fi
}

log "graphile-worker $graphile_version, PostgreSQL $pg_version, node $(node --version); $rounds rounds of $tasks tasks; raw results in $results"
for round in $(seq 1 "$rounds"); do
  for what in enqueue-single enqueue-batch; do
    for system in $(ordered "$round" persevere-pg persevere-sqlite graphile-default); do
      measure "$round" "$system" "$what"
    done
  done
  for c in 1 4 16; do
    for system in $(ordered "$round" persevere-pg graphile-default persevere-pg-buffered graphile-batched persevere-sqlite); do
      measure "$round" "$system" execute "$c"
    done
  done
  for system in $(ordered "$round" persevere-pg persevere-sqlite graphile-default); do
    measure "$round" "$system" latency
  done
done

elapsed=$(($(date +%s) - started_at))
node "$here/report.mjs" "$results" \
  "$rounds rounds, $tasks tasks per throughput run, $samples latency samples $interval_ms ms apart; graphile-worker $graphile_version on node $(node --version), PostgreSQL $pg_version, $(nproc) cores; wall time $((elapsed / 60)) min $((elapsed % 60)) s"
