"""`governor render k8s` and `governor render quadlet` (governor/deploy/k8s.py, quadlet.py,
governor/api/fleet.py): golden files for policies/*.toml on the fixture boards, every rendered
manifest validated with kubernetes-validate against two API versions (strict: an unknown field
fails), the QoS class each budget yields, and the Quadlet file's [Unit]/[Service]/[Install] as a
plain unit through `systemd-analyze verify` (Podman's own generator, Debian 13's, reads the
goldens in tests/install/test_quadlet_generator.py, and runs one in tests/quadlet).

Regenerate the goldens with GOVERNOR_UPDATE_GOLDEN=1 after an intended change, and review them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helpers.golden import update_requested

from governor.api import fleet
from governor.api.host import HostOptions
from governor.compile.compiler import compile_plan
from governor.deploy import k8s
from governor.errors import GovernorError, PolicyError, UsageError
from governor.plan.host import probe
from governor.plan.model import Plan
from governor.policy.loader import load_text

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
POLICY_DIR = REPO / "policies"
GOLDEN = REPO / "tests" / "golden" / "fleet"
EXAMPLE_POLICIES = sorted(p.stem for p in POLICY_DIR.glob("*.toml"))
HOST_NAMES = ("rk3588", "cgroup2-full")
API_VERSIONS = ("1.33.0", "1.37.0")  # resizePolicy is in both; in-place resize GA in 1.35
# the model is not on this machine: requests.memory falls back to memory.min (said in a comment)
ENGINE = (
    "/opt/llama/bin/llama-server",
    "-m",
    "/models/qwen-q4.gguf",
    "-c",
    "1024",
    "--cache-ram",
    "512",
    "--host",
    "0.0.0.0",
    "--port",
    "8080",
)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the goldens name the policy as policies/NAME.toml


def _render(target: fleet.Target, policy: str, host: str, **kw: Any) -> str:
    return fleet.render(
        target,
        POLICY_DIR.relative_to(REPO) / f"{policy}.toml",
        HostOptions(root=REPO / "tests" / "fixtures" / "hosts" / host),
        ENGINE,
        image="docker.io/library/debian:12-slim",
        **kw,
    )


# Every (policy, board) pair is a case; which ones render is read from the reviewed plan
# goldens (tests/golden/plans: .json compiles, .err is refused), never from calling the code
# under test at collection time: a pair whose render starts failing FAILS, it cannot drop out.
PLAN_GOLDEN = REPO / "tests" / "golden" / "plans"
ALL_CASES = [(p, h) for p in EXAMPLE_POLICIES for h in HOST_NAMES]
CASES = [(p, h) for p, h in ALL_CASES if not (PLAN_GOLDEN / f"{p}@{h}.err").exists()]
REFUSED = [(p, h) for p, h in ALL_CASES if (p, h) not in CASES]


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if update_requested():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{name} changed (GOVERNOR_UPDATE_GOLDEN=1 to accept)"


def _plan(text: str, host: str = "rk3588") -> Plan:
    return compile_plan(load_text(text, source="test.toml"), probe(HOSTS / host))


def _validate(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    for version in API_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)
    assert isinstance(doc, dict)
    return doc


def test_every_example_policy_renders_on_some_fixture_board() -> None:
    assert {p for p, _ in CASES} == set(EXAMPLE_POLICIES)
    for p, h in CASES:  # each case has its verdict: a plan golden that compiles
        assert (PLAN_GOLDEN / f"{p}@{h}.json").exists(), f"no plan golden for {p}@{h}"


@pytest.mark.parametrize(("policy", "host"), REFUSED, ids=[f"{p}@{h}" for p, h in REFUSED])
def test_a_policy_the_board_refuses_is_refused_by_render_too(policy: str, host: str) -> None:
    """Render refuses like check, with the plan golden's exit code and message."""
    golden = (PLAN_GOLDEN / f"{policy}@{host}.err").read_text().splitlines()
    root = HOSTS / host
    targets: tuple[fleet.Target, ...] = ("k8s", "quadlet")
    for target in targets:
        with pytest.raises(GovernorError) as info:
            _render(target, policy, host)
        err = info.value
        assert golden[:2] == [
            f"exit {err.exit_code}",
            f"governor: {err}".replace(str(root), "<root>"),
        ]


