"""perf/qos's real-engine runs in the systemd guest (issue 48): the swap setups, the policies
`governor init` writes for the two engines, one run of an arm (a llama-server chat driven by
the openai client beside a llama-completion batch job and a memory hog) and the rounds.
The pure parts are perf/qos_report.py, the command line perf/qos_real.py."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

from perf._helpers.cgroup import read_kv
from perf._helpers.disk import writable_disk_dir
from perf._helpers.server import client, free_port, health, prompt
from perf.qos_common import HELPERS, REPO, earlyoom_kills, oom_victims
from perf.qos_guest import Proc, cgroup2_root, drop_model, governor_actions, kmsg_now, log, sh
from perf.qos_report import CPU_USERS, FLOOR_ARM, RealRun, Turn, decode_tps

MIB = 1 << 20
HOG_COMM = "qos-hog"
# /proc/PID/comm is 15 bytes: llama-completion shows as "llama-completio"
JOB_COMM, CHAT_COMM = "llama-completio", "llama-server"
# The chat's template: the messages' words and a space each. The synthetic model has none, and
# chatml's markers are ~50 of its tokens a message, which the chat would re-process every turn
# (a turn's prompt was ~150 tokens at ~4 tokens/s under TCG: the smoke run's 36-98 s TTFT);
# with this one a turn's prompt is its new words and the answer before it.
CHAT_TEMPLATE = "{%- for m in messages -%}{{ m['content'] }} {% endfor -%}"
# One thread an engine: the guest has 2 vCPUs, the chat and the job one each, as an operator
# of a 2-core board would start them (init's default, -t = the online CPUs, gives both engines
# both vCPUs, and ggml's threads wait at each op for the one the other engine holds off its CPU)
THREADS = "1"
# The hog's place: its own slice, which the governor arm's board file lists (see BOARD)
HOG_SLICE = "qosreal_hog.slice"
# The governor arm's board file ($GOVERNOR_BOARD, docs/several.md "The board file"): the hog is
# the board's other work, which no policy governs; an operator lists it as background, so the
# chat's shed holds it (throttle, then freeze: its memory stays, it grows no further) before
# it reaches the job, which is background too and smaller (a shed takes the largest first)
BOARD = f"""[[cgroup]]
path = "{HOG_SLICE}"
class = "background"
yield = ["throttle", "freeze"]
name = "hog"
"""


@dataclass
class Setup:
    """What every run of one swap setup shares."""

    tmp: Path
    chat_model: Path
    job_model: Path
    server: Path
    completion: Path
    cache_ram: int  # llama-server --cache-ram MiB (the prompt cache a conversation grows)
    job_ctx: int
    job_tokens: int
    hog_mib: int
    chat_s: float  # seconds of measured turns
    words: int  # user words a turn (one token each)
    answer: int  # tokens an answer
    turns: int  # turns a conversation before a new one starts
    oomd_limit: str
    oomd_duration: str
    job_wait_s: float = 30.0  # after the chat's turns; a job still running then did not finish
    chat_argv: list[str] = field(default_factory=list)  # init's command line, without the port
    job_argv: list[str] = field(default_factory=list)
    chat_policy: Path | None = None
    job_policy: Path | None = None
    said: list[str] = field(default_factory=list)  # what init wrote (its summary lines)


# ------------------------------------------------------------------------------ swap setups


@contextlib.contextmanager
def swap_setup(kind: str, mib: int) -> Iterator[str]:
    """none: every swap off; zram: a `mib` zram device swapped on; zswap: a `mib` swap area on a
    loop device (its image on the disk-backed share) with zswap enabled. Torn down after."""
    sh("swapoff", "-a")
    if kind == "none":
        yield "no swap"
        return
    if kind == "zram":
        subprocess.run(["modprobe", "zram"], capture_output=True, check=False)
        dev = Path("/sys/block/zram0")
        if dev.joinpath("disksize").read_text().strip() != "0":
            n = Path("/sys/class/zram-control/hot_add").read_text().strip()
            dev = Path(f"/sys/block/zram{n}")
        (dev / "disksize").write_text(str(mib * MIB))
        node = f"/dev/{dev.name}"
        for _ in range(100):
            if Path(node).exists():
                break
            time.sleep(0.1)
        sh("mkswap", node)
        sh("swapon", "-p", "100", node)
        try:
            yield f"zram {node} {mib} MiB ({(dev / 'comp_algorithm').read_text().strip()})"
        finally:
            sh("swapoff", node)
            (dev / "reset").write_text("1")
        return
    if kind != "zswap":
        raise SystemExit(f"bench: unknown swap setup {kind!r}")
    image = writable_disk_dir() / f"governor-qos-swap-{os.getpid()}.img"
    with image.open("wb") as f:
        f.truncate(mib * MIB)
    subprocess.run(["modprobe", "loop"], capture_output=True, check=False)
    loop = sh("losetup", "-f", "--show", str(image)).strip()
    enabled = Path("/sys/module/zswap/parameters/enabled")
    before = enabled.read_text().strip()
    try:
        sh("mkswap", loop)
        sh("swapon", "-p", "100", loop)
        enabled.write_text("Y")
        yield f"zswap on {loop} {mib} MiB (was enabled={before})"
    finally:
        enabled.write_text(before)
        sh("swapoff", loop)
        sh("losetup", "-d", loop)
        image.unlink(missing_ok=True)


# ------------------------------------------------------------------------------ policies


def init_policy(model: Path, engine_argv: str, name: str, out: Path) -> tuple[list[str], str]:
    """`governor init` for the engine on this board (after the swap setup: init reads its swap):
    the command line it was sized for (its `next:` line) and its summary line."""
    r = subprocess.run(
        [sys.executable, "-m", "governor", "init", "--model", str(model), "--engine-argv",
         engine_argv, "--name", name, "-o", str(out), "--force"],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=300,
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"bench: governor init {name} exited {r.returncode}: {r.stderr[-800:]}")
    return init_said(r.stdout)


def init_said(text: str) -> tuple[list[str], str]:
    """init's output: the engine command line of its `next:` line (the one it sized for) and
    its first line (`wrote FILE: -c N, memory.min ...`)."""
    m = re.search(r"--engine-argv '([^']*)'", text)
    if not m:
        raise SystemExit(f"bench: no engine command line in init's output: {text[-800:]}")
    return shlex.split(m.group(1)), text.splitlines()[0]


def policies(st: Setup) -> None:
    template = st.tmp / "chat-template.jinja"
    template.write_text(CHAT_TEMPLATE)
    (st.tmp / "board.toml").write_text(BOARD)
    chat = (f"{st.server} --cache-ram {st.cache_ram} --jinja --chat-template-file {template} "
            f"--no-webui -t {THREADS} --host 127.0.0.1")  # fmt: skip
    st.chat_policy, st.job_policy = st.tmp / "chat.toml", st.tmp / "job.toml"
    st.chat_argv, said_c = init_policy(st.chat_model, chat, "chat", st.chat_policy)
    job = f"{st.completion} -c {st.job_ctx} -t {THREADS}"
    st.job_argv, said_j = init_policy(st.job_model, job, "job", st.job_policy)
    st.said = [said_c, said_j]
    for line in st.said:
        log(f"init: {line}")


def scope_limits(memory: dict[str, Any]) -> list[str]:
    """systemd-run properties for a policy's [memory] min/high/max/swap_max: the oomd and
    earlyoom arms run the engines with the limits init wrote, systemd's way."""
    names = {"min": "MemoryMin", "high": "MemoryHigh", "max": "MemoryMax",
             "swap_max": "MemorySwapMax"}  # fmt: skip
    out = []
    for key, prop in names.items():
        if key in memory:
            out.append(f"--property={prop}={systemd_bytes(str(memory[key]))}")
    return out


