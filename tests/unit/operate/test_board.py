"""The gatherer of the board's claims (governor/operate/board.py, issue 36) on fixture trees:
a run directory with published states, an install root with manifests, a /proc/meminfo and a
cgroup tree with memory.current."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from governor.operate.board import gather
from governor.plan.budget import GIB, MIB, reserve_for
from governor.rundir.state import Publisher, applied

MEMTOTAL_KB = 2 * 1024 * 1024  # a 2 GiB board
GOLDEN = Path(__file__).resolve().parents[2] / "golden/plans/base@rk3588.json"


def plan_dict(name: str, cls: str, **limits: str) -> dict[str, Any]:
    """A compiled plan (the rk3588 golden's) renamed, with these memory limits on its group."""
    plan: dict[str, Any] = json.loads(GOLDEN.read_text())
    group = f"governor.slice/{name}"
    plan.update(policy=name, group=group, leaf=f"{group}/engine")
    plan["writes"] = [
        {"cgroup": group, "file": f"memory.{k}", "value": v, "reason": k, "controller": "memory"}
        for k, v in limits.items()
    ]
    plan["qos"] = {"qos_class": cls, "yields": ["throttle", "freeze", "stop", "kill"]}
    return plan


def board(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: {MEMTOTAL_KB} kB\nMemFree: 1 kB\n")
    cg = tmp_path / "cgroup"
    run = tmp_path / "run"
    run.mkdir()
    return root, cg, run


def publish(run: Path, cg: Path, plan: dict[str, Any], current: int | None = None) -> None:
    Publisher(run, plan["policy"]).publish(
        applied(plan, policy_path=None, created=[], started_at=1.0)
    )
    if current is not None:
        (cg / plan["group"]).mkdir(parents=True)
        (cg / plan["group"] / "memory.current").write_text(f"{current}\n")


def test_running_and_installed_claims_with_the_budget_and_the_board_files_reserve(
    tmp_path: Path,
) -> None:
    root, cg, run = board(tmp_path)
    publish(run, cg, plan_dict("batch", "background", min="104857600", max="524288000"),
            current=300 * MIB)  # fmt: skip
    installed = root / "etc/governor/installed"
    installed.mkdir(parents=True)
    manifest = {"policy": "tts", "units": [], "files": [],
                "claim": plan_dict("tts", "standard", min="209715200", high="314572800")}  # fmt: skip
    (installed / "tts.json").write_text(json.dumps(manifest))
    # an installed policy that runs now is counted once, as running
    (installed / "batch.json").write_text(json.dumps({**manifest, "policy": "batch",
        "claim": plan_dict("batch", "background", min="1")}))  # fmt: skip
    got = gather(run=run, cgroup_root=cg, root=root, board=tmp_path / "none.toml")
    assert got.budget.memtotal == 2 * GIB and got.budget.reserve == reserve_for(2 * GIB)
    by = {c.name: c for c in got.claims}
    assert set(by) == {"batch", "tts"}
    assert (by["batch"].min, by["batch"].peak, by["batch"].peak_source) == (
        100 * MIB,
        500 * MIB,
        "max",
    )
    assert (by["batch"].current, by["batch"].state, by["batch"].qos_class) == (
        300 * MIB,
        "running",
        "background",
    )
    assert (by["tts"].min, by["tts"].peak, by["tts"].peak_source, by["tts"].state) == (
        200 * MIB, 300 * MIB, "high", "installed")  # fmt: skip
    f = tmp_path / "board.toml"
    f.write_text('[board]\nreserve = "512MiB"\n')
    assert gather(run=run, cgroup_root=cg, root=root, board=f).budget.budget == 1536 * MIB


def test_the_published_estimate_is_the_peak_and_a_stale_state_is_no_claim(tmp_path: Path) -> None:
    root, cg, run = board(tmp_path)
    plan = plan_dict("chat", "interactive", min="104857600", max="1073741824")
    state = applied(plan, policy_path=None, created=[], started_at=1.0).to_json()
    state.update(source="launch", pid=1, model={"model": "m", "quant": "q", "total": 700 * MIB})
    Publisher(run, "chat").publish(state)
    proc = root / "proc/1"
    proc.mkdir()
    (proc / "cmdline").write_bytes(b"python\0-m\0governor\0launch\0")
    (c,) = gather(run=run, cgroup_root=cg, root=root).claims
    assert (c.peak, c.peak_source, c.current) == (700 * MIB, "estimate", None)
    (proc / "cmdline").write_bytes(b"sleep\0")  # the pid is not a governor any more: stale
    assert gather(run=run, cgroup_root=cg, root=root).claims == ()


def test_unreadable_states_and_manifests_are_skipped_with_their_reason(tmp_path: Path) -> None:
    root, cg, run = board(tmp_path)
    (run / "bad").mkdir()
    (run / "bad/state.json").write_text("{")
    installed = root / "etc/governor/installed"
    installed.mkdir(parents=True)
    (installed / "x.json").write_text('{"claim": {"policy": "x"}}')
    (installed / "old.json").write_text('{"policy": "old", "units": [], "files": []}')
    got = gather(run=run, cgroup_root=cg, root=root)
    assert got.claims == ()
    assert len(got.problems) == 2 and "x.json" in got.problems[1]
    (root / "proc/meminfo").unlink()
    assert gather(run=run, cgroup_root=cg, root=root).budget.memtotal == 0
