"""llama-server's router (governor/engines/router.py): the preset's precedence as the router
applies it (measured with the build of notes/engine.md: GET /models lists each model's child
argv), the models of a --models-dir, each model's estimate, how many fit together, and the
refusal of `check --engine-argv` for a --models-max under which the largest cannot fit."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from governor.engines.budget import estimate_router
from governor.engines.llama import EngineArgs, parse_llama_argv
from governor.engines.router import (
    PresetError,
    RouterEstimate,
    dir_models,
    fits_together,
    parse_preset,
    router_models,
)
from governor.plan.router import ROUTER_OWN_BYTES

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "tests" / "fixtures" / "hosts" / "cgroup2-full"
SERVER = "/opt/llama/bin/llama-server"

PRESET = """\
version = 1
; every model
[*]
c = 512
cache-ram = 16
LLAMA_ARG_N_PARALLEL = 3
load-on-startup = true

[tiny]
model = /m/tiny.gguf
c = 1024
np = 2
repack = false
port = 9999

[big]
m = /m/big.gguf
LLAMA_ARG_CACHE_RAM = 0
kv-unified = false
stop-timeout = 5

[remote]
hf-repo = someone/some-model
"""


def _models(
    argv: list[str], preset: str | None, cwd: Path = Path("/srv")
) -> tuple[dict[str, EngineArgs], list[str]]:
    args = parse_llama_argv([SERVER, *argv])
    assert args.router
    models, unsized = router_models(args, preset_text=preset, cwd=cwd)
    return {m.alias: parse_llama_argv(m.argv) for m in models}, unsized


# ------------------------------------------------------------------------------ the preset


def test_the_routers_command_line_beats_the_models_section_which_beats_the_global_one() -> None:
    got, unsized = _models(["--models-preset", "p.ini", "-c", "256", "--port", "8080"], PRESET)
    tiny, big = got["tiny"], got["big"]
    assert tiny.ctx == 256 and big.ctx == 256  # CLI over both
    assert tiny.parallel == 2 and big.parallel == 3  # np over [*]
    assert tiny.cache_ram == 16 and big.cache_ram == 0
    assert not tiny.repacks and big.repacks  # repack = false
    assert big.kv_unified is False
    assert tiny.model == "/m/tiny.gguf" and big.model == "/m/big.gguf"
    assert unsized == ["remote"]  # a Hugging Face repo: no file to read
    # the router owns the child's port, alias and model; preset-only keys are no options
    (tiny_argv,) = [
        m.argv
        for m in router_models(
            parse_llama_argv(
                [SERVER, "--models-preset", "p", "--port=8080", "--no-models-autoload"]
            ),
            preset_text=PRESET,
            cwd=Path("/"),
        )[0]
        if m.alias == "tiny"
    ]
    assert not [w for w in tiny_argv if w.startswith(("--port", "--models"))], tiny_argv
    assert "--no-models-autoload" not in tiny_argv
    assert "--load-on-startup" not in tiny_argv and "--version" not in tiny_argv
    assert tiny_argv[-4:] == ("--alias", "tiny", "--model", "/m/tiny.gguf")


def test_without_a_command_line_value_the_models_section_wins_over_the_global_one() -> None:
    got, _ = _models(["--models-preset", "p.ini"], PRESET)
    assert got["tiny"].ctx == 1024 and got["big"].ctx == 512


def test_a_preset_line_that_is_no_key_value_pair_is_refused_with_its_line() -> None:
    with pytest.raises(PresetError) as err:
        parse_preset("[a]\nc = 1\njust words\n")
    assert err.value.line == 3
    assert parse_preset("k = 1\n[x]\n# c\nc=2\nc = 3\n") == {"x": {"c": "3"}}


def test_a_models_directory_lists_files_by_stem_and_subdirectories_by_name(
    tmp_path: Path,
) -> None:
    for rel in (
        "a.gguf",
        "mmproj-x.gguf",
        "notes.txt",
        "mm/mmproj-F16.gguf",
        "mm/mm-Q8_0.gguf",
        "split/s-00002-of-00002.gguf",
        "split/s-00001-of-00002.gguf",
        "empty/readme",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    got = {k: v.relative_to(tmp_path).as_posix() for k, v in dir_models(tmp_path).items()}
    assert got == {
        "a": "a.gguf",
        "mm": "mm/mm-Q8_0.gguf",
        "split": "split/s-00001-of-00002.gguf",
    }


def test_a_preset_section_named_like_a_directory_model_sets_its_options(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"")
    got, _ = _models(["--models-dir", str(tmp_path), "-np", "1"], "[a]\nc = 2048\n")
    assert got["a"].ctx == 2048 and got["a"].parallel == 1
    assert got["a"].model == str(tmp_path / "a.gguf")


# ------------------------------------------------------------------------------ the arithmetic


@pytest.mark.parametrize(
    ("totals", "budget", "n"),
    [
        ([100, 300, 200], 600, 3),
        ([100, 300, 200], 599, 2),  # the largest first: 300 + 200 fit, + 100 does not
        ([100, 300, 200], 499, 1),
        ([100, 300, 200], 299, 0),  # the largest alone does not fit
        ([], 100, 0),
    ],
)
def test_how_many_fit_together_counts_the_largest_first(
    totals: list[int], budget: int, n: int
) -> None:
    assert fits_together(totals, budget) == n


# ------------------------------------------------------------------------------ real GGUFs


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from engine.make_gguf import main as make
    finally:
        sys.path.pop(0)
    d = tmp_path / "models"
    d.mkdir()
    for name, layers in (("one", 2), ("two", 4), ("four", 8)):
        make(["-o", str(d / f"{name}.gguf"), "--preset", "tiny", "--n-layer", str(layers),
              "--n-ctx-train", "4096"])  # fmt: skip
    return d


def test_each_model_is_estimated_as_its_child_runs_it(models_dir: Path) -> None:
    argv = [SERVER, "--models-dir", str(models_dir), "-c", "512", "--cache-ram", "0"]
    rest = estimate_router(parse_llama_argv(argv), root=ROOT, budget=None, cwd=models_dir)
    assert rest.models_max == 4 and rest.loadable == 3 and rest.together is None
    for model, est in rest.models:
        alone = parse_llama_argv([SERVER, "-c", "512", "--cache-ram", "0", "-m", est.model])
        from governor.engines.budget import estimate_argv

        assert est.total == estimate_argv(alone, root=ROOT, budget=None).total, model.alias
    totals = {m.alias: e.total for m, e in rest.models}
    assert totals["four"] > totals["two"] > totals["one"]
    # the router's own memory counts beside its models (issue 45 item 7: plan/router.py)
    assert rest.own == ROUTER_OWN_BYTES > 0
    assert rest.largest_bytes == ROUTER_OWN_BYTES + sum(totals.values())
    two = totals["four"] + totals["two"]  # the two largest fit, beside the router they do not
    assert dataclasses.replace(rest, budget=two + MIB, own=0).together == 2
    assert dataclasses.replace(rest, budget=two + MIB).together == 1


def _governor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from governor.cli.app import main

    code: int | str | None = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def _budget_for_two(models_dir: Path) -> tuple[RouterEstimate, int]:
    argv = [SERVER, "--models-dir", str(models_dir), "-c", "512", "--cache-ram", "0"]
    rest = estimate_router(parse_llama_argv(argv), root=ROOT, budget=None, cwd=models_dir)
    totals = sorted((e.total for _m, e in rest.models), reverse=True)
    # the two largest and the router's own memory fit, all three do not
    return rest, ROUTER_OWN_BYTES + totals[0] + totals[1] + MIB


def test_estimate_prints_a_row_per_model_and_how_many_fit_together(
    models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rest, budget = _budget_for_two(models_dir)
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "estimate", str(models_dir), "--budget", str(budget),
        "--engine-argv", "--models-max 3 -c 512 --cache-ram 0",
    )  # fmt: skip
    assert code == 1, err  # 3 may load, 2 fit
    rows = [line.split()[0] for line in out.splitlines() if "MiB" in line and ".gguf" in line]
    assert rows == ["four", "two", "one"]  # largest first
    assert "fit together in the budget, largest first: 2" in out
    assert "pass --models-max 2" in out
    assert "(--budget): does NOT fit" in out  # the budget says where it came from
    assert f"together, with the router's own {ROUTER_OWN_BYTES / MIB:.1f} MiB: " in out
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "estimate", str(models_dir), "--budget", str(budget),
        "--engine-argv", "llama-server --models-max 2 -c 512 --cache-ram 0",
    )  # fmt: skip
    assert code == 0, out + err


def test_estimate_recognises_the_router_from_its_command_line_alone(
    models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43 item 15: the argv of a service file is enough (it exited "Missing argument
    'MODEL'"), and gives the same table as the models directory given as MODEL."""
    argv = f"llama-server --models-dir {models_dir} --models-max 3 -c 512 --cache-ram 0"
    code, out, err = _governor(capsys, "--root", str(ROOT), "estimate", "--engine-argv", argv)
    assert code == 0, err
    assert out.startswith("llama-server router: 3 models, --models-max 3"), out
    rows = [line.split()[0] for line in out.splitlines() if "MiB" in line and ".gguf" in line]
    assert rows == ["four", "two", "one"]
    code, same, err = _governor(
        capsys, "--root", str(ROOT), "estimate", str(models_dir),
        "--engine-argv", "llama-server --models-max 3 -c 512 --cache-ram 0",
    )  # fmt: skip
    assert code == 0 and same == out, err
    # a plain engine's argv with its -m is enough too
    one = models_dir / "one.gguf"
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "estimate", "--engine-argv", f"llama-server -m {one} -c 512"
    )
    assert code == 0 and f"model {one}" in out, out + err


