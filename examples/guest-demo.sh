#!/bin/bash
# The full story with every limit in force; runs INSIDE the test guest (scripts/demo --guest):
# a real cgroup v2 kernel (2 GiB RAM, TCG: llama.cpp is ~100x slower than on the host) whose
# root cgroup.subtree_control starts empty. The real llama.cpp and the synthetic 1.1 GiB model
# come from the host's engine cache (scripts/engine-setup), seen through the guest's overlay.
set -u
cd "$(dirname "$0")/.."
PY=$PWD/.venv/bin/python
gov() { "$PY" -m governor "$@"; }
step() { printf '\n== %s\n' "$*"; }
E=${GOVERNOR_ENGINE_CACHE:-/var/lib/governor/engine}
ENGINE=$E/bin/llama-completion
MODEL=$E/models/qwen18b.gguf
TINY=$E/models/tiny.gguf
W=/tmp/governor-guest-demo
mkdir -p "$W"
board="$(awk '/^MemTotal/ {print $2}' /proc/meminfo)K"

step "governor doctor"
gov doctor

step "governor estimate $(basename "$MODEL") --budget $board (MemTotal; no -c: n_ctx_train)"
gov estimate "$MODEL" --budget "$board"

step "governor init --model $(basename "$MODEL")   (repack on: refused)"
gov init --model "$MODEL" > /dev/null
echo "-> exit $? (65: does not fit at any context; the hint names the fix)"

step "governor init --model $(basename "$MODEL") --engine-argv '... -nr' --name chat -o $W/chat.toml"
gov init --model "$MODEL" --engine-argv "$ENGINE -nr" --name chat -o "$W/chat.toml" --force || exit 1
sed -n '/^\[\[pressure/q; /^#/d; /^$/d; p' "$W/chat.toml" | sed 's/^/   /'
ARGV=$("$PY" -c 'import shlex,sys; w=shlex.split(sys.argv[1][1:]); print(w[w.index("--engine-argv")+1])' \
    "$(grep '^#   governor check ' "$W/chat.toml")")
read -r -a engine <<< "$ARGV"

step "governor check chat.toml --engine-argv '$ARGV'"
gov check "$W/chat.toml" --engine-argv "$ARGV" || exit 1

step "governor launch --policy chat.toml -- ${engine[*]} -p hi -n 2   (cold page cache)"
sync; echo 3 > /proc/sys/vm/drop_caches
gov launch --policy "$W/chat.toml" --report "$W/chat.json" --sample-interval 0.2 -- \
    "${engine[@]}" -p "hi" -n 2 -no-cnv --ignore-eos -lv 4 \
    > "$W/engine.out" 2> "$W/engine.log" &
gpid=$!
G=/sys/fs/cgroup/governor.slice/chat
# (cgroupfs files report size 0: test the content, not [ -s ])
for _ in $(seq 600); do [ -n "$(cat "$G/engine/cgroup.procs" 2>/dev/null)" ] && break; sleep 0.1; done
sleep 20  # into the model load
echo "-- read back from the kernel while llama.cpp loads ($G):"
for f in memory.min memory.high memory.max memory.swap.max memory.oom.group memory.current; do
    printf '   %-18s %s\n' "$f" "$(cat "$G/$f" 2>/dev/null)"
done
printf '   %-18s %s\n' "anon / file" "$(awk '$1=="anon"||$1=="file" {printf "%s %d MiB  ", $1, $2/1048576}' "$G/memory.stat" 2>/dev/null)"
pid=$(head -1 "$G/engine/cgroup.procs" 2>/dev/null)
[ -n "$pid" ] && printf '   %-18s %s\n' "oom_score_adj" "$(cat /proc/"$pid"/oom_score_adj)"
wait $gpid; rc=$?
echo "-- governor exit status $rc; report:"
"$PY" examples/demo_report.py "$W/chat.json" "$W/engine.log" "$W/chat.toml"

step "what memory.max does: the tiny model with -lm none (weights as anonymous memory) under max 16MiB"
gov init --model "$TINY" --name tiny -o "$W/tiny.toml" --force > /dev/null || exit 1
sed -i -e '/^high = /d' -e 's/^max = .*/max = "16MiB"/' "$W/tiny.toml"
sleep 600 & bystander=$!
gov launch --policy "$W/tiny.toml" --force --report "$W/oom.json" -- "$ENGINE" -m "$TINY" \
    -c 2048 -lm none -p hello -n 64 -no-cnv --ignore-eos > /dev/null 2> "$W/oom.log"
rc=$?
echo "-- governor exit status $rc (137 = SIGKILL by the OOM killer, inside the slice):"
"$PY" examples/demo_report.py "$W/oom.json" "$W/oom.log" "$W/tiny.toml" | grep -E 'exit|peak|events'
if kill -0 "$bystander" 2>/dev/null; then echo "-- a process outside the slice is still alive: the OOM stayed inside"; fi
kill "$bystander"
ls -d /sys/fs/cgroup/governor.slice/tiny 2>/dev/null && echo "!! slice left behind" || echo "-- slice removed"
