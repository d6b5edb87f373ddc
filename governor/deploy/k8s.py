"""Plan -> a Kubernetes Pod (or Deployment) manifest for `governor render k8s`.

Pure: no files, no environment, no clock. Under the kubelet the pod's cgroups are the kubelet's,
so the policy's budget becomes the container's resources (what Pod resources can express) and
every other policy field becomes a YAML comment saying what to use instead.

- requests.memory: the GGUF estimate of the engine argv when there is one, else memory.min
  (the model's page cache; a working set inflated by mmap'd pages is not a request);
  limits.memory: memory.max. A request coupled to the limit is what made LLMKube's OOM loops.
- cpu: cpu.max as millicores, at most the number of CPUs in cpu.cpus; requests = limits.
- the QoS class those yield and why (Guaranteed is what the static CPU manager pins cores for).
- the engine argv byte for byte (every ``$`` doubled: the kubelet expands ``$(VAR)``); the
  model's directory (and an absolute engine binary's) as read-only hostPath volumes at the same
  paths, normalised, never ``/`` or a system directory (then the file alone), and a path with
  ``..`` or a relative one refused; a readiness and a startup probe on the ready URL
  (llama-server's /health); resizePolicy NotRequired for live tunes (in-place resize).

The YAML is written by hand (comments are the point, and no YAML library is a dependency):
every string is a JSON string, which YAML reads as a double-quoted scalar.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from governor.deploy.dropin import unit_text
from governor.deploy.mounts import Mount, host_mounts
from governor.kernel.parse import parse_cpulist
from governor.plan.model import Plan

DEFAULT_IMAGE = "docker.io/library/debian:12-slim"
CONTAINER = "engine"
MEMORY_THROTTLING_FACTOR = 0.9  # the kubelet's default (MemoryQoS)
PROBE_PERIOD_S = 5

Kind = Literal["Pod", "Deployment"]


@dataclass(frozen=True)
class Workload:
    """What the render knows beyond the plan: the engine argv and what was read from it."""

    argv: tuple[str, ...]
    model: str | None = None  # the -m path (llama.cpp)
    models: tuple[str, ...] = ()  # every part of a split GGUF (default: model alone)
    ready_url: str | None = None  # engine.ready, or llama-server's /health from --host/--port
    listen_host: str | None = None  # llama-server --host (None: its default, loopback)
    estimate_bytes: int | None = None  # the GGUF estimate of this argv
    estimate_note: str | None = None  # why there is none
    image: str = DEFAULT_IMAGE
    kind: Kind = "Pod"
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Resources:
    requests: dict[str, str]
    limits: dict[str, str]
    memory_request_from: str | None
    qos: str
    why: list[str]


# --- quantities --------------------------------------------------------------------------------


def quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity: the largest binary suffix that divides it exactly."""
    for suffix, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


def millicores(cpu_max: str) -> int | None:
    """cpu.max ("350000 100000") as millicores; None for "max ..."."""
    quota, _, period = cpu_max.partition(" ")
    if quota == "max":
        return None
    return int(quota) * 1000 // int(period or "100000")