@pytest.mark.parametrize(
    ("model", "argv", "said"),
    [
        # a GGUF MODEL with a router's argv was estimated as that one model, silently
        ("one.gguf", "llama-server --models-dir {d} -c 512", "--models-dir {d} (a llama-server"),
        ("{d}", "llama-server --models-dir /elsewhere -c 512", "--models-dir /elsewhere"),
        ("one.gguf", "llama-server -m /m/x.gguf", "-m /m/x.gguf (its own model)"),
    ],
)
def test_estimate_refuses_a_model_that_contradicts_the_argvs_own_in_one_line(
    models_dir: Path, capsys: pytest.CaptureFixture[str], model: str, argv: str, said: str
) -> None:
    d = str(models_dir)
    model = model.format(d=d) if "{" in model else str(models_dir / model)
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "estimate", model, "--engine-argv", argv.format(d=d)
    )
    assert code == 2, out + err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: ") and "leave MODEL out" in lines[1]
    assert lines[0].startswith(f"governor: MODEL {model} and --engine-argv's"), err
    assert said.format(d=d) in lines[0] and "contradict each other" in lines[0]


def test_estimate_without_any_model_says_what_to_give(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _governor(capsys, "--root", str(ROOT), "estimate", "--engine-argv", "-c 512")
    assert code == 2 and out == "", err
    assert err.startswith("governor: no model to estimate: give MODEL") and "\nhint: " in err


def test_a_router_directory_beside_its_preset_is_no_contradiction(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text(f"[extra]\nmodel = {models_dir / 'one.gguf'}\n")
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "estimate", str(models_dir),
        "--engine-argv", f"llama-server --models-preset {preset} -c 512 --cache-ram 0",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("llama-server router: 4 models"), out


def test_estimate_and_check_name_odd_models_and_their_leaves(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43 item 10: names like llama.cpp's preset example and like an interface file are
    shown with their leaf; a name that maps to no leaf is warned about (its child would stay
    in the router's leaf); an [engine.models.X] the router never lists is warned about."""
    import json
    import shutil

    shutil.copy(models_dir / "one.gguf", models_dir / "memory.max.gguf")
    shutil.copy(models_dir / "one.gguf", models_dir / "a\nb.gguf")
    preset = tmp_path / "p.ini"
    preset.write_text(f"[org/tiny:Q8_0]\nmodel = {models_dir / 'one.gguf'}\n")
    argv = f"llama-server --models-dir {models_dir} --models-preset {preset} -c 512 --cache-ram 0"
    code, out, err = _governor(capsys, "--root", str(ROOT), "estimate", "--engine-argv", argv)
    assert code == 0, err
    assert "  leaf of org/tiny:Q8_0: models/org%2Ftiny:Q8_0\n" in out
    assert "  leaf of memory.max: models/_memory.max\n" in out
    assert "leaf of one" not in out  # the same name: nothing to say
    rows = [line.split()[0] for line in out.splitlines() if "MiB" in line and ".gguf" in line]
    assert "'a\\nb'" in rows and "org/tiny:Q8_0" in rows  # one line each, the newline shown
    assert (
        "  warning: router model 'a\\nb' has a control character ('\\n'): no leaf of its own" in out
    )
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "estimate", "--json", "--engine-argv", argv
    )
    leaves = {m["alias"]: m["leaf"] for m in json.loads(out)["models"]}
    assert leaves["org/tiny:Q8_0"] == "org%2Ftiny:Q8_0" and leaves["a\nb"] is None
    policy = tmp_path / "r.toml"
    policy.write_text(
        'name = "r"\n[memory]\nmax = "1G"\n[engine]\nkind = "llama.cpp"\n'
        '[engine.models."org/tiny:Q8_0"]\nmax = "100M"\n[engine.models.ghost]\nmax = "100M"\n'
    )
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy), "--engine-argv", argv
    )
    assert code == 0, err
    said = out + err
    assert "router model 'a\\nb' has a control character" in said
    assert "[engine.models.\"ghost\"] limits nothing: the router lists no model 'ghost'" in said
    assert "org/tiny:Q8_0" not in said.split("limits nothing")[0]  # listed: no warning


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ('evict = "memory"', 'engine.evict = "memory" unloads nothing: the engine is no'),
        ('[engine.models.one]\nmax = "100M"', "[engine.models] limits nothing: the engine is no"),
    ],
)
def test_check_warns_of_router_keys_on_an_engine_that_is_no_router(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], keys: str, said: str
) -> None:
    policy = tmp_path / "r.toml"
    policy.write_text(f'name = "r"\n[memory]\nmax = "1G"\n[engine]\nkind = "llama.cpp"\n{keys}\n')
    one = models_dir / "one.gguf"
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy),
        "--engine-argv", f"llama-server -m {one} -c 512 --cache-ram 0",
    )  # fmt: skip
    assert code == 0, err
    assert said in out + err
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy),
        "--engine-argv", f"llama-server --models-dir {models_dir} -c 512 --cache-ram 0",
    )  # fmt: skip
    assert code == 0, err
    assert "nothing: the engine is no" not in out + err  # a router: the keys act


