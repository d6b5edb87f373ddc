"""Podman's own Quadlet generator reads every `governor render quadlet` golden (issue 48 item
2): Debian 13's podman-system-generator, run with --dryrun in a chroot of the quadlet tier's
cached trixie root file system (tests/vm/quadlet.py; scripts/setup --tests makes it), turns
each tests/golden/fleet/*.container into a service that keeps the policy's slice and limits.
The quadlet guest (tests/quadlet) then runs one for real; this is the fast, host-side reader.

Needs root (chroot, a private mount namespace) and the cached root file system: missing, the
test skips, or fails under CI=true.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from vm import quadlet
from vm.skips import is_ci

from governor.compile.compiler import compile_plan
from governor.deploy import quadlet as quadlet_render
from governor.deploy.k8s import Workload
from governor.plan.host import probe
from governor.policy.loader import load_text

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "fleet"
GENERATOR = "/usr/lib/systemd/system-generators/podman-system-generator"
INSIDE = "/mnt"  # where the files are bound in the chroot (minbase has an empty /mnt)


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (chroot, unshare)"
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        return "needs unshare and chroot"
    if not (quadlet.rootfs_dir() / ".complete").exists():
        return f"needs the trixie root file system {quadlet.rootfs_dir()} (scripts/setup --tests)"
    return None


def dryrun(units: Path) -> subprocess.CompletedProcess[str]:
    """The generator's --dryrun over the files in ``units`` (bound at /mnt in a private mount
    namespace of the cached tree, which stays unchanged)."""
    root = quadlet.rootfs_dir()
    script = (
        f'mount --bind "$1" "$2{INSIDE}" && exec chroot "$2" /usr/bin/env -i'
        f" QUADLET_UNIT_DIRS={INSIDE} {GENERATOR} --dryrun"
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         str(units), str(root)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def services(stdout: str) -> dict[str, str]:
    """``---NAME.service---`` sections of the --dryrun output, by unit name."""
    parts = re.split(r"^---(\S+)---$", stdout, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.fixture
def needs_rootfs() -> None:
    why = _missing()
    if why is not None:
        if is_ci():
            pytest.fail(why)
        pytest.skip(why)


def test_the_generator_turns_every_golden_into_a_service_with_its_slice_and_limits(
    needs_rootfs: None, tmp_path: Path
) -> None:
    goldens = sorted(GOLDEN.glob("*.container"))
    assert goldens
    # one directory per golden: the generator names the service after the file, and the
    # goldens of one policy on two boards share a name
    for golden in goldens:
        units = tmp_path / golden.stem.replace("@", "-")
        units.mkdir()
        policy = golden.stem.split("@")[0]
        (units / f"{policy}.container").write_text(golden.read_text())
        res = dryrun(units)
        assert res.returncode == 0, f"{golden.name}: the generator refused it:\n{res.stderr}"
        out = services(res.stdout)
        assert list(out) == [f"{policy}.service"], f"{golden.name}:\n{res.stdout}\n{res.stderr}"
        service = out[f"{policy}.service"]
        rendered = golden.read_text().split("\n[Service]\n", 1)[1].split("\n\n", 1)[0]
        for line in rendered.splitlines():  # the [Service] lines pass through, each of them
            if line and not line.startswith("#"):
                assert line in service.splitlines(), f"{golden.name}: {line!r} lost:\n{service}"
        assert "ExecStart=/usr/bin/podman run " in service, service


def _systemd_word(word: str) -> str:
    """One ExecStart= word after systemd's expansions, in one pass each: ``%%`` is ``%`` and
    any other specifier expands (shown as <%X>), ``$$`` is ``$`` and ``${VAR}`` expands."""
    word = re.sub(r"%(.)", lambda m: "%" if m[1] == "%" else f"<%{m[1]}>", word)
    return re.sub(r"\$\$|\$\{(\w+)\}", lambda m: "$" if m[0] == "$$" else f"<${m[1]}>", word)


def _argv(service: str) -> list[str]:
    """The argv systemd runs for the service's ExecStart= (quoting as shlex reads it)."""
    line = next(ln for ln in service.splitlines() if ln.startswith("ExecStart="))
    return [_systemd_word(w) for w in shlex.split(line.removeprefix("ExecStart="))]


def test_blanks_dollars_and_percents_reach_podman_as_written(
    needs_rootfs: None, tmp_path: Path
) -> None:
    """The values `render quadlet` writes (Volume=, Environment=, Exec=) come out of the
    generator and systemd as the paths and words the policy and the argv gave."""
    policy = 'name = "odd"\nslice = "governor.slice"\n[memory]\nmax = "768M"\n'
    policy += '[engine]\nkind = "llama.cpp"\n[process]\nenv = { A = "${HOME} 5% $x" }\n'
    plan = compile_plan(
        load_text(policy, source="odd.toml"), probe(REPO / "tests/fixtures/hosts/cgroup2-full")
    )
    argv = ("/opt/my dir/llama-server", "-m", "/models %h/a $b.gguf", "--alias", 'say "hi" 5%')
    text = quadlet_render.render(plan, Workload(argv=argv, model=argv[2]), 257)
    (tmp_path / "odd.container").write_text(text)
    res = dryrun(tmp_path)
    assert res.returncode == 0, res.stderr
    words = _argv(services(res.stdout)["odd.service"])
    volumes = {words[i + 1] for i, w in enumerate(words) if w == "-v"}
    assert volumes == {"/models %h:/models %h:ro", "/opt/my dir:/opt/my dir:ro"}
    assert words[words.index("--env") + 1] == "A=${HOME} 5% $x"
    assert tuple(words[-len(argv) :]) == argv
