"""The Prometheus collector: at every scrape, the runtime state of each governed slice
(governor/rundir/state.py: what its supervisor published, or the supervisor's own copy when it serves)
and the kernel's files, read by the same code as `governor status` (governor/operate/observe.py).

Names follow Prometheus' conventions (``governor_`` prefix, base units, ``_total`` counters)
and node_exporter's / cAdvisor's meaning for pressure (``*_waiting_seconds_total`` is PSI
"some", ``*_stalled_seconds_total`` is "full"), so the same ``rate()`` queries work. Labels are
bounded: the policy name, fixed enums, rule indexes, action verbs, model file names; never pids
or prompts. Every per-slice series carries ``policy``.

Unlimited values: a limit the kernel reads as ``max`` (memory.max, memory.swap.max, pids.max...)
is exported as ``+Inf``, so ``current / limit`` is 0 and a "near max" alert cannot fire, and the
series does not vanish when a limit is lifted. A file that does not exist (no controller, no
swap accounting) exports no series.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from governor.backends.device import cma
from governor.board.scan import scan as gather
from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.procfs import ProcFs
from governor.launch.prefetch import Prefetcher, resident_pages
from governor.operate import observe
from governor.operate.devmem import device_board
from governor.operate.swap import board_swap
from governor.plan.model import Plan
from governor.rundir.journal import Journal
from governor.rundir.state import RunState

MEMORY_KINDS = ("current", "anon", "file", "working_set", "peak")
MEMORY_EVENTS = ("low", "high", "max", "oom", "oom_kill")
PSI = ("cpu", "memory", "io")

States = Callable[[], Sequence[RunState]]


def version() -> str:

    try:
        return dist_version("governor")
    except PackageNotFoundError:
        return "unknown"


def _limit(value: int | None) -> float:
    return math.inf if value is None or value == observe.UNLIMITED else float(value)


class _Families:
    """One family per name, filled slice by slice (a name appears once in an exposition)."""

    def __init__(self) -> None:
        self.all: dict[str, Metric] = {}

    def _get(
        self,
        kind: type[GaugeMetricFamily | CounterMetricFamily],
        name: str,
        doc: str,
        labels: Sequence[str],
    ) -> Any:
        if name not in self.all:
            self.all[name] = kind(name, doc, labels=["policy", *labels])
        return self.all[name]

    def gauge(self, name: str, doc: str, policy: str, value: float, **labels: str) -> None:
        fam = self._get(GaugeMetricFamily, name, doc, list(labels))
        fam.add_metric([policy, *labels.values()], value)

    def counter(self, name: str, doc: str, policy: str, value: float, **labels: str) -> None:
        fam = self._get(CounterMetricFamily, name, doc, list(labels))
        fam.add_metric([policy, *labels.values()], value)


class GovernorCollector(Collector):
    """``states()`` gives the slices to export (the run-state records of
    governor/rundir/state.py); ``run`` is where their journals live (the tunes)."""

    def __init__(self, states: States, run: Path) -> None:
        self.states = states
        self.run = run
        self.version = version()

    def describe(self) -> Iterable[Metric]:
        return []  # no descriptions up front: the registry must not scrape at register time

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "governor_build_info", "the governor that exports these series", labels=["version"]
        )
        info.add_metric([self.version], 1)
        yield info
        fams = _Families()
        root = None
        for st in self.states():
            plan = st.plan
            if plan is None:
                continue
            root = plan.cgroup_root
            self._slice(fams, st, plan)
        yield from fams.all.values()
        yield from _cma()
        yield from _swap()
        yield from _board(self.run, root)

    # ------------------------------------------------------------------ one slice

    def _slice(self, f: _Families, st: RunState, plan: Plan) -> None:
        p = plan.policy
        fs = CgroupFs(Path(plan.cgroup_root))
        exists = not st.stale and fs.exists(plan.group)
        up = exists and observe.populated(fs, plan.group)
        f.gauge("governor_engine_up", "1 while the engine's processes run in the slice", p, up)
        if st.ready is not None:  # engines with a ready URL (llama-server's /health)
            f.gauge(
                "governor_engine_ready",
                "1 once the engine answered 200 on its ready URL (engine.ready)",
                p,
                up and st.ready,
            )
        f.counter(
            "governor_engine_restarts_total",
            "engine restarts by the supervisor (launch.restart)",
            p,
            st.restarts or 0,
        )
        self._rules(f, st, plan, p)
        self._sheds(f, st, p)
        self._unloads(f, st, p)
        self._loads(f, st, p)
        self._tunes(f, p)
        self._model(f, st, plan)
        if not exists:
            return
        # under systemd the policy's limits are on its slice unit, not on the service's cgroup
        systemd = st.systemd or None
        self._memory(f, fs, systemd["cgroup"] if systemd else plan.group, p)
        use = observe.usage(fs, plan.group)
        self._usage(f, use, p)
        for row in observe.model_rows(
            fs, plan.group, names=st.model_leaves()
        ):  # llama-server's router: each leaf
            if row["memory_current"] is not None:
                f.gauge(
                    "governor_model_memory_bytes",
                    "memory.current of each model's leaf of llama-server's router",
                    p,
                    row["memory_current"],
                    model=row["model"],
                )
        _device(f, fs, plan, st)
        drift = sum(k["state"] != "in sync" for k in observe.knobs(fs, plan, systemd=systemd))
        f.gauge(
            "governor_policy_drift",
            "files of the slice whose kernel value differs from the policy (or is missing)",
            p,
            drift,
        )
        ratio = _resident_ratio(st.prefetch_files or ())
        if ratio is not None:
            f.gauge(
                "governor_prefetch_resident_ratio",
                "fraction of the prefetch files (the model) resident in the page cache",
                p,
                ratio,
            )

    def _memory(self, f: _Families, fs: CgroupFs, group: str, p: str) -> None:
        for name, value in observe.limits(fs, group).items():
            f.gauge(
                "governor_memory_limit_bytes",
                "memory limits the kernel holds (+Inf: max, no limit)",
                p,
                _limit(value),
                limit=name,
            )

    def _usage(self, f: _Families, use: dict[str, Any], p: str) -> None:
        mem = use["memory"]
        for kind in MEMORY_KINDS:
            if mem.get(kind) is not None:
                f.gauge(
                    "governor_memory_bytes",
                    "memory of the slice: memory.current, memory.stat anon/file, working set"
                    " (current - inactive_file), memory.peak",
                    p,
                    mem[kind],
                    kind=kind,
                )
        events = use["memory_events"]
        for event in MEMORY_EVENTS:
            if event in events:
                f.counter(
                    "governor_memory_events_total",
                    "memory.events of the slice (hierarchical)",
                    p,
                    events[event],
                    event=event,
                )
        for res in PSI:
            psi = use["pressure"].get(res)
            if psi is None:
                continue
            f.counter(
                f"governor_pressure_{res}_waiting_seconds_total",
                f"PSI {res} some total: time some task of the slice waited",
                p,
                psi["some"]["total_us"] / 1e6,
            )
            if psi["full"] is not None:
                f.counter(
                    f"governor_pressure_{res}_stalled_seconds_total",
                    f"PSI {res} full total: time all non-idle tasks of the slice stalled",
                    p,
                    psi["full"]["total_us"] / 1e6,
                )
        cpu = use["cpu"]
        if cpu["usage_usec"] is not None:
            f.counter(
                "governor_cpu_usage_seconds_total",
                "cpu.stat usage_usec",
                p,
                cpu["usage_usec"] / 1e6,
            )
        if cpu["throttled_usec"] is not None:
            f.counter(
                "governor_cpu_throttled_seconds_total",
                "cpu.stat throttled_usec (cpu.max)",
                p,
                cpu["throttled_usec"] / 1e6,
            )
        pids = use["pids"]
        if pids["current"] is not None:
            f.gauge("governor_pids_current", "pids.current", p, pids["current"])
            f.gauge("governor_pids_max", "pids.max (+Inf: max)", p, _limit(pids["max"]))

    def _rules(self, f: _Families, st: RunState, plan: Plan, p: str) -> None:
        """Every rule of the plan and every action verb of each rule has its series from the
        start, at 0 until it fires (Prometheus: initialise the known label sets), so rate()
        and absence alerts can tell "never fired" from "no data"."""
        fired = {str(r.index): 0 for r in plan.watch}
        actions = {(str(r.index), str(a.verb)): 0 for r in plan.watch for a in r.actions}
        for r in st.rules or ():
            fired[str(r.get("rule"))] = r.get("fired", 0)
        for a in st.action_totals or ():
            actions[(str(a.get("rule")), str(a.get("action")))] = a.get("count", 0)
        for rule, n in fired.items():
            f.counter(
                "governor_rule_firings_total",
                "times each [[pressure]] rule fired (rule: its index in the policy)",
                p,
                n,
                rule=rule,
            )
        for (rule, verb), n in actions.items():
            f.counter(
                "governor_actions_total",
                "actions the rules ran (action: the verb)",
                p,
                n,
                rule=rule,
                action=verb,
            )

    def _sheds(self, f: _Families, st: RunState, p: str) -> None:
        for s in st.shed_totals or ():
            f.counter(
                "governor_shed_total",
                "steps this policy's `shed` took on slices of a lower [qos] class (step: unload,"
                " throttle, freeze, stop, kill; and the undo's thaw, raise, release)",
                p,
                s.get("count", 0),
                victim=str(s.get("victim")),
                step=str(s.get("step")),
            )

    def _loads(self, f: _Families, st: RunState, p: str) -> None:
        models = (st.router or {}).get("models") or {}
        for alias, m in sorted(models.items()):
            if not isinstance(m, dict) or m.get("load_s") is None:
                continue
            f.gauge(
                "governor_model_load_seconds",
                "llama-server's router: seconds from a model's child start to its first answer"
                " (its last measured load: what an unload costs to bring it back)",
                p,
                float(m["load_s"]),
                model=str(alias),
            )
            if m.get("bytes") is not None:
                f.gauge(
                    "governor_model_load_bytes",
                    "llama-server's router: memory.current of a model's leaf when its load"
                    " answered",
                    p,
                    float(m["bytes"]),
                    model=str(alias),
                )

    def _unloads(self, f: _Families, st: RunState, p: str) -> None:
        for u in (st.router or {}).get("unloads") or ():
            f.counter(
                "governor_model_unloads_total",
                "models of llama-server's router the governor unloaded (reason: memory, for"
                ' a new model under [engine] evict = "memory"; pressure, the unload action;'
                " shed, a higher class's shed)",
                p,
                u.get("count", 0),
                model=str(u.get("model")),
                reason=str(u.get("reason")),
            )

    def _tunes(self, f: _Families, p: str) -> None:
        entries = Journal(self.run / p).entries()
        undone = {i for e in entries if e.get("source") == "rollback" for i in e.get("undoes", ())}
        tunes = [e for e in entries if e.get("source") == "tune"]
        applied = len(tunes)
        rolled_back = sum(e.get("id") in undone for e in tunes)
        doc = (
            "`governor tune` changes applied to the slice, those since rolled back, those a"
            " guard refused and those reverted after an OOM kill"
        )
        f.counter("governor_tunes_total", doc, p, applied, result="applied")
        f.counter("governor_tunes_total", doc, p, rolled_back, result="rolled_back")
        for result in ("refused", "reverted"):
            done = sum(e.get("source") == f"tune-{result}" for e in entries)
            f.counter("governor_tunes_total", doc, p, done, result=result)

    def _model(self, f: _Families, st: RunState, plan: Plan) -> None:
        model = st.model or {}
        name = os.path.basename(str(model.get("model") or ""))
        f.gauge(
            "governor_engine_info",
            "1 per slice: the engine kind, model file and quant (for joins)",
            plan.policy,
            1,
            engine=plan.engine.kind,
            model=name,
            quant=str(model.get("quant") or ""),
        )
        if name and model.get("total") is not None:
            f.gauge(
                "governor_model_estimated_bytes",
                "the GGUF estimate of the engine's resident memory (governor estimate)",
                plan.policy,
                float(model["total"]),
                model=name,
            )


def _device(f: _Families, fs: CgroupFs, plan: Plan, st: RunState) -> None:
    """Device memory of the slice (fdinfo: governor/kernel/devmem.py) and what the board lost
    since the engine started that no slice was charged for (absent without a baseline)."""
    dev, board = device_board(fs, plan, st.board)
    for row in dev["rows"]:
        f.gauge(
            "governor_device_memory_bytes",
            "DRM (drm-total-<region>) and dma-buf memory the slice's processes hold, by driver"
            " and region (dma-bufs: exporter, region dma-buf), deduplicated",
            plan.policy,
            row["bytes"],
            driver=row["driver"],
            region=row["region"],
        )
    if board["unaccounted"] is not None:
        f.gauge(
            "governor_board_unaccounted_bytes",
            "since the engine started: delta(MemTotal - MemAvailable) - delta(memory.current of"
            " the governed slice): memory the board lost that no slice was charged for",
            plan.policy,
            board["unaccounted"],
        )


def _cma() -> Iterator[Metric]:
    """/proc/meminfo CmaTotal / CmaFree: board-wide, no policy label (absent without CMA)."""

    values = cma(ProcFs())
    for key, name in (("CmaTotal", "total"), ("CmaFree", "free")):
        if key in values:
            g = GaugeMetricFamily(f"governor_cma_{name}_bytes", f"/proc/meminfo {key}")
            g.add_metric([], values[key])
            yield g


def _swap() -> Iterator[Metric]:
    """The board's swap by kind (issue 33): zram's pool (mem_used_total: board memory charged
    to no cgroup) and what it stores (orig_data_size), zswap's pool and what it stores
    (/proc/meminfo Zswap / Zswapped, 5.19+), a disk swap's used space. No series without swap."""

    swap = board_swap()
    rows: list[tuple[str, str, int]] = []
    if "zram" in swap["kinds"]:
        rows += [("zram", "used", swap["zram_used"]), ("zram", "stored", swap["zram_stored"])]
    if "zswap" in swap["kinds"]:
        with contextlib.suppress(OSError, ValueError):
            mi = ProcFs().meminfo()
            if "Zswap" in mi:
                rows += [("zswap", "used", mi["Zswap"]), ("zswap", "stored", mi["Zswapped"])]
    if "disk" in swap["kinds"]:
        rows += [("disk", "used", swap["disk_used"]), ("disk", "stored", swap["disk_used"])]
    if rows:
        g = GaugeMetricFamily(
            "governor_board_swap_bytes",
            "the board's swap: used = memory (zram, zswap) or space (disk) it takes, stored ="
            " the bytes swapped to it uncompressed",
            labels=["kind", "state"],
        )
        for kind, state, value in rows:
            g.add_metric([kind, state], value)
        yield g


