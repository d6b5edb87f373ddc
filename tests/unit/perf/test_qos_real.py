"""perf/qos --engine real (issue 48): its command line (perf/qos_real.py), the aggregation and
the writers (perf/qos_report.py: the ratio to the solo runs around a run, the median and the
WORST round, TTFT p50/p95, the CSV and JSON schema, the PNG plots) and the parsing of what
`governor init` printed and of the policy sizes systemd takes (perf/qos_real_guest.py). The
benchmark itself runs in the systemd guest, not in CI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import perf.qos_real_guest as guest
from governor.board.file import read_board
from perf._helpers.server import prompt
from perf.qos_guest import governor_actions
from perf.qos_real import META_TAG, RUN_TAG, collect, finish, parse
from perf.qos_real_guest import Conversations, Setup, init_said, scope_limits, systemd_bytes
from perf.qos_report import (
    CPU_USERS,
    CSV_FIELDS,
    PHASES,
    RealRun,
    Turn,
    assign_ratios,
    cost,
    cost_lines,
    decode_tps,
    percentile,
    plot,
    projected_s,
    runs_from_json,
    summarise,
    table,
    write_csv,
    write_json,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_full_benchmark_is_the_default_and_a_smoke_run_is_its_subset() -> None:
    a = parse([])
    assert (a.swap, a.arms, a.rounds) == (
        ["none", "zram", "zswap"], ["bare", "earlyoom", "oomd", "governor"], 3,
    )  # fmt: skip
    a = parse(["--swap", "none", "--arms", "bare,governor", "--rounds", "1", "--guest"])
    assert (a.swap, a.arms, a.rounds, a.guest) == (["none"], ["bare", "governor"], 1, True)


@pytest.mark.parametrize(
    "argv",
    [["--swap", "none,zfs"], ["--arms", "bare,gov"], ["--rounds", "0"], ["--swap", ","]],
)
def test_an_unknown_swap_setup_or_arm_or_no_round_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as err:
        parse(argv)
    assert err.value.code == 2
    assert "argument --" in capsys.readouterr().err


def test_percentile_interpolates_between_the_closest_ranks() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 95) == pytest.approx(3.85)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None


def test_decode_speed_counts_the_tokens_after_the_first_over_the_time_after_it() -> None:
    turns = [Turn(ttft_s=1.0, tokens=11, seconds=3.0), Turn(ttft_s=0.5, tokens=6, seconds=5.5)]
    assert decode_tps(turns) == pytest.approx((10 + 5) / (2.0 + 5.0))
    assert decode_tps([]) == 0.0


def _runs() -> list[RealRun]:
    """One swap setup, three rounds: solo speeds 10, 10, 8, 8 around bare and governor runs."""
    r = [
        RealRun("none", "solo", 0, 0, tps=10.0, ttfts=[0.5, 0.6]),
        RealRun(
            "none",
            "bare",
            0,
            1,
            tps=5.0,
            ttfts=[3.0, 9.0],
            kills=["kernel OOM: qos-hog"],
            wall_s=312.5,
        ),
        RealRun("none", "governor", 0, 2, tps=9.8, ttfts=[0.6, 0.7], job_s=40.0),
        RealRun("none", "solo", 1, 3, tps=10.0, ttfts=[0.5]),
        RealRun("none", "governor", 1, 4, tps=9.0, ttfts=[0.8], job_s=50.0, refault_file=10),
        RealRun("none", "bare", 1, 5, tps=9.0, ttfts=[1.0], refault_file=400),
        RealRun("none", "solo", 2, 6, tps=8.0, ttfts=[0.5]),
        RealRun("none", "bare", 2, 7, tps=8.0, ttfts=[1.0], refault_file=800),
        RealRun("none", "governor", 2, 8, tps=7.6, ttfts=[0.9], job_s=45.0, refault_file=30),
        RealRun("none", "solo", 3, 9, tps=8.0, ttfts=[0.5]),
    ]
    assign_ratios(r)
    return r


def test_each_arm_is_divided_by_the_solo_runs_around_it_and_its_worst_round_is_kept() -> None:
    runs = _runs()
    by = {(r.arm, r.seq): r.ratio for r in runs}
    assert by[("bare", 1)] == pytest.approx(0.5)  # solos #0 and #3: 10
    assert by[("governor", 4)] == pytest.approx(9.0 / 9.0)  # solos #3 (10) and #6 (8)
    assert by[("solo", 0)] is None
    rows = {r.arm: r for r in summarise(runs)}
    bare, gov = rows["bare"], rows["governor"]
    assert bare.ratio_median == pytest.approx(1.0) and bare.ratio_worst == pytest.approx(0.5)
    assert bare.low_rounds == 1 and bare.oom_kills == 1 and bare.kills == "kernel OOM: qos-hog"
    assert gov.ratio_worst == pytest.approx(0.95) and gov.low_rounds == 0
    assert gov.ttft_p50 == pytest.approx(0.75) and gov.job_done == 3
    assert gov.job_s_median == 45.0 and gov.refault_median == 20
    assert bare.ttft_p95 == pytest.approx(percentile([3.0, 9.0, 1.0, 1.0], 95))
    assert bare.job_done == 0 and bare.job_s_median is None
    assert [r.arm for r in summarise(runs)] == ["solo", "bare", "governor"]
    assert "| none | bare | 3 | 1.00 | 0.50 |" in table(summarise(runs))


def test_solo_runs_of_another_swap_setup_are_not_a_baseline() -> None:
    runs = [RealRun("zram", "solo", 0, 0, tps=10.0), RealRun("zswap", "bare", 0, 1, tps=5.0)]
    assign_ratios(runs)
    assert runs[1].ratio is None


def test_the_csv_has_a_row_a_run_under_the_documented_header(tmp_path: Path) -> None:
    runs = _runs()
    write_csv(runs, tmp_path / "runs.csv")
    with (tmp_path / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_FIELDS and len(rows) == len(runs)
    bare = rows[1]
    assert (bare["arm"], bare["ratio"], bare["oom_kills"]) == ("bare", "0.5", "1")
    assert float(bare["ttft_p95"]) == pytest.approx(percentile([3.0, 9.0], 95))
    assert bare["job_s"] == "" and rows[2]["job_s"] == "40.0"
    assert bare["wall_s"] == "312.5" and rows[2]["wall_s"] == ""


def test_the_json_holds_meta_runs_and_summary_and_its_runs_read_back(tmp_path: Path) -> None:
    runs = _runs()
    write_json(runs, {"commit": "abc1234"}, tmp_path / "qos.json")
    body = json.loads((tmp_path / "qos.json").read_text())
    assert set(body) == {"meta", "runs", "summary"} and body["meta"]["commit"] == "abc1234"
    assert runs_from_json(body["runs"]) == runs
    gov = next(s for s in body["summary"] if s["arm"] == "governor")
    assert gov["ratio_worst"] == pytest.approx(0.95)


def test_the_host_collects_the_runs_the_guest_printed_among_its_log_lines() -> None:
    run = RealRun("none", "bare", 0, 1, tps=4.0, ttfts=[1.0])
    lines = [
        "bench: swap setup none: no swap",
        META_TAG + json.dumps({"kernel": "6.1.0"}),
        RUN_TAG + json.dumps(run.__dict__),
        RUN_TAG + json.dumps(run.__dict__)[:20],  # the guest's end cut it short
        "[qemu] noise",
    ]
    runs, meta = collect(lines)
    assert runs == [run] and meta == {"kernel": "6.1.0"}


def test_the_plots_are_pngs_of_every_swap_setup_and_arm(tmp_path: Path) -> None:
    runs = [*_runs(), RealRun("zram", "solo", 0, 0, tps=9.0), RealRun("zram", "bare", 0, 1, tps=3)]
    assign_ratios(runs)
    paths = plot(summarise(runs), tmp_path)
    assert [p.name for p in paths] == ["qos-ratio.png", "qos-ttft.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000


def test_finish_writes_the_csv_json_and_plots_and_returns_the_table(tmp_path: Path) -> None:
    runs = [RealRun(**{**r.__dict__, "ratio": None}) for r in _runs()]
    text = finish(runs, {"commit": "x"}, tmp_path / "out", with_plot=True)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["qos-ratio.png", "qos-ttft.png", "qos.json", "runs.csv"]
    assert "| none | governor | 3 | 0.98 | 0.95 |" in text


def test_inits_command_line_is_read_from_its_next_line() -> None:
    out = (
        "wrote /tmp/chat.toml: -c 4096, memory.min 14 MiB, high 550 MiB, max 582 MiB\n"
        "next: governor check /tmp/chat.toml --engine-argv '/e/bin/llama-server -m /m/kv.gguf"
        " -c 4096 --cache-ram 384 --context-shift -t 2'\n"
    )
    argv, said = init_said(out)
    assert argv == ["/e/bin/llama-server", "-m", "/m/kv.gguf", "-c", "4096", "--cache-ram",
                    "384", "--context-shift", "-t", "2"]  # fmt: skip
    assert said.startswith("wrote /tmp/chat.toml: -c 4096")
    with pytest.raises(SystemExit, match="no engine command line"):
        init_said("wrote x\n")


def test_the_policys_memory_limits_become_systemd_scope_properties() -> None:
    assert systemd_bytes("14MiB") == str(14 << 20)
    assert systemd_bytes("2G") == str(2 << 30)
    assert systemd_bytes("0") == "0" and systemd_bytes("max") == "infinity"
    props = scope_limits({"min": "14MiB", "high": "550MiB", "max": "582MiB", "swap_max": "0",
                          "oom_group": True})  # fmt: skip
    assert props == [
        f"--property=MemoryMin={14 << 20}", f"--property=MemoryHigh={550 << 20}",
        f"--property=MemoryMax={582 << 20}", "--property=MemorySwapMax=0",
    ]  # fmt: skip
    with pytest.raises(SystemExit, match="size"):
        systemd_bytes("14 pages")


def test_a_job_that_did_not_finish_shows_its_exit_and_a_one_turn_round_shows() -> None:
    """The smoke run's governor round: the chat's shed stopped the job (exit 143), no OOM kill;
    each run measured one turn only (its ratio is that turn's)."""
    runs = [
        RealRun("none", "solo", 0, 0, tps=0.29, turns=1),
        RealRun("none", "bare", 0, 1, tps=0.1, turns=1, job_rc=0, job_s=392.6),
        RealRun("none", "governor", 0, 2, tps=0.57, turns=1, job_rc=143),
        RealRun("none", "governor", 1, 4, tps=0.6, turns=3),  # the job still ran at the end
        RealRun("none", "solo", 1, 3, tps=0.77, turns=2),
    ]
    assign_ratios(runs)
    rows = {r.arm: r for r in summarise(runs)}
    assert rows["governor"].job_exits == "-,143" and rows["governor"].job_done == 0
    assert rows["bare"].job_exits == "" and rows["governor"].turns_fewest == 1
    assert rows["solo"].turns_fewest == 1
    lines = table(summarise(runs)).splitlines()
    assert "| 0 | 0/2 (-,143) | - | - | 1 |" in lines[4]
    assert lines[3].endswith("| 0 | 1/1 | 392.6 | - | 1 |")
    assert lines[2].endswith("| 0 | - | - | - | 1 |")  # solo: no job


def _timed(arm: str, seq: int, wall: float, window: float) -> RealRun:
    phases = {"up": 5.0, "warm": 10.0, "window": window, "job_wait": 0.0, "teardown": 2.0}
    return RealRun("none", arm, 0, seq, tps=1.0, wall_s=wall, phases=phases)


def test_the_phases_give_a_runs_cost_and_the_full_matrixs_projected_time(tmp_path: Path) -> None:
    runs = [
        _timed("solo", 0, 80.0, 63.0),
        _timed("bare", 1, 100.0, 70.0),
        _timed("governor", 2, 120.0, 66.0),
        _timed("solo", 3, 90.0, 61.0),
        RealRun("none", "bare", 0, 4),
    ]  # fmt: skip  (an untimed run: an old file's)
    c = cost(runs, [30.0, 50.0])
    assert c is not None and (c.solo_s, c.arm_s, c.setup_s) == (85.0, 110.0, 40.0)
    assert c.phases["solo"]["window"] == 62.0 and c.phases["governor"]["up"] == 5.0
    assert list(c.phases) == ["solo", "bare", "governor"]
    # 3 swap setups, each: its setup, 4 solo runs and 3 rounds x 4 arms
    assert projected_s(c, 3, 4, 3) == 3 * (40.0 + 4 * 85.0 + 12 * 110.0)
    assert projected_s(c, 1, 4, 1, boot_s=60.0) == 60.0 + 40.0 + 2 * 85.0 + 4 * 110.0
    text = cost_lines(c, (3, 4, 3))
    assert "| solo | 5.0 | 10.0 | 62.0 | 0.0 | 2.0 |" in text.splitlines()
    assert text.endswith(f"rounds: {3 * (40 + 340 + 1320) / 3600:.2f} h (one boot, without it)")
    assert cost([RealRun("none", "bare", 0, 1)], []) is None
    write_csv(runs, tmp_path / "runs.csv")
    with (tmp_path / "runs.csv").open() as f:
        row = next(csv.DictReader(f))
    assert [row[f"{p}_s"] for p in PHASES] == ["5.0", "10.0", "63.0", "0.0", "2.0"]


def test_finish_prints_the_cost_of_the_runs_it_was_given(tmp_path: Path) -> None:
    runs = [_timed("solo", 0, 80.0, 63.0), _timed("bare", 1, 100.0, 70.0)]
    text = finish(runs, {"setup_s": {"none": 20.0}}, tmp_path, with_plot=False)
    assert "a solo run 80 s, an arm run 100 s, a swap setup 20 s" in text


class _Chunk:
    def __init__(self, content: str | None, tokens: int | None) -> None:
        delta = type("Delta", (), {"content": content})()
        self.choices = [] if content is None else [type("Choice", (), {"delta": delta})()]
        self.usage = None if tokens is None else type("Usage", (), {"completion_tokens": tokens})()


class _Client:
    """Stands in for openai.OpenAI: streams `answer` chunks of noise text, records the
    messages each request carried."""

    def __init__(self) -> None:
        self.sent: list[list[dict[str, str]]] = []
        self.chat = self
        self.completions = self

    def create(self, **kw: object) -> list[_Chunk]:
        messages = kw["messages"]
        assert isinstance(messages, list) and isinstance(kw["max_tokens"], int)
        self.sent.append([dict(m) for m in messages])
        n = kw["max_tokens"]
        return [*(_Chunk("\u2581q\u2581z", None) for _ in range(n)), _Chunk(None, n)]


def _setup(tmp: Path, **kw: object) -> Setup:
    base: dict[str, object] = dict(
        tmp=tmp, chat_model=tmp / "c.gguf", job_model=tmp / "j.gguf", server=tmp / "s",
        completion=tmp / "j", cache_ram=384, job_ctx=512, job_tokens=4, hog_mib=100,
        chat_s=60.0, words=8, answer=6, turns=2, oomd_limit="15%", oomd_duration="1s",
    )  # fmt: skip
    return Setup(**{**base, **kw})  # type: ignore[arg-type]


def test_the_history_keeps_an_answer_of_answer_words_not_the_streamed_noise(
    tmp_path: Path,
) -> None:
    """A turn's prompt work is its new words and the answer before it: the history keeps
    `answer` two-letter words (one token each) for the answer; after `turns` turns a new
    conversation of new words."""
    conv = Conversations(_setup(tmp_path), "http://127.0.0.1:9")
    fake = _Client()
    conv.c = fake  # type: ignore[assignment]
    turns = [conv.next() for _ in range(3)]
    assert [t.tokens for t in turns] == [6, 6, 6]
    first, second, third = fake.sent
    assert first == [{"role": "user", "content": prompt(0, 8)}]
    said = second[1]["content"]
    assert second[1]["role"] == "assistant" and said == prompt(500, 6)
    assert len(said.split()) == 6 and "\u2581" not in said
    assert second[2] == {"role": "user", "content": prompt(1, 8)}
    assert third == [{"role": "user", "content": prompt(1000, 8)}]  # a new conversation


def test_the_engines_get_one_thread_and_the_plain_template_and_the_hog_is_on_the_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: dict[str, str] = {}

    def fake_init(model: Path, engine_argv: str, name: str, out: Path) -> tuple[list[str], str]:
        asked[name] = engine_argv
        return engine_argv.split(), f"wrote {out}"

    monkeypatch.setattr(guest, "init_policy", fake_init)
    st = _setup(tmp_path)
    guest.policies(st)
    chat, job = asked["chat"].split(), asked["job"].split()
    assert chat[chat.index("-t") + 1] == "1" and job[job.index("-t") + 1] == "1"
    assert "--jinja" in chat and "--chat-template" not in chat
    template = Path(chat[chat.index("--chat-template-file") + 1])
    assert template.read_text() == guest.CHAT_TEMPLATE and "im_start" not in guest.CHAT_TEMPLATE
    board = read_board(tmp_path / "board.toml")
    assert board.errors == ()
    (hog,) = board.entries
    assert (hog.path, hog.qos_class, hog.yields) == (guest.HOG_SLICE, "background",
                                                     ("throttle", "freeze"))  # fmt: skip


def test_the_job_generates_its_tokens_after_a_prompt_of_few_tokens(tmp_path: Path) -> None:
    st = _setup(tmp_path, job_tokens=4)
    st.job_argv = ["/e/llama-completion", "-m", "/m/small.gguf", "-c", "512", "-t", "1"]
    job, hog = guest.job_argvs(st)
    assert job[:7] == st.job_argv and job[job.index("-n") + 1] == "4"
    words = job[job.index("-p") + 1].split()
    assert len(words) == 4 and all(len(w) == 2 for w in words)  # a token each
    assert hog[hog.index("--mib") + 1] == "100"


def test_the_governor_arms_shed_steps_name_their_victim(tmp_path: Path) -> None:
    """The smoke's and the partial run's actions were counted by step only: whether the hog
    was held before the job was stopped could not be read from them."""
    lines = [
        {"event": "shed.step", "by": "chat", "victim": "hog", "step": "throttle"},
        {"event": "shed.step", "by": "chat", "victim": "hog", "step": "freeze"},
        {"event": "shed.step", "by": "chat", "victim": "job", "step": "throttle"},
        {"event": "shed.step", "by": "chat", "victim": "job", "step": "stop"},
        {"event": "action.done", "action": "reclaim 64M"},
    ]
    log_ = tmp_path / "chat.log"
    log_.write_text("llama-server noise\n" + "".join(json.dumps(x) + "\n" for x in lines))
    assert governor_actions(log_, "chat", victims=True) == [
        "chat: shed throttle hog", "chat: shed freeze hog", "chat: shed throttle job",
        "chat: shed stop job", "chat: reclaim",
    ]  # fmt: skip
    assert governor_actions(log_, "chat") == [
        "chat: shed throttle", "chat: shed freeze", "chat: shed stop", "chat: reclaim",
    ]  # fmt: skip


def test_the_cpu_only_floor_is_taken_by_name_but_not_in_the_default_matrix() -> None:
    """The floor (the job beside the chat, no hog) says what the 2 vCPUs' sharing costs by
    itself; the report puts it after the arms it is the floor of."""
    assert "cpu-only" not in parse([]).arms
    assert parse(["--arms", "cpu-only,governor"]).arms == ["cpu-only", "governor"]
    runs = [
        RealRun("none", "solo", 0, 0, tps=10.0),
        RealRun("none", "cpu-only", 0, 1, tps=8.0, job_s=60.0),
        RealRun("none", "governor", 0, 2, tps=7.0, job_s=61.0),
        RealRun("none", "solo", 1, 3, tps=10.0),
    ]
    assign_ratios(runs)
    rows = summarise(runs)
    assert [r.arm for r in rows] == ["solo", "governor", "cpu-only"]
    assert rows[2].ratio_median == pytest.approx(0.8) and rows[2].low_rounds == 1
    assert "| none | cpu-only | 1 | 0.80 | 0.80 |" in table(rows)


def test_the_window_counts_the_cpu_of_each_workload_by_its_process_name() -> None:
    """A round below 0.95x says where the vCPUs went: the hog's seconds are its process's,
    found by its comm, and a process that exits keeps what it used at the last sample."""
    import subprocess
    import sys
    import time

    named = f"open('/proc/self/comm', 'w').write({guest.HOG_COMM!r}); print(flush=True)"
    busy = subprocess.Popen([sys.executable, "-c", f"{named}\nwhile True: pass"],
                            stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert busy.stdout is not None
        busy.stdout.readline()  # named
        use = guest.CpuUse()
        for _ in range(3000):  # until the kernel has charged it a few ticks (at most ~30 s)
            time.sleep(0.01)
            use.sample()
            if use.seconds()["hog"] >= 0.05:
                break
    finally:
        busy.kill()
        busy.wait()
    use.sample()  # gone: what it used stays
    got = use.seconds()
    assert set(got) == set(CPU_USERS)
    assert got["hog"] >= 0.05 and got["idle"] >= 0  # (other tests may run engines beside it)
