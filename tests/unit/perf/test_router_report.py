"""perf/router's rounds and files (perf/router_report.py, issue 48): its command line, the
summary over rounds (the median round beside the worst), the CSV and JSON, the PNG plots and the
host's side of --guest (the rounds the guest printed among its log lines, written here). The
benchmark itself runs in the kernel guest, not in CI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perf.router_common import MIB, Result, parse_arms
from perf.router_report import (
    CSV_FIELDS,
    META_TAG,
    RUN_TAG,
    collect,
    finish,
    from_json,
    in_guest,
    parser,
    plot,
    summarise,
    table,
    to_json,
    write_csv,
    write_json,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _r(arm: str, rnd: int, **kw: Any) -> Result:
    return Result(parse_arms(arm)[0], round=rnd, **kw)


def _runs() -> list[Result]:
    """Arms 1a and 3a over three rounds; 1a's round 1 is its bad one."""
    return [
        _r("1a", 0, latencies=[2.0, 4.0, 6.0], peak=600 * MIB, refault_file=256 * 100),
        _r("3a", 0, latencies=[1.0, 1.0, 3.0], peak=500 * MIB, refault_file=256 * 10, unloads=4,
           loads=[("a", 12.5)]),
        _r("3a", 1, latencies=[2.0, 2.0, 2.0], peak=520 * MIB, refault_file=256 * 30, unloads=6),
        _r("1a", 1, latencies=[9.0, 30.0], failed=1, oom_kills=2, peak=628 * MIB,
           refault_file=256 * 400, errors=["#2 c: APIError"]),
        _r("1a", 2, latencies=[3.0, 3.0], failed=1, peak=610 * MIB, refault_file=256 * 120),
        _r("3a", 2, latencies=[1.0, 2.0, 4.0], peak=None, refault_file=256 * 20, unloads=5),
    ]  # fmt: skip


def test_three_rounds_are_the_default_and_a_round_less_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = parser().parse_args([])
    assert (a.rounds, a.out.parts[-2:], a.no_plot, a.guest_timeout) == (
        3, ("out", "router"), False, None,
    )  # fmt: skip
    a = parser().parse_args(["--rounds", "1", "--arms", "1a,3a", "--out", "x", "--guest"])
    assert (a.rounds, a.arms, a.out, a.guest) == (1, "1a,3a", Path("x"), True)
    with pytest.raises(SystemExit) as err:
        parser().parse_args(["--rounds", "0"])
    assert err.value.code == 2 and "argument --rounds" in capsys.readouterr().err


def test_variant_cs_request_mix_is_given_as_model_letters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parser().parse_args([]).pattern is None  # the variant's own (abc)
    assert parser().parse_args(["--pattern", "aabcaabc"]).pattern == "aabcaabc"
    for bad in ("", "abd", "a b"):
        with pytest.raises(SystemExit) as err:
            parser().parse_args(["--pattern", bad])
        assert err.value.code == 2 and "argument --pattern" in capsys.readouterr().err


def test_each_arm_shows_its_median_round_beside_its_worst() -> None:
    rows = {r.arm: r for r in summarise(_runs())}
    assert list(rows) == ["1a", "3a"]  # the order the arms first ran
    assert [r.arm for r in summarise(_runs()[::-1])] == ["3a", "1a"]
    alone, gov = rows["1a"], rows["3a"]
    assert alone.rounds == 3 and alone.requests == 9 and alone.failed == 2
    assert (alone.failed_worst, alone.oom_kills, alone.oom_kills_worst) == (1, 2, 2)
    # the rounds' medians 4, 19.5, 3: median 4, worst 19.5; their max 6, 30, 3
    assert alone.latency_median_s == 4.0 and alone.latency_median_worst_s == 19.5
    assert alone.latency_max_s == 6.0 and alone.latency_max_worst_s == 30.0
    assert alone.reread_mib_median == 120.0 and alone.reread_mib_worst == 400.0
    assert alone.peak_mib_median == 610.0 and alone.peak_mib_worst == 628.0
    assert alone.unloads_median is None  # the router alone has no governor
    # a round without memory.peak is left out of the peak, not counted as 0
    assert gov.peak_mib_median == 510.0 and gov.peak_mib_worst == 520.0
    assert gov.unloads_median == 5 and gov.latency_median_worst_s == 2.0
    text = table(summarise(_runs()))
    assert ("| 1a: router alone, --models-max 2 | 3 | 2 of 9 (1) | 2 (2) | 610 / 628 | 120 / 400 |"
            " 4.0 / 19.5 | 6.0 / 30.0 | - |") in text.splitlines()  # fmt: skip


def test_a_round_reads_back_from_its_json_with_its_arm_and_tuples() -> None:
    for r in _runs():
        assert from_json(json.loads(json.dumps(to_json(r)))) == r
    assert to_json(_runs()[1])["arm"] == "3a"


def test_the_host_collects_the_rounds_the_guest_printed_among_its_log_lines() -> None:
    runs = _runs()
    lines = [
        "perf/router: kernel 6.1.0",
        META_TAG + json.dumps({"kernel": "6.1.0"}),
        *(RUN_TAG + json.dumps(to_json(r)) for r in runs[:2]),
        RUN_TAG + json.dumps(to_json(runs[2]))[:30],  # the guest's end cut it short
        RUN_TAG + json.dumps({**to_json(runs[2]), "arm": "9z"}),  # an arm this side lacks
        RUN_TAG + json.dumps({"round": 0}),  # no arm at all
        RUN_TAG + json.dumps({**to_json(runs[2]), "loads": 3}),  # not a list
        "[qemu] noise",
    ]
    got, meta = collect(lines)
    assert got == runs[:2] and meta == {"kernel": "6.1.0"}