@pytest.mark.parametrize(("policy", "host"), CASES, ids=[f"{p}@{h}" for p, h in CASES])
def test_k8s_golden_and_valid_against_two_api_versions(policy: str, host: str) -> None:
    for kind, suffix in (("Pod", "pod"), ("Deployment", "deployment")):
        text = _render("k8s", policy, host, kind=kind)
        _golden(f"{policy}@{host}.{suffix}.yaml", text)
        doc = _validate(text)
        assert doc["kind"] == kind


@pytest.mark.parametrize(("policy", "host"), CASES, ids=[f"{p}@{h}" for p, h in CASES])
def test_quadlet_golden(policy: str, host: str) -> None:
    text = _render("quadlet", policy, host)
    _golden(f"{policy}@{host}.container", text)


def test_the_validator_refuses_a_broken_manifest() -> None:
    """The schema check bites: a misspelt field (strict) and a bad resize policy fail."""
    text = _render("k8s", "npu-chat", "rk3588")
    doc = yaml.safe_load(text)
    doc["spec"]["containers"][0]["resources"]["limit"] = {"memory": "1Gi"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, API_VERSIONS[0], strict=True)
    doc = yaml.safe_load(text)
    doc["spec"]["containers"][0]["resizePolicy"] = "NotRequired"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, API_VERSIONS[-1], strict=True)


def test_npu_chat_pod_carries_the_budget_probe_volume_and_comments() -> None:
    text = _render("k8s", "npu-chat", "rk3588")
    doc = _validate(text)
    c = doc["spec"]["containers"][0]
    assert c["command"] == [ENGINE[0]] and c["args"] == list(ENGINE[1:])
    assert c["resources"] == {
        "requests": {"memory": "1153432Ki", "cpu": "3500m"},  # memory.min = 1.1GiB
        "limits": {"memory": "1887436Ki", "cpu": "3500m"},  # memory.max = 1.8GiB, cpu.max 350%
    }
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8080}
    assert {v["hostPath"]["path"] for v in doc["spec"]["volumes"]} == {"/models", "/opt/llama/bin"}
    assert [r["resourceName"] for r in c["resizePolicy"]] == ["cpu", "memory"]
    comments = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert "# QoS class: Burstable" in comments
    for field in ("memory.min = ", "memory.oom_group = true", "[[pressure]] rule(s) (PSI)"):
        assert any(field in ln for ln in comments), field
    assert any("not on this machine" in ln for ln in comments)  # why memory.min is the request


@pytest.mark.parametrize(
    ("body", "qos", "requests", "limits"),
    [
        (
            '[memory]\nmin = "1GiB"\nmax = "1GiB"\n[cpu]\ncpus = "4-7"',
            "Guaranteed",
            {"memory": "1Gi", "cpu": "4"},
            {"memory": "1Gi", "cpu": "4"},
        ),
        ("[io]\nweight = 100", "BestEffort", {}, {}),
        (
            '[memory]\nmax = "1GiB"\n[cpu]\nmax = "150%"',
            "Guaranteed",  # no request: the kubelet takes the limit
            {"cpu": "1500m"},
            {"memory": "1Gi", "cpu": "1500m"},
        ),
        (
            '[memory]\nmin = "512MiB"\nmax = "1GiB"',
            "Burstable",
            {"memory": "512Mi"},
            {"memory": "1Gi"},
        ),
        ('[cpu]\ncpus = "4-7"\nmax = "200%"', "Burstable", {"cpu": "2"}, {"cpu": "2"}),
    ],
)
def test_qos_class_follows_the_budget(
    body: str, qos: str, requests: dict[str, str], limits: dict[str, str]
) -> None:
    plan = _plan(f'name = "q"\n{body}\n')
    res = k8s.resources(plan, k8s.Workload(argv=("/bin/engine",)))
    assert (res.qos, res.requests, res.limits) == (qos, requests, limits)


