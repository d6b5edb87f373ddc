"""The gatherer of the board's claims (governor/board/scan.py, issue 36) on fixture trees:
a run directory with published states, an install root with manifests, a /proc/meminfo and a
cgroup tree with memory.current."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from governor.board.budget import GIB, MIB, reserve_for
from governor.board.scan import scan as gather
from governor.plan.model import Plan
from governor.rundir.state import Publisher, applied

MEMTOTAL_KB = 2 * 1024 * 1024  # a 2 GiB board
GOLDEN = Path(__file__).resolve().parents[2] / "golden/plans/base@rk3588.json"


def plan_dict(name: str, cls: str, **limits: object) -> dict[str, Any]:
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
    """An applied slice: its state, and its group in ``cg`` (an apply state holds while its
    cgroup exists)."""
    plan = {**plan, "cgroup_root": str(cg)}
    Publisher(run, plan["policy"]).publish(
        applied(Plan.from_dict(plan), policy_path=None, created=[], started_at=1.0)
    )
    (cg / plan["group"]).mkdir(parents=True)
    if current is not None:
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
    by = {c.name: c for c in got.slices}
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
    state = applied(Plan.from_dict(plan), policy_path=None, created=[], started_at=1.0).to_json()
    state.update(source="launch", pid=1, model={"model": "m", "quant": "q", "total": 700 * MIB})
    Publisher(run, "chat").publish(state)
    proc = root / "proc/1"
    proc.mkdir()
    (proc / "cmdline").write_bytes(b"python\0-m\0governor\0launch\0")
    (c,) = gather(run=run, cgroup_root=cg, root=root).slices
    assert (c.peak, c.peak_source, c.current) == (700 * MIB, "estimate", None)
    (proc / "cmdline").write_bytes(b"sleep\0")  # the pid is not a governor any more: stale
    assert gather(run=run, cgroup_root=cg, root=root).slices == ()


def test_unreadable_states_and_manifests_are_skipped_with_their_reason(tmp_path: Path) -> None:
    root, cg, run = board(tmp_path)
    (run / "bad").mkdir()
    (run / "bad/state.json").write_text("{")
    installed = root / "etc/governor/installed"
    installed.mkdir(parents=True)
    (installed / "x.json").write_text('{"claim": {"policy": "x"}}')
    (installed / "old.json").write_text('{"policy": "old", "units": [], "files": []}')
    got = gather(run=run, cgroup_root=cg, root=root)
    assert got.slices == ()
    assert len(got.notes) == 2 and "x.json" in got.notes[1]
    (root / "proc/meminfo").unlink()
    assert gather(run=run, cgroup_root=cg, root=root).budget.memtotal == 0


# ------------------------------------------------------------------ issue 43 items 5-8


def test_a_claim_records_whether_a_stop_of_its_engine_frees_it(tmp_path: Path) -> None:
    """apply (no process: its memory.min stays), launch --keep (the group is published as
    applied when the engine ends), governor monitor (holds the state while the group is
    there) keep their claim after a stop; a plain launch's goes with its supervisor."""
    root, cg, run = board(tmp_path)
    publish(run, cg, plan_dict("applied", "background", min="104857600"))
    for name, extra in (
        ("kept", {"kept_by": "launch --keep"}),
        ("watched", {"source": "monitor"}),
        ("plain", {}),
    ):
        plan = {**plan_dict(name, "background", min="104857600"), "cgroup_root": str(cg)}
        state = applied(
            Plan.from_dict(plan), policy_path=None, created=[], started_at=1.0
        ).to_json()
        state.update(source="launch", pid=1, created=None, kept_by=None)
        state.update(extra)
        Publisher(run, name).publish({k: v for k, v in state.items() if v is not None})
        (cg / plan["group"]).mkdir(parents=True)
    (root / "proc/1").mkdir()
    (root / "proc/1/cmdline").write_bytes(b"python\0-m\0governor\0launch\0")
    by = {c.name: c.stays for c in gather(run=run, cgroup_root=cg, root=root).slices}
    assert by == {
        "applied": "apply",
        "kept": "launch --keep",
        "watched": "governor monitor",
        "plain": "",
    }


