"""A tune that ends up changing nothing is still a fact about the slice: refused by a guard, or
reverted after an OOM kill during the change. Both are journaled without changes (status shows
them; rollback and the monitor skip them) and counted by governor_tunes_total{result}. A dry
run that a guard would refuse journals nothing.

Needs: a tmp directory (a fake tree from the rk3588 fixture)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.api import host as api_host
from governor.api import operate as api_operate
from governor.api import tune as api_tune
from governor.errors import BackendError, PolicyError
from governor.kernel import files as kf
from governor.kernel.cgroupfs import CgroupFs
from governor.metrics.export import exposition
from governor.operate.status import collect, render
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher

M = 1 << 20
HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


@pytest.fixture
def slice_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """`governor apply`'s slice "st" on a fake tree: (its group dir, the run dir)."""
    cg = tmp_path / "cg"
    shutil.copytree(HOSTS / "rk3588" / "sys" / "fs" / "cgroup", cg)
    policy = tmp_path / "st.toml"
    policy.write_text('name = "st"\n[memory]\nhigh = "1G"\nmax = "1536M"\n')
    plan = api_host.check(policy, api_host.HostOptions(root=HOSTS / "rk3588", cgroup_root=cg))
    group = cg / plan.group
    group.mkdir(parents=True)
    controllers = (cg / "cgroup.controllers").read_text()
    for d in (cg, group.parent, group):  # what apply leaves: every controller enabled down
        (d / "cgroup.subtree_control").write_text(controllers if d != group else "")
    for d in (group.parent, group):
        (d / "cgroup.controllers").write_text(controllers)
    for w in plan.writes:
        (group / w.file).write_text(w.value + "\n")
    (group / kf.MEMORY_CURRENT).write_text(f"{512 * M}\n")
    (group / kf.MEMORY_MIN).write_text("0\n")
    (group / kf.MEMORY_EVENTS).write_text("oom_kill 0\n")
    run = tmp_path / "run"
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    Publisher(run, "st").publish(
        {"policy": "st", "source": "apply", "pid": None, "plan": plan.to_dict()}
    )
    yield group, run


def _tunes(run: Path, result: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(exposition(run, "st").decode()):
        for s in fam.samples:
            if s.name == "governor_tunes_total" and s.labels["result"] == result:
                return s.value
    raise AssertionError(f"no governor_tunes_total{{result={result!r}}}")


def test_a_refused_tune_is_journaled_and_counted_and_a_refused_dry_run_is_not(
    slice_: tuple[Path, Path],
) -> None:
    group, run = slice_
    with pytest.raises(PolicyError, match=r"below memory\.current"):
        api_tune.tune("st", ("memory.high=150M", "memory.max=200M"), dry_run=True, force=False)
    assert Journal(run / "st").entries() == []
    with pytest.raises(PolicyError, match=r"below memory\.current"):
        api_tune.tune("st", ("memory.high=150M", "memory.max=200M"), dry_run=False, force=False)
    (entry,) = Journal(run / "st").entries()
    assert (entry["source"], entry["changes"]) == ("tune-refused", [])
    assert {"file": kf.MEMORY_MAX, "new": str(200 * M)} in entry["asked"]
    assert "below memory.current" in entry["error"]
    assert (group / kf.MEMORY_MAX).read_text().strip() == str(1536 * M)
    text = render(collect(run, "st"))
    assert "tune-refused: memory.max 209715200 is below" in text, text
    assert _tunes(run, "refused") == 1 and _tunes(run, "applied") == 0
    # a later tune and its rollback do not see the refusal as something to undo
    api_tune.tune("st", ("memory.high=900M",), dry_run=False, force=False)
    api_operate.rollback("st", to=None, everything=False)
    assert (group / kf.MEMORY_HIGH).read_text().strip() == str(1 << 30)


def test_a_tune_reverted_after_an_oom_kill_is_journaled_and_counted(
    slice_: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    group, run = slice_
    kills = iter([0, 1])  # before the change, after it: an OOM kill happened meanwhile
    monkeypatch.setattr(CgroupFs, "memory_events", lambda _s, _g: {"oom_kill": next(kills)})
    with pytest.raises(BackendError, match="reverted"):
        api_tune.tune("st", ("memory.high=900M",), dry_run=False, force=False)
    monkeypatch.setattr(CgroupFs, "memory_events", lambda _s, _g: {"oom_kill": 1})
    assert (group / kf.MEMORY_HIGH).read_text().strip() == str(1 << 30)
    (entry,) = Journal(run / "st").entries()
    assert (entry["source"], entry["changes"]) == ("tune-reverted", [])
    assert _tunes(run, "reverted") == 1 and _tunes(run, "applied") == 0


def test_rollback_with_nothing_to_undo_is_66_with_a_journal_hint(
    slice_: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to roll back is a missing input (66), not an invalid policy (65): the hint
    points at the journal, not at `governor schema`; nothing is written or journaled."""
    from governor.cli.app import main

    group, run = slice_
    for argv, left in (
        (["rollback", "st"], "no tune left to undo"),
        (["rollback", "st", "--all"], "no change left to undo"),
        (["rollback", "st", "--to", "0"], "no change after journal entry 0"),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 66, argv
        err = capsys.readouterr().err.splitlines()
        assert (
            err[0]
            == f"governor: nothing to roll back for st: {left} ({run / 'st' / 'journal.jsonl'})"
        )
        assert err[1].startswith("hint: `governor status st` shows the journal"), err
        assert "schema" not in err[1]
    assert Journal(run / "st").entries() == []
    assert (group / kf.MEMORY_HIGH).read_text().strip() == str(1 << 30)


def test_a_tune_lists_and_writes_only_the_files_whose_value_changes(
    slice_: tuple[Path, Path],
) -> None:
    """Routing (governor/operate/tune/route.py): a key already at its compiled value is no
    change; the dry run shows each change with the kernel's value and its way (cgroupfs here:
    no systemd); a tune to the values in force journals nothing."""
    group, run = slice_
    out = api_tune.tune("st", ("memory.high=1G", "memory.max=1200M"), dry_run=True, force=False)
    assert out == {
        "policy": "st",
        "dry_run": True,
        "changes": [
            {
                "file": kf.MEMORY_MAX,
                "kernel": str(1536 * M),
                "new": str(1200 * M),
                "via": "cgroupfs",
            }
        ],
    }
    same = api_tune.tune("st", ("memory.high=1G",), dry_run=False, force=False)
    assert same == {"policy": "st", "dry_run": False, "changes": []}
    assert Journal(run / "st").entries() == []
    assert (group / kf.MEMORY_MAX).read_text().strip() == str(1536 * M)
