#!/usr/bin/env python3
"""The estimate's accuracy band, both ways (issue 45 item 2): per cell of a small matrix
(models x -c x -np x --cache-ram x repack x projector) the estimate `governor estimate` gives,
the engine's measured memory.peak and their ratio; goal +10 % / -0 % (never under, at most 10 %
over) and zero false refusals.

    flock /tmp/governor-guest.lock .venv/bin/python -m perf.accuracy --guest [--cells a,b] [--repeat N]
    .venv/bin/python -m perf.accuracy [--cells a,b]   # as root on a cgroup v2 kernel

Each cell runs once (`--repeat N`: N rounds of the matrix, a cell's peak the worst of its runs
and their min-max beside it), alone, in a fresh cgroup with no limit (what is measured is what the
engine takes, not what reclaim leaves it), the page cache dropped first so the model's and
the projector's file pages are charged to the cell (the estimate is for a cold cache, as
docs/calibration.md). One-shot cells run llama-completion to exit (`-n 4`); server cells run
llama-server to ready, then their conversations (distinct ~120-word prompts: each a new saved
state, so a --cache-ram fills) and/or one image request (a 64x64 PNG, the synthetic
projector's 256 tokens), then read memory.peak. Models: scripts/engine-setup's synthetic ones.

False refusal: `check`/`init` refuse an argv when its estimate is above memory.max; a cell is
a false refusal when the estimate is above the limit it needs with the band's slack, 1.10 x
its measured peak (it would run there, the governor would refuse it).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shlex
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from perf._helpers.cgroup import read_kv
from perf._helpers.engine_paths import BIG, BIN, COMPLETION, MMPROJ, SMALL, TINY
from perf._helpers.server import KVGUEST, SERVER, SERVER_ARGS, chat, free_port, prompt, wait_ready
from perf.accuracy_report import MIB, STAT_KEYS, Result, failed, merge, table

REPO = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup")
SLICE = "perfaccuracy.slice"
MTMD_CLI = BIN / "llama-mtmd-cli"
IMAGE = Path("/tmp/perf-accuracy.png")
TIME = "/usr/bin/time"  # GNU time: a one-shot engine's peak RSS in --host-rss  # written by run_cell for llama-mtmd-cli


@dataclass(frozen=True)
class Cell:
    name: str
    argv: tuple[str, ...]  # the engine argv after the program's path
    program: Path
    conversations: int = 0  # server: distinct text conversations
    image: bool = False  # server: one image request (needs --mmproj)


def _srv(name: str, model: Path, *args: str, conversations: int = 0, image: bool = False) -> Cell:
    return Cell(
        name, ("-m", str(model), *args, "-t", "2", *SERVER_ARGS), SERVER, conversations, image
    )


def _one(name: str, model: Path, *args: str) -> Cell:
    argv = ("-m", str(model), *args, "-p", "hello world", "-n", "4", "-no-cnv", "--ignore-eos")
    return Cell(name, (*argv, "-t", "2"), COMPLETION)


MM = ("--mmproj", str(MMPROJ))
CELLS = (
    _one("tiny-c512", TINY, "-c", "512"),
    _one("tiny-c2048", TINY, "-c", "2048"),
    _one("tiny-c2048-q8kv", TINY, "-c", "2048", "-ctk", "q8_0", "-ctv", "q8_0"),
    _one("small-c512-repack", SMALL, "-c", "512"),
    _one("small-c512-nr", SMALL, "-c", "512", "-nr"),
    _one("small-c2048-nr", SMALL, "-c", "2048", "-nr"),
    # the 1.1 GiB model (vocab 151936): the logits part counted up to LOGITS_COUNTED_MAX;
    # scripts/engine-setup BIG=1 only (skipped without it), ~4 min under TCG
    _one("qwen18b-c2048-nr", BIG, "-c", "2048", "-nr"),
    _srv("kv-c1024-np1-cram0", KVGUEST, "-c", "1024", "-np", "1", "--cache-ram", "0", conversations=2),
    _srv("kv-c2048-np2-cram0", KVGUEST, "-c", "2048", "-np", "2", "--cache-ram", "0", conversations=2),
    _srv("kv-c2048-np2-cram6", KVGUEST, "-c", "2048", "-np", "2", "--cache-ram", "6", conversations=4),
    _srv("kv-c4096-np4-kvu", KVGUEST, "-c", "4096", "-np", "4", "-kvu", "--cache-ram", "0", conversations=2),
    _srv("tiny-mmproj-c1024", TINY, *MM, "-c", "1024", "-np", "1", "--cache-ram", "0", image=True),
    _srv("tiny-mmproj-c2048-np2", TINY, *MM, "-c", "2048", "-np", "2", "--cache-ram", "0", conversations=1, image=True),
    Cell("tiny-mtmd-cli-c1024", ("-m", str(TINY), *MM, "-c", "1024", "--image", str(IMAGE),
         "-p", "what is this", "-n", "4", "-t", "2", "--chat-template", "chatml"), MTMD_CLI),
)  # fmt: skip


def engine_files(program: Path) -> list[Path]:
    """The engine's binary and the shared libraries it loads (ldd), resolved."""
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=False)
    libs = [w for line in out.stdout.splitlines() for w in line.split() if w.startswith("/")]
    return [program.resolve(), *(Path(w).resolve() for w in libs)]