def test_an_applied_slice_whose_cgroup_is_gone_claims_nothing(tmp_path: Path) -> None:
    root, cg, run = board(tmp_path)
    publish(run, cg, plan_dict("batch", "background", min="104857600"))
    assert [c.name for c in gather(run=run, cgroup_root=cg, root=root).slices] == ["batch"]
    (cg / "governor.slice/batch").rmdir()
    assert gather(run=run, cgroup_root=cg, root=root).slices == ()


def test_a_manifest_with_a_negative_or_absurd_claim_is_skipped_with_its_reason(
    tmp_path: Path,
) -> None:
    """Issue 43 item 7: memory.min -1 TiB in a manifest gave "933 GiB of guarantees free" on a
    2 GiB board and admitted anything."""
    root, cg, run = board(tmp_path)
    installed = root / "etc/governor/installed"
    installed.mkdir(parents=True)
    bad: dict[str, dict[str, object]] = {
        "neg": {"min": -(1 << 40)},
        "flag": {"min": True},
        "float": {"max": 1.5e9},
        "huge": {"min": 64 * GIB},  # 32 x this 2 GiB board
        "dev": {"min": 0, "device": -5},
    }
    for name, limits in bad.items():
        claim = plan_dict(name, "standard", **{k: v for k, v in limits.items() if k != "device"})
        if "device" in limits:
            claim["device"] = {"memory": limits["device"]}
        (installed / f"{name}.json").write_text(
            json.dumps({"policy": name, "units": [], "files": [], "claim": claim})
        )
    got = gather(run=run, cgroup_root=cg, root=root)
    assert got.slices == ()
    assert len(got.notes) == len(bad)
    assert all(any(f"{n}" in p for p in got.notes) for n in bad)
    assert any("memory.min '-1099511627776' is not a size" in p for p in got.notes)
    assert any("more than 16 x this board's MemTotal" in p for p in got.notes)


def test_a_negative_manifest_claim_admits_nothing_it_would_not_admit_anyway(
    tmp_path: Path,
) -> None:
    from governor.board.budget import admit
    from governor.board.slice import QosClass, Slice
    from governor.operate.boardview import view

    root, cg, run = board(tmp_path)
    publish(run, cg, plan_dict("batch", "standard", min=str(1500 * MIB)))
    installed = root / "etc/governor/installed"
    installed.mkdir(parents=True)
    claim = plan_dict("neg", "standard", min=-(1 << 40))
    (installed / "neg.json").write_text(json.dumps({"policy": "neg", "claim": claim}))
    got = gather(run=run, cgroup_root=cg, root=root)
    free = view(got.budget, got.slices, (), got.notes)["free"]["guarantees"]
    assert free == got.budget.budget - 1500 * MIB  # not 933 GiB
    new = Slice(name="chat", cgroup="governor.slice/chat", qos=QosClass("standard"), min=600 * MIB,
                peak=600 * MIB, peak_source="max")  # fmt: skip
    assert admit(got.budget, new, got.slices).kind == "guarantees"


def test_unknown_board_keys_and_a_reserve_that_leaves_no_budget_are_told(tmp_path: Path) -> None:
    root, cg, run = board(tmp_path)
    f = tmp_path / "board.toml"
    f.write_text('[board]\nreserve = "512MiB"\nreserv = "1G"\n')
    got = gather(run=run, cgroup_root=cg, root=root, board=f)
    # the reserve is read all the same, the unknown key told as `check` tells it
    assert got.budget.reserve == 512 * MIB and got.no_budget is None
    assert got.notes == (f"unknown key ({f}, board.reserv)",)
    f.write_text('[board]\nreserve = "2GiB"\n')
    got = gather(run=run, cgroup_root=cg, root=root, board=f)
    assert got.budget.budget == 0
    assert got.no_budget == (
        f"the reserve (2048 MiB) leaves no budget on this board (MemTotal 2048 MiB)"
        f" ([board] reserve, {f})"
    )
