"""What a new user meets on a board without the memory controller, and the prefetch helper's
end (issue 35 item 14), on a real cgroup2 kernel (kernel tier, in the guest):

- `governor bench` of a policy whose group has no memory controller (only pids here: no
  memory.peak, no memory.current) measures the engine's RSS instead (the seed's psutil
  sampler), and its CSV and text say so, instead of `peak ?` and `samples 0`;
- the prefetch helper of a launch is reaped as soon as it is done, while the engine (a server
  that runs for days) still runs: no zombie child of the governor.

Runs in the kernel guest: flock /tmp/governor-guest.lock scripts/test --tier kernel -k hygiene
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers.cgroups import ScratchSlice

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
ENGINE_MIB = 48
ZOMBIE_LIMIT_S = 10.0  # a reaped helper is gone within ms; before the fix it stayed for good

# a stand-in engine: 48 MiB of anonymous memory, touched, held a moment, exit 0
ENGINE = f"""
import time
block = bytearray({ENGINE_MIB} << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(3)
"""


def _policy(tmp_path: Path, slice_: ScratchSlice, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nslice = "{slice_.name}"\n' + textwrap.dedent(body))
    return path


def _governor(*args: str) -> list[str]:
    return [sys.executable, "-m", "governor", *args]


@pytest.mark.kernel(controllers=("pids",), root=True, psi=False)
def test_bench_without_the_memory_controller_samples_the_engine_rss(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    policy = _policy(tmp_path, scratch_slice, "norss", "[pids]\nmax = 64\n")
    engine = tmp_path / "engine.py"
    engine.write_text(ENGINE)
    out_csv, out_json = tmp_path / "b.csv", tmp_path / "b.json"
    res = subprocess.run(
        _governor(
            "bench", "--policy", str(policy), "--runs", "1", "--csv", str(out_csv),
            "--json", str(out_json), "--", sys.executable, str(engine),
        ),
        capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
    )  # fmt: skip
    print(res.stdout, res.stderr[-3000:])
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    group = scratch_slice.path / "norss"
    assert not (group / "memory.current").exists() or not group.exists()
    (row,) = list(csv.DictReader(out_csv.open()))
    assert row["exit_status"] == "0"
    assert (row["peak_source"], row["series_source"]) == ("rss samples", "rss")
    assert int(row["samples"]) >= 1
    assert int(row["peak_bytes"]) >= ENGINE_MIB * MIB  # the engine's anon memory, at least
    assert "no memory controller" in row["note"]
    (run,) = json.loads(out_json.read_text())["runs"]
    assert run["series"] and run["series_source"] == "rss"
    assert "(rss samples)" in res.stdout and "samples " in res.stdout
    assert "no memory controller" in res.stdout


def _state(pid: int) -> str:
    """The process's state letter (Z: a zombie), "gone" when /proc has no such pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _helper_pid(log: Path) -> int | None:
    """The prefetch helper's pid, from the launch's `prefetch.started` log line."""
    for line in log.read_text(errors="replace").splitlines():
        if '"prefetch.started"' in line:
            return int(json.loads(line)["pid"])
    return None


@pytest.mark.kernel(controllers=("pids",), root=True, psi=False)
def test_the_prefetch_helper_is_reaped_while_the_engine_runs(
    tmp_path: Path, scratch_slice: ScratchSlice
) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"\1" * (4 * MIB))
    policy = _policy(
        tmp_path,
        scratch_slice,
        "reap",
        f"""
        [pids]
        max = 64
        [prefetch]
        files = ["{model}"]
        mode = "populate"
        """,
    )
    stop, report, log = tmp_path / "stop", tmp_path / "report.json", tmp_path / "launch.log"
    engine = ["/bin/sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.2; done"]
    with log.open("w") as err:
        gov = subprocess.Popen(
            _governor("launch", "--policy", str(policy), "--report", str(report), "--", *engine),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        helper, zombie_since = None, None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert gov.poll() is None, log.read_text()[-3000:]  # the engine still runs
            helper = helper or _helper_pid(log)
            state = "?" if helper is None else _state(helper)
            if state == "gone":
                break  # exited AND reaped, the engine running on
            if state == "Z":
                zombie_since = zombie_since or time.monotonic()
                assert time.monotonic() - zombie_since < ZOMBIE_LIMIT_S, (
                    f"the prefetch helper {helper} stays a zombie while the engine runs"
                )
            time.sleep(0.05)
        else:
            pytest.fail(f"the prefetch helper {helper} did not finish: {log.read_text()[-3000:]}")
        assert gov.poll() is None
    finally:
        stop.touch()  # the engine ends; the launch cleans up before the slice's teardown
        code = gov.wait(timeout=300)
    assert code == 0, log.read_text()[-3000:]
    data = json.loads(report.read_text())
    assert data["prefetch_bytes"] == 4 * MIB, data
