#!/usr/bin/env bash
# Benchmarks: the same work on a plain host directory and through agentvfs's host, memory,
# sqlite and postgres routes (the last against a private local server this script starts), and through two peer FUSE filesystems installable by package name (Debian's
# `bindfs`, and libfuse's `passthrough_ll` example compiled from `libfuse3-dev`), all in one run
# (this machine's disk speed drifts between runs). Prints medians and ratios (route time / native
# time; for throughput rows, route MB/s / native MB/s), then the gate's cost with 1, 100 and
# 10,000 rules, the daemon's RSS after a `find` over many files, and the agent tools against
# ripgrep. Not a test: CI does not run it. Needs root (installs missing Debian packages).
# Usage: scripts/bench.sh [runs]   (RSS_FILES=N changes the size of the RSS tree, default 200000;
# BENCH_DIR=/some/dir runs on that directory's filesystem instead of /tmp's)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
RSS_FILES=${RSS_FILES:-200000}
cargo build --release -q
TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
BIN=$TARGET_DIR/release/agentvfs

# BENCH_DIR puts the work (native directory, host-route root, peers' roots) on another
# filesystem; see doc/performance.md for why the filesystem's state matters.
W=$(mktemp -d "${BENCH_DIR:-/tmp}/agentvfs-bench.XXXXXX")
MNT=$W/mnt
# Every mount this script makes, and the process serving it (same index): the trap unmounts
# them all (lazily if a plain unmount fails) and stops the processes, so no mount outlives it.
MOUNTS=()
PIDS=()
alive() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1; [[ $s != Z* ]]; }
stop_mount() {
  local mnt=$1 pid=$2
  mountpoint -q "$mnt" 2>/dev/null && { umount "$mnt" 2>/dev/null || true; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do alive "$pid" || break; sleep 0.05; done
  alive "$pid" && kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || true
  mountpoint -q "$mnt" 2>/dev/null && { umount -l "$mnt" 2>/dev/null || true; }
  return 0
}
cleanup() {
  local i
  for i in "${!MOUNTS[@]}"; do stop_mount "${MOUNTS[$i]}" "${PIDS[$i]}"; done
  if [[ -n ${PGW:-} ]]; then as_pg "$PG_BIN/pg_ctl" -D "$PGW/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$PGW"; fi
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM # so that the EXIT trap runs on a signal too

# Starts the server of one mount in the background (the command's last argument is the
# mountpoint) and waits until the mount is there; its pid is left in $LAST_PID.
start_mount() {
  local mnt=$1 log=$2; shift 2
  mkdir -p "$mnt"
  "$@" >"$log" 2>&1 &
  LAST_PID=$!
  MOUNTS+=("$mnt"); PIDS+=("$LAST_PID")
  for _ in $(seq 600); do
    mountpoint -q "$mnt" && return 0
    alive "$LAST_PID" || break
    sleep 0.05
  done
  echo "bench: mounting $mnt failed:" >&2; cat "$log" >&2; exit 1
}
start_agentvfs() { start_mount "$2" "$W/daemon.$(basename "$2").log" env RUST_LOG=warn "$BIN" mount --config "$1" "$2"; }

# The peers, by package name: Debian's bindfs, and libfuse's passthrough_ll example as
# libfuse3-dev ships it (fuse3 for fusermount3), compiled here; ripgrep, git, bc and fio too.
PKGS=()
command -v bindfs >/dev/null || PKGS+=(bindfs)
EXAMPLES=/usr/share/doc/libfuse3-dev/examples
{ ls "$EXAMPLES"/passthrough_ll.c* && pkg-config --exists fuse3 && command -v fusermount3; } >/dev/null 2>&1 ||
  PKGS+=(libfuse3-dev fuse3)
command -v rg >/dev/null || PKGS+=(ripgrep)
command -v git >/dev/null || PKGS+=(git)
command -v bc >/dev/null || PKGS+=(bc)
command -v fio >/dev/null || PKGS+=(fio)
command -v python3 >/dev/null || PKGS+=(python3)
compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || PKGS+=(postgresql)
if ((${#PKGS[@]})); then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${PKGS[@]}"; } >/dev/null
fi
for f in passthrough_ll.c passthrough_helpers.h; do
  if [[ -f $EXAMPLES/$f ]]; then cp "$EXAMPLES/$f" "$W/$f"; else zcat "$EXAMPLES/$f.gz" >"$W/$f"; fi
done
# shellcheck disable=SC2046
gcc -O2 -w -I"$W" -o "$W/passthrough_ll" "$W/passthrough_ll.c" $(pkg-config --cflags --libs fuse3)

# The postgres route's server: private (its own data directory, port and socket directory),
# run as the unprivileged `postgres` user, with the server's default durability (fsync on,
# synchronous_commit on), reached through its Unix socket.
as_pg() { setpriv --reuid postgres --regid postgres --init-groups -- "$@"; }
PG_BIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin | sort -V | tail -1)
PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Beside $W, which only root may enter.
PGW=$(mktemp -d /tmp/agentvfs-bench-pg.XXXXXX) && chown postgres: "$PGW"
as_pg "$PG_BIN/initdb" -D "$PGW/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
as_pg "$PG_BIN/pg_ctl" -D "$PGW/data" -l "$PGW/log" -w -o "-p $PG_PORT -k $PGW -c listen_addresses=''" start >/dev/null
PG_URL="postgresql://postgres@${PGW//\//%2F}:$PG_PORT/postgres"

mkdir -p "$W/native" "$W/host-root/bench" "$MNT" "$W/bindfs-root" "$W/ll-root"
cat > "$W/config.toml" <<TOML
socket = "$W/main.sock"
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
[[routes]]
path = "/pg"
backend = "postgres"
url = "$PG_URL"
[[rules]]
operations = ["read", "write"]
paths = ["/**/.env", "/**/secrets/**"]
mode = "deny"
TOML
start_agentvfs "$W/config.toml" "$MNT"
mkdir -p "$MNT/mem"
# Each peer over its own plain directory on the same disk as the native one, with the
# options it ships with (bindfs: single-threaded; passthrough_ll: multi-threaded, cache=auto).
start_mount "$W/mnt-bindfs" "$W/bindfs.log" bindfs -f "$W/bindfs-root" "$W/mnt-bindfs"
start_mount "$W/mnt-ll" "$W/ll.log" "$W/passthrough_ll" -f -o source="$W/ll-root" "$W/mnt-ll"

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

# A git repository of 10k committed files (500 directories x 20), for `git status` and
# `git add -A` (after changing 1,000 files and adding 1,000 new ones). Packed, as a clone is:
# passthrough_ll holds an open descriptor per inode the kernel knows, and 10k loose objects
# on top of the 10k files would pass this machine's limit of 20,000 (which root cannot raise).
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_CONFIG_COUNT=2 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*' \
  GIT_CONFIG_KEY_1=gc.auto GIT_CONFIG_VALUE_1=0
REPO=$W/repo
mkdir -p "$REPO"
for d in $(seq 0 499); do mkdir "$REPO/d$d"; done
for i in $(seq 1 10000); do printf 'line one of %s\nline two\n' "$i" > "$REPO/d$((i % 500))/f$i.txt"; done
(cd "$REPO" && git init -q && git add -A && git -c user.name=bench -c user.email=bench@localhost commit -qm init &&
  git gc -q)
tar -C "$REPO" -cf "$W/repo.tar" .
rm -rf "$REPO"

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
# Renames from one process (a shell loop would time 10k starts of mv).
w_rename() { perl -e 'for (1 .. 10000) { rename "c/f$_", "c/r$_" or die "c/f$_: $!\n" }'; }
w_unrename() { perl -e 'for (1 .. 10000) { rename "c/r$_", "c/f$_" or die "c/r$_: $!\n" }'; }
w_stat() { find c -type f -exec stat -c %s {} + >/dev/null; }
w_lslr() { ls -lR c >/dev/null; }
w_delete() { rm -rf c; }
w_untar() { mkdir t && tar -C t -xf "$W/tree.tar" && sync; }
w_grep() { grep -r "let x = 7;" t >/dev/null; }
w_rmtree() { rm -rf t; }
w_seqwrite() { dd if=/dev/zero of=big bs=1M count=1024 conv=fsync status=none; }
w_seqread() { dd if=big of=/dev/null bs=1M status=none; }
w_seqreadwarm() { dd if=big of=/dev/null bs=1M status=none; }
# 4 KiB buffered random writes over a 256 MiB file: the row's time is 65,536 writes at the
# IOPS fio measured (fio's own start-up and layout excluded).
w_randwrite() {
  fio --name=rw --filename=rw.dat --rw=randwrite --bs=4k --size=256M --ioengine=psync \
    --output-format=terse --terse-version=3 | awk -F';' '$49 > 0 {print 65536 / $49}' > "$W/rowtime"
  rm -f rw.dat
  [[ -s $W/rowtime ]]
}
# A small crate (20 modules, no dependencies), built from scratch.
w_cargosetup() {
  cargo new -q --vcs none cb && cd cb && for m in $(seq 1 20); do
    echo "mod m$m;" >> src/main.rs
    for f in $(seq 1 30); do echo "pub fn f$f(x: u64) -> u64 { x.wrapping_mul($f).rotate_left($m) }"; done > "src/m$m.rs"
  done
}
w_cargo() { cd cb && env -u CARGO_TARGET_DIR cargo build -q --offline; }
w_cargoclean() { rm -rf cb; }
w_cleanup() { rm -f big; }
w_gitsetup() { mkdir g && tar -C g -xf "$W/repo.tar" && cd g && git status >/dev/null; }
w_gitstatus() { cd g && git status >/dev/null; }
# The changes end a second before `git add` writes the index: git trusts a file's stat only
# when it was modified in an earlier second than the index was written (git built without
# USE_NSEC, as Debian's is), and re-reads the others at the next status. Without the pause,
# how many files that is depends on where a second boundary falls (0 to 2,000 in six runs of
# the same build), and the status row after the commit swung with it.
w_gitchange() {
  cd g && for i in $(seq 1 10 10000); do
    echo changed >> "d$((i % 500))/f$i.txt" && echo new > "d$((i % 500))/n$i.txt"
  done
  sleep 1
}
w_gitadd() { cd g && git add -A; }
# What an agent runs most: `git status` right after committing in the same tree.
w_gitcommit() { cd g && git -c user.name=bench -c user.email=bench@localhost commit -qm change; }
w_gitafter() { cd g && git status >/dev/null; }
w_gitclean() { rm -rf g; }
export -f w_create w_rename w_unrename w_stat w_lslr w_delete w_untar w_grep w_rmtree w_seqwrite w_seqread w_cleanup \
  w_gitsetup w_gitstatus w_gitchange w_gitadd w_gitcommit w_gitafter w_gitclean w_seqreadwarm w_randwrite w_cargosetup w_cargo \
  w_cargoclean
export W

# run TARGET DIR ROW: times w_ROW in DIR into times.TARGET.ROW; a failure is recorded (and
# shown as "fail" in the table) instead of stopping the run. Untimed steps pass ROW "-STEP".
declare -A FAILED
run() {
  local target=$1 dir=$2 row=$3 start end
  rm -f "$W/rowtime"
  start=$(date +%s.%N)
  if (cd "$dir" && bash -c "w_${row#-}") >/dev/null 2>"$W/err"; then
    end=$(date +%s.%N)
    # A workload that measures itself leaves its own time in $W/rowtime.
    if [[ -s $W/rowtime ]]; then cat "$W/rowtime" >> "$W/times.$target.$row"
    elif [[ $row != -* ]]; then echo "$end - $start" | bc -l >> "$W/times.$target.$row"; fi
  else
    FAILED[$target.${row#-}]=1
    echo "$target: w_${row#-} failed: $(head -c 300 "$W/err" | tr '\n' ' ')" >> "$W/failures"
  fi
}

declare -A RESULT
# BENCH_TARGETS picks a subset (native is always measured: every ratio needs it).
read -r -a TARGETS <<< "native ${BENCH_TARGETS:-host memory sqlite postgres bindfs ll}"
# BENCH_PARTS picks sections: main (the table), gate, floor, rss, tools.
PARTS=" ${BENCH_PARTS:-main gate floor rss tools} "
part() { [[ $PARTS == *" $1 "* ]]; }
dir_of() {
  case $1 in
    native) echo "$W/native" ;;
    host) echo "$MNT/host/bench" ;;
    memory) echo "$MNT/mem" ;;
    sqlite) echo "$MNT/db" ;;
    postgres) echo "$MNT/pg" ;;
    bindfs) echo "$W/mnt-bindfs" ;;
    ll) echo "$W/mnt-ll" ;;
  esac
}

