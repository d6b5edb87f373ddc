"""`governor install` / `governor uninstall` (governor/deploy/install.py, api.install, the CLI) against a
tmp --root: the diff, --dry-run writes nothing, idempotence, atomic writes, the manifest,
restoring a replaced file, files shared by two policies, operator-edited files left alone.

Needs: the rk3588 host fixture (probed through the global --root) and the example policies.
Nothing here talks to systemd: with --root other than / install does not daemon-reload.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.cli import run

from governor.deploy import install as inst
from governor.deploy.dropin import UnitFile
from governor.errors import PolicyNotFound

REPO = Path(__file__).resolve().parents[3]
RK3588 = str(REPO / "tests" / "fixtures" / "hosts" / "rk3588")
POLICIES = REPO / "policies"
UNIT_DIR = "etc/systemd/system"


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): (p.read_text() if p.is_file() else "<dir>")
        for p in sorted(root.rglob("*"))
    }


def cli_install(
    capsys: pytest.CaptureFixture[str], root: Path, policy: str, *extra: str
) -> tuple[int, str, str]:
    return run(
        capsys,
        "--root",
        RK3588,
        "install",
        str(POLICIES / f"{policy}.toml"),
        "--root",
        str(root),
        *extra,
    )


def test_dry_run_shows_the_diff_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "etc").mkdir()
    before = tree(tmp_path)
    code, out, err = cli_install(capsys, tmp_path, "npu-chat", "--dry-run")
    assert code == 0, err
    assert tree(tmp_path) == before
    assert "+++ b/etc/systemd/system/governor-npu\\x2dchat.slice" in out
    assert "+++ b/etc/systemd/system/governor@npu-chat.service.d/50-governor.conf" in out
    assert "+AllowedCPUs=4-7" in out
    assert "would install governor-npu\\x2dchat.slice governor@npu-chat.service" in out
    assert "4 file(s) would change" in out


def test_install_writes_units_and_manifest_and_is_idempotent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = cli_install(capsys, tmp_path, "npu-chat")
    assert code == 0, err
    unit_dir = tmp_path / UNIT_DIR
    assert (unit_dir / "governor.slice").exists()
    assert (unit_dir / "governor@.service").exists()
    assert "MemoryMax=1932734464" in (unit_dir / "governor-npu\\x2dchat.slice").read_text()
    conf = unit_dir / "governor@npu-chat.service.d" / "50-governor.conf"
    assert f"GOVERNOR_POLICY={POLICIES / 'npu-chat.toml'}" in conf.read_text()
    assert oct(conf.stat().st_mode & 0o777) == "0o644"
    manifest = json.loads((tmp_path / "etc/governor/installed/npu-chat.json").read_text())
    assert manifest["units"] == ["governor-npu\\x2dchat.slice", "governor@npu-chat.service"]
    assert all(f["previous"] is None and f["written"] for f in manifest["files"])
    assert "installed governor-npu\\x2dchat.slice governor@npu-chat.service" in out
    snapshot = tree(tmp_path)
    code, out, _ = cli_install(capsys, tmp_path, "npu-chat")
    assert code == 0
    assert out.strip().endswith("0 file(s) changed")
    assert "---" not in out
    assert tree(tmp_path) == snapshot
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temp files left behind


def test_uninstall_restores_the_tree_exactly_and_a_replaced_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    unit_dir = tmp_path / UNIT_DIR
    unit_dir.mkdir(parents=True)
    (unit_dir / "governor.slice").write_text("[Unit]\nDescription=the operator's own\n")
    (tmp_path / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    before = tree(tmp_path)
    assert cli_install(capsys, tmp_path, "npu-batch")[0] == 0
    assert "LLM engines" in (unit_dir / "governor.slice").read_text()
    code, out, err = run(capsys, "uninstall", "npu-batch", "--root", str(tmp_path))
    assert code == 0, err
    assert "-Description=governor: LLM engines under resource policies" in out
    assert tree(tmp_path) == before


def test_uninstall_takes_the_policy_file_too_and_fails_66_when_not_installed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(
        capsys, "uninstall", str(POLICIES / "npu-chat.toml"), "--root", str(tmp_path)
    )
    assert code == 66
    assert err.startswith("governor: policy npu-chat is not installed")


def test_files_shared_by_two_policies_go_with_the_last_uninstall(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    before = tree(tmp_path)
    assert cli_install(capsys, tmp_path, "npu-chat")[0] == 0
    assert cli_install(capsys, tmp_path, "npu-batch")[0] == 0
    template = tmp_path / UNIT_DIR / "governor@.service"
    assert run(capsys, "uninstall", "npu-chat", "--root", str(tmp_path))[0] == 0
    assert template.exists()  # npu-batch still uses it
    assert not (tmp_path / UNIT_DIR / "governor-npu\\x2dchat.slice").exists()
    assert run(capsys, "uninstall", "npu-batch", "--root", str(tmp_path))[0] == 0
    assert tree(tmp_path) == before


def test_a_file_edited_after_install_is_kept_and_reported(tmp_path: Path) -> None:
    files = [UnitFile(f"{UNIT_DIR}/a.slice", "[Unit]\n")]
    inst.install("p", files, ["a.slice"], root=tmp_path)
    (tmp_path / UNIT_DIR / "a.slice").write_text("[Unit]\nDescription=mine now\n")
    result = inst.uninstall("p", root=tmp_path)
    assert result.kept == [f"{UNIT_DIR}/a.slice"]
    assert (tmp_path / UNIT_DIR / "a.slice").read_text().endswith("mine now\n")
    with pytest.raises(PolicyNotFound):
        inst.uninstall("p", root=tmp_path)


def test_a_reinstall_that_drops_a_file_restores_it(tmp_path: Path) -> None:
    reloads: list[str] = []

    def reload() -> str:
        reloads.append("x")
        return "test"

    first = [UnitFile(f"{UNIT_DIR}/a.slice", "A\n"), UnitFile(f"{UNIT_DIR}/b.slice", "B\n")]
    inst.install("p", first, [], root=tmp_path, reload=reload)
    result = inst.install("p", first[:1], [], root=tmp_path, reload=reload)
    assert [(c.path, c.new) for c in result.changes] == [(f"{UNIT_DIR}/b.slice", None)]
    assert not (tmp_path / UNIT_DIR / "b.slice").exists()
    assert inst.install("p", first[:1], [], root=tmp_path, reload=reload).changes == []
    assert reloads == ["x", "x"]  # only when something changed


def test_atomic_write_leaves_the_old_file_when_the_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "unit.slice"
    target.write_text("old\n")

    def boom(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(Exception, match="cannot write"):
        inst.atomic_write(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["unit.slice"]


def test_install_on_a_host_without_systemd_is_refused_with_69(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(
        capsys,
        "--root",
        str(REPO / "tests" / "fixtures" / "hosts" / "hybrid-host"),
        "install",
        str(POLICIES / "dev-box.toml"),
        "--root",
        str(tmp_path),
        "--dry-run",
    )
    assert code == 69
    assert "systemd is not PID 1" in err


def test_uninstall_of_a_path_like_name_is_refused_and_nothing_outside_the_root_goes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    victim = outside / "victim.conf"
    victim.write_text("keep me\n")
    # a manifest placed where `../../../../outside/x` would resolve from the manifest dir
    (outside / "x.json").write_text(
        json.dumps(
            {
                "policy": "x",
                "units": [],
                "files": [
                    {
                        "path": "../outside/victim.conf",
                        "sha256": "0",
                        "previous": None,
                        "written": True,
                    }
                ],
            }
        )
    )
    code, _, err = run(capsys, "uninstall", "../../../../outside/x", "--root", str(root))
    assert code == 65
    assert err.startswith("governor: '../../../../outside/x' is not a policy name")
    assert "hint:" in err
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize("bad", ["/etc/passwd", "../../etc/passwd", "etc/../../x", ""])
def test_a_manifest_entry_outside_the_root_is_refused_and_nothing_is_removed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bad: str
) -> None:
    assert cli_install(capsys, tmp_path, "npu-chat")[0] == 0
    mpath = tmp_path / "etc/governor/installed/npu-chat.json"
    manifest = json.loads(mpath.read_text())
    manifest["files"][0]["path"] = bad
    mpath.write_text(json.dumps(manifest))
    before = tree(tmp_path)
    code, _, err = run(capsys, "uninstall", "npu-chat", "--root", str(tmp_path))
    assert code == 65
    assert err.startswith("governor: install manifest is corrupt: ")
    assert "hint:" in err
    assert tree(tmp_path) == before


def test_a_corrupt_manifest_of_another_policy_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli_install(capsys, tmp_path, "npu-chat")[0] == 0
    (tmp_path / "etc/governor/installed/other.json").write_text('{"policy": 1}')
    before = tree(tmp_path)
    code, _, err = cli_install(capsys, tmp_path, "npu-batch")
    assert code == 65, err
    assert "other.json" in err.splitlines()[0]
    assert tree(tmp_path) == before


def test_a_policy_path_with_a_newline_cannot_inject_unit_directives(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    evil = tmp_path / "nl\n[Service]\nExecStartPre=touch pwned\n#.toml"
    evil.write_text((POLICIES / "npu-chat.toml").read_text())
    (tmp_path / "base.toml").write_text((POLICIES / "base.toml").read_text())
    root = tmp_path / "root"
    root.mkdir()
    code, _, err = run(capsys, "--root", RK3588, "install", str(evil), "--root", str(root))
    assert code == 0, err
    units = [p for p in root.rglob("*") if p.is_file() and "installed" not in str(p)]
    assert units
    for unit in units:
        lines = unit.read_text().splitlines()
        assert not [line for line in lines if line.startswith("ExecStartPre")], unit
        assert lines.count("[Service]") <= 1, unit
    assert "\\x0a[Service]\\x0aExecStartPre=touch pwned" in "".join(
        unit.read_text() for unit in units
    )


def test_an_existing_unit_that_is_not_utf8_is_left_alone_with_65(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    unit_dir = tmp_path / UNIT_DIR
    unit_dir.mkdir(parents=True)
    (unit_dir / "governor.slice").write_bytes(b"\xff\xfe not text")
    before = tree_bytes(tmp_path)
    code, _, err = cli_install(capsys, tmp_path, "npu-chat")
    assert code == 65, err
    assert "not UTF-8" in err.splitlines()[0] and err.splitlines()[1].startswith("hint: ")
    assert tree_bytes(tmp_path) == before


def tree_bytes(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }
