"""One preflight (governor/engines/preflight.py): every refusal `governor launch` makes before it applies
anything is made by `governor check POLICY --engine-argv '...'` too, with the same exit code and
the same ``governor: ...`` / ``hint: ...`` lines, in the same order.

The parity tests run both commands as `python -m governor` subprocesses against the rk3588 host
fixture with ``--cgroup-root`` at a tmp copy of its cgroup root, and check that launch left that
root untouched (it refused before applying). Large files are sparse (truncate): their size is
what the checks read. The engine is /bin/true, so launch's engine lookup passes.

Needs: the host fixtures, /bin/true, a FIFO-capable tmp file system; the GGUF cases need the
`gguf` package (dev extra); the unreadable-file case as root drops CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH from the child's bounding set (skipped with the reason when it cannot).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from governor.compile.compiler import Workload, compile_plan
from governor.engines import prefetch_files as pf
from governor.engines import preflight as pre
from governor.engines.llama import EngineArgs
from governor.errors import PermissionDenied, PolicyError, PolicyNotFound
from governor.plan.host import probe
from governor.plan.model import Plan
from governor.policy.loader import load_text

REPO = Path(__file__).resolve().parents[3]
RK3588 = REPO / "tests" / "fixtures" / "hosts" / "rk3588"
ENGINE = "/bin/true"
MIB = 1 << 20


# ------------------------------------------------------------------------------------ helpers


def write_policy(
    directory: Path,
    *,
    kind: str = "generic",
    max_: str | None = "64M",
    high: str | None = None,
    mode: str = "none",
    files: list[str] | None = None,
    memlock: str | None = None,
    cap: int | None = None,
    user: str | None = None,
) -> Path:
    lines = ['name = "pf"', 'slice = "test.slice"', "[memory]"]
    if max_ is not None:
        lines.append(f'max = "{max_}"')
    if high is not None:
        lines.append(f'high = "{high}"')
    if memlock is not None or user is not None:
        lines.append("[process]")
    if memlock is not None:
        lines.append(f'memlock = "{memlock}"')
    if user is not None:
        lines.append(f'user = "{user}"')
    lines += ["[engine]", f'kind = "{kind}"']
    if cap is not None:
        lines.append(f"max_context_tokens = {cap}")
    lines += ["[prefetch]", f'mode = "{mode}"']
    if files is not None:
        lines.append(f"files = {json.dumps(files)}")
    path = directory / "policy.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def sparse(path: Path, nbytes: int) -> Path:
    with path.open("wb") as f:
        f.truncate(nbytes)
    return path


def make_gguf(directory: Path) -> Path:
    pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO / "tests" / "engine"))
    try:
        import make_gguf as mk  # type: ignore[import-not-found,unused-ignore]
    finally:
        sys.path.pop(0)
    out = directory / "tiny.gguf"
    assert mk.main(["--preset", "tiny", "-o", str(out)]) == 0
    return out


PR_CAPBSET_DROP = 24  # <linux/prctl.h>
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2  # <linux/capability.h>


def _drop_dac() -> None:
    """In the child before exec: root without the capabilities that bypass file modes, so a
    mode-000 file is unreadable again (the bounding set caps what exec grants root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _can_drop_dac(directory: Path) -> bool:
    """Whether a child without those capabilities really cannot read a mode-000 file."""
    probe_file = sparse(directory / "probe", 1)
    probe_file.chmod(0)
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; open(sys.argv[1]).close()", str(probe_file)],
        preexec_fn=_drop_dac,  # a single-threaded test process
        capture_output=True,
        check=False,
    )
    probe_file.unlink()
    return proc.returncode != 0 and b"PermissionError" in proc.stderr


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        """The `governor: ...` and `hint: ...` lines (launch may log JSON events before them)."""
        return [ln for ln in self.err.splitlines() if ln.startswith(("governor: ", "hint: "))]

    @property
    def logged_warnings(self) -> list[str]:
        out = []
        for line in self.err.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("level") == "warning" and "message" in event:
                out.append(str(event.get("message")))
        return out