ROWS=(create rename stat lslr delete untar grep rmtree seqwrite seqread seqreadwarm randwrite gitstatus gitadd gitafter cargo)
part main || TARGETS=()
for target in "${TARGETS[@]}"; do
  for row in "${ROWS[@]}"; do : > "$W/times.$target.$row"; done
done
# Each run goes through every target in turn, so they all meet the disk in a similar state
# (ext4 gets slower at creating files after many deletions, and the run deletes a lot).
for _ in $(seq "$RUNS"); do
  for target in "${TARGETS[@]}"; do
    dir=$(dir_of "$target")
    for row in create rename stat lslr delete untar grep rmtree seqwrite; do
      [[ $row == stat ]] && drop_caches
      [[ $row == grep ]] && run "$target" "$dir" -grep # warm
      run "$target" "$dir" "$row"
    done
    drop_caches
    run "$target" "$dir" seqread
    run "$target" "$dir" seqreadwarm
    run "$target" "$dir" -cleanup
    run "$target" "$dir" randwrite
    run "$target" "$dir" -cargosetup
    run "$target" "$dir" cargo
    run "$target" "$dir" -cargoclean
    run "$target" "$dir" -gitsetup # also warms the cache and refreshes the index
    [[ -n ${FAILED[$target.gitsetup]:-} ]] && FAILED[$target.gitstatus]=1 && FAILED[$target.gitadd]=1 &&
      FAILED[$target.gitafter]=1
    run "$target" "$dir" gitstatus
    run "$target" "$dir" -gitchange
    run "$target" "$dir" gitadd
    run "$target" "$dir" -gitcommit
    run "$target" "$dir" gitafter
    run "$target" "$dir" -gitclean
  done
