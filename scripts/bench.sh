#!/usr/bin/env bash
# Benchmarks: the same work on a plain host directory and through agentvfs's host, memory and
# sqlite routes, in one run (this machine's disk speed drifts between runs). Prints medians
# and ratios (route time / native time; for throughput rows, route MB/s / native MB/s).
# Not a test: CI does not run it. Needs root. Usage: scripts/bench.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
cargo build --release -q
BIN=$PWD/target/release/agentvfs

W=$(mktemp -d /tmp/agentvfs-bench.XXXXXX)
MNT=$W/mnt
PID=
cleanup() {
  [[ -n $PID ]] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  mountpoint -q "$MNT" 2>/dev/null && umount -l "$MNT" || true
  rm -rf "$W"
}
trap cleanup EXIT

mkdir -p "$W/native" "$W/host-root/bench" "$MNT"
cat > "$W/config.toml" <<TOML
[default]
backend = "memory"
[[routes]]
path = "/host"
backend = "host"
root = "$W/host-root"
[[routes]]
path = "/db"
backend = "sqlite"
database = "$W/store.db"
[[rules]]
operations = ["read", "write"]
paths = ["/**/.env", "/**/secrets/**"]
mode = "deny"
TOML
RUST_LOG=warn "$BIN" mount --config "$W/config.toml" "$MNT" >"$W/daemon.log" 2>&1 &
PID=$!
for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.05; done
mkdir -p "$MNT/mem"

# A source-like tree for untar/grep: 380 directories x 20 files of ~1.5 KiB.
SRC=$W/src-tree
BODY=$(for i in $(seq 1 40); do echo "    let x = $i;"; done)
for d in $(seq 1 380); do
  mkdir -p "$SRC/pkg$((d % 20))/mod$d"
  for f in $(seq 1 20); do
    printf 'fn f%s_%s() {\n%s\n}\n' "$d" "$f" "$BODY" > "$SRC/pkg$((d % 20))/mod$d/file$f.rs"
  done
done
tar -C "$SRC" -cf "$W/tree.tar" .

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# time_it DIR CMD...: runs CMD in DIR, prints seconds.
time_it() {
  local dir=$1; shift
  local start end
  start=$(date +%s.%N)
  (cd "$dir" && "$@") >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

w_create() { mkdir c && cd c && for i in $(seq 1 10000); do printf '%1024s' '' > f$i; done; }
w_stat() { find c -type f -exec stat -c %s {} + >/dev/null; }
w_lslr() { ls -lR c >/dev/null; }
w_delete() { rm -rf c; }
w_untar() { mkdir t && tar -C t -xf "$W/tree.tar" && sync; }
w_grep() { grep -r "let x = 7;" t >/dev/null; }
w_rmtree() { rm -rf t; }
w_seqwrite() { dd if=/dev/zero of=big bs=1M count=512 conv=fsync status=none; }
w_seqread() { dd if=big of=/dev/null bs=1M status=none; }
w_cleanup() { rm -f big; }
export -f w_create w_stat w_lslr w_delete w_untar w_grep w_rmtree w_seqwrite w_seqread w_cleanup
export W

declare -A RESULT
TARGETS=(native host memory sqlite)
dir_of() {
  case $1 in
    native) echo "$W/native" ;;
    host) echo "$MNT/host/bench" ;;
    memory) echo "$MNT/mem" ;;
    sqlite) echo "$MNT/db" ;;
  esac
}

ROWS=(create stat lslr delete untar grep rmtree seqwrite seqread)
for target in "${TARGETS[@]}"; do
  dir=$(dir_of "$target")
  for row in "${ROWS[@]}"; do : > "$W/times.$target.$row"; done
  for _ in $(seq "$RUNS"); do
    for row in create stat lslr delete untar grep rmtree seqwrite; do
      [[ $row == stat ]] && drop_caches
      [[ $row == grep ]] && (cd "$dir" && w_grep) >/dev/null 2>&1 # warm
      time_it "$dir" bash -c "w_$row" >> "$W/times.$target.$row"
    done
    drop_caches
    time_it "$dir" bash -c w_seqread >> "$W/times.$target.seqread"
    (cd "$dir" && w_cleanup)
  done
  for row in "${ROWS[@]}"; do RESULT[$target.$row]=$(median < "$W/times.$target.$row"); done