def _board(run: Path, cgroup_root: str | None) -> Iterator[Metric]:
    """The board's budget and every governed slice's claims on it, running or installed: the
    figures of `governor board` (governor/board/scan.py); board-wide, no policy label."""

    seen = gather(run=run, cgroup_root=Path(cgroup_root or "/sys/fs/cgroup"))
    if seen.budget.memtotal <= 0:
        return
    budget = GaugeMetricFamily(
        "governor_board_budget_bytes", "MemTotal less the board's reserve ([board] reserve)"
    )
    budget.add_metric([], seen.budget.budget)
    yield budget
    claimed = GaugeMetricFamily(
        "governor_board_claimed_bytes",
        "the governed slices' claims: memory.min (+ [device]) and their expected peaks",
        labels=["kind"],
    )
    claimed.add_metric(["min"], sum(c.guaranteed for c in seen.slices))
    claimed.add_metric(["peak"], sum(c.peak_claim for c in seen.slices))
    yield claimed


def _resident_ratio(files: Sequence[str]) -> float | None:
    """Resident pages / pages of the files (mincore; nothing is read or faulted in)."""
    if not files:
        return None

    pre = Prefetcher()
    resident = total = 0
    for path in files:
        try:
            # a state's path may name a FIFO now: O_NONBLOCK opens it at once (issue 43)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            size = st.st_size
            if size == 0 or not stat.S_ISREG(st.st_mode):
                continue
            vec = pre.residency(fd, size)
        except OSError:
            continue
        finally:
            os.close(fd)
        resident += resident_pages(vec)
        total += len(vec)
    return None if total == 0 else resident / total


def registry(states: States, run: Path) -> CollectorRegistry:
    """A registry holding only the governor's collector (no process/platform collectors)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GovernorCollector(states, run))
    return reg