done
for target in "${TARGETS[@]}"; do
  for row in "${ROWS[@]}"; do RESULT[$target.$row]=$(median < "$W/times.$target.$row"); done
done
# The peers and the main daemon are done: unmount them now (the trap would otherwise).
for i in "${!MOUNTS[@]}"; do stop_mount "${MOUNTS[$i]}" "${PIDS[$i]}"; done
MOUNTS=(); PIDS=()

# A row's name in the tables (the main one and the gate's).
label() {
  case $1 in
    create) echo "create 10k 1 KiB files" ;; rename) echo "rename 10k files" ;; stat) echo "stat 10k files, cold" ;;
    lslr) echo "ls -lR over 10k files" ;; delete) echo "delete 10k files" ;;
    untar) echo "untar 7.6k-file tree + sync" ;; grep) echo "grep -r, warm" ;;
    rmtree) echo "rm -rf the 7.6k-file tree" ;; seqwrite) echo "1 GiB write + fsync" ;;
    seqread) echo "1 GiB read, cold" ;; seqreadwarm) echo "1 GiB read, warm" ;;
    randwrite) echo "4 KiB random writes, 256 MiB" ;; cargo) echo "cargo build, 20-module crate" ;;
    gitstatus) echo "git status, 10k-file repo, warm" ;;
    gitadd) echo "git add -A, 1k changed + 1k new" ;;
    gitafter) echo "git status after add -A + commit" ;;
  esac
}
if part main; then
COLUMNS_SHOWN=("${TARGETS[@]:1}")
printf '\n%-34s %10s' "workload (median of $RUNS)" "native s"
for target in "${COLUMNS_SHOWN[@]}"; do printf ' %8s' "${target/#ll/pt_ll}"; done
printf '\n'
for row in "${ROWS[@]}"; do
  n=${RESULT[native.$row]}
  if [[ -z $n || -n ${FAILED[native.$row]:-} ]]; then printf '%-34s %10s' "$(label "$row")" fail
  else printf '%-34s %10.3f' "$(label "$row")" "$n"; fi
  for target in "${COLUMNS_SHOWN[@]}"; do
    v=${RESULT[$target.$row]}
    if [[ -z $v || -z $n || -n ${FAILED[$target.$row]:-} ]]; then printf ' %8s' fail
    else printf ' %7.2fx' "$(echo "$v / $n" | bc -l)"; fi
  done
  printf '\n'
