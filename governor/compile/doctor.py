"""Pure diagnosis of HostFacts: one Finding per topic, each with the kernel's reason and a fix.

No I/O: ``probe()`` gathered everything. ``governor doctor`` renders these; the compiler makes
its own fail-closed decisions from the same facts.
"""

from __future__ import annotations

from typing import Literal

from governor.kernel.files import (
    CGROUP_CONTROLLERS,
    CGROUP_FREEZE,
    CGROUP_KILL,
    CGROUP_SUBTREE_CONTROL,
    CONTROLLER_ORDER,
    CONTROLLERS,
    MEMORY_PEAK,
    MEMORY_RECLAIM,
)
from governor.kernel.mglru import LRU_GEN_ENABLED, LRU_GEN_MIN_TTL_MS, Mglru
from governor.kernel.parse import format_cpulist
from governor.kernel.swap import BoardSwap
from governor.kernel.writeprobe import Probe
from governor.plan.host import HostFacts
from governor.record import record
from governor.sizes import human_bytes

Level = Literal["ok", "warn", "error"]

DEFAULT_NEEDS: frozenset[str] = CONTROLLERS

# kernel feature gates (Documentation/admin-guide/cgroup-v2.rst, madvise(2), clone(2))
CGROUP_FREEZE_MIN = (5, 2)  # cgroup.freeze: the "freeze" pressure action
CGROUP_KILL_MIN = (5, 14)  # cgroup.kill: race-free kill of the whole engine tree
MEMORY_PEAK_MIN = (5, 19)  # memory.peak: high-water mark reported by status
MEMORY_RECLAIM_MIN = (5, 19)  # memory.reclaim: the "reclaim 64M" pressure action
MADV_POPULATE_READ_MIN = (5, 14)  # MADV_POPULATE_READ: prefetch mode "populate"
CLONE_INTO_CGROUP_MIN = (5, 7)  # clone3(CLONE_INTO_CGROUP): start the engine inside its leaf
PSI_UNPRIVILEGED_MIN = (6, 5)  # PSI triggers for a process without CAP_SYS_RESOURCE
ZSWAP_WRITEBACK_MIN = (6, 8)  # memory.zswap.writeback: a per-cgroup switch for zswap writeback

# systemd gates (systemd.resource-control(5))
ALLOWED_CPUS_MIN_SYSTEMD = 244  # AllowedCPUs=: cpuset for the systemd backend

UNIFIED_FIX = "boot with systemd.unified_cgroup_hierarchy=1 (and cgroup_no_v1=all)"
PSI_FIX = "add psi=1 to the kernel command line (CONFIG_PSI_DEFAULT_DISABLED kernels)"

_KCONFIG: dict[str, str] = {
    "memory": "CONFIG_MEMCG",
    "cpu": "CONFIG_CGROUP_SCHED",
    "cpuset": "CONFIG_CPUSETS",
    "io": "CONFIG_BLK_CGROUP",
    "pids": "CONFIG_CGROUP_PIDS",
    "hugetlb": "CONFIG_CGROUP_HUGETLB",
}

_KERNEL_FEATURES: tuple[tuple[str, tuple[int, int], str, str], ...] = (
    ("kernel.cgroup_freeze", CGROUP_FREEZE_MIN, CGROUP_FREEZE, "the freeze action is unavailable"),
    ("kernel.clone_into_cgroup", CLONE_INTO_CGROUP_MIN, "clone3(CLONE_INTO_CGROUP)",
     "the launcher falls back to fork + write cgroup.procs"),
    ("kernel.cgroup_kill", CGROUP_KILL_MIN, CGROUP_KILL,
     "kill, restart and the watchdog after the governor's death fall back to freezing the "
     "group and SIGKILL of each of its pids until it is empty"),
    ("kernel.madv_populate_read", MADV_POPULATE_READ_MIN, "MADV_POPULATE_READ",
     "prefetch populate falls back to a MAP_POPULATE mapping (errors silent), then read loops"),
    ("kernel.memory_peak", MEMORY_PEAK_MIN, MEMORY_PEAK, "peak usage is not reported"),
    ("kernel.memory_reclaim", MEMORY_RECLAIM_MIN, MEMORY_RECLAIM,
     "the reclaim action falls back to lowering memory.high by its amount for one write "
     "(the kernel reclaims within it) and restoring it"),
    ("kernel.psi_unprivileged", PSI_UNPRIVILEGED_MIN, "unprivileged PSI triggers",
     "a monitor without CAP_SYS_RESOURCE polls the PSI totals instead of arming triggers"),
    ("kernel.zswap_writeback", ZSWAP_WRITEBACK_MIN, "memory.zswap.writeback",
     "zswap writes back to the swap device for every cgroup (no per-group switch)"),
)  # fmt: skip