def test_the_estimate_is_the_memory_request_and_the_limit_caps_it() -> None:
    plan = _plan('name = "e"\n[memory]\nmin = "256MiB"\nmax = "1GiB"\n')
    est = k8s.resources(plan, k8s.Workload(argv=("x",), estimate_bytes=700 << 20))
    assert est.requests["memory"] == "700Mi"
    assert est.memory_request_from == "the GGUF estimate of the engine argv"
    capped = k8s.resources(plan, k8s.Workload(argv=("x",), estimate_bytes=2 << 30))
    assert capped.requests["memory"] == "1Gi"


def test_render_refuses_like_check(tmp_path: Path) -> None:
    """A context above engine.max_context_tokens is refused (65) before anything is rendered;
    no engine after -- is a usage error."""
    argv = (*ENGINE[:3], "-c", "8192")
    with pytest.raises(PolicyError, match="max_context_tokens"):
        fleet.render(
            "k8s", POLICY_DIR / "npu-chat.toml", HostOptions(root=HOSTS / "rk3588"), argv, image="i"
        )
    with pytest.raises(UsageError):
        fleet.render(
            "k8s", POLICY_DIR / "npu-chat.toml", HostOptions(root=HOSTS / "rk3588"), (), image="i"
        )


def test_no_policy_text_can_start_a_yaml_line() -> None:
    plan = _plan('name = "n"\n[memory]\nmax = "1GiB"\n[process]\nenv = { A = "x\\nkind: Evil" }\n')
    text = k8s.render(plan, k8s.Workload(argv=("/bin/e", "a\nkind: Evil")))
    doc = _validate(text)
    assert doc["kind"] == "Pod"
    assert doc["spec"]["containers"][0]["args"] == ["a\nkind: Evil"]
    assert doc["spec"]["containers"][0]["env"] == [{"name": "A", "value": "x\nkind: Evil"}]


# ---------------------------------------------------------------- the Quadlet file


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            out[current] = []
        elif line and not line.startswith("#") and current:
            out[current].append(line)
    return out


def test_quadlet_service_carries_the_slice_and_the_limits() -> None:
    text = _render("quadlet", "npu-chat", "rk3588")
    s = _sections(text)
    assert "Slice=governor-npu\\x2dchat.slice" in s["Service"]
    for directive in (
        "MemoryMin=1181114368",
        "MemoryHigh=1717985280",
        "MemoryMax=1932734464",
        "CPUQuota=350%",
        "AllowedCPUs=4-7",
        "TasksMax=512",
        "OOMPolicy=kill",
    ):
        assert directive in s["Service"], directive
    assert s["Container"][0] == "Image=docker.io/library/debian:12-slim"
    assert "Exec=" + " ".join(ENGINE) in s["Container"]
    assert "Volume=/models:/models:ro" in s["Container"]


@pytest.mark.parametrize(("policy", "host"), CASES, ids=[f"{p}@{h}" for p, h in CASES])
def test_quadlet_unit_parts_pass_systemd_analyze_verify(
    policy: str, host: str, tmp_path: Path
) -> None:
    """What the generator passes through ([Unit], [Service], [Install]) as a plain service with
    the ExecStart= quadlet would add (here /bin/true): systemd-analyze verify accepts it."""
    tool = shutil.which("systemd-analyze")
    assert tool is not None, "systemd-analyze missing (apt-get install systemd)"
    text = _render("quadlet", policy, host)
    s = _sections(text)
    service = s["Service"] + ["ExecStart=/bin/true"]
    unit = "\n".join(
        ["[Unit]", *s["Unit"], "", "[Service]", *service, "", "[Install]", *s["Install"], ""]
    )
    (tmp_path / f"{policy}.service").write_text(unit)
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{tmp_path}:", SYSTEMD_LOG_LEVEL="notice")
    out = subprocess.run(
        [tool, "verify", "--man=no", f"{policy}.service"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    ours = [ln for ln in (out.stdout + out.stderr).splitlines() if str(tmp_path) in ln]
    assert out.returncode == 0, out.stdout + out.stderr
    assert not ours, "\n".join(ours)