def test_check_refuses_a_models_max_whose_largest_models_cannot_fit_unless_evict_is_memory(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rest, budget = _budget_for_two(models_dir)
    policy = tmp_path / "router.toml"
    text = f'name = "router"\n[memory]\nmax = {budget}\n[engine]\nkind = "llama.cpp"\n'
    policy.write_text(text)
    engine = f"{SERVER} --models-dir {models_dir} -c 512 --cache-ram 0"
    for models_max, said in (("", "--models-max 4 (llama-server's default)"), ("3", "")):
        argv = f"{engine} --models-max {models_max}" if models_max else engine
        code, _out, err = _governor(
            capsys, "--root", str(ROOT), "check", str(policy), "--engine-argv", argv
        )
        assert code == 65, err
        first, hint = err.splitlines()[:2]
        assert first.startswith("governor: --models-max ") and said in first
        assert "2 fit together (engine argv, --models-max)" in first
        assert "pass --models-max 2" in hint
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy), "--engine-argv",
        f"{engine} --models-max 2",
    )  # fmt: skip
    assert code == 0, err
    policy.write_text(text + 'evict = "memory"\n')
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy), "--engine-argv", engine
    )
    assert code == 0, err
    assert "engine.evict = memory" in out + err


def test_check_of_a_router_whose_largest_model_fits_nothing_says_so(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "router.toml"
    policy.write_text('name = "router"\n[memory]\nmax = "8M"\n[engine]\nkind = "llama.cpp"\n')
    code, _out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy), "--engine-argv",
        f"{SERVER} --models-dir {models_dir} -c 512 --cache-ram 0 --models-max 1",
    )  # fmt: skip
    assert code == 65
    assert "0 fit together" in err and "no model fits alone (the largest, four," in err