def test_the_csv_has_a_row_a_round_under_the_documented_header(tmp_path: Path) -> None:
    write_csv(_runs(), tmp_path / "runs.csv")
    with (tmp_path / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_FIELDS and len(rows) == 6
    bad = rows[3]
    assert (bad["arm"], bad["variant"], bad["round"], bad["requests"]) == ("1a", "a", "1", "3")
    assert (bad["failed"], bad["oom_kills"], bad["reread_mib"]) == ("1", "2", "400.0")
    assert (bad["latency_median_s"], bad["latency_max_s"]) == ("19.5", "30.0")
    assert bad["unloads"] == "" and rows[1]["unloads"] == "4" and rows[5]["peak_mib"] == ""
    assert (rows[1]["loads"], rows[1]["reload_s"]) == ("1", "12.5")
    assert bad["errors"] == "#2 c: APIError"


def test_the_json_holds_meta_rounds_and_summary(tmp_path: Path) -> None:
    write_json(_runs(), {"commit": "abc1234"}, tmp_path / "router.json")
    body = json.loads((tmp_path / "router.json").read_text())
    assert set(body) == {"meta", "runs", "summary"} and body["meta"]["commit"] == "abc1234"
    assert [from_json(x) for x in body["runs"]] == _runs()
    assert body["summary"][0]["latency_median_worst_s"] == 19.5


def test_the_plots_are_pngs_of_every_arm(tmp_path: Path) -> None:
    paths = plot(summarise([*_runs(), _r("3c", 0, latencies=[0.5])]), tmp_path)
    assert [p.name for p in paths] == ["router-latency.png", "router-reread.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000


def test_finish_writes_the_csv_json_and_plots_and_returns_the_summary(tmp_path: Path) -> None:
    text = finish(_runs(), {"commit": "x"}, tmp_path / "out", with_plot=True)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["router-latency.png", "router-reread.png", "router.json", "runs.csv"]
    assert "| 3a: governor, evict = memory, --models-max 3 | 3 |" in text


def test_with_guest_the_host_writes_what_the_guests_output_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    printed = ["perf/router: kernel 6.1.0", META_TAG + json.dumps({"kernel": "6.1.0"}),
               *(RUN_TAG + json.dumps(to_json(r)) for r in _runs())]  # fmt: skip
    script = "import sys; sys.stdout.write(sys.argv[1])"
    real = subprocess.Popen
    seen: list[list[str]] = []

    def guest(cmd: list[str], **kw: Any) -> subprocess.Popen[str]:
        seen.append(cmd)  # the harness's command: what would boot the guest
        return real([sys.executable, "-c", script, "\n".join(printed) + "\n"], **kw)

    monkeypatch.setattr(subprocess, "Popen", guest)
    a = parser().parse_args(["--guest", "--rounds", "3", "--out", str(tmp_path), "--no-plot"])
    assert in_guest(["--rounds=3"], a) == 0
    (harness,) = [c for c in seen if "--" in c]  # (git tells the commit the run began at)
    assert harness[harness.index("--") + 1 :][-3:] == ["perf.router", "--rounds=3", "--no-plot"]
    out = capsys.readouterr().out
    assert "perf/router: kernel 6.1.0" in out and RUN_TAG not in out  # the records not echoed
    body = json.loads((tmp_path / "router.json").read_text())
    assert len(body["runs"]) == 6 and body["meta"]["kernel"] == "6.1.0"
    assert body["meta"]["command"] == "python -m perf.router --rounds=3"
    assert not (tmp_path / "router-latency.png").exists()  # --no-plot


def test_with_guest_a_failing_report_keeps_the_guests_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import perf.router_report as report

    printed = [META_TAG + json.dumps({"kernel": "6.1.0"}),
               *(RUN_TAG + json.dumps(to_json(r)) for r in _runs()), "perf/router: done"]  # fmt: skip
    script = "import sys; sys.stdout.write(sys.argv[1])"
    real = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, **kw: real(
        [sys.executable, "-c", script, "\n".join(printed) + "\n"], **kw))  # fmt: skip

    def broken(*_a: Any, **_k: Any) -> str:
        raise RuntimeError("no display")

    monkeypatch.setattr(report, "finish", broken)
    a = parser().parse_args(["--guest", "--out", str(tmp_path / "out")])
    assert in_guest([], a) == 1
    kept = (tmp_path / "out" / report.RAW_NAME).read_text().splitlines()
    assert kept == printed[:-1]  # the tagged lines, as printed, and only those
    assert collect(kept)[0] == _runs()  # the rounds read back from them
    assert "the report failed (RuntimeError: no display)" in capsys.readouterr().out


def test_finish_adds_variant_cs_table_when_a_round_of_it_ran(tmp_path: Path) -> None:
    c = _r("3c", 0, latencies=[0.5], loads=[("a", 20.0), ("b", 3.0)],
           reloaded_turns=[(1.5, 20, True), (4.0, 60, False)])  # fmt: skip
    text = finish([*_runs(), c], {}, tmp_path, with_plot=False)
    row = "| 3c: governor, evict = memory, --models-max 3 | 0 of 1 | 0 (0) | 0 | 1 / 1 / 0 | 23.0 |"
    assert row in text
    assert "1.5 (20 tok) x1 | 4.0 (60 tok) x1" in text
    assert "loads (a / b / c)" not in finish(_runs(), {}, tmp_path, with_plot=False)
