"""`governor status`: per governed slice, what the policy asks next to what the kernel holds,
what the slice uses, and what the governor will do next.

Reads the published runtime state (governor/rundir/state.py) and the kernel (through CgroupFs); writes
nothing. The JSON form is a documented, stable schema (docs/status.schema.json, format 1):
fields are only ever added.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from governor.board.scan import scan as gather
from governor.kernel.cgroupfs import CgroupFs
from governor.operate.clocks import observe as clock_rows
from governor.operate.clocks import render as render_clocks
from governor.operate.devmem import device_board, render_device
from governor.operate.observe import knobs, model_rows, usage
from governor.operate.swap import board_swap, render_swap
from governor.rundir.clocks import Ledger
from governor.rundir.journal import Journal
from governor.rundir.liveness import REVERTER, alive
from governor.rundir.state import states_of
from governor.sizes import human_bytes

SCHEMA_FORMAT = 1


def collect(
    run: Path, name: str | None = None, *, now: float | None = None, root: Path = Path("/")
) -> list[dict[str, Any]]:
    """The status of every governed slice (or of ``name``; PolicyNotFound when there is none).
    ``root``: where the board's /proc is (its MemTotal, as `governor board --root` reads it)."""
    now = time.time() if now is None else now
    states = states_of(
        run,
        name,
        hint="`governor status` lists what runs; start it with `governor launch` or"
        " `governor apply`",
    )
    out = []
    cgroup_root = ""
    swap = board_swap()  # board-wide: read once (zram's memory is charged to no slice)
    for st in states:
        plan = st.plan
        if plan is None:
            continue
        cgroup_root = plan.cgroup_root
        fs = CgroupFs(Path(plan.cgroup_root))
        exists = fs.exists(plan.group)
        journal = Journal(run / plan.policy)
        systemd = st.systemd
        item: dict[str, Any] = {
            "format": SCHEMA_FORMAT,
            "policy": plan.policy,
            "source": st.source,
            "policy_path": st.policy_path,
            "state": "stale" if st.stale else ("running" if exists else "gone"),
            "pid": st.pid,
            "engine_pid": st.engine_pid,
            "backend": st.backend,
            "cgroup": f"{plan.cgroup_root}/{plan.group}",
            "uptime_s": round(now - st.started_at, 1) if st.started_at else None,
            "restarts": st.restarts,
            "ready": st.ready,
            "systemd_unit": systemd["unit"] if systemd else None,
            "knobs": knobs(fs, plan, journal=journal, systemd=systemd) if exists else [],
            "usage": usage(fs, plan.group) if exists else None,
            # llama-server's router: a row per model leaf (operate/observe.py model_rows)
            "models": last_requests(
                model_rows(fs, plan.group, (st.model or {}).get("router"), names=st.model_leaves())
                if exists
                else [],
                st.router,
                now,
            ),
            "rules": st.rules,
            "last_actions": st.last_actions,
            "journal": journal.tail(5),
            "pending_confirm": [
                {
                    "id": e["id"],
                    "confirm_by": e["confirm_by"],
                    "files": [ch["file"] for ch in e["changes"]],
                    "reverter_pid": e.get("reverter_pid"),
                    # killed (a logout with KillUserProcesses, the OOM killer): no revert
                    "reverter_alive": alive(e.get("reverter_pid"), marker=REVERTER),
                }
                for e in journal.pending()
            ],
            "degraded": list(plan.degraded),
            "clocks": clock_rows(plan, run),  # [clocks]: governor/operate/clocks.py
            "qos": st.qos or plan.qos.to_json(),
            # a higher class's shed that holds on this slice (its journal; issue 23)
            "shed": hold.as_dict() if (hold := journal.shed(alive)) is not None else None,
            "board_swap": swap,
        }
        if exists:  # NPU/GPU memory memcg may not see, and the board (operate/devmem.py)
            item["device_memory"], item["board"] = device_board(fs, plan, st.board)
        out.append(item)
    if out:  # the board's budget and claims: the same for every slice
        claims = (budget := board_budget(run, Path(cgroup_root), root)).pop("claims")
        for item in out:
            item["budget"] = {**budget, "claim": claims.get(item["policy"])}
    return out