def cpu_quantity(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _writes(plan: Plan) -> dict[str, str]:
    return {w.file: w.value for w in plan.writes}


def _bytes(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def resources(plan: Plan, work: Workload) -> Resources:
    """The container's requests and limits and the QoS class the kubelet gives them."""
    w = _writes(plan)
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    why: list[str] = []
    mem_max = _bytes(w.get("memory.max"))
    mem_min = _bytes(w.get("memory.min"))
    request, source = None, None
    if work.estimate_bytes is not None:
        request, source = work.estimate_bytes, "the GGUF estimate of the engine argv"
    elif mem_min:
        request, source = mem_min, "memory.min"
    if request is not None and mem_max is not None:
        request = min(request, mem_max)
    if mem_max is not None:
        limits["memory"] = quantity(mem_max)
    if request is not None:
        requests["memory"] = quantity(request)
    milli = millicores(w["cpu.max"]) if "cpu.max" in w else None
    cpus = len(parse_cpulist(w["cpuset.cpus"])) if "cpuset.cpus" in w else None
    if cpus is not None:
        milli = min(milli, cpus * 1000) if milli is not None else cpus * 1000
    if milli is not None:
        limits["cpu"] = requests["cpu"] = cpu_quantity(milli)
    # the kubelet defaults a missing request to its limit
    eff = {k: requests.get(k, limits.get(k)) for k in ("cpu", "memory")}
    if not requests and not limits:
        qos = "BestEffort"
        why.append("no requests and no limits")
    elif all(k in limits and eff[k] == limits[k] for k in ("cpu", "memory")):
        qos = "Guaranteed"
        why.append("requests equal limits for cpu and memory")
    else:
        qos = "Burstable"
        if "memory" not in limits:
            why.append("no memory limit (the policy has no memory.max)")
        elif eff["memory"] != limits["memory"]:
            why.append(
                f"requests.memory {eff['memory']} ({source}) is below limits.memory"
                f" {limits['memory']} (memory.max)"
            )
        if "cpu" not in limits:
            why.append("no cpu limit (the policy has neither cpu.max nor cpu.cpus)")
    if qos != "Guaranteed":
        why.append(
            "Guaranteed (what the static CPU manager pins whole cores for) needs requests ="
            " limits for cpu and memory: set memory.min = memory.max in a policy for the cluster,"
            " or keep Burstable and its headroom for the page cache"
        )
    if "cpu" in limits and milli is not None and milli % 1000:
        why.append(
            f"cpu {limits['cpu']} is not a whole number of CPUs: the static CPU manager pins"
            " only integer requests of a Guaranteed pod"
        )
    return Resources(requests, limits, source, qos, why)


# --- what Pod resources cannot say -------------------------------------------------------------


def unexpressed(plan: Plan, res: Resources) -> list[tuple[str, str]]:
    """(policy field, what to use instead) for each policy field the Pod cannot carry."""
    w = _writes(plan)
    return [*_memory_fields(w, res), *_cpu_io_and_rules(plan, w), *_process_fields(plan, res)]


def _memory_fields(w: dict[str, str], res: Resources) -> list[tuple[str, str]]:
    """memory.min/low/high/swap/oom_group: what the kubelet (MemoryQoS, swapBehavior) does."""
    out: list[tuple[str, str]] = []
    mem_min = _bytes(w.get("memory.min"))
    if mem_min is not None:
        out.append(
            (
                f"memory.min = {quantity(mem_min)}",
                "no Pod field protects memory; the kubelet's MemoryQoS feature gate (alpha)"
                " writes memory.min = requests.memory"
                f" ({res.requests.get('memory', 'none')} here) on the container's cgroup",
            )
        )
    if "memory.low" in w:
        out.append((f"memory.low = {w['memory.low']}", "no Pod field; no kubelet setting"))
    high, top = _bytes(w.get("memory.high")), _bytes(w.get("memory.max"))
    if high is not None:
        req = _bytes(_unquantity(res.requests.get("memory"))) or 0
        factor = (
            f"memoryThrottlingFactor: {(high - req) / (top - req):.2f} gives this value"
            f" (default {MEMORY_THROTTLING_FACTOR})"
            if top is not None and top > req and high >= req
            else "its memoryThrottlingFactor sets it"
        )
        out.append(
            (
                f"memory.high = {quantity(high)}",
                "MemoryQoS (alpha) writes memory.high = requests + memoryThrottlingFactor x"
                f" (limits - requests); {factor}",
            )
        )
    if "memory.swap.max" in w:
        out.append(
            (
                f"memory.swap_max = {w['memory.swap.max']}",
                "the kubelet's swapBehavior: NoSwap (the default) is 0; LimitedSwap sizes it"
                " from requests.memory",
            )
        )
    if w.get("memory.oom.group") == "1":
        out.append(
            (
                "memory.oom_group = true",
                "the kubelet (1.28+, cgroup v2) sets memory.oom.group = 1 on each container"
                " unless singleProcessOOMKill: true: keep that kubelet setting off",
            )
        )
    return out


def _cpu_io_and_rules(plan: Plan, w: dict[str, str]) -> list[tuple[str, str]]:
    """cpu.weight/cpus, pids, io and the [[pressure]] rules."""
    out: list[tuple[str, str]] = []
    if "cpu.weight" in w:
        out.append(
            (
                f"cpu.weight = {w['cpu.weight']}",
                "the kubelet derives cpu.weight from requests.cpu; raise requests.cpu",
            )
        )
    if "cpuset.cpus" in w:
        out.append(
            (
                f"cpu.cpus = {w['cpuset.cpus']}",
                "a pod cannot name cores: with the static CPU manager a Guaranteed pod with an"
                " integer cpu gets exclusive cores; keep the others out of its pool with the"
                " kubelet's reservedSystemCPUs",
            )
        )
    if "pids.max" in w:
        out.append((f"pids.max = {w['pids.max']}", "the kubelet's podPidsLimit (node-wide)"))
    if "io.weight" in w:
        out.append((f"io.weight = {w['io.weight']}", "no Pod field; no kubelet setting"))
    if plan.watch:
        out.append(
            (
                f"{len(plan.watch)} [[pressure]] rule(s) (PSI)",
                "the kubelet has no PSI rules (node-pressure eviction is node-wide and late):"
                " run `governor monitor POLICY --cgroup <the pod's container cgroup>` on the node",
            )
        )
    return out


def _process_fields(plan: Plan, res: Resources) -> list[tuple[str, str]]:
    """[process], prefetch and restarts: the container runtime's and the kubelet's."""
    out: list[tuple[str, str]] = []
    launch = plan.launch
    if launch.oom_score_adj is not None:
        out.append(
            (
                f"process.oom_score_adj = {launch.oom_score_adj}",
                f"the kubelet sets it from the QoS class ({res.qos})",
            )
        )
    if launch.nice is not None:
        out.append((f"process.nice = {launch.nice}", "no Pod field"))
    if launch.memlock is not None:
        out.append(
            (
                f"process.memlock = {launch.memlock}",
                "RLIMIT_MEMLOCK is the container runtime's; mlock needs"
                " securityContext.capabilities.add: [IPC_LOCK]",
            )
        )
    if launch.user is not None or launch.group is not None:
        out.append(
            (
                f"process.user/group = {launch.user}/{launch.group}",
                "securityContext.runAsUser/runAsGroup (numeric ids)",
            )
        )
    if plan.prefetch.mode != "none":
        out.append(
            (
                f"prefetch.mode = {plan.prefetch.mode}",
                "an initContainer that reads the model (its page cache is charged to the pod)",
            )
        )
    if launch.restart_max:
        out.append(
            (
                f"process.restart_max = {launch.restart_max}",
                "restartPolicy: Always with the kubelet's back-off (10 s doubling, 5 min cap)",
            )
        )
    return out


def _unquantity(q: str | None) -> str | None:
    if q is None:
        return None
    for suffix, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if q.endswith(suffix):
            return str(int(q[: -len(suffix)]) << shift)
    return q


# --- YAML --------------------------------------------------------------------------------------


def _s(value: str) -> str:
    return json.dumps(value)


def kubelet_literal(value: str) -> str:
    """A command, args or env value the kubelet passes as it is: it expands ``$(VAR)`` there
    and reads ``$$`` as one ``$`` (kubernetes third_party/forked/golang/expansion), so every
    ``$`` is doubled: the engine gets the argv's bytes, ``$(HOME)`` and ``$$`` included."""
    return value.replace("$", "$$")


def volumes(work: Workload) -> list[Mount]:
    """The hostPath volumes of the engine's model (every part) and absolute binary."""
    return host_mounts(work.argv, work.models or ((work.model,) if work.model else ()))


def _probe(url: str, indent: str, *, startup_s: float | None) -> list[str]:
    parts = urlsplit(url)
    lines = [
        f"{indent}httpGet:",
        f"{indent}  path: {_s(parts.path or '/')}",
        f"{indent}  port: {parts.port}",
        f"{indent}periodSeconds: {PROBE_PERIOD_S}",
    ]
    if startup_s is not None:
        lines.append(f"{indent}failureThreshold: {max(1, int(startup_s) // PROBE_PERIOD_S)}")
    return lines


def _container(plan: Plan, work: Workload, res: Resources, indent: str) -> list[str]:
    i = indent
    lines = [f"{i}- name: {CONTAINER}", f"{i}  image: {_s(work.image)}"]
    if work.argv:
        lines.append(f"{i}  command: [{_s(kubelet_literal(work.argv[0]))}]")
        if work.argv[1:]:
            lines.append(f"{i}  args:")
            lines += [f"{i}  - {_s(kubelet_literal(a))}" for a in work.argv[1:]]
    env = {**plan.launch.env, **work.env}
    if env:
        lines.append(f"{i}  env:")
        for key in sorted(env):
            lines += [
                f"{i}  - name: {_s(key)}",
                f"{i}    value: {_s(kubelet_literal(env[key]))}",
            ]
    lines.append(f"{i}  resources:")
    for what, values in (("requests", res.requests), ("limits", res.limits)):
        if values:
            lines.append(f"{i}    {what}:")
            lines += [f"{i}      {k}: {_s(values[k])}" for k in sorted(values)]
    if res.limits:
        lines += [
            f"{i}  # a live tune (`governor tune` on a board) is an in-place resize here"
            " (stable in 1.35): kubectl patch pod --subresource resize",
            f"{i}  resizePolicy:",
        ]
        for name in sorted(res.limits):
            lines += [
                f"{i}  - resourceName: {name}",
                f"{i}    restartPolicy: NotRequired",
            ]
    if work.ready_url is not None:
        if work.listen_host in (None, "127.0.0.1", "localhost", "::1"):
            lines.append(
                f"{i}  # the kubelet probes the pod's IP: the engine must listen on it"
                " (llama-server --host 0.0.0.0)"
            )
        lines.append(f"{i}  readinessProbe:")
        lines += _probe(work.ready_url, f"{i}    ", startup_s=None)
        lines.append(f"{i}  # engine.ready_timeout = {plan.engine.ready_timeout_s:g}s")
        lines.append(f"{i}  startupProbe:")
        lines += _probe(work.ready_url, f"{i}    ", startup_s=plan.engine.ready_timeout_s)
    mounts = volumes(work)
    if mounts:
        lines.append(f"{i}  volumeMounts:")
        for name, path, _type in mounts:
            lines += [
                f"{i}  - name: {name}",
                f"{i}    mountPath: {_s(path)}",
                f"{i}    readOnly: true",
            ]
    return lines


def _pod_spec(plan: Plan, work: Workload, res: Resources, indent: str) -> list[str]:
    i = indent
    lines = [f"{i}restartPolicy: Always", f"{i}containers:"]
    lines += _container(plan, work, res, i)
    mounts = volumes(work)
    if mounts:
        lines.append(f"{i}volumes:")
        for name, path, kind in mounts:
            lines += [
                f"{i}- name: {name}",
                f"{i}  hostPath:",
                f"{i}    path: {_s(path)}",
                f"{i}    type: {kind}",
            ]
    return lines


def _header(plan: Plan, work: Workload, res: Resources, degraded: Sequence[str]) -> list[str]:
    src = f" ({plan.source})" if plan.source else ""
    lines = [
        f"# Generated by `governor render k8s` from policy {plan.policy}{src}.",
        "# Under the kubelet only what Pod resources express is enforced; on a plain board",
        "# `governor install` / `governor launch` enforce all of the policy.",
        f"# QoS class: {res.qos}",
    ]
    lines += [f"#   {why}" for why in res.why]
    if res.memory_request_from is not None:
        lines.append(f"# requests.memory: {res.memory_request_from}")
    if work.estimate_note:
        lines.append(f"# requests.memory: {work.estimate_note}")
    notes = unexpressed(plan, res)
    if notes:
        lines.append("# Not expressible in Pod resources (what to use instead):")
        lines += [f"#   {what}: {instead}" for what, instead in notes]
    for d in degraded:
        lines.append(f"# NOT rendered (controller missing on the probed host): {d}")
    return lines


def render(plan: Plan, work: Workload) -> str:
    """The manifest: a Pod, or a one-replica Deployment (Recreate: two engines do not fit)."""
    res = resources(plan, work)
    lines = _header(plan, work, res, plan.degraded)
    labels = [
        f"app.kubernetes.io/name: {_s(plan.policy)}",
        'app.kubernetes.io/managed-by: "governor"',
    ]
    lines += [
        "apiVersion: " + ("v1" if work.kind == "Pod" else "apps/v1"),
        f"kind: {work.kind}",
        "metadata:",
        f"  name: {_s(plan.policy)}",
        "  labels:",
        *(f"    {label}" for label in labels),
        "spec:",
    ]
    if work.kind == "Pod":
        lines += _pod_spec(plan, work, res, "  ")
    else:
        lines += [
            "  replicas: 1",
            "  strategy:",
            "    type: Recreate",
            "  selector:",
            "    matchLabels:",
            f"      app.kubernetes.io/name: {_s(plan.policy)}",
            "  template:",
            "    metadata:",
            "      labels:",
            *(f"        {label}" for label in labels),
            "    spec:",
        ]
        lines += _pod_spec(plan, work, res, "      ")
    # no text from a policy or an argv can start a line of its own (JSON strings are escaped
    # already; comments carry policy text)
    return unit_text(lines, keep_tab=False)