# ------------------------------------------------------------------------------ the policy


def test_router_model_tables_compile_into_the_plan_in_bytes() -> None:
    from governor.compile.compiler import compile_plan
    from governor.plan.host import probe
    from governor.plan.model import Plan, RouterModelSpec
    from governor.policy.loader import load_text

    policy = load_text(
        'name = "r"\n[memory]\nmax = "1G"\n[engine]\nkind = "llama.cpp"\nevict = "memory"\n'
        '[engine.models.small]\nmax = "300M"\nhigh = "250M"\noom_group = true\n'
        '[engine.models."a.b"]\nmax = "10%"\n'
        '[engine.models."org/tiny:Q8_0"]\nmax = "200M"\n'  # llama.cpp's preset names
    )
    host = probe(ROOT, target="governor.slice/r")
    plan = compile_plan(policy, host)
    assert plan.engine.evict == "memory"
    assert plan.engine.models == (
        RouterModelSpec(alias="a.b", max=host.mem_total // 10),
        RouterModelSpec(alias="org/tiny:Q8_0", max=200 * MIB),
        RouterModelSpec(alias="small", max=300 * MIB, high=250 * MIB, oom_group=True),
    )
    assert Plan.from_json(plan.to_json()) == plan  # the run time reads them back


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('evict = "lru"', "evict"),
        ('[engine.models.x]\nhigh = "2G"\nmax = "1G"', "high (2GiB) is above max (1GiB)"),
        ('[engine.models.".."]\nmax = "1G"', "no cgroup leaf can be made for it"),
        ('[engine.models."a\\nb"]\nmax = "1G"', "has a control character"),
        ('[engine.models."a\\u007fb"]\nmax = "1G"', "has a control character"),
        ('[engine.models.x]\nmin = "1G"', "min"),
    ],
)
def test_bad_router_keys_are_refused(table: str, said: str) -> None:
    from governor.errors import PolicyError
    from governor.policy.loader import load_text

    with pytest.raises(PolicyError) as err:
        load_text(f'name = "r"\n[engine]\nkind = "llama.cpp"\n{table}\n')
    assert said in str(err.value)