def png(side: int = 64) -> bytes:
    """A side x side RGB gradient PNG (stdlib only: zlib + the PNG chunk layout)."""
    rows = b"".join(
        b"\0" + b"".join(bytes((x * 4 % 256, y * 4 % 256, 128)) for x in range(side))
        for y in range(side)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def image_request(base: str, timeout: float = 900.0) -> int:
    """One chat request with the PNG and a few words; the prompt tokens the server counted."""
    url = "data:image/png;base64," + base64.b64encode(png()).decode()
    body = {
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "what is this"},
        ]}],
        "max_tokens": 4,
    }  # fmt: skip
    req = urllib.request.Request(
        f"{base}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return int(json.loads(r.read())["usage"]["prompt_tokens"])


def estimate_of(program: Path, argv: tuple[str, ...]) -> tuple[int, dict[str, int]]:
    """The estimate `governor estimate --engine-argv` gives (in-process, no budget)."""
    from governor.engines.budget import estimate_argv
    from governor.engines.llama import parse_llama_argv

    est = estimate_argv(parse_llama_argv([str(program), *argv]), root=Path("/"), budget=None)
    return est.total, {t.name: t.bytes for t in est.terms}


def _enter(group: Path) -> None:
    fd = os.open(group / "cgroup.procs", os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def evict(paths: list[Path]) -> None:
    """These files' clean pages out of the page cache (a host run: no global drop_caches)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_bytes(path: Path) -> int:
    """How much of ``path`` is in the page cache (util-linux fincore)."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    return int(out.split()[0]) if out.split() and out.split()[0].isdigit() else 0


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def run_cell(cell: Cell, parent: Path | None, log: Path) -> Result:
    """One run of ``cell`` in a new cgroup under ``parent`` (memory controller enabled there);
    ``parent`` None: a host without a memory controller, where the peak is the process's
    peak RSS plus the page cache of what it read without mapping (the projector), its files
    evicted from the page cache first: a proxy of memory.peak, not memory.peak."""
    if parent is None:
        return _run_rss(cell, log)
    group = parent / cell.name
    group.mkdir()
    try:
        return _run_in(cell, group, log)
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.2)


def _run_in(cell: Cell, group: Path, log: Path) -> Result:
    argv = list(cell.argv)
    port = free_port()
    if cell.program == SERVER:
        argv += ["--host", "127.0.0.1", "--port", str(port)]
    total, terms = estimate_of(cell.program, tuple(argv))
    IMAGE.write_bytes(png())
    drop_caches()
    t0 = time.monotonic()
    tokens: list[int] = []
    with log.open("w") as err:
        # preexec_fn: only the cgroup.procs write runs between fork and exec (no locks taken)
        proc = subprocess.Popen(
            [str(cell.program), *argv], stdout=subprocess.DEVNULL, stderr=err, text=True,
            preexec_fn=lambda: _enter(group),  # noqa: PLW1509
        )  # fmt: skip
        try:
            if cell.program == SERVER:
                tokens = _serve(cell, proc, port)
            else:
                rc = proc.wait(timeout=900)
                if rc != 0:
                    raise RuntimeError(f"{cell.name}: exit {rc}; see {log}")
            stat = read_kv(group / "memory.stat")
            peak = int((group / "memory.peak").read_text())
        finally:
            proc.kill()
            proc.wait()
    events = read_kv(group / "memory.events")
    return Result(
        cell=cell.name,
        argv=shlex.join([cell.program.name, *cell.argv]),
        estimate=total,
        terms=terms,
        peak=peak,
        anon=stat.get("anon", 0),
        file=stat.get("file", 0),
        prompt_tokens=tokens,
        oom_kill=events.get("oom_kill", 0),
        wall_s=time.monotonic() - t0,
        stat={k: stat[k] for k in STAT_KEYS if k in stat},
        engine_files={str(f): cached_bytes(f) for f in engine_files(cell.program)},
    )


def _serve(cell: Cell, proc: subprocess.Popen[str], port: int) -> list[int]:
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, proc, timeout=900)
    tokens = [
        chat(base, i, prompt(i, 120), max_tokens=4).prompt_tokens for i in range(cell.conversations)
    ]
    if cell.image:
        tokens.append(image_request(base))
    time.sleep(0.5)
    return tokens