def systemd_bytes(text: str) -> str:
    """A policy size ("14MiB", "2G", "0", "max") as systemd's bytes ("infinity" for max)."""
    if text == "max":
        return "infinity"
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(i?B)?", text)
    if not m:
        raise SystemExit(f"bench: size {text!r}")
    return str(int(m.group(1)) << (10 * " KMGT".index(m.group(2) or " ")))


# ------------------------------------------------------------------------------ one run


def start_scope(unit: str, slice_: str, argv: list[str], out: Path, props: list[str]) -> Proc:
    cmd = ["systemd-run", "--scope", "--quiet", f"--unit={unit}", f"--slice={slice_}", *props]
    with out.open("ab") as f:
        popen = subprocess.Popen([*cmd, *argv], stdout=f, stderr=subprocess.STDOUT)
    return Proc(popen, unit=unit)


def start_governed(policy: Path, argv: list[str], log_: Path, env: dict[str, str]) -> Proc:
    body = tomllib.loads(policy.read_text())
    cg = cgroup2_root() / body.get("slice", "governor.slice") / body["name"]
    cmd = [sys.executable, "-m", "governor", "launch", "--policy", str(policy), "--", *argv]
    with log_.open("ab") as f:
        popen = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    return Proc(popen, cgroup=cg)


