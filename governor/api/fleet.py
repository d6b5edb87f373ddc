"""`governor render k8s` and `governor render quadlet` in the composition root: load, read the
engine argv, compile against the probed board (the global --root renders for another board's
facts), estimate the model when it is here, and hand the plan to the pure renderers in
governor/deploy/ (k8s.py, quadlet.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from governor.api.host import HostOptions, compile_policy, load_policy, probe_host
from governor.api.launch_compile import ready_url
from governor.deploy import k8s, quadlet
from governor.engines.llama import EngineArgs, is_gguf, model_parts
from governor.engines.preflight import engine_args, fit_estimate
from governor.errors import UsageError
from governor.plan.model import Plan

Target = Literal["k8s", "quadlet"]
DEFAULT_SYSTEMD = 252  # Debian 12's, when the probed host does not run systemd


def render(
    target: Target,
    path: Path,
    opts: HostOptions,
    engine: Sequence[str],
    *,
    image: str,
    kind: Literal["Pod", "Deployment"] = "Pod",
    force: bool = False,
) -> str:
    if not engine:
        raise UsageError(
            "no engine command after -- (-- ENGINE)",
            hint=f"governor render {target} POLICY -- /path/llama-server -m MODEL.gguf -c 2048",
        )
    policy = load_policy(path)
    args = engine_args(
        policy.engine.kind,
        policy.engine.max_context_tokens,
        engine,
        max_cache_ram=policy.engine.max_cache_ram,
        env=policy.process.env,
    )
    host = probe_host(opts, target=f"{policy.slice}/{policy.name}")
    plan = compile_policy(policy, host, opts, path)
    estimate, note = _estimate(plan, args, opts, path, force=force)
    work = _workload(plan, engine, args, image=image, kind=kind, estimate=(estimate, note))
    if target == "k8s":
        return k8s.render(plan, work)
    return quadlet.render(plan, work, host.systemd_version or DEFAULT_SYSTEMD)


def _workload(
    plan: Plan,
    engine: Sequence[str],
    args: EngineArgs | None,
    *,
    image: str,
    kind: Literal["Pod", "Deployment"],
    estimate: tuple[int | None, str | None],
) -> k8s.Workload:
    """What the renderers need of the engine: its argv, model files, readiness, estimate."""
    return k8s.Workload(
        argv=tuple(engine),
        model=args.model if args is not None else None,
        models=tuple(str(m) for m in model_parts(args.model)) if args and args.model else (),
        ready_url=ready_url(plan, args),
        listen_host=args.host if args is not None else None,
        estimate_bytes=estimate[0],
        estimate_note=estimate[1],
        image=image,
        kind=kind,
    )


def _estimate(
    plan: Plan, args: EngineArgs | None, opts: HostOptions, path: Path, *, force: bool
) -> tuple[int | None, str | None]:
    """The GGUF estimate of the argv when its model is readable here (refused like `check`
    when it does not fit memory.max, unless --force); else (None, why)."""
    if args is None or args.model is None or not is_gguf(args):
        return None, None
    if not Path(args.model).is_file():
        return None, f"no estimate: the model {args.model} is not on this machine"
    writes = {w.file: w.value for w in plan.writes}

    def limit(file: str) -> int | None:
        value = writes.get(file)
        return int(value) if value is not None and value.isdigit() else None

    est, _, _ = fit_estimate(
        args,
        memory_max=limit("memory.max"),
        memory_high=limit("memory.high"),
        root=opts.root,
        force=force,
        source=str(path),
    )
    if est is None:
        return None, "no estimate: the gguf package is missing"
    return est.total, None