def board_budget(run: Path, cgroup_root: Path, root: Path = Path("/")) -> dict[str, Any]:
    """The figures of `governor board` (governor/board/scan.py gathers the claims)."""

    seen = gather(run=run, cgroup_root=cgroup_root, root=root)
    b = seen.budget
    mins = sum(c.guaranteed for c in seen.slices)
    peaks = sum(c.peak_claim for c in seen.slices)
    return {
        "memtotal": b.memtotal,
        "reserve": b.reserve,
        "budget": b.budget,
        "claimed": {"min": mins, "peak": peaks},
        "free": {"guarantees": b.budget - mins, "peaks": b.budget - peaks},
        "claims": {
            c.name: {"min": c.guaranteed, "peak": c.peak_claim, "peak_source": c.peak_source}
            for c in seen.slices
        },
    }


def shed_text(shed: dict[str, Any]) -> str:
    """ "throttled by npu-chat since 12:00:03: board memory some 100ms/1s" """
    since = time.strftime("%H:%M:%S", time.localtime(shed["since"])) if shed.get("since") else "?"
    text = f"{shed['state']} by {shed['by']} since {since}: {shed.get('when')}"
    if shed.get("memory_high") and shed["state"] == "throttled":
        text += f" (memory.high {shed['memory_high']})"
    return text