@dataclass
class Governor:
    """Runs `python -m governor` with the rk3588 host and a tmp cgroup root."""

    tmp: Path
    cgroup_root: Path

    def __call__(self, *argv: str, drop_dac: bool = False) -> Run:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "governor",
                "--root",
                str(RK3588),
                "--cgroup-root",
                str(self.cgroup_root),
                *argv,
            ],
            cwd=self.tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            preexec_fn=_drop_dac if drop_dac else None,  # single-threaded
        )
        return Run(proc.returncode, proc.stdout, proc.stderr)

    def cgroup_tree(self) -> list[str]:
        return sorted(str(p.relative_to(self.cgroup_root)) for p in self.cgroup_root.rglob("*"))

    def both(self, policy: Path, engine: str, *, drop_dac: bool = False) -> tuple[Run, Run]:
        """(check --engine-argv, launch) of the same policy and engine command line."""
        before = self.cgroup_tree()
        check = self("check", str(policy), "--engine-argv", engine, drop_dac=drop_dac)
        launch = self("launch", "--policy", str(policy), "--", *engine.split(), drop_dac=drop_dac)
        assert "Traceback" not in check.err + launch.err, check.err + launch.err
        assert self.cgroup_tree() == before  # launch stopped before it applied anything
        return check, launch


@pytest.fixture
def gov(tmp_path: Path) -> Governor:
    cg = tmp_path / "cgroup"
    shutil.copytree(RK3588 / "sys" / "fs" / "cgroup", cg)
    return Governor(tmp_path, cg)


def assert_same_refusal(check: Run, launch: Run, code: int, needle: str) -> None:
    assert (check.code, launch.code) == (code, code), (check, launch)
    assert check.out == ""
    assert check.error_lines == launch.error_lines
    assert check.error_lines[0].startswith("governor: ")
    assert needle in check.error_lines[0], check.error_lines


# --------------------------------------------------------------- parity: every pre-apply refusal


def _ctx_cap(tmp: Path) -> tuple[Path, str]:
    model = sparse(tmp / "model.bin", MIB)
    return write_policy(tmp, kind="llama.cpp", cap=2048), f"{ENGINE} -m {model} -c 4096"


def _ctx_unreadable(tmp: Path) -> tuple[Path, str]:
    return write_policy(tmp, kind="llama.cpp"), f"{ENGINE} -m model.bin -c abc"


def _model_missing(tmp: Path) -> tuple[Path, str]:
    return write_policy(tmp, kind="llama.cpp"), f"{ENGINE} -m {tmp / 'none.bin'} -c 512"


def _model_above_max(tmp: Path) -> tuple[Path, str]:
    model = sparse(tmp / "model.bin", 100 * MIB)
    return write_policy(tmp, kind="llama.cpp", max_="64M"), f"{ENGINE} -m {model} -c 512"


def _prefetch_missing(tmp: Path) -> tuple[Path, str]:
    return write_policy(tmp, mode="populate", files=[str(tmp / "none.bin")]), ENGINE


def _prefetch_glob_empty(tmp: Path) -> tuple[Path, str]:
    return write_policy(tmp, mode="populate", files=["*.nothing"]), ENGINE


def _prefetch_fifo(tmp: Path) -> tuple[Path, str]:
    os.mkfifo(tmp / "fifo")  # an open() without O_NONBLOCK would wait for a writer forever
    return write_policy(tmp, mode="populate", files=[str(tmp / "fifo")]), ENGINE


def _prefetch_directory(tmp: Path) -> tuple[Path, str]:
    (tmp / "dir").mkdir()
    return write_policy(tmp, mode="advise", files=[str(tmp / "dir")]), ENGINE


def _prefetch_auto_generic(tmp: Path) -> tuple[Path, str]:
    return write_policy(tmp, mode="populate", files=None), ENGINE


def _memlock_model_without_m(tmp: Path) -> tuple[Path, str]:
    return write_policy(tmp, kind="llama.cpp", memlock="model"), f"{ENGINE} -c 512"


def _memlock_first(tmp: Path) -> tuple[Path, str]:
    # also prefetch "auto" without -m (65 of its own): memlock is the first refusal
    policy = write_policy(tmp, kind="llama.cpp", memlock="model", mode="populate")
    return policy, f"{ENGINE} -c 512"