def _run_rss(cell: Cell, log: Path) -> Result:
    argv = list(cell.argv)
    port = free_port()
    if cell.program == SERVER:
        argv += ["--host", "127.0.0.1", "--port", str(port)]
    total, terms = estimate_of(cell.program, tuple(argv))
    IMAGE.write_bytes(png())
    files = [Path(w) for w in argv if w.endswith(".gguf")]
    evict(files)
    t0 = time.monotonic()
    tokens: list[int] = []
    anon = 0
    with log.open("w") as err:
        # a one-shot engine's peak RSS through GNU time: a child forked from Python would
        # count the interpreter's pages before exec in its ru_maxrss
        timed = log.with_suffix(".maxrss")
        wrap = [] if cell.program == SERVER else [TIME, "-f", "%M", "-o", str(timed)]
        proc = subprocess.Popen(
            [*wrap, str(cell.program), *argv], stdout=subprocess.DEVNULL, stderr=err, text=True
        )
        try:
            if cell.program == SERVER:
                tokens = _serve(cell, proc, port)
                peak, anon = status_kib(proc.pid, "VmHWM"), status_kib(proc.pid, "RssAnon")
            elif proc.wait(timeout=900) != 0:
                raise RuntimeError(f"{cell.name}: exit {proc.returncode}; see {log}")
            else:
                peak = int(timed.read_text().split()[-1]) * 1024
        finally:
            proc.kill()
            proc.wait()
    unmapped = sum(cached_bytes(Path(argv[i + 1])) for i, w in enumerate(argv) if w == "--mmproj")
    return Result(
        cell=cell.name,
        argv=shlex.join([cell.program.name, *cell.argv]),
        estimate=total,
        terms=terms,
        peak=peak + unmapped,
        anon=anon,
        file=unmapped,
        prompt_tokens=tokens,
        wall_s=time.monotonic() - t0,
    )


def run_matrix(cells: list[Cell], run: Callable[[Cell], Result], repeat: int = 1) -> list[Result]:
    """Every cell through ``run``, one line each, ``repeat`` rounds of the whole matrix (the
    rounds interleaved, so a cell's runs are apart in time); a cell that fails is reported,
    not fatal. One result a cell: its runs merged (the worst peak, every run's in peaks)."""
    runs: dict[str, list[Result]] = {c.name: [] for c in cells}
    for cell in [c for _ in range(repeat) for c in cells]:
        try:
            r = run(cell)
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
            r = failed(cell.name, cell.program, cell.argv, f"{type(e).__name__}: {e}")
            print(f"perf/accuracy: {cell.name}: FAILED {r.error}", flush=True)
        else:
            print(
                f"perf/accuracy: {r.cell}: estimate {r.estimate / MIB:.1f} MiB, peak"
                f" {r.peak / MIB:.1f} MiB ({r.ratio:.3f}), tokens {r.prompt_tokens},"
                f" {r.wall_s:.0f} s; {r.argv}\n  terms {r.terms}; anon {r.anon} file {r.file};"
                f" stat {r.stat}; engine files cached {r.engine_files}",
                flush=True,
            )
        runs[cell.name].append(r)
    return [merge(rs) for rs in runs.values()]