def test_check_refuses_a_model_name_with_a_newline_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43 item 9: the policy accepted [engine.models."a\\nb"], whose leaf the kernel
    refuses (cgroup_mkdir: EINVAL) at the child's start."""
    policy = tmp_path / "r.toml"
    policy.write_text(
        'name = "r"\n[engine]\nkind = "llama.cpp"\n[engine.models."a\\nb"]\nmax = "1G"\n'
    )
    code, out, err = _governor(capsys, "--root", str(ROOT), "check", str(policy))
    assert code == 65, (out, err)
    lines = err.strip().splitlines()
    assert lines[0].startswith("governor: ") and "control character" in lines[0], err
    assert "engine.models" in lines[0] and lines[1].startswith("hint:"), err
    assert len(lines) == 2, err


def test_init_for_a_router_sizes_memory_max_for_the_models_that_fit_and_check_accepts_it(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from governor.board.budget import reserve_for
    from governor.engines.budget import headroom_for
    from governor.init.draft import fit_budget

    rest, _budget = _budget_for_two(models_dir)
    totals = sorted((e.total for _m, e in rest.models), reverse=True)
    # a board whose ceiling fits the two largest with their headroom, not all three
    two = ROUTER_OWN_BYTES + totals[0] + totals[1]  # with the router's own memory

    def room(board: int) -> int:
        return fit_budget(board - reserve_for(board)) - ROUTER_OWN_BYTES

    board = 4 * MIB * 1024  # shrunk until only two fit
    while fits_together(totals, room(board)) > 2:
        board -= MIB
    assert fits_together(totals, room(board)) == 2
    policy = tmp_path / "router.toml"
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "init", "--model", str(models_dir), "--board-memory",
        str(board), "--engine-argv", "llama-server -c 512 --cache-ram 0", "-o", str(policy),
    )  # fmt: skip
    assert code == 0, err
    assert "--models-max 2" in out
    text = policy.read_text()
    assert f'max = "{-(-(two + headroom_for(two)) // MIB)}MiB"' in text
    line = next(x for x in text.splitlines() if x.startswith("#   governor launch "))
    engine = line.split(" -- ", 1)[1]
    assert engine.endswith("--models-max 2")
    code, _out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy), "--engine-argv", engine
    )
    assert code == 0, err


def test_the_plan_cache_keys_a_router_on_its_directory_preset_and_every_model_file(
    tmp_path: Path,
) -> None:
    """A model added to the directory, a preset edited or a model file replaced changes the
    launch's cache inputs (its estimate and leaf limits come from them): a miss, not a stale
    plan."""
    from governor.api.launch_compile import _router_inputs
    from governor.cache.plans import file_identity

    models = tmp_path / "models"
    models.mkdir()
    (models / "a.gguf").write_bytes(b"GGUF")
    other = tmp_path / "elsewhere.gguf"
    other.write_bytes(b"GGUF")
    preset = tmp_path / "models.ini"
    preset.write_text(f"[far]\nmodel = {other}\n")
    argv = (SERVER, "--models-dir", "models", "--models-preset", "models.ini", "-c", "256")
    args = parse_llama_argv(argv)
    os.utime(models, ns=(1, 1))  # an old mtime: the next entry moves it whatever the clock's grain
    inputs = _router_inputs(args, tmp_path)
    assert inputs == [str(preset), str(models), str(models / "a.gguf"), str(other)]
    before = [file_identity(p) for p in inputs]
    (models / "b.gguf").write_bytes(b"GGUF")  # the directory's mtime moves
    assert file_identity(str(models)) != before[1]
    assert str(models / "b.gguf") in _router_inputs(args, tmp_path)
    # not a router: nothing more than its -m (the caller's own list)
    assert _router_inputs(parse_llama_argv((SERVER, "-m", str(other))), tmp_path) == []


