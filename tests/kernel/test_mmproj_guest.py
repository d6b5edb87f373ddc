"""A vision projector's estimate against memory.peak in the kernel guest (issue 45 item 1).

llama-server with the tiny text model and scripts/engine-setup's synthetic LLaVA-style
projector (tests/engine/make_mmproj.py: 38.5 MiB of f16 weights, 256 tokens an image) encodes
one 64x64 PNG in a fresh cgroup with no limit, page cache dropped first (so the projector's
file pages, read once by clip.cpp, are charged to the run); the estimate `governor estimate`
gives for the same argv must lie within the band of perf/accuracy.py: never under memory.peak,
at most 10 % over, and `governor estimate --budget` at 1.10 x the peak must say it fits (no
false refusal). The cell is perf/accuracy.py's ``tiny-mmproj-c1024`` (one run of it).

The band is judged against a cell's WORST run (docs/benchmarks.md, "The accuracy band": the
limit a cell needs is its worst run's peak), and one run is not the worst: the projector cells
moved 10-11.5 MiB run to run (the spread run, 2026-12-06), and this test's own runs on a fresh
machine peaked at 128.2 and 130.2 MiB where the cell's three accuracy runs gave 138.0-140.2
(estimate 146.7: 1.13-1.145x those runs, 1.05x the worst). So the upper side and the budget
allow SPREAD above this run's peak; the never-under side is this run's, strict. The spread is
the cell's own, not a moved peak: `perf/accuracy.py --guest --repeat 2` right after gave
128.1 and 138.3 MiB for this cell (2026-12-06 14:39, 8e40d88: 1.061x the worst).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cgroups import ScratchSlice

from perf._helpers.engine_paths import MMPROJ, TINY
from perf._helpers.server import SERVER
from perf.accuracy import CELLS, run_cell
from perf.accuracy_report import BAND, MIB

REPO = Path(__file__).resolve().parents[2]
CELL = next(c for c in CELLS if c.name == "tiny-mmproj-c1024")
IMAGE_TOKENS = 256  # (224 / 14)^2: the synthetic projector's patch grid
SPREAD = 12 * MIB  # a projector cell's run-to-run spread of memory.peak (module docstring)


@pytest.fixture
def out_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Beside the junit xml (the harness's results directory), else the test's tmp_path."""
    xml = getattr(request.config.option, "xmlpath", None)
    return Path(xml).parent if xml else tmp_path


@pytest.mark.kernel(controllers=("memory",), root=True)
@pytest.mark.engine(binary=SERVER, paths=(TINY, MMPROJ))
def test_projector_estimate_is_within_the_band_of_memory_peak(
    tmp_path: Path, enabled_root_subtree: Path, scratch_slice: ScratchSlice, out_dir: Path
) -> None:
    parent = scratch_slice.create()
    (parent / "cgroup.subtree_control").write_text("+memory")
    r = run_cell(CELL, parent, tmp_path / "server.log")
    (out_dir / "mmproj-guest.json").write_text(
        json.dumps({**r.__dict__, "ratio": r.ratio}, indent=1)
    )
    assert r.oom_kill == 0
    assert r.prompt_tokens and r.prompt_tokens[-1] > IMAGE_TOKENS  # the image was encoded
    assert r.terms["projector"] > 0 and r.terms["image"] > 0
    assert r.peak <= r.estimate <= (r.peak + SPREAD) * (1 + BAND), (
        f"estimate {r.estimate / MIB:.1f} MiB vs memory.peak {r.peak / MIB:.1f} MiB"
        f" ({r.ratio:.3f}); terms {r.terms}; anon {r.anon / MIB:.0f} file {r.file / MIB:.0f}"
    )
    budget = int((r.peak + SPREAD) * (1 + BAND))
    res = subprocess.run(
        [sys.executable, "-m", "governor", "estimate", "--budget", str(budget), "--json",
         "--engine-argv", r.argv],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr  # fits: no false refusal
    assert json.loads(res.stdout)["terms"]["projector"] == r.terms["projector"]
