#!/bin/bash
# The full story with every limit in force; runs INSIDE the test guest (scripts/demo --guest):
# a real cgroup v2 kernel whose root cgroup.subtree_control starts empty.
set -u
cd "$(dirname "$0")/.."
PY=.venv/bin/python
gov() { "$PY" -m governor "$@"; }
W=/tmp/governor-guest-demo
mkdir -p "$W"
cat > "$W/toy.toml" <<'TOML'
name = "toy"
description = "a 300 MiB budget for the toy engine"
slice = "demo.slice"
[memory]
high = "260M"
max = "300M"
swap_max = "0"
oom_group = true
[cpu]
cpus = "1-2"
weight = 200
max = "150%"
[pids]
max = 64
[process]
oom_score_adj = 500
[engine]
kind = "llama.cpp"
max_context_tokens = 4096
TOML
head -c $((128 << 20)) /dev/urandom > "$W/model.bin"

echo "== governor doctor"
gov doctor
echo
echo "== governor plan $W/toy.toml"
gov plan "$W/toy.toml"
echo
echo "== launch that fits: 128 MiB model + -c 512 (96 MiB KV) under memory.max 300M"
gov launch --policy "$W/toy.toml" --report "$W/fits.json" -- \
    "$PY" examples/toy_engine.py -m "$W/model.bin" -c 512 --ms-per-token 20 2> >(grep -v '^{' >&2) &
gpid=$!
G=/sys/fs/cgroup/demo.slice/toy
# (cgroupfs files report size 0: test the content, not [ -s ])
for _ in $(seq 300); do [ -n "$(cat "$G/engine/cgroup.procs" 2>/dev/null)" ] && break; sleep 0.1; done
echo "-- read back from the kernel while the engine runs ($G):"
for f in memory.high memory.max memory.swap.max memory.oom.group cpuset.cpus cpu.weight cpu.max pids.max; do
    printf '   %-18s %s\n' "$f" "$(cat "$G/$f")"
done
printf '   %-18s %s\n' "root subtree_control" "$(cat /sys/fs/cgroup/cgroup.subtree_control)"
pid=$(head -1 "$G/engine/cgroup.procs")
printf '   %-18s %s\n' "engine cpus" "$(grep Cpus_allowed_list /proc/$pid/status | cut -f2)"
printf '   %-18s %s\n' "oom_score_adj" "$(cat /proc/$pid/oom_score_adj)"
wait $gpid; echo "-- exit status $?; report:"; cat "$W/fits.json"
echo
echo "== launch that does not fit: -c 2048 (384 MiB KV) under memory.max 300M"
sleep 600 & bystander=$!
gov launch --policy "$W/toy.toml" --report "$W/oom.json" -- \
    "$PY" examples/toy_engine.py -m "$W/model.bin" -c 2048 --ms-per-token 0 2> >(grep -v '^{' >&2)
rc=$?
echo "-- governor exit status $rc (137 = SIGKILL by the OOM killer); report:"
cat "$W/oom.json"
if kill -0 "$bystander" 2>/dev/null; then echo "-- a process outside the slice is still alive: the OOM stayed inside"; fi
kill "$bystander"
ls -d /sys/fs/cgroup/demo.slice 2>/dev/null && echo "!! slice left behind" || echo "-- slice removed"