done
echo
echo "ratios are route time / native time (lower is better; 1.00x = native speed);"
echo "bindfs = Debian bindfs $(bindfs --version 2>/dev/null | awk '{print $2; exit}'), pt_ll = libfuse $(pkg-config --modversion fuse3) example/passthrough_ll"
[[ -s $W/failures ]] && { echo "failures:"; sort -u "$W/failures" | sed 's/^/  /'; }
fi

if part gate; then
# The gate's cost: the same metadata work through the host route with 1, 100 and 10,000 rules
# whose patterns match nothing the workload touches, each count on a fresh daemon start. Half
# the rules lie inside the route (as a project's rules do) and hide what they match, so a
# directory's stat asks whether they reach beneath it; half may match anywhere, so every
# rename asks whether they change what the moved entry carries.
GATE_ROOT=$W/gate-root
mkdir -p "$GATE_ROOT"
(cd "$GATE_ROOT" && w_create) >/dev/null
gate_config() {
  cat <<TOML
socket = "$W/gate.sock"
[default]
backend = "memory"
[[routes]]
path = "/host"
backend = "host"
root = "$GATE_ROOT"
TOML
  awk -v n="$1" 'BEGIN { for (i = 1; i <= n; i++)
    if (i % 2) printf "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/host/nomatch/%d/**\"]\nmode = \"deny\"\n", i
    else printf "[[rules]]\noperations = [\"write\"]\npaths = [\"/**/x%d.secret\"]\nmode = \"deny\"\n", i }'
}
GATE_COUNTS=(1 100 10000)
GATE_ROWS=(stat rename untar)
for n in "${GATE_COUNTS[@]}"; do
  gate_config "$n" > "$W/gate-$n.toml"
  start_agentvfs "$W/gate-$n.toml" "$W/gmnt"
  for row in "${GATE_ROWS[@]}"; do : > "$W/times.gate$n.$row"; done
  for _ in $(seq "$RUNS"); do
    drop_caches
    run "gate$n" "$W/gmnt/host" stat
    run "gate$n" "$W/gmnt/host" rename
    run "gate$n" "$W/gmnt/host" -unrename
    run "gate$n" "$W/gmnt/host" untar
    run "gate$n" "$W/gmnt/host" -rmtree
  done
  stop_mount "$W/gmnt" "$LAST_PID"
  for row in "${GATE_ROWS[@]}"; do RESULT[gate$n.$row]=$(median < "$W/times.gate$n.$row"); done
