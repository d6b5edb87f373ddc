#!/bin/bash
# The board install as a user types it on a fresh Debian 12 (as root; the docs show these lines):
# the wheel into a venv, a profile line that puts its bin/ on PATH and its share/ on
# XDG_DATA_DIRS (man and bash-completion find the pages and the completion there), then
# `governor install` for a policy. tests/install/test_board_install.py runs it in a fresh
# bookworm root file system; WHEELHOUSE (the wheel and its dependencies) stands in for PyPI.
# The wheel installed is always this repository's, by its path as the docs show it: from
# WHEELHOUSE, else built here from the checkout (REPO, default: two levels up). Never
# `pip install cgroup-governor` by name: that fetches whatever PyPI holds under the name.
set -euxo pipefail
WHEELHOUSE=${WHEELHOUSE:-}
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}

# --- the install (apt-get install python3-venv: the test's root file system has it already)
python3 -m venv /opt/governor
pip_from=()
if [ -n "$WHEELHOUSE" ]; then
    pip_from=(--no-index --find-links "$WHEELHOUSE")
    dist=$WHEELHOUSE
else
    dist=$(mktemp -d)
    /opt/governor/bin/pip wheel --no-deps --wheel-dir "$dist" "$REPO"
fi
wheels=("$dist"/cgroup_governor-*.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
    echo "board-install: want one cgroup_governor wheel in $dist, found: ${wheels[*]}" >&2
    exit 1
fi
/opt/governor/bin/pip install "${pip_from[@]}" "${wheels[0]}"
cat > /etc/profile.d/governor.sh <<'PROFILE'
export PATH=/opt/governor/bin:$PATH
export XDG_DATA_DIRS=/opt/governor/share:${XDG_DATA_DIRS:-/usr/local/share:/usr/share}
PROFILE
