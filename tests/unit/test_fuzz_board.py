"""The board file (/etc/governor/board.toml), generated (issue 35): whatever it holds, its one
reader (governor/board/file.py read_board) returns typed entries and one governor error per
bad entry, never a traceback; every entry it returns is valid (a clean relative path outside
every governed slice, a known class, known steps in ladder order, a unique name); and the
shedder's victims from it (governor/board/scan.py and the shedder) never raise either.

Like tests/unit/test_fuzz.py: mostly well-formed but hostile files (paths with '.'/'..'/empty
components, on or around governed slices, unknown classes and steps, duplicate names, unknown
keys, wrong types, now and then a damaged file), the reach reported and floored.

Needs: nothing (a tmp directory as the cgroup root)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

from fakefs.plans import make_plan
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.board.file import GOVERNED_ROOT, read_board
from governor.board.scan import scan
from governor.errors import PolicyError
from governor.kernel.cgroupfs import CgroupFs
from governor.monitor.actions.shedder import Shedder
from governor.plan.model import CGROUP_STEPS, QOS_RANK, QosSpec
from governor.record import replace
from governor.rundir.state import Publisher, applied

from .test_fuzz import _VALUES, Reach, _check_error, _fraction, _key, _rarely, _summary, _toml

GOVERNED = ("apps.slice/job", "governor.slice/npu-chat")
_GOOD_PATHS = ["system.slice/camera.service", "system.slice/ui.service", "docker/abc123",
               "user.slice/user-1000.slice", "x.slice", "apps.slice/other"]  # fmt: skip
_BAD_PATHS = [".", "..", "a/./b", "a/../b", "a/.", "./a", "a//b", "/abs", "a/", "", "a b",
              "governor.slice", "governor.slice/x", "apps.slice", "apps.slice/job",
              "apps.slice/job/engine", "é/x", "a\x00b", "x" * 300]  # fmt: skip


@st.composite
def _entry(draw: st.DrawFn) -> dict[str, object]:
    out: dict[str, object] = {}
    if not _rarely(draw, 5):
        if _rarely(draw, 35):
            out["path"] = draw(st.one_of(st.sampled_from(_BAD_PATHS), _VALUES))
        else:
            out["path"] = draw(st.sampled_from(_GOOD_PATHS))
    if draw(st.booleans()):
        good = st.sampled_from(sorted(QOS_RANK))
        out["class"] = draw(_VALUES if _rarely(draw, 15) else good)
    if draw(st.booleans()):
        steps = draw(st.lists(st.sampled_from(CGROUP_STEPS), max_size=4, unique=True))
        if _rarely(draw, 15):
            steps = [*steps, draw(st.sampled_from(["nap", "kill", "", "KILL", "throttle"]))]
        out["yield"] = steps if not _rarely(draw, 5) else draw(_VALUES)
    if draw(st.booleans()):
        bad = _rarely(draw, 20)  # most names are good: a bad one must sit beside good entries
        names = ["Cam", "a b", "-x", "n" * 70] if bad else ["cam", "ui", "x"]
        out["name"] = draw(st.sampled_from(names))
    if _rarely(draw, 8):
        out[draw(st.sampled_from(["color", "Path", "reserve"]))] = draw(_VALUES)
    return out


@st.composite
def _board_text(draw: st.DrawFn) -> bytes:
    entries = draw(st.lists(_entry(), min_size=0 if _rarely(draw, 10) else 1, max_size=6))
    lines = []
    if _rarely(draw, 5):
        lines.append(f"{_key(draw(st.sampled_from(['name', 'board', 'x'])))} = {_toml(3)}")
    if _rarely(draw, 5):
        lines.append(f"cgroup = {_toml(draw(_VALUES))}")
    else:
        for e in entries:
            lines.append("[[cgroup]]")
            lines += [f"{_key(k)} = {_toml(v)}" for k, v in e.items()]
    data = ("\n".join(lines) + "\n").encode()
    damage = draw(st.integers(0, 99))
    if damage < 4:
        data = data[: draw(st.integers(0, len(data)))]
    elif damage < 6:
        data = b"\xff\xfe" + data
    return data


def test_any_board_file_reads_as_valid_entries_and_one_error_per_bad_one(
    tmp_path: Path, report_reach: Callable[[str], None]
) -> None:
    reach: Reach = collections.Counter()
    root = tmp_path / "cg"
    for p in (*_GOOD_PATHS, *GOVERNED):
        (root / p).mkdir(parents=True, exist_ok=True)
    fs, run, board = CgroupFs(root), tmp_path / "run", tmp_path / "board.toml"
    job = make_plan(policy="job", group=GOVERNED[0], leaf=f"{GOVERNED[0]}/engine")
    Publisher(run, "job").publish(applied(job, policy_path=None, created=[],
                                          started_at=1.0))  # fmt: skip
    shedder = replace(make_plan(policy="npu-chat", group=GOVERNED[1]),
                      qos=QosSpec(qos_class="interactive"))  # fmt: skip

    @settings(max_examples=300)
    @given(_board_text())
    def run_one(data: bytes) -> None:
        reach["examples"] += 1
        board.write_bytes(data)
        read = read_board(board, GOVERNED)
        for err in read.errors:
            assert isinstance(err, PolicyError) and err.file == str(board)
            _check_error(err, (65,))
        if not any(e.field is None for e in read.errors):
            reach["file read"] += 1
        names = [e.name for e in read.entries]
        assert len(set(names)) == len(names)
        for e in read.entries:
            parts = e.path.split("/")
            assert all(parts) and not {".", ".."} & set(parts) and not e.path.startswith("/")
            for g in (GOVERNED_ROOT, *GOVERNED):
                assert not (e.path == g or g.startswith(e.path + "/") or e.path.startswith(g + "/"))
            assert e.qos_class in QOS_RANK
            assert list(e.yields) == [s for s in CGROUP_STEPS if s in e.yields]
        if read.entries:
            reach["an entry valid"] += 1
        if read.entries and read.errors:
            reach["valid beside bad"] += 1
        seen = scan(run=run, cgroup_root=fs.root, board=board, own=(shedder.group,), fs=fs)
        assert len(seen.file_invalid) == len(read.errors)
        victims = [
            v
            for v in Shedder(fs, shedder, run=run, board=board, own_cgroup="").victims()
            if not v.governed
        ]
        assert {v.cgroup for v in victims} <= {e.path for e in read.entries}
        if victims:
            reach["a victim"] += 1

    run_one()
    stages = ("file read", "an entry valid", "valid beside bad", "a victim")
    report_reach(_summary("board file", reach, stages))
    assert _fraction(reach, "file read") >= 0.7, "most board files must be read to the entries"
    assert _fraction(reach, "an entry valid") >= 0.4, "many must hold a valid entry"
    assert _fraction(reach, "valid beside bad") >= 0.1, "a bad entry must sit beside good ones"