done
printf '\n%-34s %10s %10s %10s %8s %8s\n' "gate cost, host route (median of $RUNS)" "1 rule s" "100 s" \
  "10k s" "100/1" "10k/1"
for row in "${GATE_ROWS[@]}"; do
  one=${RESULT[gate1.$row]}
  printf '%-34s' "$(label "$row")"
  for n in "${GATE_COUNTS[@]}"; do
    v=${RESULT[gate$n.$row]}
    if [[ -z $v || -n ${FAILED[gate$n.$row]:-} ]]; then printf ' %10s' fail; else printf ' %10.3f' "$v"; fi
  done
  for n in 100 10000; do
    v=${RESULT[gate$n.$row]}
    if [[ -z $v || -z $one ]]; then printf ' %8s' -; else printf ' %7.2fx' "$(echo "$v / $one" | bc -l)"; fi
  done
  printf '\n'
done
echo "rule i: /host/nomatch/<i>/** (deny read+write) for odd i, /**/x<i>.secret (deny write) for even i; none match the workload"

fi

if part floor; then
# One round trip's cost: calls the kernel always sends to the daemon (statvfs; stat of a name
# never seen), on the native directory and through the host route, with the caller free to
# move between CPUs and pinned to one. The difference is what any request costs before the
# daemon does its work; every row of the main table pays it per request (doc/performance.md).
mkdir -p "$W/rt-root/probe" "$W/native-probe"
cat > "$W/rt.toml" <<TOML
socket = "$W/rt.sock"
[default]
backend = "memory"
[[routes]]
path = "/host"
backend = "host"
root = "$W/rt-root"
TOML
start_agentvfs "$W/rt.toml" "$W/rtmnt"
RT=scripts/bench/round-trip.py
read -r NS NM < <(python3 "$RT" "$W/native-probe")
read -r HS HM < <(python3 "$RT" "$W/rtmnt/host/probe")
read -r PS PM < <(taskset -c 0 python3 "$RT" "$W/rtmnt/host/probe")
stop_mount "$W/rtmnt" "$LAST_PID"
printf '\n%-34s %10s %10s %10s %10s\n' "round trip, host route (us/call)" native host "host, 1 CPU" "extra"
printf '%-34s %10.2f %10.2f %10.2f %10.2f\n' "statvfs (always sent)" "$NS" "$HS" "$PS" "$(echo "$HS - $NS" | bc -l)"
printf '%-34s %10.2f %10.2f %10.2f %10.2f\n' "stat of a missing name (LOOKUP)" "$NM" "$HM" "$PM" "$(echo "$HM - $NM" | bc -l)"
HALT_POLL=/sys/module/haltpoll/parameters/guest_halt_poll_ns
[[ -r $HALT_POLL ]] && echo "this VM's guest halt-polling: guest_halt_poll_ns = $(cat "$HALT_POLL") (0 = off; see doc/performance.md)"
echo "host, 1 CPU = the caller pinned to CPU 0; extra = host - native"

