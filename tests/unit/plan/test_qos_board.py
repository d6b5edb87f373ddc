"""[qos] combinations that could never do anything and board-file entries on governed slices
are refused by `governor check` (issue 35, items 1, 7, 13): exit 65, one line naming the
field (and the slice)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakefs.plans import make_plan

from governor.api.check import check_board
from governor.board.file import load_board, read_board
from governor.compile.compiler import compile_plan
from governor.errors import PolicyError
from governor.plan.host import probe
from governor.policy.loader import load_text
from governor.rundir.state import Publisher, applied

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


def _compile(text: str) -> None:
    policy = load_text(text, source="test.toml")
    compile_plan(policy, probe(HOSTS / "rk3588", target=f"governor.slice/{policy.name}"),
                 source="test.toml")  # fmt: skip


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            'name = "bg"\n[qos]\nclass = "background"\n'
            '[[pressure]]\nwhen = "memory some 150ms/2s"\ndo = ["log"]\n'
            '[[pressure]]\nwhen = "board available < 100M"\ndo = ["log", "shed"]\n',
            "pressure[1].do",
            "no class ranks below background",
        ),
        (
            'name = "chat"\n[qos]\nclass = "interactive"\nyield = ["throttle"]\n',
            "qos.yield",
            "no class ranks above interactive",
        ),
    ],
)
def test_a_meaningless_qos_combination_is_refused_naming_the_field(
    text: str, field: str, words: str
) -> None:
    with pytest.raises(PolicyError) as err:
        _compile(text)
    assert err.value.exit_code == 65 and err.value.field == field
    assert words in str(err.value) and str(err.value).endswith(f"(test.toml, {field})")


@pytest.mark.parametrize(
    "text",
    [
        'name = "std"\n[qos]\nclass = "standard"\n[[pressure]]\n'
        'when = "board available < 100M"\ndo = ["shed"]\n',
        'name = "bg"\n[qos]\nclass = "background"\nyield = ["throttle"]\n',
        'name = "chat"\n[qos]\nclass = "interactive"\n[[pressure]]\n'
        'when = "board available < 100M"\ndo = ["shed"]\n',
    ],
)
def test_meaningful_qos_combinations_still_compile(text: str) -> None:
    _compile(text)


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("GOVERNOR_RUN_DIR", str(run))
    return run


@pytest.mark.parametrize(
    ("path", "slice_"),
    [
        ("governor.slice", "governor.slice"),
        ("governor.slice/anything", "governor.slice"),
        ("apps.slice", "apps.slice/job"),  # contains an installed policy's group
        ("apps.slice/job", "apps.slice/job"),
        ("apps.slice/job/engine", "apps.slice/job"),
    ],
)
def test_check_refuses_a_board_entry_on_a_governed_slice_naming_it(
    tmp_path: Path, run_dir: Path, path: str, slice_: str
) -> None:
    (tmp_path / "job.toml").write_text('name = "job"\nslice = "apps.slice"\n')
    board = tmp_path / "board.toml"
    board.write_text(f'[[cgroup]]\npath = "x.slice/ok"\n[[cgroup]]\npath = "{path}"\n')
    with pytest.raises(PolicyError) as err:
        check_board(board)
    assert err.value.exit_code == 65 and err.value.field == "cgroup[1].path"
    assert f"governed slice {slice_!r}" in str(err.value)


def test_check_knows_the_running_slices_from_the_run_dir(tmp_path: Path, run_dir: Path) -> None:
    plan = make_plan(policy="web", group="web.slice/web", leaf="web.slice/web/engine")
    Publisher(run_dir, "web").publish(applied(plan, policy_path=None, created=[], started_at=1.0))
    board = tmp_path / "etc" / "board.toml"
    board.parent.mkdir()
    board.write_text('[[cgroup]]\npath = "web.slice"\n')
    with pytest.raises(PolicyError) as err:
        check_board(board)
    assert "governed slice 'web.slice/web'" in str(err.value)
    board.write_text('[[cgroup]]\npath = "cam.slice/cam"\n')
    assert check_board(board) == 1


@pytest.mark.parametrize(
    "path", ["a/./b", ".", "a/.", "./a", "a/..", "a//b", "/a", "a b", f"a/{'x' * 256}"]
)
def test_check_refuses_a_board_path_with_a_dot_component(tmp_path: Path, path: str) -> None:
    board = tmp_path / "board.toml"
    board.write_text(f'[[cgroup]]\npath = "{path}"\n')
    with pytest.raises(PolicyError) as err:
        load_board(board)
    assert err.value.exit_code == 65 and err.value.field == "cgroup[0].path"


def test_the_reader_returns_every_good_entry_and_one_error_per_bad_one(tmp_path: Path) -> None:
    board = tmp_path / "board.toml"
    board.write_text(
        'color = 1\n[[cgroup]]\npath = "a/x"\n[[cgroup]]\npath = "a/./y"\n'
        '[[cgroup]]\npath = "b/x"\n[[cgroup]]\npath = "c/z"\nyield = ["nap"]\n'
        '[[cgroup]]\npath = "d/w"\nclass = "background"\n'
    )
    read = read_board(board)
    assert [(e.name, e.path) for e in read.entries] == [("x", "a/x"), ("w", "d/w")]
    assert [e.field for e in read.errors] == ["color", "cgroup[1].path", "cgroup[2].name",
                                              "cgroup[3].yield"]  # fmt: skip
    assert all(e.exit_code == 65 and e.file == str(board) for e in read.errors)


@pytest.mark.parametrize(("key", "value"), [("class", "[]"), ("class", "{}"), ("yield", "[[1]]")])
def test_a_board_value_of_the_wrong_type_is_an_error_never_a_traceback(
    tmp_path: Path, key: str, value: str
) -> None:
    board = tmp_path / "board.toml"
    board.write_text(f'[[cgroup]]\npath = "a/b"\n{key} = {value}\n')
    with pytest.raises(PolicyError) as err:
        load_board(board)
    assert err.value.exit_code == 65 and err.value.field == f"cgroup[0].{key}"