def provenance() -> str:
    """Date, commit, kernel and engine build of a run: the line above the table."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip() or "unknown"  # fmt: skip
    version = subprocess.run(
        [str(COMPLETION), "--version"], capture_output=True, text=True, check=False
    )
    build = next(
        (ln for ln in (version.stdout + version.stderr).splitlines() if ln.startswith("version")),
        "version unknown",
    )
    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit},"
        f" kernel {os.uname().release}, llama.cpp {build}"
    )


def in_guest(argv: list[str], timeout: float) -> int:
    """Run this module in the kernel guest through the project's harness (tests/vm/run.py)."""
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "perf.accuracy", *argv]
    harness = [
        sys.executable,
        "-m",
        "vm.run",
        "--guest",
        "kernel",
        f"--timeout={timeout}",
        "--cpus=2",
    ]
    return subprocess.call([*harness, "--", *cmd], cwd=REPO / "tests")


def until(
    run: Callable[[Cell], Result], stop: float | None, clock: Callable[[], float] = time.monotonic
) -> Callable[[Cell], Result]:
    """``run``, but a cell due after ``stop`` (``clock``'s time) is not started: it fails as
    "not run", so the table still prints before the guest's timeout ends the boot."""

    def bounded(cell: Cell) -> Result:
        if stop is not None and clock() > stop:
            raise RuntimeError("not run: --deadline passed")
        return run(cell)

    return bounded


def select(names: str) -> list[Cell]:
    """The cells ``--cells`` names, in its order (a slow cell last: a timeout keeps the rest);
    a cell named again runs again there (its runs merged as --repeat's: a noisy cell's spread)."""
    wanted = names.split(",")
    if unknown := sorted(set(wanted) - {c.name for c in CELLS}):
        raise SystemExit(f"perf/accuracy: unknown cells {unknown} (--cells)")
    return [c for n in wanted for c in CELLS if c.name == n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--cells", default=",".join(c.name for c in CELLS), help="run in this order")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the matrix (the spread)")
    ap.add_argument("--deadline", type=float, help="start no cell after this many seconds")
    ap.add_argument("--guest", action="store_true", help="run in the kernel test guest")
    ap.add_argument("--guest-timeout", type=float, default=2100.0)
    ap.add_argument(
        "--host-rss", action="store_true",
        help="no memory controller: peak RSS + the projector's page cache (a proxy)",
    )  # fmt: skip
    a = ap.parse_args()
    cells = select(a.cells)
    if a.guest:
        more = [] if a.deadline is None else [f"--deadline={a.deadline}"]
        return in_guest([f"--cells={a.cells}", f"--repeat={a.repeat}", *more], a.guest_timeout)
    if not a.host_rss and (os.geteuid() != 0 or not (CGROUP / "cgroup.controllers").exists()):
        raise SystemExit("perf/accuracy: needs root on a cgroup v2 kernel (--guest, --host-rss)")
    if not MTMD_CLI.exists() and MTMD_CLI in {c.program for c in cells}:
        print(f"perf/accuracy: {MTMD_CLI} missing (an engine cache before b11312): cell skipped")
        cells = [c for c in cells if c.program != MTMD_CLI]
    if not BIG.exists() and any(str(BIG) in c.argv for c in cells):
        print(f"perf/accuracy: {BIG} missing (scripts/engine-setup without BIG=1): cell skipped")
        cells = [c for c in cells if str(BIG) not in c.argv]
    for c in cells:
        for path in (c.program, *(Path(w) for w in c.argv if w.endswith(".gguf"))):
            if not path.exists():
                raise SystemExit(f"perf/accuracy: {path} missing: run scripts/engine-setup")
    parent: Path | None = None
    if not a.host_rss:
        (CGROUP / "cgroup.subtree_control").write_text("+memory")
        parent = CGROUP / SLICE
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text("+memory")
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        if parent is not None:
            stack.callback(parent.rmdir)
        stop = None if a.deadline is None else t0 + a.deadline
        results = run_matrix(
            cells,
            until(lambda c: run_cell(c, parent, Path(f"/tmp/perf-accuracy-{c.name}.log")), stop),
            a.repeat,
        )
    print(f"perf/accuracy: {len(results)} cells in {time.monotonic() - t0:.0f} s")
    command = shlex.join(["python", "-m", "perf.accuracy", *sys.argv[1:]])
    print(f"\n{provenance()}; {command}\n\n{table(results)}", flush=True)
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