fi

if part rss; then
# The daemon's memory: RSS (VmRSS) of a fresh daemon, after untarring RSS_FILES empty files onto
# its memory route, and after a `find` over them with a cold kernel cache (the kernel has
# forgotten the inodes, so the daemon should have released what it kept for them). The tree
# is streamed by scripts/bench/empty-tar.py, because creating it on disk first is slow here.
cat > "$W/rss.toml" <<TOML
socket = "$W/rss.sock"
[default]
backend = "memory"
TOML
start_agentvfs "$W/rss.toml" "$W/rmnt"
rss_mib() { awk '/^VmRSS:/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
RSS0=$(rss_mib "$LAST_PID")
start=$(date +%s.%N)
python3 scripts/bench/empty-tar.py "$RSS_FILES" | tar -C "$W/rmnt" -xf -
T_FILL=$(echo "$(date +%s.%N) - $start" | bc -l)
RSS1=$(rss_mib "$LAST_PID")
drop_caches
start=$(date +%s.%N)
FOUND=$(find "$W/rmnt" -type f -printf '%s %p\n' | wc -l) # %s stats, so every file is looked up
T_FIND=$(echo "$(date +%s.%N) - $start" | bc -l)
RSS2=$(rss_mib "$LAST_PID")
stop_mount "$W/rmnt" "$LAST_PID"
printf '\n%-34s %10s %10s %10s %10s\n' "daemon RSS, memory route" files "fresh MiB" "filled MiB" \
  "find MiB"
printf '%-34s %10s %10s %10s %10s\n' "find over a tree of empty files" "$FOUND" "$RSS0" "$RSS1" "$RSS2"
printf 'untar took %.1f s, the cold find %.1f s\n' "$T_FILL" "$T_FIND"

fi

if part tools; then
# The agent tools against ripgrep over a 100k-file tree on the host route (warm cache): `grep`
# and `glob` called through the engine (examples/toolbench, no socket, engine built once) versus
# `rg -F` and `rg --files -g` on the same host directory. Ratio = tool time / rg time.
cargo build --release -q --example toolbench
TOOLBENCH=$TARGET_DIR/release/examples/toolbench
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
fi
