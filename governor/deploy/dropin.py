"""Plan -> systemd unit files and drop-ins (text), from the mapping table in
plan/unitmap.py. Pure: no files, no environment, no clock; ``governor install`` writes the
result. Everything systemd cannot express (or this systemd version cannot) is applied by
``governor launch`` on the engine leaf at start, and the rendered files say so in a comment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from governor.errors import PolicyError
from governor.plan.model import Plan
from governor.plan.unitmap import (
    ENGINE_LEAF,
    OOM_POLICY_MIN_SYSTEMD,
    Split,
    policy_slice,
    service_unit,
    split,
)

SERVICE_TEMPLATE = "governor@.service"
ROOT_SLICE = "governor.slice"
GOVERNOR_PLACEHOLDER = "@GOVERNOR@"
DEFAULT_GOVERNOR = "/usr/local/bin/governor"
UNIT_DIR = "etc/systemd/system"
POLICY_DIR = "/etc/governor"

Section = Literal["Slice", "Service"]

# Service-side settings from [process]; D-Bus names equal the directives. Not used for scopes
# (a scope has no exec context: the launcher applies them to the engine in any case).
SERVICE_DIRECTIVES: tuple[tuple[str, str], ...] = (
    ("process.oom_score_adj", "OOMScoreAdjust"),
    ("process.nice", "Nice"),
    ("process.memlock", "LimitMEMLOCK"),
    ("process.env", "Environment"),
    ("memory.oom_group", "OOMPolicy"),
)


def governor_applies(plan: Plan) -> list[tuple[str, str]]:
    """What ``governor launch`` does itself at start whatever systemd's version, for this plan."""
    out: list[tuple[str, str]] = []
    if plan.launch.user or plan.launch.group:
        out.append(
            (
                "process.user/group",
                "not User=/Group=: the launcher drops to them"
                " before exec; the supervisor stays root to manage its delegated subtree",
            )
        )
    if plan.launch.memlock == "model":
        out.append(
            (
                'process.memlock = "model"',
                "LimitMEMLOCK needs the model's size, known"
                " only from the engine's -m: the launcher sets RLIMIT_MEMLOCK",
            )
        )
    if plan.launch.affinity is not None:
        out.append(
            ("cpu.cpus (affinity)", "the launcher also pins the engine with sched_setaffinity")
        )
    if plan.prefetch.mode != "none":
        out.append(
            (
                f"prefetch.mode = {plan.prefetch.mode}",
                "runs in the engine's leaf so the pages are charged to it",
            )
        )
    if plan.watch:
        out.append(
            (
                f"{len(plan.watch)} [[pressure]] rule(s)",
                "the governor's monitor acts on PSI triggers; systemd has no rule engine",
            )
        )
    if plan.engine.kind != "generic":
        out.append(
            (
                f"engine.kind = {plan.engine.kind}",
                "argv caps are checked before anything is applied",
            )
        )
    return out


def service_settings(plan: Plan, systemd_version: int) -> list[tuple[str, str, str]]:
    """(policy field or reason, directive, value) for the instance's [Service] section.

    They apply to the supervising governor too (it holds no model); the launcher sets the
    same values on the engine in any case."""
    spec = plan.launch
    out: list[tuple[str, str, str]] = []
    if spec.oom_score_adj is not None:
        out.append(("process.oom_score_adj", "OOMScoreAdjust", str(spec.oom_score_adj)))
    if spec.nice is not None:
        out.append(("process.nice", "Nice", str(spec.nice)))
    if isinstance(spec.memlock, int):
        out.append(
            (
                "process.memlock",
                "LimitMEMLOCK",
                "infinity" if spec.memlock == -1 else str(spec.memlock),
            )
        )
    for key in sorted(spec.env):
        out.append(("process.env", "Environment", quote_word(f"{key}={spec.env[key]}")))
    if systemd_version >= OOM_POLICY_MIN_SYSTEMD:
        # the supervising governor reports an OOM kill and exits 128+9; OOMPolicy=stop would
        # stop the unit under it, OOMPolicy=kill would set memory.oom.group on the whole unit
        # (supervisor included): governor sets memory.oom.group on the engine leaf instead
        out.append(("OOM kills: reported by the supervising governor", "OOMPolicy", "continue"))
    return out


