"""What Podman's Quadlet generator does with `governor render quadlet`'s [Container] values
(governor/deploy/quadlet.py), as Podman 5.4's generator was seen doing it (tests/install/
test_quadlet_generator.py runs it): Volume= is copied into ExecStart= unparsed, so it is
written raw with `%` and `$` doubled (quotes would become part of the path); Environment= is
unquoted and then copied into ExecStart= as --env, where systemd expands `${VAR}` and `%`
specifiers, so `$` and `%` are doubled like Exec='s; a path -v cannot carry is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.compile.compiler import compile_plan
from governor.deploy import quadlet
from governor.deploy.k8s import Workload
from governor.errors import PolicyError
from governor.plan.host import probe
from governor.policy.loader import load_text

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
POLICY = """\
name = "q"
slice = "governor.slice"
[memory]
max = "768M"
[engine]
kind = "llama.cpp"
[process]
env = { A = "${HOME} 5% $x" }
"""


def _render(*argv: str, env: dict[str, str] | None = None) -> list[str]:
    plan = compile_plan(load_text(POLICY, source="q.toml"), probe(HOSTS / "cgroup2-full"))
    work = Workload(argv=argv, model=argv[2], env=env or {})
    return quadlet.render(plan, work, 257).splitlines()


def test_a_volume_with_blanks_is_written_raw_not_quoted() -> None:
    lines = _render("/opt/my dir/llama-server", "-m", "/models dir/q4.gguf")
    assert "Volume=/models dir:/models dir:ro" in lines
    assert "Volume=/opt/my dir:/opt/my dir:ro" in lines


def test_a_volume_doubles_specifiers_and_dollars() -> None:
    lines = _render("llama-server", "-m", "/m%h$x/q4.gguf")
    assert "Volume=/m%%h$$x:/m%%h$$x:ro" in lines


@pytest.mark.parametrize("model", ["/models:a/q4.gguf", "/models /q4.gguf", "/models\\/q4.gguf"])
def test_a_path_that_volume_cannot_carry_is_refused(model: str) -> None:
    with pytest.raises(PolicyError) as info:
        _render("llama-server", "-m", model)
    assert info.value.exit_code == 65
    assert "cannot be a Podman volume" in str(info.value)


def test_environment_doubles_dollars_and_specifiers() -> None:
    lines = _render("llama-server", "-m", "/models/q4.gguf", env={"B": "a$b"})
    assert 'Environment="A=$${HOME} 5%% $$x"' in lines
    assert 'Environment="B=a$$b"' in lines