def test_init_for_a_router_sizes_beside_the_boards_other_claims(models_dir: Path) -> None:
    """A board where two models fit alone: beside another slice's claim of the largest
    model's size only one does, and the draft says which claim it was sized beside;
    its own old claim (same name) does not count."""
    from governor.board.budget import reserve_for
    from governor.board.slice import QosClass, Slice
    from governor.init.board import Tenants
    from governor.init.draft import Request, fit_budget
    from governor.init.router import draft_router
    from governor.plan.host import probe
    from governor.record import replace

    rest, _budget = _budget_for_two(models_dir)
    totals = sorted((e.total for _m, e in rest.models), reverse=True)
    board = 4 * MIB * 1024
    while fits_together(totals, fit_budget(board - reserve_for(board)) - ROUTER_OWN_BYTES) > 2:
        board -= MIB
    host = replace(probe(ROOT), mem_total=board)
    req = Request(
        model=models_dir, ctx=None, engine_argv=("llama-server", "-c", "512", "--cache-ram", "0")
    )

    def claim(name: str, peak: int) -> Slice:
        return Slice(
            name=name, cgroup=f"governor.slice/{name}", qos=QosClass("background"), min=0,
            peak=peak, peak_source="max", state="running",
        )  # fmt: skip

    alone = draft_router(req, host, root=ROOT)
    assert alone.sizing.models_max == 2 and not alone.sizing.tenants
    beside = draft_router(
        req, host, root=ROOT, tenants=Tenants(claims=(claim("batch", totals[0]),))
    )
    assert beside.sizing.models_max == 1
    assert beside.sizing.ceiling < alone.sizing.ceiling
    assert "#   beside batch " in beside.text
    own = draft_router(
        req, host, root=ROOT, tenants=Tenants(claims=(claim(alone.name, totals[0]),))
    )
    assert own.sizing.models_max == 2


def test_a_router_on_a_unix_socket_is_never_spoken_to_at_8080_and_check_says_why(
    models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43 item 11: llama-server --host /x.sock answers on no TCP address: no readiness
    probe, no router url (evict, unload and the shed's unload off), and check warns with where
    and what to do; --port 0 (the kernel picks it) is refused as before (no port to know)."""
    from governor.api.launch import router_url
    from governor.supervise.ready import server_url

    sock = str(tmp_path / "r.sock")
    assert server_url(sock, None) is None and server_url(f"{sock}, {sock}", 9000) is None
    assert server_url(None, 0) is None
    assert server_url(f"{sock},127.0.0.1", 9000) == "http://127.0.0.1:9000/health"
    argv = (SERVER, "--models-dir", str(models_dir), "-c", "512", "--host", sock)
    assert router_url({"router": {}}, argv, {}) is None
    assert router_url({"router": {}}, argv[:-2], {"LLAMA_ARG_HOST": sock}) is None
    # the engine's environment is the policy's too: its port, not the governor's default
    assert router_url({"router": {}}, argv[:-2], {"LLAMA_ARG_PORT": "9100"}) == (
        "http://127.0.0.1:9100"
    )  # fmt: skip
    policy = tmp_path / "r.toml"
    policy.write_text('name = "r"\n[engine]\nkind = "llama.cpp"\nevict = "memory"\n')
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy), "--allow-missing", "memory",
        "--engine-argv", " ".join(argv),
    )  # fmt: skip
    said = [line for line in (out + err).splitlines() if "UNIX socket" in line]
    assert code == 0 and len(said) == 1, out + err
    assert f"llama-server listens on a UNIX socket only (--host {sock})" in said[0]
    assert 'no readiness probe (ready at exec), no evict = "memory", no `unload`' in said[0]
    assert "(engine argv --host/--port); add a TCP address" in said[0]
    code, out, err = _governor(
        capsys, "--root", str(ROOT), "check", str(policy), "--engine-argv",
        " ".join((*argv[:-2], "--port", "0")),
    )  # fmt: skip
    assert code == 65 and "engine option --port is not a TCP port (1-65535): '0'" in err, err