def _populate_above_max(tmp: Path) -> tuple[Path, str]:
    big = sparse(tmp / "weights.bin", 100 * MIB)
    return write_policy(tmp, mode="populate", files=[str(big)], max_="64M"), ENGINE


def _lock_above_max(tmp: Path) -> tuple[Path, str]:
    big = sparse(tmp / "weights.bin", 100 * MIB)
    return write_policy(tmp, mode="lock", files=[str(big)], max_="64M"), ENGINE


def _gguf_above_max(tmp: Path) -> tuple[Path, str]:
    model = make_gguf(tmp)
    return write_policy(tmp, kind="llama.cpp", max_="20M"), f"{ENGINE} -m {model} -c 2048"


REFUSALS: dict[str, tuple[Callable[[Path], tuple[Path, str]], int, str]] = {
    "max_context_tokens exceeded": (_ctx_cap, 65, "exceeds engine.max_context_tokens = 2048"),
    "engine argv unreadable": (_ctx_unreadable, 65, "-c/--ctx-size is not an integer"),
    "model file missing": (_model_missing, 66, "model file not found"),
    "model file above memory.max": (_model_above_max, 65, "does not fit memory.max"),
    "prefetch file missing": (_prefetch_missing, 66, "prefetch file not found"),
    "prefetch glob matches nothing": (_prefetch_glob_empty, 66, "prefetch glob matches no file"),
    "prefetch file is a FIFO": (_prefetch_fifo, 65, "prefetch file is not a regular file"),
    "prefetch file is a directory": (_prefetch_directory, 65, "not a regular file"),
    "prefetch auto without llama.cpp": (_prefetch_auto_generic, 65, 'prefetch.files = "auto"'),
    "memlock model without -m": (_memlock_model_without_m, 65, 'process.memlock = "model"'),
    "memlock refused before prefetch": (_memlock_first, 65, 'process.memlock = "model"'),
    "populate above memory.max": (_populate_above_max, 65, "it would evict itself"),
    "lock above memory.max": (_lock_above_max, 65, "prefetch.mode = lock would lock"),
    "GGUF estimate above memory.max": (_gguf_above_max, 65, "above memory.max 20 MiB"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_check_refuses_what_launch_refuses_with_the_same_code_and_line(
    case: str, gov: Governor
) -> None:
    make, code, needle = REFUSALS[case]
    policy, engine = make(gov.tmp)
    check, launch = gov.both(policy, engine)
    assert_same_refusal(check, launch, code, needle)


def test_unreadable_prefetch_file_is_77_for_both(tmp_path: Path, gov: Governor) -> None:
    drop = os.geteuid() == 0
    if drop and not _can_drop_dac(tmp_path):
        pytest.skip("running as root and CAP_DAC_OVERRIDE cannot be dropped: root reads any file")
    secret = sparse(tmp_path / "secret.bin", MIB)
    secret.chmod(0)
    policy = write_policy(tmp_path, mode="populate", files=[str(secret)])
    check, launch = gov.both(policy, ENGINE, drop_dac=drop)
    assert_same_refusal(check, launch, 77, "prefetch file is not readable")


def test_warnings_are_the_same_and_do_not_refuse(tmp_path: Path, gov: Governor) -> None:
    """A prefetch above memory.high (but within memory.max) is a warning: check exits 0 and
    prints it, launch logs the same message and goes on. To stop launch after its preflight
    and before it applies anything, process.user names no account: launch looks it up just
    before apply (69), check does not look at accounts."""
    data = sparse(tmp_path / "weights.bin", 48 * MIB)
    policy = write_policy(
        tmp_path,
        mode="populate",
        files=[str(data)],
        max_="64M",
        high="32M",
        user="governor-test-nobody-here",
    )
    check, launch = gov.both(policy, ENGINE)
    assert check.code == 0, check.err
    printed = [ln.removeprefix("  warning: ") for ln in check.out.splitlines() if "warning:" in ln]
    assert printed == [
        "prefetch of 48MiB crosses memory.high 32MiB: it will throttle and reclaim itself"
    ]
    assert launch.logged_warnings == printed
    assert launch.code == 69, launch.err
    assert "process.user 'governor-test-nobody-here' does not exist" in launch.error_lines[-2]


# ----------------------------------------------------------------------------- the API, directly


def _plan(text: str, *, model_bytes: int | None = None) -> Plan:
    host = probe(RK3588)
    return compile_plan(
        load_text(text), host, workload=Workload(model_bytes=model_bytes), source="p.toml"
    )


POLICY = 'name = "pf"\n[memory]\nmax = "64M"\nhigh = "32M"\n[prefetch]\nmode = "{mode}"\nfiles = {files}\n'


def _run(plan: Plan, args: EngineArgs | None = None, *, force: bool = False) -> pre.Preflight:
    return pre.preflight(plan, args, root=RK3588, cwd=Path("/"), force=force)


def test_preflight_returns_the_files_their_bytes_and_warnings(tmp_path: Path) -> None:
    a, b = sparse(tmp_path / "a.bin", 8 * MIB), sparse(tmp_path / "b.bin", 40 * MIB)
    plan = _plan(POLICY.format(mode="populate", files=json.dumps([str(a), str(b), str(a)])))
    got = _run(plan)
    assert got.files == (str(a), str(b))  # in order, once each
    assert got.prefetch_bytes == 48 * MIB
    assert got.estimate is None
    assert [event for event, _ in got.warnings] == ["prefetch.budget"]


@pytest.mark.parametrize("mode", ["populate", "lock"])
def test_prefetch_above_memory_max_is_refused_for_populate_and_lock(
    tmp_path: Path, mode: str
) -> None:
    big = sparse(tmp_path / "big.bin", 100 * MIB)
    plan = _plan(POLICY.format(mode=mode, files=json.dumps([str(big)])))
    with pytest.raises(PolicyError) as exc:
        _run(plan)
    assert exc.value.exit_code == 65 and exc.value.field == "prefetch.mode"
    assert str(100 * MIB) in str(exc.value) and str(64 * MIB) in str(exc.value)


def test_advise_above_memory_max_is_a_warning_not_a_refusal(tmp_path: Path) -> None:
    big = sparse(tmp_path / "big.bin", 100 * MIB)
    got = _run(_plan(POLICY.format(mode="advise", files=json.dumps([str(big)]))))
    assert any("memory.max" in message for _, message in got.warnings)


def test_memlock_model_is_resolved_by_the_model_or_refused() -> None:
    text = 'name = "pf"\n[process]\nmemlock = "model"\n'
    with pytest.raises(PolicyError) as exc:
        _run(_plan(text))
    assert exc.value.field == "process.memlock" and exc.value.file == "p.toml"
    _run(_plan(text, model_bytes=MIB))  # compiled with the model's size: nothing to refuse


def test_model_size_counts_only_when_there_is_no_gguf_estimate(tmp_path: Path) -> None:
    model = sparse(tmp_path / "m.bin", 100 * MIB)
    args = pre.engine_args("llama.cpp", None, ("llama", "-m", str(model), "-c", "512"))
    assert pre.model_bytes(args) == 100 * MIB
    plan = _plan('name = "pf"\n[memory]\nmax = "64M"\n[engine]\nkind = "llama.cpp"\n')
    with pytest.raises(PolicyError) as exc:
        _run(plan, args)
    assert "does not fit memory.max" in str(exc.value)


def test_gguf_estimate_is_the_budget_and_force_turns_it_into_a_warning(tmp_path: Path) -> None:
    model = make_gguf(tmp_path)
    args = pre.engine_args("llama.cpp", None, ("llama", "-m", str(model), "-c", "2048"))
    plan = _plan('name = "pf"\n[memory]\nmax = "20M"\n[engine]\nkind = "llama.cpp"\n')
    with pytest.raises(PolicyError) as exc:
        _run(plan, args)
    assert "--force" in (exc.value.hint or "")
    got = _run(plan, args, force=True)
    assert got.estimate is not None and not got.estimate.fits
    assert [e for e, _ in got.warnings] == ["estimate.forced"]
    roomy = _plan('name = "pf"\n[memory]\nmax = "200M"\n[engine]\nkind = "llama.cpp"\n')
    fits = _run(roomy, args)
    assert fits.estimate is not None and fits.estimate.fits and fits.warnings == ()


def test_engine_args_enforce_the_cap_for_llama_cpp_only() -> None:
    with pytest.raises(PolicyError) as exc:
        pre.engine_args("llama.cpp", 2048, ("llama", "-c", "0"))
    assert "n_ctx_train" in str(exc.value)
    assert pre.engine_args("generic", 2048, ("prog", "-c", "99999")) is None
    assert pre.model_bytes(None) is None


def test_model_bytes_of_a_missing_model_is_66(tmp_path: Path) -> None:
    args = pre.engine_args("llama.cpp", None, ("llama", "-m", str(tmp_path / "x.gguf")))
    with pytest.raises(PolicyNotFound) as exc:
        pre.model_bytes(args)
    assert exc.value.exit_code == 66


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PolicyError) as exc:
        pf.check_readable(fifo, source="p.toml")
    assert exc.value.exit_code == 65


def test_missing_file_is_66(tmp_path: Path) -> None:
    with pytest.raises(PolicyNotFound) as exc:
        pf.check_readable(tmp_path / "none", source=None)
    assert exc.value.exit_code == 66


def test_directory_is_not_a_prefetch_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as exc:
        pf.check_readable(tmp_path, source=None)
    assert exc.value.exit_code == 65


def _unreadable_exit_code(directory: Path) -> int:
    """check_readable on a mode-000 file; 77 when it raised PermissionDenied. Root reads any
    file, so as root the check runs in a child that dropped to nobody (65534)."""
    f = sparse(directory / "secret.gguf", 4096)
    f.chmod(0)

    def attempt() -> int:
        try:
            pf.check_readable(f)
        except PermissionDenied as err:
            assert err.errno == errno.EACCES
            return err.exit_code
        return 0

    if os.geteuid() != 0:
        return attempt()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            code = attempt()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_unreadable_file_is_77() -> None:
    # a world-traversable directory: pytest's tmp_path is 0700 (nobody could not even stat)
    directory = Path(tempfile.mkdtemp(prefix="governor-test-"))
    try:
        directory.chmod(0o755)
        assert _unreadable_exit_code(directory) == 77
    finally:
        shutil.rmtree(directory)


# ---------------------------------------------------------------------------- file selection


def test_auto_takes_every_part_of_a_split_gguf(tmp_path: Path) -> None:
    for i in (1, 2, 3):
        sparse(tmp_path / f"m-0000{i}-of-00003.gguf", 4096)
    got = pf.resolve_files(
        "auto", model="m-00001-of-00003.gguf", engine_kind="llama.cpp", cwd=tmp_path
    )
    assert [p.name for p in got] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_auto_needs_a_llama_cpp_model() -> None:
    with pytest.raises(PolicyError):
        pf.resolve_files("auto", model=None, engine_kind="llama.cpp", cwd=Path("/"))
    with pytest.raises(PolicyError):
        pf.resolve_files("auto", model="x.gguf", engine_kind="generic", cwd=Path("/"))


def test_globs_expand_sorted_and_relative_to_cwd(tmp_path: Path) -> None:
    for name in ("b.bin", "a.bin", "c.txt"):
        sparse(tmp_path / name, 4096)
    got = pf.resolve_files(
        ["*.bin", str(tmp_path / "c.txt")], model=None, engine_kind="generic", cwd=tmp_path
    )
    assert [p.name for p in got] == ["a.bin", "b.bin", "c.txt"]


def test_glob_without_match_is_66(tmp_path: Path) -> None:
    with pytest.raises(PolicyNotFound) as exc:
        pf.resolve_files(["*.gguf"], model=None, engine_kind="generic", cwd=tmp_path)
    assert exc.value.exit_code == 66


# ------------------------------------------------------------------------------- budget (pure)


def test_model_larger_than_memory_max_is_refused_with_the_numbers() -> None:
    with pytest.raises(PolicyError) as exc:
        pre.fit_model_size(
            model_bytes=600 * MIB, memory_max=512 * MIB, memory_high=None, source="p.toml"
        )
    assert exc.value.exit_code == 65
    assert str(600 * MIB) in str(exc.value) and str(512 * MIB) in str(exc.value)
    assert exc.value.field == "memory.max"


def test_kv_cache_counts_against_memory_max() -> None:
    with pytest.raises(PolicyError):
        pre.fit_model_size(
            model_bytes=400 * MIB, kv_bytes=200 * MIB, memory_max=512 * MIB, memory_high=None
        )


def test_model_above_memory_high_is_a_warning_with_a_note_on_the_kv_cache() -> None:
    warnings, notes = pre.fit_model_size(
        model_bytes=600 * MIB, memory_max=1024 * MIB, memory_high=512 * MIB
    )
    assert [e for e, _ in warnings] == ["budget.above_high"]
    assert notes  # the KV cache was not known: said so


def test_prefetch_above_memory_high_is_a_warning() -> None:
    said = pre.fit_prefetch(
        mode="populate", prefetch_bytes=600 * MIB, memory_max=1024 * MIB, memory_high=512 * MIB
    )
    assert len(said) == 1 and "memory.high" in said[0][1]


def test_fitting_model_and_prefetch_pass_quietly() -> None:
    warnings, notes = pre.fit_model_size(
        model_bytes=100 * MIB, kv_bytes=10 * MIB, memory_max=None, memory_high=512 * MIB
    )
    assert warnings == [] and notes == []
    said = pre.fit_prefetch(
        mode="lock", prefetch_bytes=100 * MIB, memory_max=None, memory_high=512 * MIB
    )
    assert said == []


@pytest.mark.parametrize("mode", ["populate", "lock"])
def test_prefetching_more_than_memory_max_is_refused(mode: str) -> None:
    with pytest.raises(PolicyError) as exc:
        pre.fit_prefetch(
            mode=mode, prefetch_bytes=300 * MIB, memory_max=200 * MIB, memory_high=None
        )
    assert exc.value.field == "prefetch.mode"


def test_a_forced_gguf_estimate_is_the_only_budget_fit(tmp_path: Path) -> None:
    """The file size (~6 MiB) is above memory.max too, but the estimate is THE budget of a
    GGUF: --force lets it through and the file size is not checked again."""
    model = make_gguf(tmp_path)
    assert model.stat().st_size > 4 * MIB
    args = pre.engine_args("llama.cpp", None, ("llama", "-m", str(model), "-c", "512"))
    plan = _plan('name = "pf"\n[memory]\nmax = "4M"\n[engine]\nkind = "llama.cpp"\n')
    got = _run(plan, args, force=True)
    assert [e for e, _ in got.warnings] == ["estimate.forced"]


def test_a_prefetch_of_the_model_above_memory_high_is_said_once(tmp_path: Path) -> None:
    model = sparse(tmp_path / "m.bin", 48 * MIB)
    args = pre.engine_args("llama.cpp", None, ("llama", "-m", str(model), "-c", "512"))
    text = (
        'name = "pf"\n[memory]\nmax = "64M"\nhigh = "32M"\n[engine]\nkind = "llama.cpp"\n'
        '[prefetch]\nmode = "populate"\n'
    )
    got = _run(_plan(text), args)
    assert got.files == (str(model),)
    assert [e for e, _ in got.warnings] == ["prefetch.budget"]
    assert got.notes  # the KV cache size was not known


@pytest.mark.parametrize(
    ("report", "code", "needle"),
    [
        ("", 2, "is a directory"),  # the tmp directory itself
        ("missing/dir/report.json", 66, "does not exist"),
    ],
)
def test_an_unwritable_report_is_refused_before_anything_is_applied(
    tmp_path: Path, gov: Governor, report: str, code: int, needle: str
) -> None:
    policy = write_policy(tmp_path)
    before = gov.cgroup_tree()
    run = gov("launch", "--policy", str(policy), "--report", str(tmp_path / report), "--", ENGINE)
    assert run.code == code, run
    assert needle in run.error_lines[0] and run.error_lines[1].startswith("hint: ")
    assert gov.cgroup_tree() == before