def _size(value: int | None) -> str:
    return "-" if value is None else human_bytes(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render(items: list[dict[str, Any]], *, now: float | None = None) -> str:
    """The plain form, one block per slice."""
    now = time.time() if now is None else now
    if not items:
        return "no governed slices\n"
    lines: list[str] = []
    for it in items:
        lines += _head_lines(it)
        lines += budget_lines(it.get("budget"))
        lines += _knob_lines(it)
        lines += _usage_lines(it)
        lines += render_device(it)
        lines += render_swap(it)
        lines += _rule_lines(it)
        lines += _journal_lines(it)
        lines += render_clocks(it.get("clocks", []))
        lines += [f"  NOT in force: {d}" for d in it["degraded"]]
        lines.append("")
    return "\n".join(lines)


def _head_lines(it: dict[str, Any]) -> list[str]:
    """Who runs it, where, its state, its [qos] class and a shed that holds it."""
    lines: list[str] = []
    head = f"{it['policy']}  {it['state']}"
    if it["pid"]:
        head += f"  pid {it['pid']}"
    if it["engine_pid"]:
        head += f" (engine {it['engine_pid']})"
    head += f"  up {_duration(it['uptime_s'])}  restarts {it['restarts']}"
    if it.get("ready") is not None:
        head += "  ready" if it["ready"] else "  NOT ready (loading)"
    lines += [head, f"  cgroup   {it['cgroup']}  ({it['backend'] or it['source']})"]
    if it["state"] == "stale":
        gone = (
            "its cgroup" if it["source"] == "apply" else "the supervisor that published this state"
        )
        lines.append(f"  STALE: {gone} is gone (`governor status --prune` clears it)")
    qos = it.get("qos")
    if qos:
        lines.append(f"  qos      {qos['class']}  (a shed may: {', '.join(qos['yield']) or '-'})")
    if it.get("shed"):
        lines.append(f"  SHED     {shed_text(it['shed'])}")
    return lines


def budget_lines(b: dict[str, Any] | None) -> list[str]:
    """This slice's claim and the board's budget (`governor board` has the whole table)."""
    if not b:
        return []
    c = b.get("claim")
    mine = f"min {_size(c['min'])}, peak {_size(c['peak'])} ({c['peak_source']}); " if c else ""
    return [
        f"  claim: {mine}board budget {_size(b['budget'])}, claimed {_size(b['claimed']['min'])}"
        f" min / {_size(b['claimed']['peak'])} peak, free {_signed(b['free']['guarantees'])}"
        f" for guarantees / {_signed(b['free']['peaks'])} for peaks"
    ]


def _signed(n: int) -> str:
    return f"-{_size(-n)}" if n < 0 else _size(n)


def _knob_lines(it: dict[str, Any]) -> list[str]:
    """Each knob: the policy's value, the kernel's (and the unit's), its state."""
    lines: list[str] = []
    if it["knobs"]:
        unit = it.get("systemd_unit")
        head = f"  {'knob':<18}{'policy':>14}{'kernel':>14}"
        lines.append(head + (f"{'unit':>14}" if unit else "") + "  state")
        for k in it["knobs"]:
            row = f"  {k['file']:<18}{k['policy']:>14}{k['kernel'] or '-':>14}"
            if unit:
                row += f"{k.get('unit') or '-':>14}"
            state = k["state"]
            if k.get("reverts_at"):
                at = time.strftime("%H:%M:%S", time.localtime(k["reverts_at"]))
                state = f"tuned, reverts at {at} unless confirmed"
            lines.append(f"{row}  {state}")
        if unit:
            lines.append(f"  (unit: {unit}, as `systemctl show` says)")
    return lines


def _usage_lines(it: dict[str, Any]) -> list[str]:
    """Memory, memory.events, PSI, CPU and pids as the kernel counts them now."""
    lines: list[str] = []
    usage = it["usage"]
    if usage:
        m = usage["memory"]
        lines.append(
            f"  memory   current {_size(m['current'])}  peak {_size(m['peak'])}"
            f"  anon {_size(m['anon'])}  file {_size(m['file'])}  swap {_size(m['swap'])}"
            + (f"  zswap {_size(m['zswap'])}" if m.get("zswap") is not None else "")
        )
        ev = usage["memory_events"]
        if ev:
            lines.append("  events   " + "  ".join(f"{k} {v}" for k, v in ev.items()))
        psi = [
            f"{res} some {p['some']['avg10']:.2f}"
            + (f" full {p['full']['avg10']:.2f}" if p["full"] else "")
            for res, p in usage["pressure"].items()
        ]
        if psi:
            lines.append("  pressure " + "; ".join(psi) + "  (avg10 %)")
        cpu = usage["cpu"]
        if cpu["usage_usec"] is not None:
            thr = cpu["throttled_usec"]
            lines.append(
                f"  cpu      usage {cpu['usage_usec'] / 1e6:.1f}s"
                + (f"  throttled {thr / 1e6:.1f}s" if thr is not None else "")
            )
        pids = usage["pids"]
        if pids["current"] is not None:
            lines.append(f"  pids     {pids['current']} / {pids['max'] or 'max'}")
    for row in it.get("models") or []:  # llama-server's router: one line per model leaf
        lines.append(
            f"  model    {row['model']}"
            + (f"  leaf {row['leaf']}" if row.get("leaf", row["model"]) != row["model"] else "")
            + f"  {'loaded' if row['loaded'] else 'unloaded'}"
            f"  current {_size(row['memory_current'])}  max {_size(row['memory_max'])}"
            f"  estimate {_size(row['estimate'])}  oom_kill {row['oom_kill']}"
            f"  last request {ago(row.get('last_request_s'))}" + _load_text(row)
        )
    return lines


def _load_text(row: dict[str, Any]) -> str:
    """``  load 3.5s 42MiB``: a model's measured load; "" before one is measured."""
    if row.get("load_s") is None:
        return ""
    size = row.get("load_bytes")
    return f"  load {row['load_s']:.1f}s" + (f" {_size(size)}" if size is not None else "")


def last_requests(
    rows: list[dict[str, Any]], router: dict[str, Any] | None, now: float
) -> list[dict[str, Any]]:
    """Each model row with its last request as the launch published it (RunState.router,
    supervise/activity.py Activity): ``last_request`` (epoch) and ``last_request_s`` (its age);
    and its measured load, ``load_s`` and ``load_bytes`` (None: not measured)."""
    models = (router or {}).get("models") or {}
    for row in rows:
        published = models.get(row["model"]) or {}
        t = published.get("last_request")
        row["last_request"] = t
        row["last_request_s"] = None if t is None else round(max(0.0, now - t), 1)
        # its measured load (issue 46, supervise/loads.py): seconds to its first answer, bytes
        row["load_s"] = published.get("load_s")
        row["load_bytes"] = published.get("bytes")
    return rows


def ago(seconds: float | None) -> str:
    """An age as status and top show it: "12s ago", "5m ago", "3h ago"; "-": never."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{int(seconds)}s ago"
    if seconds < 7200:
        return f"{int(seconds // 60)}m ago"
    return f"{int(seconds // 3600)}h ago"


def _rule_lines(it: dict[str, Any]) -> list[str]:
    """The rules' state and next actions, and the last actions taken."""
    lines: list[str] = []
    for r in it["rules"]:
        state = r["state"]
        if r.get("cooldown_until"):
            state += f" until {time.strftime('%H:%M:%S', time.localtime(r['cooldown_until']))}"
        elif r.get("hold_until"):
            state += f" until {time.strftime('%H:%M:%S', time.localtime(r['hold_until']))}"
        now = ""
        if "refaults_pct" in r:  # a thrash rule: the share over its window at the last sample
            pct = r["refaults_pct"]
            now = "  now " + ("-" if pct is None else f"{pct:g}%")
        lines.append(
            f"  rule #{r['rule']} {r['when']:<24} {state:<22} fired {r['fired']}{now}"
            f"  next: {', '.join(r['next_actions'])}"
        )
    for a in it["last_actions"][-5:]:
        at = time.strftime("%H:%M:%S", time.localtime(a["at"])) if a.get("at") else "?"
        done = "; ".join(
            f"{x['action']}" + (f" {x.get('before')} -> {x.get('after')}" if "before" in x else "")
            for x in a.get("actions", [])
        )
        lines.append(f"  action   {at} #{a['rule']} {a['when']}: {done}")
    return lines


def _journal_lines(it: dict[str, Any]) -> list[str]:
    """The change journal's last entries and the tunes pending a --confirm."""
    lines: list[str] = []
    for e in it.get("journal", []):
        at = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        done = "; ".join(f"{c['file']} {c['before']} -> {c['after']}" for c in e["changes"])
        if e.get("confirms"):
            done = f"kept #{', #'.join(map(str, e['confirms']))}"
        reason = e.get("reason")
        if e.get("error"):
            done, reason = e["error"], None
        elif reason and e["source"] != "shed":  # "reason" alone where nothing changed
            done, reason = (f"{done} ({reason})" if done else reason), None
        if e["source"] == "probe_generate":  # "probe_generate: restart, <why>"
            done = f"{e.get('step')}, {done}"
        if e["source"] == "shed":  # "shed: unload a by chat (why)", "shed: freeze by chat: ..."
            what = f"{e.get('step')} {e['model']}" if e.get("model") else str(e.get("step"))
            done = f"{what} by {e.get('by')}" + (f": {done}" if done else "")
            done += f" ({reason})" if reason else ""
        if e["source"] == "unload" and e.get("model") and not e.get("error"):
            # a model of llama-server's router unloaded: "unload tiny: room for small"
            lines.append(f"  journal  #{e['id']} {at} unload {e['model']}: {e.get('reason')}")
            continue
        lines.append(f"  journal  #{e['id']} {at} {e['source']}: {done}")
    for p in it.get("pending_confirm", []):
        at = time.strftime("%H:%M:%S", time.localtime(p["confirm_by"]))
        files = ", ".join(p["files"])
        if p.get("reverter_alive", True):
            lines.append(
                f"  PENDING  #{p['id']} ({files}) reverts at {at} unless"
                f" confirmed: governor tune {it['policy']} --confirm"
            )
        else:
            lines.append(
                f"  PENDING  #{p['id']} ({files}) will NOT revert at {at}: its reverter"
                f" (pid {p.get('reverter_pid')}) is gone; keep it: governor tune"
                f" {it['policy']} --confirm, undo it: governor rollback {it['policy']}"
            )
    return lines


def ledger_lines(run: Path, items: list[dict[str, Any]]) -> list[str]:
    """The board's clocks no slice shows: a restore that failed after its run ended (the
    entry keeps its holders: `governor remove` retries it), an entry the ledger cannot use."""
    ledger = Ledger(run)
    shown = {r["file"].rpartition("/")[0] for it in items for r in it.get("clocks", [])}
    entries = ledger.read()
    lines = list(ledger.problems)
    for path, entry in entries.items():
        if entry.failed and path not in shown:
            holders = ", ".join(h.policy for h in entry.holders) or "nobody"
            lines.append(f"clock {entry.name} NOT restored (held by {holders}): {entry.failed[0]}")
    return lines
