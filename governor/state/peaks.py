"""Peaks learned from runs (issue 45 item 3): the measured peak of each governed run
(memory.peak, else the sampled tree RSS) under the model file's identity and the argv's plan
key, kept in the state directory's per-model store (state/store.py), so that the next
`estimate`, `init`, `governor board` and admission stand on what the engine really took rather
than on the formula alone.

A key is the model's identity (state/store.py :func:`model_identity`), a space, and its plan:
the program's name and the argv's words that a compile reads (governor/plan/llama_args.py
``compile_words``: the words the plan cache is keyed on) but the model's own option, in a
canonical order. Each plan keeps its last RUNS_MAX peaks and the formula's figure; a model its
PLANS_MAX plans recorded last. The learned peak is the highest of the kept runs.

Standard library only: the supervisor records at the engine's exit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from governor.plan.llama_args import READ_OPTS, Unkeyable, compile_words, options
from governor.record import record
from governor.state.store import (
    LOCK_WAIT_S,
    PLAN_KEY_MAX,
    PLANS_MAX,
    RUNS_MAX,
    Entry,
    LockBusy,
    Store,
    model_identity,
)

# a learned peak this far from the formula's figure (either way) says the formula is wrong for
# this model and argv: reported once per key
FAR_SHARE = 0.25


@record(frozen=True)
class Learned:
    """What the kept runs of one key say: the highest peak and how many runs measured it."""

    peak: int
    runs: int
    estimate: int | None = None  # the formula's figure at the last run

    def text(self) -> str:
        """``peak 612 MiB (measured, 3 runs)``."""
        return f"peak {self.peak >> 20} MiB (measured, {self.runs} run{'s' * (self.runs != 1)})"

    def to_json(self) -> dict[str, Any]:
        return {"peak": self.peak, "runs": self.runs, "estimate": self.estimate}


def peak_key(model: str | Path, argv: Sequence[str]) -> str | None:
    """The key of ``model`` run by ``argv`` (module docstring); None when the file is gone, the
    argv has no plan key (Unkeyable) or the key is too long to keep."""
    ident = model_identity(model)
    if ident is None or not argv:
        return None
    try:
        words = compile_words(["", *argv[1:]])[1:]
    except Unkeyable:
        return None
    # the model is the file's identity; the other steps in any order, options by their
    # canonical name (-c and --ctx-size are one), so `estimate MODEL --engine-argv ...` finds it
    steps = sorted(
        [READ_OPTS.get(o.name, o.name), *o.words[1:]] if not o.inline else [o.words[0]]
        for o in options(words)
        if READ_OPTS.get(o.name) != "model"
    )
    plan = json.dumps([os.path.basename(argv[0]), *steps])
    return f"{ident} {plan}" if len(plan) <= PLAN_KEY_MAX else None


def learned(directory: Path | None, key: str | None) -> tuple[Learned | None, str | None]:
    """The learned peak of ``key`` (None: no run measured it yet) and a note for a bad store."""
    if directory is None or key is None:
        return None, None
    ident, _, plan = key.partition(" ")
    models, note = Store(directory).read()
    entry = models.get(ident, {}).get("peaks", {}).get(plan)
    if entry is None:
        return None, note
    return Learned(max(entry["runs"]), len(entry["runs"]), entry.get("estimate")), note


def far_text(got: Learned) -> str | None:
    """What to say when the learned peak is further than FAR_SHARE from the formula's."""
    if not got.estimate:
        return None
    ratio = got.estimate / got.peak
    if abs(got.peak / got.estimate - 1) <= FAR_SHARE:
        return None
    return (
        f"the formula's estimate {got.estimate >> 20} MiB is {ratio:.2f}x the measured"
        f" {got.text()}: the formula is off for this model and argv (more than"
        f" {FAR_SHARE:.0%}); the measured peak is what the board claims"
    )


def record_peak(
    directory: Path,
    key: str,
    peak: int,
    estimate: int | None,
    *,
    now: float | None = None,
    lock_wait_s: float = LOCK_WAIT_S,
) -> tuple[Learned, str | None]:
    """Add one run's ``peak`` under ``key`` (bounded: module docstring) and return what the
    key says now, with the far-from-the-formula text the first time it is far (else None).
    OSError and LockBusy pass: the caller logs them, the run is over either way."""
    ident, _, plan = key.partition(" ")
    said: dict[str, Any] = {}

    def change(entry: Entry) -> Entry:
        plans = dict(entry.get("peaks", {}))
        old = plans.pop(plan, None) or {"runs": [], "said": False}
        runs = [*old["runs"], peak][-RUNS_MAX:]
        got = Learned(max(runs), len(runs), estimate)
        far = None if old.get("said", False) else far_text(got)
        said.update(got=got, far=far)
        plans[plan] = {
            "runs": runs,
            "estimate": estimate,
            "at": time.time() if now is None else now,
            "said": bool(old.get("said", False)) or far is not None,
        }
        while len(plans) > PLANS_MAX:
            del plans[min(plans, key=lambda k: plans[k]["at"])]
        return {**entry, "peaks": plans}

    Store(directory).update(ident, change, now=now, lock_wait_s=lock_wait_s)
    return said["got"], said["far"]


__all__ = ["Learned", "LockBusy", "far_text", "learned", "peak_key", "record_peak"]
