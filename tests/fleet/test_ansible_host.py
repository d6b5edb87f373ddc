"""The Ansible module governor.board.policy with the real ansible-playbook (`-c local`,
ANSIBLE_COLLECTIONS_PATH = the checkout) against a `--root` tree: install renders for the rk3588
fixture board (global --root) into a temporary DESTDIR, so no systemd is needed here. One
playbook per story: check mode changes nothing and shows the diff, apply changes, a second run
is ok, a policy change shows in check mode and applies, state absent leaves nothing, a policy
copied from the controller (with the file it extends), and a bad policy fails with governor's
one-line message. The live board (systemctl, tune --confirm) is the systemd guest's test
(tests/systemd/test_fleet_guest.py)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from helpers.ansible import REPO, run_play

FIXTURE = REPO / "tests" / "fixtures" / "hosts" / "rk3588"
GOVERNOR = str(Path(sys.executable).with_name("governor"))
POLICY = """\
name = "fleet-a"
[memory]
min = "64M"
high = "{high}"
max = "256M"
[cpu]
cpus = "4-7"
max = "200%"
"""


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _policy(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    root = tmp_path / "board"
    root.mkdir()
    policy = tmp_path / "fleet-a.toml"
    policy.write_text(POLICY.format(high="200M"))
    defaults = {
        "root": str(root),
        "probe_root": str(FIXTURE),
        "executable": GOVERNOR,
        "engine": ["/bin/sleep", "1000"],
    }
    return root, policy, defaults


def test_check_apply_idempotent_change_absent(tmp_path: Path) -> None:
    root, policy, defaults = _policy(tmp_path)
    slice_file = root / "etc/systemd/system/governor-fleet\\x2da.slice"
    p = str(policy)
    tasks: list[dict[str, Any]] = [
        {"governor.board.policy": {"policy": p}, "check_mode": True, "register": "check1"},
        {"governor.board.policy": {"policy": p}, "register": "apply1"},
        {"governor.board.policy": {"policy": p}, "register": "apply2"},
        {"ansible.builtin.stat": {"path": str(slice_file)}, "register": "before"},
        {
            "ansible.builtin.copy": {"dest": p, "content": POLICY.format(high="150M")},
            "register": "edit",
        },
        {"governor.board.policy": {"policy": p}, "check_mode": True, "register": "check2"},
        {"ansible.builtin.stat": {"path": str(slice_file)}, "register": "after_check"},
        {"governor.board.policy": {"policy": p}, "register": "apply3"},
        {"ansible.builtin.stat": {"path": str(slice_file)}, "register": "after_apply"},
        {
            "governor.board.policy": {"policy": p, "state": "absent"},
            "check_mode": True,
            "register": "gone_check",
        },
        {"ansible.builtin.stat": {"path": str(slice_file)}, "register": "after_gone_check"},
        {"governor.board.policy": {"policy": p, "state": "absent"}, "register": "gone"},
        {"governor.board.policy": {"policy": p, "state": "absent"}, "register": "gone2"},
    ]
    r, run = run_play(tmp_path, tasks, defaults=defaults)
    assert run.returncode == 0, run.stdout + run.stderr
    # check mode: changed, a diff in Ansible's format, nothing written on the board
    assert r["check1"]["changed"] and r["check1"]["name"] == "fleet-a"
    assert "etc/systemd/system/governor-fleet\\x2da.slice" in r["check1"]["files"]
    assert "+MemoryHigh=209715200" in run.stdout  # the --diff output of the first task
    assert "after: etc/systemd/system/governor-fleet\\x2da.slice" in run.stdout
    # apply, then ok
    assert r["apply1"]["changed"] and r["apply1"]["units"][1] == "governor@fleet-a.service"
    assert not r["apply2"]["changed"] and r["apply2"]["files"] == []
    # a change: check mode reports it and leaves the file as it was; apply writes it
    assert r["check2"]["changed"]
    assert r["check2"]["diff"][0]["before"].count("MemoryHigh=209715200") == 1
    assert "MemoryHigh=157286400" in r["check2"]["diff"][0]["after"]
    assert r["after_check"]["stat"]["checksum"] == r["before"]["stat"]["checksum"]
    assert r["apply3"]["changed"]
    assert r["after_apply"]["stat"]["checksum"] != r["before"]["stat"]["checksum"]
    # absent: check mode keeps everything; then nothing is left; then ok
    assert r["gone_check"]["changed"] and r["after_gone_check"]["stat"]["exists"]
    assert r["gone"]["changed"] and not r["gone2"]["changed"]
    assert _files(root) == {}
    assert run.stdout.count("changed: [localhost]") >= 5


def test_policy_copied_from_the_controller_with_what_it_extends(tmp_path: Path) -> None:
    root, _, defaults = _policy(tmp_path)
    controller = tmp_path / "controller"
    controller.mkdir()
    (controller / "base.toml").write_text('[memory]\nmax = "256M"\n[pids]\nmax = 64\n')
    (controller / "fleet-b.toml").write_text(
        'name = "fleet-b"\nextends = "base.toml"\n[memory]\nhigh = "200M"\n'
    )
    p = str(controller / "fleet-b.toml")
    task = {"policy": p, "copy": True}
    tasks: list[dict[str, Any]] = [
        {"governor.board.policy": task, "check_mode": True, "register": "check"},
        {"ansible.builtin.find": {"paths": str(root), "recurse": True}, "register": "nothing"},
        {"governor.board.policy": task, "register": "apply1"},
        {"governor.board.policy": task, "register": "apply2"},
        {"governor.board.policy": {**task, "state": "absent"}, "register": "gone"},
    ]
    r, run = run_play(tmp_path, tasks, defaults=defaults)
    assert run.returncode == 0, run.stdout + run.stderr
    assert r["check"]["changed"] and r["nothing"]["matched"] == 0
    # the drop-in names the policy where it will be on the board, not the check's temporary copy
    dropin = next(d for d in r["check"]["diff"] if d["after_header"].endswith("50-governor.conf"))
    assert f"GOVERNOR_POLICY={root}/etc/governor/fleet-b.toml" in dropin["after"]
    assert "governor-check-" not in str(r["check"]["diff"])
    assert r["apply1"]["changed"] and not r["apply2"]["changed"], r["apply2"]
    assert (root / "etc/governor/base.toml").read_text().startswith("[memory]")
    assert r["gone"]["changed"]
    # the copied policy went with it; the file it extends stays (other policies may use it)
    assert _files(root) == {"etc/governor/base.toml": (controller / "base.toml").read_bytes()}


def test_a_bad_policy_fails_with_governors_one_line_message(tmp_path: Path) -> None:
    root, policy, defaults = _policy(tmp_path)
    policy.write_text('name = "fleet-a"\n[memory]\nhigh = "lots"\n')
    tasks: list[dict[str, Any]] = [
        {
            "governor.board.policy": {"policy": str(policy)},
            "register": "bad",
            "ignore_errors": True,
        },
    ]
    r, _ = run_play(tmp_path, tasks, defaults=defaults)
    assert r["bad"]["failed"]
    assert r["bad"]["msg"].startswith("governor: ") and "memory.high" in r["bad"]["msg"]
    assert r["bad"]["rc"] == 65
    assert _files(root) == {}


def test_a_policy_the_board_cannot_admit_fails_the_task_with_75_and_the_line(
    tmp_path: Path,
) -> None:
    root, policy, defaults = _policy(tmp_path)
    policy.write_text('name = "fleet-a"\n[memory]\nmin = "1.1GiB"\n')
    second = tmp_path / "fleet-b.toml"
    second.write_text('name = "fleet-b"\n[memory]\nmin = "1.1GiB"\n')
    tasks: list[dict[str, Any]] = [
        {"governor.board.policy": {"policy": str(policy)}, "register": "first"},
        {
            "governor.board.policy": {"policy": str(second)},
            "register": "second",
            "ignore_errors": True,
        },
    ]
    r, run = run_play(tmp_path, tasks, defaults=defaults)
    assert not r["first"].get("failed"), run.stdout
    assert r["second"]["failed"] and r["second"]["rc"] == 75
    # the rk3588 fixture's 1966 MiB: 1715 MiB of budget, fleet-a's installed claim holds 1126
    assert r["second"]["msg"].startswith(
        "governor: the board cannot admit fleet-b: memory.min 1126 MiB, 589 MiB of guarantees"
        " left, 538 MiB short (fleet-a holds 1126 MiB, installed) ([qos] admit, "
    ), r["second"]["msg"]
    assert not any("fleet-b" in f for f in _files(root))


# ---------------------------------------------------------------- the live decision, pure


def _module() -> Any:
    import importlib.util

    path = REPO / "ansible_collections/governor/board/plugins/modules/policy.py"
    spec = importlib.util.spec_from_file_location("governor_board_policy", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SLICE = "governor-fleet\\x2da.slice"
PATH = f"etc/systemd/system/{SLICE}"
OLD = (
    "# x\n[Slice]\n# memory.high -> ...\nMemoryHigh=209715200\nMemoryMax=268435456\nCPUQuota=150%\n"
)


def _install_json_tunable(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """The directive -> tune key table as `governor install --json` prints it (the module
    has no copy: governor/plan/unitmap.py is the one table)."""
    import json

    from governor.cli.render import show_install_json
    from governor.deploy.install import Result

    capsys.readouterr()
    show_install_json(Result(changes=[], units=[SLICE], manifest="m"), dry_run=True)
    tunable: dict[str, str] = json.loads(capsys.readouterr().out)["tunable"]
    return tunable


def test_install_json_carries_the_directive_to_tune_key_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _install_json_tunable(capsys) == {
        "MemoryMin": "memory.min", "MemoryLow": "memory.low", "MemoryHigh": "memory.high",
        "MemoryMax": "memory.max", "MemorySwapMax": "memory.swap_max", "CPUWeight": "cpu.weight",
        "CPUQuota": "cpu.max", "AllowedCPUs": "cpu.cpus", "TasksMax": "pids.max",
        "IOWeight": "io.weight",
    }  # fmt: skip


def test_only_limit_directives_of_the_policy_slice_are_tuned_live(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tunable = _install_json_tunable(capsys)

    def only(changes: list[dict[str, Any]], slice_unit: str) -> list[str] | None:
        result: list[str] | None = _module().only_limits(changes, slice_unit, tunable)
        return result

    new = OLD.replace("MemoryHigh=209715200", "MemoryHigh=157286400").replace("150%", "200%")
    assert only([{"path": PATH, "before": OLD, "after": new}], SLICE) == [
        "cpu.max=200%",
        "memory.high=157286400",
    ]
    unlimited = OLD.replace("MemoryMax=268435456", "MemoryMax=infinity")
    assert only([{"path": PATH, "before": OLD, "after": unlimited}], SLICE) == ["memory.max=max"]
    # anything else needs a reinstall and a restart: a directive added or removed, another
    # directive, another file (the service drop-in), a new install
    added = OLD + "TasksMax=64\n"
    assert only([{"path": PATH, "before": OLD, "after": added}], SLICE) is None
    desc = OLD.replace("# x\n", "[Unit]\nDescription=b\n")
    other = desc.replace("Description=b", "Description=c")
    assert only([{"path": PATH, "before": desc, "after": other}], SLICE) is None
    dropin = "etc/systemd/system/governor@fleet-a.service.d/50-governor.conf"
    assert only([{"path": dropin, "before": "Nice=1\n", "after": "Nice=2\n"}], SLICE) is None
    assert only([{"path": PATH, "before": None, "after": OLD}], SLICE) is None
    assert only([{"path": PATH, "before": OLD, "after": OLD}], SLICE) is None  # nothing to tune
    # a governor whose install --json has no table (older): every change restarts
    changed = [{"path": PATH, "before": OLD, "after": unlimited}]
    assert _module().only_limits(changed, SLICE, {}) is None


# ---------------------------------------------------------------- issue 35: items 5 and 6


def test_check_mode_on_the_live_board_reads_the_copied_policy_with_diff(tmp_path: Path) -> None:
    """`--check --diff` with copy: true on the live board (root /): the temporary copy of a
    changed policy is still there when `governor diff --json` reads it (it was removed first:
    exit 66, "policy file not found"). Check mode writes nothing, so root / is safe here; the
    probe is the rk3588 fixture's, and the copy's directory is a tmp one."""
    _, _, defaults = _policy(tmp_path)
    controller = tmp_path / "controller"
    controller.mkdir()
    (controller / "fleet-c.toml").write_text(
        POLICY.format(high="200M").replace('"fleet-a"', '"fleet-c"')
    )
    board_dir = tmp_path / "board-etc"
    task = {"policy": str(controller / "fleet-c.toml"), "copy": True, "policy_dir": str(board_dir)}
    tasks: list[dict[str, Any]] = [
        {"governor.board.policy": task, "check_mode": True, "register": "check"},
    ]
    r, run = run_play(tmp_path, tasks, defaults={**defaults, "root": "/"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert r["check"]["changed"] and "drift" in r["check"], r["check"]
    assert not board_dir.exists()  # check mode: nothing written where the board keeps it
    leftovers = [p for p in Path(tempfile.gettempdir()).glob("governor-check-*")]
    assert not [p for p in leftovers if (p / "fleet-c.toml").exists()], leftovers


def test_the_engine_argv_reaches_exec_start_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No $VAR, ${VAR} or ~ expansion from the board's environment (run_command's default
    expanded them: a secret in a world-readable unit); the drop-in's systemd syntax keeps `$`,
    `%`, quotes and spaces literal ($$, %%, "...")."""
    monkeypatch.setenv("SECRET_TOKEN", "s3cr3t-from-the-board")
    root, policy, defaults = _policy(tmp_path)
    engine = [
        "/bin/sleep",
        "--api-key",
        "$SECRET_TOKEN",
        "${SECRET_TOKEN}",
        "~",
        "~/m",
        "5%",
        "a b",
    ]
    tasks: list[dict[str, Any]] = [
        {"governor.board.policy": {"policy": str(policy), "engine": engine}, "register": "up"},
    ]
    r, run = run_play(tmp_path, tasks, defaults=defaults)
    assert run.returncode == 0, run.stdout + run.stderr
    assert r["up"]["changed"]
    text = "".join(v.decode() for v in _files(root).values())
    assert "s3cr3t" not in text and str(Path.home()) + "/m" not in text
    exec_start = [ln for ln in text.splitlines() if ln.startswith("ExecStart=/") and "--api" in ln]
    assert len(exec_start) == 1, text
    assert exec_start[0].endswith(
        ' -- /bin/sleep --api-key "$$SECRET_TOKEN" "$${SECRET_TOKEN}" ~ ~/m 5%% "a b"'
    ), exec_start