done

printf '\n%-34s %10s %8s %8s %8s\n' "workload (median of $RUNS)" "native s" host memory sqlite
label() {
  case $1 in
    create) echo "create 10k 1 KiB files" ;; stat) echo "stat 10k files, cold" ;;
    lslr) echo "ls -lR over 10k files" ;; delete) echo "delete 10k files" ;;
    untar) echo "untar 7.6k-file tree + sync" ;; grep) echo "grep -r, warm" ;;
    rmtree) echo "rm -rf the 7.6k-file tree" ;; seqwrite) echo "512 MiB write + fsync (x slower)" ;;
    seqread) echo "512 MiB read, cold (x slower)" ;;
  esac
}
for row in "${ROWS[@]}"; do
  n=${RESULT[native.$row]}
  printf '%-34s %10.3f' "$(label "$row")" "$n"
  for target in host memory sqlite; do
    printf ' %7.2fx' "$(echo "${RESULT[$target.$row]} / $n" | bc -l)"
  done
  printf '\n'
done
echo
echo "ratios are route time / native time (lower is better; 1.00x = native speed)"

# The agent tools against ripgrep over a 100k-file tree on the host route (warm cache): `grep`
# and `glob` called through the engine (examples/toolbench, no socket, engine built once) versus
# `rg -F` and `rg --files -g` on the same host directory. Ratio = tool time / rg time.
command -v rg >/dev/null || { apt-get update -qq && apt-get install -y -qq ripgrep; } >/dev/null
cargo build --release -q --example toolbench
TOOLBENCH=${CARGO_TARGET_DIR:-$PWD/target}/release/examples/toolbench
BIG=$W/host-root/big
LINES=$(for i in $(seq 1 40); do echo "    let x = $i;"; done)
for p in $(seq 1 50); do
  for m in $(seq 1 20); do
    mkdir -p "$BIG/pkg$p/mod$m"
    for f in $(seq 1 100); do
      printf 'fn f%s_%s_%s() {\n%s\n}\n' "$p" "$m" "$f" "$LINES" > "$BIG/pkg$p/mod$m/file$f.rs"
    done
  done
done
# Only the host route, so the tools and the mounted daemon do not share other stores.
cat > "$W/tools.toml" <<TOML
[default]
backend = "memory"
[[routes]]
path = "/host"
backend = "host"
root = "$W/host-root"
[[rules]]
operations = ["read", "write"]
paths = ["/**/.env", "/**/secrets/**"]
mode = "deny"
TOML
GREP_PATTERN='f17_3_7('
GLOB_PATTERN='*.rs'
: > "$W/times.rg.grep"; : > "$W/times.tool.grep"; : > "$W/times.rg.glob"; : > "$W/times.tool.glob"
rg -F "$GREP_PATTERN" "$BIG" >/dev/null # warm
for _ in $(seq "$RUNS"); do
  time_it "$W" rg -F "$GREP_PATTERN" "$BIG" >> "$W/times.rg.grep"
  "$TOOLBENCH" "$W/tools.toml" grep "{\"pattern\": \"$GREP_PATTERN\", \"path\": \"/host/big\"}" >> "$W/times.tool.grep"
  time_it "$W" rg --files -g "$GLOB_PATTERN" "$BIG" >> "$W/times.rg.glob"
  "$TOOLBENCH" "$W/tools.toml" glob "{\"pattern\": \"$GLOB_PATTERN\", \"path\": \"/host/big\"}" >> "$W/times.tool.glob"
done
printf '\n%-34s %10s %10s %8s\n' "tool vs ripgrep (median of $RUNS)" "rg s" "tool s" ratio
for row in grep glob; do
  r=$(median < "$W/times.rg.$row")
  t=$(median < "$W/times.tool.$row")
  case $row in
    grep) label="grep -F, 100k files, 1 match" ;;
    glob) label="glob '$GLOB_PATTERN', 100k files" ;;
  esac
  printf '%-34s %10.3f %10.3f %7.2fx\n' "$label" "$r" "$t" "$(echo "$t / $r" | bc -l)"
done
