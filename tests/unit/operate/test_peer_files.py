"""Files other processes write are read bounded (issue 43 item 3, governor/peer/files.py): a
state.json that is a FIFO, a symlink to /dev/zero or larger than its cap; an install manifest,
the board file, a journal or the clock ledger that is one of those: `governor status`, `board`,
`top`, `metrics`, an admission and the shedder's victim scan each finish (no hang, no
MemoryError) and name the file, while the other slices are read as before.

Needs: a tmp directory (a copy of the rk3588 fixture's cgroup tree)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from governor.api.admit import admission
from governor.board.scan import scan as gather
from governor.cli.app import main
from governor.kernel.cgroupfs import CgroupFs
from governor.monitor.actions.shedder import Shedder
from governor.operate.status import collect
from governor.rundir.clocks import Ledger
from governor.rundir.journal import Journal
from governor.rundir.state import STATE_MAX, Publisher, scan_states

from .test_corrupt_rundir import HOSTS, _good_state, _plans

BIG = 64 << 20  # a state of 64 MiB: 2000 times the largest real one (rundir/state.py)
TIMEOUT = 60  # a FIFO read by a regression hangs: the test fails instead of hanging CI


pytestmark = pytest.mark.usefixtures("memory_cap")  # tests/unit/conftest.py


def _make(path: Path, kind: str) -> str:
    """Put a ``kind`` of peer file at ``path``; what the reader says of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking open hangs
        return "a FIFO, not a file"
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")  # read to EOF: never ends, takes the memory
        return "a device, not a file"
    if kind == "symlink":
        path.symlink_to("/dev/zero")
        return "a symlink (not followed)"
    with path.open("wb") as f:  # sparse: its size says it all
        f.truncate(BIG)
    return f"{BIG} bytes, over its cap of {STATE_MAX}"


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("kind", ["fifo", "symlink", "oversized"])
def test_a_fifo_symlinked_or_oversized_state_is_skipped_by_every_reader_naming_it(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state is a file the governor writes (temp file + rename): a symlink there, even to a
    real file, is not one of its states and is not followed (to /dev/zero here)."""
    run = tmp_path / "run"
    plans = _plans(tmp_path)
    Publisher(run, "good").publish(_good_state(plans["good"]))
    path = run / "bad" / "state.json"
    problem = _make(path, kind)

    states, errors = scan_states(run)
    assert [s.policy for s in states] == ["good"]
    assert [str(e) for e in errors] == [f"{path}: cannot read it ({problem})"]
    assert [it["policy"] for it in collect(run)] == ["good"]
    # the shedder's scan at each firing, inside a running engine's monitor
    shedder = plans["chat"]
    cg = tmp_path / "cg"
    assert [v.name for v in Shedder(CgroupFs(cg), shedder, run=run, own_cgroup="").victims()] == [
        "good"
    ]
    # the admission's read of the board (the gatherer) and an admission itself
    seen = gather(run=run, cgroup_root=cg, root=HOSTS / "rk3588")
    assert [c.name for c in seen.slices] == ["good"]
    assert f"{path}: cannot read it ({problem})" in seen.notes
    admission(shedder, run=run, root=HOSTS / "rk3588", hold=False, act=False).release()

    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    opts = ["--root", str(HOSTS / "rk3588"), "--cgroup-root", str(cg)]
    for argv in (["status"], ["board"], ["top", "-b", "-n", "1"], ["metrics"]):
        with pytest.raises(SystemExit) as exit_:
            main([*opts, *argv])
        out, err = capsys.readouterr()
        assert exit_.value.code in (0, None), (argv, out, err)
        assert "Traceback" not in err, (argv, err)
        if argv[0] != "metrics":
            assert "good" in out, (argv, out)
        if argv[0] == "board":
            assert f"skipped: {path}: cannot read it ({problem})" in out.splitlines()
    with pytest.raises(SystemExit) as exit_:
        main([*opts, "status", "bad"])
    assert exit_.value.code == 66
    assert capsys.readouterr().err.startswith(
        f"governor: the state of bad is not readable: cannot read it ({problem}) ({path})\n"
    )


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_fifo_or_dev_zero_manifest_and_board_file_are_skipped_by_board_naming_them(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc/meminfo").write_text("MemTotal: 2097152 kB\n")
    manifest = root / "etc/governor/installed/peer.json"
    board = tmp_path / "board.toml"
    said = _make(manifest, kind)
    _make(board, kind)
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("GOVERNOR_BOARD", str(board))
    seen = gather(run=run, cgroup_root=tmp_path / "cg", root=root)
    assert seen.slices == ()
    assert seen.notes == (
        f"cannot read the board file: {said} ({board})",
        f"{manifest}: {'a symlink (not followed)' if kind == 'dev-zero' else said}",
    )
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(root), "--cgroup-root", str(tmp_path / "cg"), "board"])
    out, err = capsys.readouterr()
    assert exit_.value.code in (0, None), err
    assert f"skipped: {manifest}: " in out and f"skipped: cannot read the board file: {said}" in out
    # `governor check BOARD` reads exactly that file: one line, 65
    with pytest.raises(SystemExit) as exit_:
        main(["check", str(board)])
    assert exit_.value.code in (65, 66)
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_install_refuses_a_fifo_or_dev_zero_manifest_in_one_line(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "dest"
    manifest = dest / "etc/governor/installed/chat.json"
    _make(manifest, kind)
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    policy = tmp_path / "chat.toml"
    policy.write_text('name = "chat"\n')
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(HOSTS / "rk3588"), "install", str(policy), "--root", str(dest)])
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 65, err
    assert (
        err[0]
        == (
            "governor: existing file is a symlink (not followed); not replacing it"
            if kind == "dev-zero"
            else "governor: existing file is a FIFO, not a file; not replacing it"
        )
        + f" ({manifest})"
    )
    assert err[1].startswith("hint: ")


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_fifo_or_dev_zero_journal_and_ledger_read_as_empty_with_their_problem(
    tmp_path: Path, kind: str
) -> None:
    journal = Journal(tmp_path)
    _make(journal.path, kind)
    assert journal.entries() == []
    assert journal.problems == [f"{journal.path}: a symlink (not followed)"] or (
        kind == "fifo" and journal.problems == [f"{journal.path}: a FIFO, not a file"]
    )
    ledger = Ledger(tmp_path)
    _make(ledger.path, kind)
    assert ledger.read() == {}
    (problem,) = ledger.problems
    assert problem.startswith(f"clock ledger {ledger.path} is not a ledger: a ")


@pytest.mark.timeout(TIMEOUT)
def test_metrics_residency_skips_a_prefetch_file_that_is_now_a_fifo(tmp_path: Path) -> None:
    """A state's prefetch_files are paths another process named: /metrics' residency of them
    opens each without blocking and counts regular files only."""
    from governor.metrics.collector import _resident_ratio

    model = tmp_path / "model.gguf"
    model.write_bytes(b"x" * 8192)
    _make(tmp_path / "gone.gguf", "fifo")
    ratio = _resident_ratio([str(tmp_path / "gone.gguf"), str(model)])
    assert ratio is not None and 0.0 <= ratio <= 1.0
    assert _resident_ratio([str(tmp_path / "gone.gguf")]) is None


def test_a_journal_over_its_cap_reads_its_newest_entries_and_ids_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal only grows (a monitor appends at each limit it sets): a read takes its
    newest end, so the latest tune a monitor must not undo and the next id stay right."""
    from governor.rundir import journal as journal_mod

    journal = Journal(tmp_path)
    for _ in range(20):
        journal.append("monitor", [])
    line = len(journal.path.read_bytes()) // 20
    monkeypatch.setattr(journal_mod, "JOURNAL_MAX", 5 * line + line // 2)
    got = journal.entries()
    assert [e["id"] for e in got] == [16, 17, 18, 19, 20]
    assert journal.problems[0].startswith(f"{journal.path}: its oldest ")
    assert journal.append("tune", [])["id"] == 21


@pytest.mark.timeout(TIMEOUT)
def test_install_over_a_masked_unit_says_it_is_masked_and_leaves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`systemctl mask` leaves the unit a symlink to /dev/null: install names the mask and
    how to lift it, and leaves the symlink (before the bounded read it replaced the unit,
    unmasking it silently)."""
    from governor.deploy.dropin import UNIT_DIR

    dest = tmp_path / "dest"
    unit = dest / UNIT_DIR / "governor.slice"
    unit.parent.mkdir(parents=True)
    unit.symlink_to(os.devnull)
    monkeypatch.setenv("GOVERNOR_BOARD", str(tmp_path / "board.toml"))
    policy = tmp_path / "chat.toml"
    policy.write_text('name = "chat"\n')
    with pytest.raises(SystemExit) as exit_:
        main(["--root", str(HOSTS / "rk3588"), "install", str(policy), "--root", str(dest)])
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 65, err
    assert err[0] == (
        f"governor: the unit is masked (a symlink to /dev/null); not replacing it ({unit})"
    )
    assert err[1] == "hint: `systemctl unmask governor.slice` if it should run, then install again"
    assert unit.is_symlink() and os.readlink(unit) == os.devnull