def turn(
    c: openai.OpenAI, messages: list[ChatCompletionMessageParam], answer: int, said: str
) -> Turn:
    """One streamed chat turn of `answer` tokens; `said` is appended to `messages` as the
    answer (the history grows by as many tokens as the answer had: see Conversations)."""
    t0 = time.perf_counter()
    first: float | None = None
    tokens = 0
    for chunk in c.chat.completions.create(
        model="chat", messages=messages, max_tokens=answer, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ):  # fmt: skip
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta.content and first is None:
                first = time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    messages.append({"role": "assistant", "content": said})
    return Turn(ttft_s=seconds if first is None else first, tokens=tokens, seconds=seconds)


class Conversations:
    """Multi-turn conversations, one after the other: each turn adds `words` new user words to
    the history; after `turns` turns a new conversation (new words, so the server's prompt
    cache keeps the old one's state and grows). The answer the history keeps is `answer`
    two-letter words, not the text streamed: a real model's answer re-tokenizes to its own
    tokens, the synthetic model's noise to several times as many (the smoke run's ~150-token
    turns), so with it each turn re-processed its history's answers; with the stand-in a
    turn's prompt work is its answer and its new words, as a real chat's."""

    def __init__(self, st: Setup, base: str) -> None:
        self.st, self.c = st, client(base, timeout=600.0)
        self.conv, self.n = 0, 0
        self.messages: list[ChatCompletionMessageParam] = []

    def next(self) -> Turn:
        if self.n >= self.st.turns:
            self.conv, self.n, self.messages = self.conv + 1, 0, []
        seed = self.conv * 1000 + self.n
        self.messages.append({"role": "user", "content": prompt(seed, self.st.words)})
        self.n += 1
        said = prompt(seed + 500, self.st.answer)
        return turn(self.c, self.messages, self.st.answer, said)


