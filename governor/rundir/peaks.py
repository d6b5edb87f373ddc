"""Peaks learned from runs (issue 45 item 3): ``<run dir>/peaks.json``, the measured peak of
each governed run (memory.peak, else the sampled tree RSS) under the model file's identity and
the argv's plan key, so that the next `estimate`, `init`, `governor board` and admission stand on
what the engine really took rather than on the formula alone.

A key is the model file's identity (size, mtime in ns, inode: a replaced or rewritten file is
a new model), the program's name and the argv's words that a compile reads
(governor/plan/llama_args.py ``compile_words``: the words the plan cache is keyed on) but the
model's own option, in a canonical order. Each key keeps its last
:data:`RUNS_MAX` peaks and the formula's figure; the file keeps the :data:`KEYS_MAX` keys used
last. The learned peak is the highest of the kept runs.

Another process writes the file (or a crash, a hand): it is read through one bounded,
validating reader. A file that is not what this module writes is one note and no learned peak,
never a crash; the next recorded run replaces it. Writes happen under a lock beside it
(governor/peer/lock.py) and replace the file atomically. Standard library only: the supervisor
records at the engine's exit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from governor.atomic import write_atomic
from governor.peer.files import read_capped
from governor.peer.lock import LockBusy, take
from governor.plan.llama_args import READ_OPTS, Unkeyable, compile_words, options
from governor.record import record

PEAKS_FILE = "peaks.json"
LOCK_FILE = ".peaks.lock"
FORMAT = 1
RUNS_MAX = 8  # the last runs kept per key: the learned peak is their highest
KEYS_MAX = 64  # keys kept (the ones recorded last): a board runs a handful of models
KEY_MAX = 4096  # a longer key (an argv of thousands of words) is not recorded
PEAKS_MAX = 1 << 20  # KEYS_MAX entries of ~1-4 KiB
LOCK_WAIT_S = 2.0
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


def model_identity(model: str | Path) -> str | None:
    """size:mtime_ns:inode of the model file (None when it cannot be stat'ed)."""
    try:
        st = os.stat(model)
    except (OSError, ValueError):
        return None
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


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
    key = f"{ident} {json.dumps([os.path.basename(argv[0]), *steps])}"
    return key if len(key) <= KEY_MAX else None


def _is_size(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def check_entry(entry: object) -> str | None:
    """What is wrong with one key's entry (None: what :func:`record_peak` writes)."""
    if not isinstance(entry, dict):
        return "an entry is not an object"
    runs = entry.get("runs")
    if not isinstance(runs, list) or not runs or not all(_is_size(r) for r in runs):
        return "runs is not a list of byte counts"
    if len(runs) > RUNS_MAX:
        return f"more than {RUNS_MAX} runs"
    est = entry.get("estimate")
    if est is not None and not _is_size(est):
        return "estimate is not a byte count"
    if not isinstance(entry.get("at"), (int, float)) or isinstance(entry.get("at"), bool):
        return "at is not a time"
    if not isinstance(entry.get("said", False), bool):
        return "said is not a bool"
    return None


def parse_peaks(raw: bytes) -> dict[str, dict[str, Any]]:
    """The entries of a peaks file's bytes (pure); ValueError names what is wrong."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    except ValueError as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a peaks file of format {FORMAT}")
    peaks = data.get("peaks")
    if not isinstance(peaks, dict) or len(peaks) > KEYS_MAX:
        raise ValueError(f"peaks is not an object of at most {KEYS_MAX} keys")
    for key, entry in peaks.items():
        problem = check_entry(entry)
        if problem is not None or len(key) > KEY_MAX:
            raise ValueError(f"entry {key[:60]!r}: {problem or 'key too long'}")
    return peaks


def read_peaks(run: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The file's entries and the note that says why they are none (a bad file: one note)."""
    path = run / PEAKS_FILE
    try:
        raw = read_capped(path, PEAKS_MAX)
    except FileNotFoundError:
        return {}, None
    except OSError as err:
        return {}, f"{path}: {err.strerror or err}: no learned peaks"
    try:
        return parse_peaks(raw), None
    except ValueError as err:
        return {}, f"{path}: {err}: no learned peaks (the next run replaces it)"


def learned(run: Path | None, key: str | None) -> tuple[Learned | None, str | None]:
    """The learned peak of ``key`` (None: no run measured it yet) and a note for a bad file."""
    if run is None or key is None:
        return None, None
    peaks, note = read_peaks(run)
    entry = peaks.get(key)
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
    run: Path,
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
    fd = take(run / LOCK_FILE, deadline=time.monotonic() + lock_wait_s)
    try:
        peaks, _note = read_peaks(run)  # a bad file is replaced
        entry = peaks.pop(key, None) or {"runs": [], "said": False}
        runs = [*entry["runs"], peak][-RUNS_MAX:]
        said = bool(entry.get("said", False))
        got = Learned(max(runs), len(runs), estimate)
        far = None if said else far_text(got)
        entry = {
            "runs": runs,
            "estimate": estimate,
            "at": now or time.time(),
            "said": said or bool(far),
        }
        peaks[key] = entry  # last: the most recent key
        while len(peaks) > KEYS_MAX:
            oldest = min(peaks, key=lambda k: peaks[k]["at"])
            del peaks[oldest]
        write_atomic(run / PEAKS_FILE, json.dumps({"format": FORMAT, "peaks": peaks}), 0o644)
        return got, far
    finally:
        os.close(fd)


__all__ = ["Learned", "LockBusy", "learned", "peak_key", "read_peaks", "record_peak"]