# --- quoting (systemd.syntax(7), systemd.service(5) "Command lines") --------------------------


def quote_word(word: str) -> str:
    """One word for a unit file: specifiers (%) doubled, quoted when it has space or quotes."""
    text = word.replace("%", "%%")
    if text and not any(c in text for c in " \t\n\"'\\;$"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def quote_exec_word(word: str) -> str:
    """One ExecStart= argument: as quote_word, and ``$`` doubled (no variable expansion)."""
    return quote_word(word.replace("$", "$$"))


# --- rendering ---------------------------------------------------------------------------------


def unit_text(lines: Sequence[str], *, keep_tab: bool = True) -> str:
    """THE escaper of rendered text (units, Quadlet, Kubernetes YAML): join the lines; a control
    character inside any one of them (a policy path with a newline echoed in a comment) is
    written as a visible ``\\xNN``, so no text from a policy can start a line of its own.
    Directive values are quoted by quote_word. ``keep_tab``: False for YAML (no tabs there)."""
    return "".join(_one_line(line, keep_tab) + "\n" for line in lines)


def _one_line(line: str, keep_tab: bool) -> str:
    if line.isprintable():
        return line
    keep = "\t" if keep_tab else ""
    return "".join(c if c.isprintable() or c in keep else f"\\x{ord(c):02x}" for c in line)


GOVERNOR_SLICE = """\
# governor.slice: parent of the slices of LLM engines run under governor policies.
# Shipped by governor (units/governor.slice); `governor install` writes it when missing.
[Unit]
Description=governor: LLM engines under resource policies
Before=slices.target
"""

SERVICE_TEMPLATE_TEXT = """\
# governor@.service: runs one LLM engine under the governor policy named by the instance.
#   systemctl start governor@npu-chat      (policy /etc/governor/npu-chat.toml)
# The engine command comes from GOVERNOR_ENGINE in /etc/governor/<policy>.env (split at
# whitespace), or from the ExecStart= that `governor install POLICY -- ENGINE...` writes into
# the instance's drop-in. `governor install POLICY` also writes the policy's slice with its limits.
# GOVERNOR_METRICS=[ADDR:]PORT in the .env file serves Prometheus /metrics while the engine
# runs (`governor launch --metrics`; ADDR defaults to 127.0.0.1).
[Unit]
Description=governor: LLM engine under policy %i

[Service]
# READY=1 is sent over $NOTIFY_SOCKET once the engine has been exec'd
Type=notify
NotifyAccess=main
Environment=GOVERNOR_POLICY=/etc/governor/%i.toml
EnvironmentFile=-/etc/governor/%i.env
ExecStart=@GOVERNOR@ launch --backend systemd --policy ${GOVERNOR_POLICY} -- $GOVERNOR_ENGINE
# the unit's cgroup subtree belongs to governor: it moves itself to <unit>/supervisor and runs
# the engine in <unit>/engine (no internal processes)
Delegate=yes
# /var/lib/governor: what runs measured of each model (governor/state/store.py), kept across
# reboots (the run dir /run/governor is a tmpfs)
StateDirectory=governor
# SIGTERM to the governor only; it forwards it to the engine and cleans up
KillMode=mixed
TimeoutStopSec=30s
# the governor exits with the engine's status; 143 = the engine ended by the SIGTERM of a stop
SuccessExitStatus=143
Restart=on-failure
# usage (2), bad policy (65), missing file (66), host cannot enforce (69), permission (77),
# engine not executable / not found (126/127): restarting cannot help
RestartPreventExitStatus=2 65 66 69 77 126 127
# governor writes one JSON object per line on stderr when it is not a TTY
StandardError=journal
SyslogIdentifier=governor-%i
"""


def render_service_template(governor: str = DEFAULT_GOVERNOR) -> str:
    return SERVICE_TEMPLATE_TEXT.replace(GOVERNOR_PLACEHOLDER, quote_exec_word(governor))


def _header(plan: Plan, version: int) -> list[str]:
    src = f" ({plan.source})" if plan.source else ""
    return [
        f"# Generated by `governor install` from policy {plan.policy}{src} for systemd {version}.",
        "# Do not edit: change the policy and run `governor install` again.",
    ]


def render_slice(plan: Plan, systemd_version: int) -> str:
    """The policy's slice unit (``governor-<name>.slice``) with every limit systemd can set."""
    parts = split(plan, systemd_version)
    lines = _header(plan, systemd_version)
    lines += [
        "[Unit]",
        f"Description=governor policy {plan.policy}",
        "Before=slices.target",
        "",
        "[Slice]",
    ]
    for s in parts.unit:
        lines.append(f"# {s.write.reason} -> {s.write.file} = {s.write.value}")
        lines.append(f"{s.directive}={s.ini}")
    lines += _governor_notes(plan, parts)
    return unit_text(lines)


def _governor_notes(plan: Plan, parts: Split) -> list[str]:
    lines = [
        "",
        f"# Not set by systemd: `governor launch`, the main process of {service_unit(plan.policy)},",
        "# applies these itself at start:",
    ]
    for d in parts.governor:
        lines.append(
            f"#   {d.write.file} = {d.write.value} on the engine leaf .../{ENGINE_LEAF}"
            f" ({d.write.reason}): {d.why}"
        )
    for what, why in governor_applies(plan):
        lines.append(f"#   {what}: {why}")
    for missing in plan.degraded:
        lines.append(f"# NOT in force on this host: {missing}")
    return lines


def render_instance(
    plan: Plan,
    systemd_version: int,
    *,
    policy_path: str,
    governor: str = DEFAULT_GOVERNOR,
    engine: Sequence[str] | None = None,
) -> str:
    """The drop-in ``governor@<name>.service.d/50-governor.conf``."""
    lines = _header(plan, systemd_version)
    lines += [
        "[Service]",
        f"Slice={policy_slice(plan.slice, plan.policy)}",
        f"Environment={quote_word('GOVERNOR_POLICY=' + policy_path)}",
    ]
    for field, directive, value in service_settings(plan, systemd_version):
        lines.append(f"# {field}")
        lines.append(f"{directive}={value}")
    if plan.engine.kind == "llama.cpp":
        # READY=1 waits for the engine's ready URL (llama-server's /health) up to
        # engine.ready_timeout, then governor stops it itself (69): systemd must not give up
        # first (its default TimeoutStartSec is 90 s). Unit-file only: no transient scope waits.
        lines.append("# engine.ready_timeout + 60 s")
        lines.append(f"TimeoutStartSec={int(plan.engine.ready_timeout_s) + 60}s")
    if engine:
        cmd = [
            governor,
            "launch",
            "--backend",
            "systemd",
            "--policy",
            policy_path,
            "--",
            *engine,
        ]
        lines += ["ExecStart=", "ExecStart=" + " ".join(quote_exec_word(w) for w in cmd)]
    if systemd_version < OOM_POLICY_MIN_SYSTEMD:
        lines.append(f"# OOMPolicy= needs systemd >= {OOM_POLICY_MIN_SYSTEMD}")
    return unit_text(lines)


@dataclass(frozen=True)
class UnitFile:
    path: str  # relative to the install root, e.g. etc/systemd/system/governor.slice
    text: str


def render_install(
    plan: Plan,
    systemd_version: int,
    *,
    policy_path: str,
    governor: str = DEFAULT_GOVERNOR,
    engine: Sequence[str] | None = None,
) -> list[UnitFile]:
    """Every file `governor install` writes for one policy, in write order (parents first)."""
    if not plan.slice.endswith(".slice"):
        raise PolicyError(f"slice {plan.slice!r} is not a slice unit", field="slice")
    out: list[UnitFile] = []
    if plan.slice == ROOT_SLICE:
        out.append(UnitFile(f"{UNIT_DIR}/{ROOT_SLICE}", GOVERNOR_SLICE))
    out.append(UnitFile(f"{UNIT_DIR}/{SERVICE_TEMPLATE}", render_service_template(governor)))
    out.append(
        UnitFile(
            f"{UNIT_DIR}/{policy_slice(plan.slice, plan.policy)}",
            render_slice(plan, systemd_version),
        )
    )
    out.append(
        UnitFile(
            f"{UNIT_DIR}/{service_unit(plan.policy)}.d/50-governor.conf",
            render_instance(
                plan, systemd_version, policy_path=policy_path, governor=governor, engine=engine
            ),
        )
    )
    return out


def unit_names(plan: Plan) -> list[str]:
    return [policy_slice(plan.slice, plan.policy), service_unit(plan.policy)]
