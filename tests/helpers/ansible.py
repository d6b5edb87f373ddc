"""Run a playbook with the real ansible-playbook against this machine (``-c local``), with
the repository as the collections path (``governor.board`` is ansible_collections/governor/board).

The play is written as JSON (which YAML reads); each step's registered result is saved by a
last task to a JSON file the test reads, so one ansible-playbook run covers a whole story.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
# the board's own Python runs the module (it needs nothing but the standard library)
BOARD_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def run_play(
    tmp: Path,
    tasks: list[dict[str, Any]],
    *,
    defaults: dict[str, Any],
    diff: bool = True,
    timeout: float = 600,
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run ``tasks`` (each with a ``register`` name) and return {name: result} and the run."""
    results = tmp / "results.json"
    names = [t["register"] for t in tasks if "register" in t]
    content = "{{ {" + ", ".join(f"'{n}': {n}" for n in names) + "} | to_json }}"
    dump = {  # raw: no module to ship and run (a guest under TCG pays seconds for each)
        "name": "save the results",
        "ansible.builtin.raw": f"cat > {results} <<'GOVERNOR_RESULTS'\n{content}\nGOVERNOR_RESULTS",
    }
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "module_defaults": {"governor.board.policy": defaults},
            "tasks": [*tasks, dump],
        }
    ]
    book = tmp / "play.yml"
    book.write_text(json.dumps(play, indent=1))
    home = tmp / "ansible-home"
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(REPO),
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_REMOTE_TEMP": str(home / "remote"),
        "ANSIBLE_NOCOLOR": "1",
        "LC_ALL": "C.UTF-8",  # ansible-core refuses a locale whose encoding is not UTF-8
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_PYTHON_INTERPRETER": BOARD_PYTHON,
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
    }
    argv = [str(PLAYBOOK), "-i", "localhost,", "-c", "local", str(book)]
    if diff:
        argv.append("--diff")
    run = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=tmp
    )
    assert results.exists(), f"the play did not finish:\n{run.stdout}\n{run.stderr}"
    return json.loads(results.read_text()), run