@record(frozen=True)
class Finding:
    level: Level
    topic: str
    message: str
    fix: str | None = None


def _ok(topic: str, message: str) -> Finding:
    return Finding(level="ok", topic=topic, message=message)


def _version(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def _cgroup2(host: HostFacts) -> Finding:
    topic = "cgroup2"
    if host.cgroup_layout == "unified":
        return _ok(topic, f"cgroup2 is mounted at {host.cgroup_mount} (unified hierarchy)")
    if host.cgroup_layout == "hybrid":
        held = ", ".join(sorted(host.v1_controllers)) or "none"
        return Finding(
            level="warn",
            topic=topic,
            message=f"hybrid hierarchy: cgroup2 at {host.cgroup_mount}, "
            f"controllers bound to cgroup v1: {held}",
            fix=UNIFIED_FIX,
        )
    if host.cgroup_layout == "legacy":
        return Finding(
            level="error",
            topic=topic,
            message="only cgroup v1 is mounted; governor needs cgroup2",
            fix=UNIFIED_FIX,
        )
    return Finding(
        level="error",
        topic=topic,
        message="no cgroup hierarchy is mounted",
        fix="mount -t cgroup2 none /sys/fs/cgroup (systemd does this when PID 1)",
    )


def _delegation_fix(host: HostFacts, cgroup: str) -> str:
    unit = cgroup.rsplit("/", 1)[-1]
    if host.pid1 != "systemd":
        return f"make {cgroup} writable by governor or let governor create it"
    if unit.endswith((".service", ".scope")):
        return f"set Delegate=yes on {unit} so systemd leaves its subtree to governor"
    return (
        f"systemd manages {unit}: use the systemd backend, or run governor in a service/scope "
        "with Delegate=yes and put the engine below it"
    )


def _controller(host: HostFacts, name: str) -> Finding:
    topic = f"controller.{name}"
    mount = host.cgroup_mount
    if name not in host.controllers:
        if name in host.v1_controllers:
            return Finding(
                level="error",
                topic=topic,
                message=f"{name} is held by cgroup v1, so cgroup2 cannot use it",
                fix=UNIFIED_FIX,
            )
        if mount is None:
            return Finding(
                level="error",
                topic=topic,
                message=f"{name} is unavailable: no cgroup2 hierarchy",
                fix=UNIFIED_FIX if host.cgroup_layout == "legacy" else None,
            )
        kconfig = _KCONFIG.get(name)
        built = f"rebuild the kernel with {kconfig}" if kconfig else "rebuild the kernel with it"
        fix = (
            "add cgroup_enable=memory to the kernel command line (Raspberry Pi kernels boot "
            f"with cgroup_disable=memory), else {built}"
            if name == "memory"
            else f"remove cgroup_disable={name} from the kernel command line, else {built}"
        )
        return Finding(
            level="error",
            topic=topic,
            message=f"{name} is not in {mount}/{CGROUP_CONTROLLERS}",
            fix=fix,
        )
    for level in host.path:
        if name not in level.subtree_control:
            file = f"{mount}/{level.path}/{CGROUP_SUBTREE_CONTROL}"
            return Finding(
                level="warn",
                topic=topic,
                message=f"{name} is available but {file} does not enable it; governor writes "
                f"+{name} there top-down, which fails without write access to {level.path}",
                fix=_delegation_fix(host, level.path),
            )
    if name in host.subtree_control:
        return _ok(topic, f"{name} is available and enabled in {mount}/{CGROUP_SUBTREE_CONTROL}")
    return _ok(
        topic,
        f"{name} is available; not yet enabled in {mount}/{CGROUP_SUBTREE_CONTROL}, "
        "governor enables it top-down",
    )


def _psi(host: HostFacts) -> Finding:
    if host.psi:
        return _ok("psi", f"PSI is available ({host.psi_detail})")
    return Finding(
        level="warn",
        topic="psi",
        message=f"PSI is unavailable ({host.psi_detail}); pressure rules cannot arm triggers",
        fix=PSI_FIX,
    )


def _core_types(host: HostFacts) -> Finding:
    ct = host.core_types
    if ct is None:
        return _ok("cpus.core_types", "cpus = big/little unavailable: all CPUs alike")
    return _ok(
        "cpus.core_types",
        f"big.LITTLE from {ct.source}: little {format_cpulist(ct.little)}, "
        f"big {format_cpulist(ct.big)}",
    )


def _cpus_online(host: HostFacts) -> Finding:
    offline = sorted(set(host.cpus_possible) - set(host.cpus_online))
    if not offline:
        return _ok("cpus.online", f"all CPUs online: {format_cpulist(host.cpus_online)}")
    return Finding(
        level="warn",
        topic="cpus.online",
        message=f"CPUs {format_cpulist(offline)} are offline; "
        f"online: {format_cpulist(host.cpus_online)}",
        fix="echo 1 > /sys/devices/system/cpu/cpuN/online, or drop them from cpus",
    )


def _kernel_features(host: HostFacts) -> list[Finding]:
    have = host.kernel_version
    out: list[Finding] = []
    for topic, minimum, feature, without in _KERNEL_FEATURES:
        if have >= minimum:
            out.append(_ok(topic, f"{feature} (kernel {_version(minimum)}+) is available"))
        else:
            # what nothing relies on here is said, not warned about: zswap writeback (no
            # setting uses it) and unprivileged PSI triggers for a governor running as root
            unused = topic == "kernel.zswap_writeback" or (
                topic == "kernel.psi_unprivileged" and host.euid == 0
            )
            out.append(
                Finding(
                    level="ok" if unused else "warn",
                    topic=topic,
                    message=f"{feature} needs kernel {_version(minimum)}+, this is "
                    f"{host.kernel_release}: {without}",
                    fix=f"upgrade to kernel {_version(minimum)} or newer",
                )
            )
    return out


def _systemd(host: HostFacts) -> Finding:
    topic = "systemd"
    if host.pid1 == "":
        return Finding(
            level="warn",
            topic=topic,
            message="PID 1 is hidden (/proc mounted with hidepid=); cannot tell whether "
            "systemd manages cgroups",
            fix=None,
        )
    if host.pid1 != "systemd":
        return _ok(topic, f"PID 1 is {host.pid1}, not systemd: the cgroupfs backend applies")
    version = host.systemd_version
    if version is None:
        return Finding(
            level="warn",
            topic=topic,
            message="systemd is PID 1 but its version is unknown",
            fix="check `systemctl --version`",
        )
    if version < ALLOWED_CPUS_MIN_SYSTEMD:
        return Finding(
            level="warn",
            topic=topic,
            message=f"systemd {version} is PID 1; AllowedCPUs= needs "
            f"{ALLOWED_CPUS_MIN_SYSTEMD}+, so the systemd backend cannot pin CPUs",
            fix="use the cgroupfs backend for cpus, or upgrade systemd",
        )
    return _ok(topic, f"systemd {version} is PID 1")


def _privileges(host: HostFacts) -> Finding:
    if host.euid == 0:
        return _ok("privileges", "running as root")
    return Finding(
        level="warn",
        topic="privileges",
        message=f"not root (euid {host.euid}): governor can only use a delegated cgroup subtree",
        fix="run as root, or under systemd-run --user --scope -p Delegate=yes",
    )


def _ordered(names: frozenset[str]) -> list[str]:
    known = [n for n in CONTROLLER_ORDER if n in names]
    return known + sorted(names - set(known))


def diagnose(host: HostFacts, *, needs: frozenset[str] = DEFAULT_NEEDS) -> list[Finding]:
    """One Finding per topic, in a stable order: cgroups, controllers, PSI, CPUs, kernel, users."""
    findings = [_cgroup2(host)]
    findings += [_controller(host, name) for name in _ordered(needs)]
    findings += [_psi(host), _core_types(host), _cpus_online(host)]
    findings += _kernel_features(host)
    findings += [_systemd(host), _privileges(host)]
    return findings


def swap_finding(swap: BoardSwap, kernel: tuple[int, int]) -> Finding:
    """The board's swap and what the governor does with it (issue 33; docs/swap.md)."""
    kinds = swap.kinds
    if swap.swaps_error is not None:  # no device read is not "no device"
        return Finding(
            level="warn",
            topic="swap",
            message=f"swap unknown ({swap.swaps_error})",
            fix="/proc/swaps lists the swap devices (CONFIG_SWAP): check that it can be read",
        )
    if not kinds:
        return _ok("swap", "no swap device: anon pages stay in RAM; swap_max has no effect")
    said = []
    for d in swap.devices:
        said.append(f"{d.name} ({'zram' if d.zram else d.type}, {human_bytes(d.size)})")
    msg = "swap on " + ", ".join(said)
    if "zram" in kinds:
        msg += (
            f"; zram holds {human_bytes(swap.zram_used)} of board memory for"
            f" {human_bytes(swap.zram_stored)} stored, charged to no slice: a slice's swap_max"
            " there is board memory the budget counts"
        )
    if swap.zswap_enabled:
        msg += "; zswap is on (its pool is charged to each slice: zswap_max caps it"
        msg += (
            ", zswap_writeback keeps it off the device)" if kernel >= ZSWAP_WRITEBACK_MIN else ")"
        )
    if "zram" in kinds and swap.zswap_enabled:
        return Finding(
            level="warn",
            topic="swap",
            message=msg + "; zswap in front of zram compresses every page twice",
            fix="disable one: echo N > /sys/module/zswap/parameters/enabled (or zswap.enabled=0)",
        )
    return _ok("swap", msg)


# what a served model meets under the multi-gen LRU (issue 47; docs/boards.md): the refaults
# rule's thresholds were measured on the active/inactive LRU, and min_ttl_ms turns a thrash it
# cannot stop into a global OOM kill (Documentation/admin-guide/mm/multigen_lru.rst)
MGLRU_REFAULTS = (
    "reclaim ages pages by generations, not the active/inactive lists the refaults rule was "
    "tuned on: a refaults threshold measured on another kernel may fire earlier or later here"
)
MGLRU_MIN_TTL_FIX = (
    f"echo 0 > /sys/{LRU_GEN_MIN_TTL_MS} leaves thrash to the [[pressure]] rules (they shed "
    "the engine's neighbours first); keep N >= 1000 only as the last valve, and give the "
    "engine an oom_score_adj below its neighbours'"
)


def mglru_finding(lru: Mglru) -> Finding:
    """The multi-gen LRU's state and what it means for a served model (issue 47)."""
    topic = "mglru"
    path = f"/sys/{LRU_GEN_ENABLED}"
    if not lru.built:
        return _ok(topic, f"no multi-gen LRU in this kernel (no {path}): reclaim uses the "
                   "active/inactive LRU the refaults rule was tuned on")  # fmt: skip
    if lru.error is not None:
        return Finding(level="warn", topic=topic, message=f"multi-gen LRU unknown ({lru.error})",
                       fix=f"read {path} as root")  # fmt: skip
    mask = f"{lru.enabled:#06x}"
    if not lru.on:
        return _ok(topic, f"multi-gen LRU built but off ({path} {mask}): reclaim uses the "
                   "active/inactive LRU the refaults rule was tuned on")  # fmt: skip
    ttl = lru.min_ttl_ms
    if not ttl:
        said = "unknown" if ttl is None else "0: no working set is protected"
        return _ok(topic, f"multi-gen LRU on ({mask}), min_ttl_ms {said}; {MGLRU_REFAULTS}")
    return Finding(
        level="warn",
        topic=topic,
        message=f"multi-gen LRU on ({mask}), min_ttl_ms {ttl}: the kernel keeps the last {ttl} "
        "ms of every working set and OOM-kills (a global kill, by oom_score) when it cannot, so "
        f"a model re-read under pressure is killed instead of thrashing; {MGLRU_REFAULTS}",
        fix=MGLRU_MIN_TTL_FIX,
    )


# found by a harmless write (kernel/writeprobe.py), not by version: (topic, what, since, without)
_WRITE_PROBED: tuple[tuple[str, str, str, str], ...] = (
    ("kernel.memory_peak_reset", "memory.peak reset (a per-run peak without a new group)",
     "6.12", "memory.peak is the group's high-water mark since the group was made: a restart "
     "in the same group reports the highest of its runs"),
    ("kernel.reclaim_swappiness", "memory.reclaim swappiness= (file or anon first, per write)",
     "6.11", "memory.reclaim balances file and anon pages by vm.swappiness, the board's (a "
     "`reclaim N swappiness=S` action writes N alone there and says so)"),
)  # fmt: skip


def write_probe_findings(peak: Probe, swappiness: Probe) -> list[Finding]:
    """What the late memory-controller features' probes found (issue 47): said, not warned
    about (nothing the governor enforces needs them)."""
    out = []
    for (topic, what, since, without), got in zip(_WRITE_PROBED, (peak, swappiness), strict=True):
        if got.verdict == "yes":
            out.append(_ok(topic, f"{what}: the kernel took a write ({got.where})"))
        elif got.verdict == "no":
            out.append(
                _ok(topic, f"{what} needs kernel {since}+, refused ({got.where}): {without}")
            )
        else:
            out.append(_ok(topic, f"{what}: unknown ({got.where}); without it (before {since}): "
                           f"{without}"))  # fmt: skip
    return out
