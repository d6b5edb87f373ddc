#!/bin/bash
# The board install as a user types it on a fresh Debian 12 (as root; the docs show these lines):
# the wheel into a venv, a profile line that puts its bin/ on PATH and its share/ on
# XDG_DATA_DIRS (man and bash-completion find the pages and the completion there), then
# `governor install` for a policy. tests/install/test_board_install.py runs it in a fresh
# bookworm root file system; WHEELHOUSE (the wheel and its dependencies) stands in for PyPI.
set -euxo pipefail
WHEELHOUSE=${WHEELHOUSE:-}
pip_from=(); [ -n "$WHEELHOUSE" ] && pip_from=(--no-index --find-links "$WHEELHOUSE")

# --- the install (apt-get install python3-venv: the test's root file system has it already)
python3 -m venv /opt/governor
/opt/governor/bin/pip install "${pip_from[@]}" cgroup-governor
cat > /etc/profile.d/governor.sh <<'PROFILE'
export PATH=/opt/governor/bin:$PATH
export XDG_DATA_DIRS=/opt/governor/share:${XDG_DATA_DIRS:-/usr/local/share:/usr/share}
PROFILE
