"""Composition root: builds the objects each command needs from its arguments.

The CLI calls only these functions; tests call them too, with fixture roots."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from governor.plan.compiler import Workload
    from governor.plan.doctor import Finding
    from governor.plan.host import HostFacts
    from governor.plan.model import Plan
    from governor.policy.model import Policy


@dataclass(frozen=True)
class HostOptions:
    """Where to look: the filesystem root for /proc and /sys, and the cgroup2 mount."""

    root: Path = Path("/")
    cgroup_root: Path | None = None
    allow_missing: frozenset[str] = field(default_factory=frozenset)


def load_policy(path: Path) -> Policy:
    from governor.policy.loader import load

    return load(path)


def probe_host(opts: HostOptions, *, target: str | None = None) -> HostFacts:
    from governor.plan.host import probe

    return probe(opts.root, cgroup_root=opts.cgroup_root, target=target)


def check(path: Path, opts: HostOptions, *, workload: Workload | None = None) -> Plan:
    """load + probe + compile: what every command that touches a host starts with."""
    from governor.plan.compiler import compile_plan

    policy = load_policy(path)
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    return compile_plan(
        policy, host, workload=workload, allow_missing=opts.allow_missing, source=str(path)
    )


def doctor(opts: HostOptions) -> tuple[HostFacts, list[Finding]]:
    from governor.plan.doctor import diagnose

    host = probe_host(opts)
    return host, diagnose(host)


def schema() -> dict[str, Any]:
    from governor.policy.model import Policy

    out = Policy.model_json_schema(by_alias=True, mode="validation")
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "governor policy"
    return out