class CpuUse:
    """CPU seconds of the chat, the job and the hog (by their processes' comm), the governor's
    supervisors (`governor launch`) and the guest's idle time, over a window. Sampled every
    turn: a process that exits in the window keeps what it had used at its last sample."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self.idle: list[float] = []
        self.sample()
        self.first = {pid: cpu for pid, (_, cpu) in self.last.items()}

    def sample(self) -> None:
        names = {CHAT_COMM: "chat", JOB_COMM: "job", HOG_COMM: "hog"}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                who = names.get(comm)
                if who is None and comm.startswith("python"):
                    argv = (d / "cmdline").read_bytes().split(b"\0")
                    who = "governor" if b"governor" in argv and b"launch" in argv else None
            except (OSError, ValueError):
                continue
            if who is not None:
                f = stat[stat.rindex(")") + 2 :].split()
                self.last[int(d.name)] = (who, (int(f[11]) + int(f[12])) / self.tick)
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()
        self.idle.append((int(cpu[4]) + int(cpu[5])) / self.tick)  # idle + iowait

    def seconds(self) -> dict[str, float]:
        out = dict.fromkeys(CPU_USERS, 0.0)
        for pid, (who, cpu) in self.last.items():
            out[who] += cpu - self.first.get(pid, 0.0)
        out["idle"] = self.idle[-1] - self.idle[0]
        return {k: round(v, 2) for k, v in out.items()}


def refaults(p: Proc) -> int | None:
    if p.cgroup is None:
        p.sample()
    if p.cgroup is None:
        return None
    return read_kv(p.cgroup / "memory.stat").get("workingset_refault_file")


def job_argvs(st: Setup) -> tuple[list[str], list[str]]:
    # 4 two-letter words, 4 tokens of the synthetic vocab ("Once upon a time" is 13 of them:
    # ~40 s of prompt under TCG before the job's first token)
    job = [*st.job_argv, "-p", prompt(7, 4), "-n", str(st.job_tokens), "--ignore-eos",
           "-no-cnv"]  # fmt: skip
    hog = [sys.executable, "-u", str(HELPERS / "hog.py"), "--mib", str(st.hog_mib),
           "--step-mib", "16", "--interval", "0.25", "--hold", "10", "--comm", HOG_COMM]  # fmt: skip
    return job, hog


def once(st: Setup, swap: str, arm: str, rnd: int, seq: int) -> RealRun:
    """One run: the chat server up (warm-up turn not measured), then the job and the hog start
    (not in "solo") and the chat's turns for st.chat_s seconds are measured."""
    tag = f"{swap}-{seq}-{arm}"
    run = RealRun(swap=swap, arm=arm, round=rnd, seq=seq)
    t_start = last = time.monotonic()

    def mark(phase: str) -> None:  # the phase that ends now (PHASES)
        nonlocal last
        now = time.monotonic()
        run.phases[phase] = round(now - last, 1)
        last = now

    for m in (st.chat_model, st.job_model):
        drop_model(m)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    chat_argv = [*st.chat_argv, "--port", str(port)]
    env = {**os.environ, "GOVERNOR_RUN_DIR": str(st.tmp / f"run-{tag}"),
           "GOVERNOR_BOARD": str(st.tmp / "board.toml")}  # fmt: skip
    Path(env["GOVERNOR_RUN_DIR"]).mkdir(mode=0o755)
    logs = {"chat": st.tmp / f"chat-{tag}.log", "job": st.tmp / f"job-{tag}.log"}
    hog_log = st.tmp / f"hog-{tag}.log"
    extra: list[subprocess.Popen[bytes]] = []
    assert st.chat_policy is not None and st.job_policy is not None
    cmem = tomllib.loads(st.chat_policy.read_text())["memory"]
    jmem = tomllib.loads(st.job_policy.read_text())["memory"]
    limited = arm in ("oomd", "earlyoom")
    if arm == "earlyoom":
        eo_log = st.tmp / f"earlyoom-{tag}.log"
        with eo_log.open("wb") as f:
            extra.append(subprocess.Popen(
                ["earlyoom", "-r", "0", "--prefer", f"^({HOG_COMM}|{JOB_COMM})$", "--avoid",
                 f"^{CHAT_COMM}$"], stdout=f, stderr=subprocess.STDOUT))  # fmt: skip
    if arm == "governor":
        chat = start_governed(st.chat_policy, chat_argv, logs["chat"], env)
    else:
        chat = start_scope(f"qosreal-chat-{tag}.scope", "qosreal_chat.slice", chat_argv,
                           logs["chat"], scope_limits(cmem) if limited else [])  # fmt: skip
    bg_slice = "qosreal_bg_oomd.slice" if arm == "oomd" else "qosreal_bg.slice"
    # oomd: the hog beside the job in the slice oomd watches; else in the board file's slice
    hog_slice = bg_slice if arm == "oomd" else HOG_SLICE
    job: Proc | None = None
    hog: Proc | None = None
    k0 = kmsg_now()
    since = time.time()
    job_t0 = 0.0
    try:
        up_by = time.monotonic() + 300
        while health(base) != 200:
            if chat.popen.poll() is not None or time.monotonic() > up_by:
                raise AssertionError(f"the chat never answered /health ({logs['chat']})")
            time.sleep(0.2)
        mark("up")
        conv = Conversations(st, base)
        conv.next()  # warm-up: the model's pages in, not measured
        mark("warm")
        if arm != "solo":
            job_cmd, hog_cmd = job_argvs(st)
            job_t0 = time.monotonic()
            if arm == "governor":
                job = start_governed(st.job_policy, job_cmd, logs["job"], env)
            else:
                job = start_scope(f"qosreal-job-{tag}.scope", bg_slice, job_cmd, logs["job"],
                                  scope_limits(jmem) if limited else [])  # fmt: skip
            if arm != FLOOR_ARM:  # the floor: the job's CPU beside the chat, no memory question
                hog = start_scope(f"qosreal-hog-{tag}.scope", hog_slice, hog_cmd, hog_log, [])
        r0 = refaults(chat)
        chat.sample()
        use = CpuUse()
        turns: list[Turn] = []
        end = time.monotonic() + st.chat_s
        while time.monotonic() < end and chat.popen.poll() is None:
            try:
                turns.append(conv.next())
            except (openai.OpenAIError, OSError) as err:
                run.error = f"chat turn {len(turns)}: {type(err).__name__}: {err}"[:300]
                break
            for p in (chat, job, hog):
                if p is not None:
                    p.sample()
            use.sample()
        use.sample()
        run.cpu_s = use.seconds()
        r1 = refaults(chat)
        if len(chat.full_us) >= 2:
            run.full_s = round((chat.full_us[-1][1] - chat.full_us[0][1]) / 1e6, 2)
        run.refault_file = r1 - r0 if r0 is not None and r1 is not None else None
        run.turns, run.tps = len(turns), decode_tps(turns)
        run.ttfts = [round(t.ttft_s, 4) for t in turns]
        mark("window")
        if job is not None:
            by = time.monotonic() + st.job_wait_s
            while job.popen.poll() is None and time.monotonic() < by:
                time.sleep(0.5)
            run.job_rc = job.popen.poll()
            if run.job_rc == 0:
                run.job_s = round(time.monotonic() - job_t0, 2)
            mark("job_wait")
    except (AssertionError, OSError, openai.OpenAIError) as err:
        run.error = f"{type(err).__name__}: {err}"[:300]
        tail = logs["chat"].read_text(errors="replace")[-1500:] if logs["chat"].exists() else ""
        log(f"{arm}: {run.error}; the chat's log ends:\n{tail}")
    finally:
        for p in (chat, job, hog):
            if p is not None and p.popen.poll() is None:
                p.popen.terminate()
                try:
                    p.popen.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait()
        for e in extra:
            e.terminate()
            e.wait()
    run.chat_rc = chat.popen.returncode
    run.hog_rc = None if hog is None else hog.popen.returncode
    kmsg = "\n".join(sh("dmesg").splitlines()[k0:])
    run.kills += [f"kernel OOM: {v}" for v in oom_victims(kmsg)]
    if arm == "earlyoom":
        run.kills += earlyoom_kills(eo_log.read_text())
    if arm == "oomd":
        j = sh("journalctl", "-u", "systemd-oomd.service", "--no-pager", "-o", "cat",
               f"--since=@{since:.0f}")  # fmt: skip
        run.kills += [f"oomd: {ln[:80]}" for ln in j.splitlines() if "Killed" in ln]
    for who, path in logs.items():
        # the victim named: whether a shed held the hog (the board file's) before the job
        run.actions += governor_actions(path, who, victims=True) if arm == "governor" else []
        if arm == "governor":
            run.kills += [a for a in governor_actions(path, who) if a.endswith(": kill")]
    mark("teardown")
    run.wall_s = round(time.monotonic() - t_start, 1)
    log(f"{swap} {arm} r{rnd} #{seq} ({run.wall_s} s): {run.turns} turns {run.tps:.2f} tok/s, ttft "
        f"{sorted(run.ttfts)[len(run.ttfts) // 2] if run.ttfts else '-'}s, job rc {run.job_rc} "
        f"{run.job_s}s, hog rc {run.hog_rc}, refault {run.refault_file}, full {run.full_s}s, kills {run.kills}, "
        f"actions {run.actions}, error {run.error}, phases {run.phases}, cpu {run.cpu_s}")  # fmt: skip
    return run


def rounds(st: Setup, swap: str, arms: Sequence[str], n: int) -> Iterator[RealRun]:
    """`n` rounds of a solo run and every arm (the order reversed every other round), and a
    closing solo run: each arm's ratio is to the solo runs around it."""
    from perf.oomd import Oomd

    seq = 0
    for r in range(n):
        for arm in ["solo", *(arms if r % 2 == 0 else reversed(arms))]:
            if arm == "oomd":
                with Oomd(["qosreal_bg_oomd.slice"], st.oomd_limit, st.oomd_duration):
                    yield once(st, swap, arm, r, seq)
            else:
                yield once(st, swap, arm, r, seq)
            seq += 1
    yield once(st, swap, "solo", n, seq)


def stage_models(disk: Path, models: Sequence[Path]) -> list[Path]:
    """The models copied onto the ext4 loop mount: real, evictable page cache charged to the
    reader (the guests' 9p root bypasses the page cache for read())."""
    out = []
    for m in models:
        dst = disk / m.resolve().name
        if not dst.exists():
            shutil.copyfile(m, dst)
        out.append(dst)
    return out
