"""``set FILE VALUE|+-N%`` and ``reclaim SIZE``: the group's limits, within bounds.

``set memory.X`` never goes above the plan's memory.max (the live one when the plan has none)
and never below memory.min (cgroup-v2.rst: memory.high below memory.min would reclaim protected
memory; memory.max below usage triggers OOM). Values are page-floored the way the kernel stores
them (mm/page_counter.c). Without memory.reclaim (Linux < 5.19) a reclaim is done by a short
memory.high squeeze (governor/monitor/fallbacks.py).
"""

from __future__ import annotations

import errno

from governor.errors import BackendError
from governor.kernel import files as kf
from governor.kernel.parse import format_max, parse_max
from governor.monitor.actions.base import Context, Handler, Result
from governor.monitor.fallbacks import reclaim_by_high
from governor.plan.model import Action

CPU_WEIGHT_MIN, CPU_WEIGHT_MAX = 1, 10000  # cgroup-v2.rst "cpu.weight"
_MEMORY_BOUNDED = (kf.MEMORY_MIN, kf.MEMORY_LOW, kf.MEMORY_HIGH, kf.MEMORY_MAX)


class Limits(Handler):
    def run(self, action: Action, ctx: Context) -> Result:
        if action.verb == "reclaim":
            return self._reclaim(action)
        with self.env.journal_locked():
            return self._set(action, ctx)

    def _reclaim(self, action: Action) -> Result:
        assert action.bytes is not None
        env = self.env
        before = env.live(kf.MEMORY_CURRENT)
        notes: list[str] = []
        try:
            self._write_reclaim(action, notes)
        except BackendError as err:
            if err.errno == errno.ENOENT and (env.fs.path(env.group) / kf.MEMORY_HIGH).exists():
                lower, _ = self._bounds(kf.MEMORY_HIGH)  # Linux < 5.19
                notes.append(
                    reclaim_by_high(
                        env.fs, env.group, action.bytes, before, lower=lower, page=env.page_size
                    )
                )
                if action.swappiness is not None:
                    notes.append(f"swappiness={action.swappiness} not applied")
            # memory.reclaim returns EAGAIN when it reclaimed less than asked (cgroup-v2.rst)
            elif err.errno != errno.EAGAIN:
                raise
            else:
                notes.append("EAGAIN: reclaimed less than asked")
        after = env.live(kf.MEMORY_CURRENT)
        detail = "; ".join(notes) if notes else None
        return Result(str(action), ok=True, before=before, after=after, detail=detail)

    def _write_reclaim(self, action: Action, notes: list[str]) -> None:
        """``N swappiness=S`` where the kernel takes it (6.11); a kernel before refuses the key
        with EINVAL: then ``N`` alone, balanced by the board's vm.swappiness, and said."""
        env, amount = self.env, str(action.bytes)
        if action.swappiness is None:
            env.fs.write(env.group, kf.MEMORY_RECLAIM, amount)
            return
        try:
            env.fs.write(env.group, kf.MEMORY_RECLAIM, f"{amount} swappiness={action.swappiness}")
        except BackendError as err:
            if err.errno != errno.EINVAL:
                raise
            notes.append(
                f"swappiness={action.swappiness} refused (EINVAL: Linux < 6.11): reclaimed by the"
                " board's vm.swappiness"
            )
            env.fs.write(env.group, kf.MEMORY_RECLAIM, amount)

    def _set(self, action: Action, ctx: Context) -> Result:
        assert action.file is not None
        env, file = self.env, action.file
        before_text = env.fs.read(env.group, file).strip()
        tuned = env.journal.tuned(file) if env.journal is not None else None
        if tuned is not None and action.relative_percent is None:
            return Result(
                str(action),
                ok=True,
                before=before_text,
                after=before_text,
                detail=f"kept: the operator tuned {file} to {tuned}",
            )
        value = self._target(action, before_text)
        if value == before_text:
            return Result(str(action), ok=True, before=before_text, after=value, detail="at bound")
        env.fs.write(env.group, file, value)
        after = env.fs.read(env.group, file).strip()
        if env.journal is not None:
            env.journal.append(
                "monitor",
                [{"cgroup": env.group, "file": file, "before": before_text, "after": after}],
                rule=ctx.rule,
                action=str(action),
            )
        return Result(str(action), ok=True, before=before_text, after=after)

    def _target(self, action: Action, before_text: str) -> str:
        """The value to write for ``set``, within bounds."""
        file = action.file
        assert file is not None
        if file == kf.CPU_WEIGHT:
            weight = int(before_text)
            if action.relative_percent is not None:
                weight = scale_percent(weight, action.relative_percent)
            elif action.value:
                weight = int(action.value)
            return str(min(max(weight, CPU_WEIGHT_MIN), CPU_WEIGHT_MAX))
        if file == kf.CPU_MAX:
            assert action.value is not None
            return action.value  # compiled to the kernel's "quota period"
        lower, upper = self._bounds(file)
        if action.relative_percent is not None:
            base = parse_max(before_text)
            if base is None and not action.relative_percent.startswith("-"):
                return before_text  # "max" raised by 10% is still "max": never a tightening
            if base is None:  # "max": lower relative to the bound, or to what is in use
                base = upper if upper is not None else (self.env.live(kf.MEMORY_CURRENT) or 0)
            want: int | None = scale_percent(base, action.relative_percent)
        else:
            want = action.bytes  # None: "max"
        if want is None:
            want = upper  # "max" is capped by the plan's memory.max
        if want is not None:
            if upper is not None:
                want = min(want, upper)
            want = max(want, lower)
            want = want // self.env.page_size * self.env.page_size
        return format_max(want)

    def _bounds(self, file: str) -> tuple[int, int | None]:
        """(lower, upper) for a memory file: [memory.min, memory.max of the plan]."""
        if file not in _MEMORY_BOUNDED:
            return 0, None
        env = self.env
        tuned_max = env.journal.tuned(kf.MEMORY_MAX) if env.journal is not None else None
        plan_max = (
            parse_max(tuned_max) if tuned_max is not None else self._plan_value(kf.MEMORY_MAX)
        )
        upper = plan_max if plan_max is not None else env.live(kf.MEMORY_MAX)
        lower = 0 if file == kf.MEMORY_MIN else (env.live(kf.MEMORY_MIN) or 0)
        hold = env.shed_hold() if file == kf.MEMORY_HIGH else None
        shed_high = parse_max(hold.memory_high) if hold and hold.memory_high else None
        if shed_high is not None:  # a higher class throttled it: never raised above that
            upper = shed_high if upper is None else min(upper, shed_high)
        return lower, upper

    def _plan_value(self, file: str) -> int | None:
        for w in self.env.plan.writes:
            if w.file == file and w.cgroup == self.env.group:
                return parse_max(w.value)
        return None


def scale_percent(base: int, percent: str) -> int:
    """``base`` changed by ``percent`` ("-10", "+12.5"), exactly (integer arithmetic on the
    decimal text, rounded toward zero like int(Decimal)): no float error on byte counts."""
    sign = -1 if percent.startswith("-") else 1
    whole, _, frac = percent.lstrip("+-").partition(".")
    den = 100 * int("1" + "0" * len(frac))
    num = sign * int(whole + frac)
    total = base * (den + num)
    return total // den if total >= 0 else -(-total // den)
