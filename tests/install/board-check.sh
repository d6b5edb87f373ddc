# Sourced by an interactive login shell (bash -lic) after board-install.sh: what a user sees.
set -u
echo "== help"; governor --help | head -3
echo "== man -w"; man -w governor governor.toml
echo "== man1"; MANPAGER=cat MANWIDTH=100 man governor | head -12
echo "== man5"; MANPAGER=cat MANWIDTH=100 man governor.toml | grep -m1 -A3 '^\[MEMORY\]'
# a TAB: bash-completion's -D loader finds share/bash-completion/completions/governor
_completion_loader governor
echo "== complete"; complete -p governor
mkdir -p /tmp/work/sub /run/governor/npu-chat && cd /tmp/work && : > chat.toml && : > notes.txt
tab() { COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=(); _governor_completion governor
        echo "tab $*: ${COMPREPLY[*]}"; }
tab governor sta
tab governor status ""
tab governor check ""
echo "== install"; mkdir -p /tmp/board
governor --root /tmp/hosts/cgroup2-full install /tmp/policies/dev-box.toml --root /tmp/board >/dev/null 2>&1
echo "install rc=$?"
grep -h '^ExecStart=/' /tmp/board/etc/systemd/system/governor@.service
