"""Policy loading and validation (governor/policy/loader.py, model.py): good and bad files in
tests/fixtures/policies/, each bad one with its exit code, field path and message; ``extends``
override rules and error provenance; file-level failures (missing, directory, non-UTF-8,
writable by others as root); hypothesis: garbage never gives anything but a PolicyError.

Needs: nothing but the fixture files and tmp_path.
"""

from __future__ import annotations

import stat
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor.errors import (
    EXIT_NOINPUT,
    EXIT_NOPERM,
    EXIT_POLICY,
    GovernorError,
    PermissionDenied,
    PolicyError,
    PolicyNotFound,
)
from governor.policy import values as v
from governor.policy.durations import Duration
from governor.policy.loader import load, load_text
from governor.policy.model import Policy

POLICIES = Path(__file__).resolve().parents[2] / "fixtures" / "policies"
GOOD = POLICIES / "good"
BAD = POLICIES / "bad"
EXTENDS = POLICIES / "extends"
GIB = 1 << 30

# (file under bad/, exit code, field path, substring of the message)
BAD_CASES: list[tuple[str, int, str | None, str]] = [
    # unknown keys at every level
    ("unknown-top-key.toml", EXIT_POLICY, "nmae", "unknown key"),
    ("unknown-table.toml", EXIT_POLICY, "network", "unknown key"),
    ("unknown-memory-key.toml", EXIT_POLICY, "memory.hihg", "unknown key"),
    ("unknown-cpu-key.toml", EXIT_POLICY, "cpu.cpuset", "unknown key"),
    ("unknown-io-key.toml", EXIT_POLICY, "io.max", "unknown key"),
    ("unknown-pids-key.toml", EXIT_POLICY, "pids.limit", "unknown key"),
    ("unknown-process-key.toml", EXIT_POLICY, "process.uid", "unknown key"),
    ("unknown-engine-key.toml", EXIT_POLICY, "engine.model", "unknown key"),
    ("unknown-prefetch-key.toml", EXIT_POLICY, "prefetch.glob", "unknown key"),
    ("unknown-pressure-key.toml", EXIT_POLICY, "pressure[1].action", "unknown key"),
    # wrong types, no coercion
    ("bool-as-string.toml", EXIT_POLICY, "memory.oom_group", "expected true or false, got 'true'"),
    ("bool-as-int.toml", EXIT_POLICY, "memory.oom_group", "expected true or false, got 1"),
    ("int-as-size-string.toml", EXIT_POLICY, "pids.max", "got '1G'"),
    ("weight-as-string.toml", EXIT_POLICY, "cpu.weight", "expected an integer, got '100'"),
    ("weight-as-float.toml", EXIT_POLICY, "io.weight", "expected an integer, got 100.0"),
    ("weight-out-of-range.toml", EXIT_POLICY, "cpu.weight", "less than or equal to 10000"),
    ("threads-as-string.toml", EXIT_POLICY, "engine.threads", "expected an integer, got '4'"),
    ("oom-score-adj-out-of-range.toml", EXIT_POLICY, "process.oom_score_adj", "-1000"),
    ("nice-out-of-range.toml", EXIT_POLICY, "process.nice", "less than or equal to 19"),
    ("env-not-string.toml", EXIT_POLICY, "process.env.THREADS", "expected a string, got 4"),
    ("env-bad-name.toml", EXIT_POLICY, "process.env", "invalid environment variable name 'A-B'"),
    ("engine-kind.toml", EXIT_POLICY, "engine.kind", "'vllm'"),
    ("prefetch-mode.toml", EXIT_POLICY, "prefetch.mode", "'mlock'"),
    ("prefetch-files-not-list.toml", EXIT_POLICY, "prefetch.files", "list of paths"),
    ("pids-zero.toml", EXIT_POLICY, "pids.max", "positive integer or 'max', got 0"),
    ("memory-not-table.toml", EXIT_POLICY, "memory", "got '1GiB'"),
    ("name-not-string.toml", EXIT_POLICY, "name", "expected a string, got 5"),
    ("extends-not-string.toml", EXIT_POLICY, "extends", "extends must be a string"),
    # sizes
    ("negative-size.toml", EXIT_POLICY, "memory.max", "must not be negative, got -1"),
    ("negative-size-string.toml", EXIT_POLICY, "memory.high", "must not be negative"),
    ("unparsable-size.toml", EXIT_POLICY, "memory.max", "cannot parse size 'lots'"),
    ("ambiguous-unit.toml", EXIT_POLICY, "memory.max", "ambiguous unit 'MB'"),
    ("float-size.toml", EXIT_POLICY, "memory.max", "expected a size"),
    ("percent-over-100.toml", EXIT_POLICY, "memory.high", "percent must be in (0, 100]"),
    ("model-for-high.toml", EXIT_POLICY, "memory.high", "'model' is not allowed here"),
    ("memlock-percent.toml", EXIT_POLICY, "process.memlock", "'50%' is not allowed here"),
    # memory ordering
    ("high-above-max.toml", EXIT_POLICY, "memory", "memory.high (2GiB) is above memory.max (1GiB)"),
    ("min-above-low.toml", EXIT_POLICY, "memory", "memory.min (1GiB) is above memory.low (512MiB)"),
    ("max-string-below-high.toml", EXIT_POLICY, "memory", "memory.high (max) is above memory.max"),
    # slice and name
    ("slice-dotdot.toml", EXIT_POLICY, "slice", "invalid slice '../x'"),
    ("slice-with-slash.toml", EXIT_POLICY, "slice", "invalid slice 'a/b.slice'"),
    ("slice-no-suffix.toml", EXIT_POLICY, "slice", "must end in '.slice'"),
    ("slice-bare-suffix.toml", EXIT_POLICY, "slice", "must end in '.slice'"),
    ("name-uppercase.toml", EXIT_POLICY, "name", "invalid policy name 'Chat'"),
    ("name-with-slash.toml", EXIT_POLICY, "name", "invalid policy name '../etc'"),
    ("name-too-long.toml", EXIT_POLICY, "name", "at most 63 characters"),
    ("name-missing.toml", EXIT_POLICY, "name", "required key missing"),
    # CPU
    ("cpus-garbage.toml", EXIT_POLICY, "cpu.cpus", "cannot parse CPU list 'fast'"),
    ("cpus-descending.toml", EXIT_POLICY, "cpu.cpus", "descending CPU range '7-4'"),
    ("cpu-max-bad.toml", EXIT_POLICY, "cpu.max", "share of one CPU"),
    ("cpu-max-below-minimum.toml", EXIT_POLICY, "cpu.max", "1 ms quota minimum"),
    # pressure rules and triggers
    ("trigger-window-too-short.toml", EXIT_POLICY, "pressure[0].when", "outside the kernel's"),
    ("trigger-window-too-long.toml", EXIT_POLICY, "pressure[0].when", "outside the kernel's"),
    ("trigger-stall-above-window.toml", EXIT_POLICY, "pressure[0].when", "longer than its window"),
    ("trigger-bad-resource.toml", EXIT_POLICY, "pressure[0].when", "cannot parse trigger 'swap"),
    ("trigger-cpu-full.toml", EXIT_POLICY, "pressure[0].when", "'cpu full'"),
    ("pressure-no-actions.toml", EXIT_POLICY, "pressure[0].do", "at least 1 item"),
    ("pressure-missing-when.toml", EXIT_POLICY, "pressure[0].when", "required key missing"),
    ("pressure-bad-for.toml", EXIT_POLICY, "pressure[0].for", "expected a duration string"),
    ("pressure-as-table.toml", EXIT_POLICY, "pressure", "expected a list"),
    # actions
    ("action-unknown.toml", EXIT_POLICY, "pressure[0].do[1]", "unknown action 'reboot'"),
    ("action-unknown-signal.toml", EXIT_POLICY, "pressure[0].do[0]", "unknown signal 'SIGFOO'"),
    ("action-sigstop.toml", EXIT_POLICY, "pressure[0].do[0]", "SIGSTOP is not allowed"),
    ("action-freeze-no-duration.toml", EXIT_POLICY, "pressure[0].do[0]", "freeze needs a duration"),
    ("action-set-unknown-file.toml", EXIT_POLICY, "pressure[0].do[0]", "cannot set"),
    # the cgroup v1 knob
    ("oom-kill-disable.toml", EXIT_POLICY, "memory.oom_kill_disable", "cgroup v1 knob"),
    ("oom-kill-disable-top.toml", EXIT_POLICY, "oom_kill_disable", "cgroup v1 knob"),
    # syntax
    ("toml-syntax.toml", EXIT_POLICY, None, "TOML syntax error"),
]


def _load_error(path: Path, euid: int | None = None) -> GovernorError:
    with pytest.raises(GovernorError) as info:
        load(path, euid=euid)
    return info.value


# ---------------------------------------------------------------- the table


def test_every_bad_fixture_is_in_the_table() -> None:
    listed = {case[0] for case in BAD_CASES}
    on_disk = {p.name for p in BAD.glob("*.toml")}
    assert on_disk == listed


@pytest.mark.parametrize(
    ("name", "code", "field", "needle"), BAD_CASES, ids=[c[0] for c in BAD_CASES]
)
def test_bad_policy_is_rejected_with_exit_code_field_and_message(
    name: str, code: int, field: str | None, needle: str
) -> None:
    path = BAD / name
    err = _load_error(path)
    assert isinstance(err, PolicyError)
    assert err.exit_code == code
    assert err.field == field
    assert err.file == str(path)
    assert needle in err.reason
    # the one-line message carries the coordinates
    assert "\n" not in str(err)
    assert str(path) in str(err)
    if field is not None:
        assert field in str(err)


@pytest.mark.parametrize("name", ["unknown-top-key.toml", "unknown-memory-key.toml"])
def test_unknown_key_hint_points_at_the_schema(name: str) -> None:
    err = _load_error(BAD / name)
    assert err.hint is not None
    assert "governor schema" in err.hint


@pytest.mark.parametrize("name", ["oom-kill-disable.toml", "oom-kill-disable-top.toml"])
def test_oom_kill_disable_is_rejected_with_the_v2_equivalents(name: str) -> None:
    err = _load_error(BAD / name)
    assert "v1" in str(err)
    assert err.hint is not None
    assert "memory.oom.group" in err.hint
    assert "oom_score_adj = -1000" in err.hint
    assert "memory.min" in err.hint


def test_single_bad_action_reports_exactly_one_problem() -> None:
    err = _load_error(BAD / "action-sigstop.toml")
    assert "more problem" not in str(err)


# ---------------------------------------------------------------- good files


def test_minimal_policy_has_the_documented_defaults() -> None:
    p = load(GOOD / "minimal.toml")
    assert p.name == "minimal"
    assert p.slice == "governor.slice"
    assert p.description == ""
    assert p.memory.max is None
    assert p.cpu.cpus is None
    assert p.pressure == ()
    assert p.process.on_governor_exit == "kill"
    assert p.engine.kind == "generic"
    assert p.prefetch.files == "auto"
    assert p.prefetch.mode == "none"


def test_full_policy_parses_every_key_into_typed_values() -> None:
    p = load(GOOD / "full.toml")
    assert p.slice == "llm.slice"
    assert p.memory.min == v.Size("bytes", Decimal(256 << 20))
    assert p.memory.low == v.Size("bytes", Decimal(512 << 20))
    assert p.memory.high == v.Size("bytes", Decimal(3 * GIB // 2))
    assert p.memory.max == v.Size("bytes", Decimal(7 * GIB // 4))
    assert p.memory.swap_max == v.Size("max")
    assert p.memory.oom_group is True
    assert p.cpu.cpus == v.CpuSpec("list", (0, 1, 2, 3, 6))
    assert p.cpu.weight == 10000
    assert p.cpu.max == v.CpuMax(Decimal(350))
    assert p.io.weight == 1
    assert p.pids.max == "max"
    assert p.process.oom_score_adj == -1000
    assert p.process.nice == -20
    assert p.process.memlock == v.Size("unlimited")
    assert p.process.env == {"LLAMA_ARG_THREADS": "4", "_X": ""}
    assert p.process.on_governor_exit == "keep"
    assert p.engine.max_context_tokens == 4096
    assert p.prefetch.files == ("/models/*.gguf", "/models/tokenizer.json")
    assert p.prefetch.mode == "lock"
    assert len(p.pressure) == 3
    first = p.pressure[0]
    assert first.when == v.parse_trigger("memory some 150ms/2s")
    assert first.for_ == Duration(3_000_000)
    assert first.cooldown == Duration(10_000_000)
    assert [str(a) for a in first.do] == [
        "log",
        "signal SIGUSR1",
        "reclaim 64MiB",
        "set memory.high -10%",
        "set memory.max +5.5%",
    ]
    assert p.pressure[1].do[4].argv == ("/usr/bin/logger", "-t", "governor", "io stall")
    when = p.pressure[2].when
    assert isinstance(when, v.PsiTrigger) and when.window.us == 500_000


@pytest.mark.parametrize("path", sorted(GOOD.glob("*.toml")), ids=lambda p: p.name)
def test_good_policy_loads_and_its_dump_validates_again(path: Path) -> None:
    policy = load(path)
    dumped = policy.model_dump(by_alias=True, exclude_none=True)
    assert Policy.model_validate(dumped) == policy


def test_policy_models_are_frozen() -> None:
    policy = load(GOOD / "minimal.toml")
    with pytest.raises(ValueError, match="frozen"):
        policy.name = "other"  # type: ignore[misc]  # the point: assignment must fail


def test_load_text_validates_a_policy_without_a_file() -> None:
    policy = load_text('name = "inline"\n[cpu]\nweight = 300\n')
    assert policy.cpu.weight == 300


def test_load_text_refuses_extends() -> None:
    with pytest.raises(PolicyError) as info:
        load_text('name = "x"\nextends = "base.toml"\n', source="inline")
    assert info.value.field == "extends"
    assert info.value.file == "inline"


def test_policy_name_with_trailing_newline_is_rejected() -> None:
    with pytest.raises(PolicyError) as info:
        load_text('name = "chat\\n"')
    assert info.value.field == "name"


def test_env_variable_name_with_trailing_newline_is_rejected() -> None:
    with pytest.raises(PolicyError) as info:
        load_text('name = "x"\n[process.env]\n"FOO\\n" = "1"\n')
    assert info.value.field == "process.env"


# ---------------------------------------------------------------- file-level failures


def test_missing_policy_file_is_exit_66(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    err = _load_error(path)
    assert isinstance(err, PolicyNotFound)
    assert err.exit_code == EXIT_NOINPUT == 66
    assert str(path) in str(err)
    assert err.hint is not None


def test_directory_given_as_policy_is_exit_66(tmp_path: Path) -> None:
    err = _load_error(tmp_path)
    assert isinstance(err, PolicyNotFound)
    assert err.exit_code == 66
    assert "directory" in str(err)


def test_non_utf8_policy_is_exit_65_with_the_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "x"\ndescription = "caf\xe9"\n')
    err = _load_error(path)
    assert type(err) is PolicyError
    assert err.exit_code == 65
    assert "not valid UTF-8 (byte 29)" in str(err)
    assert err.file == str(path)


def test_empty_policy_file_is_missing_its_name(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_bytes(b"")
    err = _load_error(path)
    assert isinstance(err, PolicyError)
    assert err.field == "name"


def _world_writable_copy(tmp_path: Path, src: Path) -> Path:
    dest = tmp_path / src.name
    dest.write_bytes(src.read_bytes())
    dest.chmod(dest.stat().st_mode | stat.S_IWOTH)
    return dest


def test_policy_writable_by_others_is_refused_as_root_with_77(tmp_path: Path) -> None:
    path = _world_writable_copy(tmp_path, GOOD / "minimal.toml")
    err = _load_error(path, euid=0)
    assert isinstance(err, PermissionDenied)
    assert err.exit_code == EXIT_NOPERM == 77
    assert str(path) in str(err)
    assert err.hint == f"chmod o-w {path}"


def test_policy_writable_by_others_is_accepted_for_a_normal_user(tmp_path: Path) -> None:
    path = _world_writable_copy(tmp_path, GOOD / "minimal.toml")
    assert load(path, euid=1000).name == "minimal"


def test_extended_base_writable_by_others_is_refused_as_root(tmp_path: Path) -> None:
    (tmp_path / "child.toml").write_text('extends = "base.toml"\nname = "child"\n')
    base = _world_writable_copy(tmp_path, EXTENDS / "base.toml")
    (tmp_path / "child.toml").chmod(0o644)
    err = _load_error(tmp_path / "child.toml", euid=0)
    assert err.exit_code == 77
    assert str(base) in str(err)


# ---------------------------------------------------------------- extends


def test_child_overrides_scalars_merges_tables_and_replaces_arrays() -> None:
    child = load(EXTENDS / "child.toml")
    assert child.name == "child"
    assert child.description == "from base"  # inherited
    assert child.slice == "base.slice"  # inherited scalar
    assert child.extends is None
    # [memory] merges key by key: high from the child, max and oom_group from the base
    assert child.memory.high == v.parse_size("1.2GiB")
    assert child.memory.max == v.parse_size("1.5GiB")
    assert child.memory.oom_group is True
    # [cpu] untouched by the child
    assert child.cpu.weight == 100
    # prefetch.files (an array) is replaced, prefetch.mode (a scalar) inherited
    assert child.prefetch.files == ("/models/c.gguf",)
    assert child.prefetch.mode == "advise"
    # [[pressure]] is replaced as a whole
    assert len(child.pressure) == 1
    assert str(child.pressure[0].when) == "io some 200ms/2s"


def test_grandchild_inherits_through_the_whole_chain() -> None:
    g = load(EXTENDS / "grandchild.toml")
    assert g.name == "grandchild"
    assert g.description == "own description"
    assert g.cpu.weight == 300
    assert g.memory.high == v.parse_size("1.2GiB")  # from child
    assert g.memory.max == v.parse_size("1.5GiB")  # from base
    assert g.prefetch.files == ("/models/c.gguf",)


def test_extends_is_relative_to_the_extending_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(POLICIES.parent)
    nested = load(EXTENDS / "sub" / "nested.toml")
    assert nested.name == "nested"
    assert nested.slice == "base.slice"


def test_name_is_not_inherited() -> None:
    err = _load_error(EXTENDS / "noname-child.toml")
    assert isinstance(err, PolicyError)
    assert err.field == "name"
    assert "required key missing" in str(err)


def test_missing_name_in_a_child_points_at_the_child() -> None:
    err = _load_error(EXTENDS / "noname-child.toml")
    assert isinstance(err, PolicyError)
    assert err.file == str(EXTENDS / "noname-child.toml")


def test_extends_cycle_is_an_error_naming_the_chain() -> None:
    err = _load_error(EXTENDS / "cycle-a.toml")
    assert type(err) is PolicyError
    assert err.exit_code == 65
    assert err.field == "extends"
    assert "extends cycle" in str(err)
    assert "cycle-a.toml -> " in str(err)
    assert "cycle-b.toml -> " in str(err)


def test_self_extends_is_a_cycle() -> None:
    err = _load_error(EXTENDS / "self.toml")
    assert err.exit_code == 65
    assert "extends cycle" in str(err)


def test_missing_extended_file_is_exit_66_naming_the_reference() -> None:
    err = _load_error(EXTENDS / "missing-parent.toml")
    assert isinstance(err, PolicyNotFound)
    assert err.exit_code == 66
    assert err.field == "extends"
    assert err.file == str(EXTENDS / "missing-parent.toml")
    assert "'no-such-base.toml' not found" in str(err)


def test_extending_a_directory_is_exit_66() -> None:
    err = _load_error(EXTENDS / "dir-parent.toml")
    assert err.exit_code == 66
    assert "directory" in str(err)


def test_extends_chain_deeper_than_the_limit_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p0.toml").write_text('name = "p0"\n')
    for i in range(1, 12):
        (tmp_path / f"p{i}.toml").write_text(f'extends = "p{i - 1}.toml"\nname = "p{i}"\n')
    err = _load_error(tmp_path / "p11.toml")
    assert err.exit_code == 65
    assert "deeper than" in str(err)


@pytest.mark.parametrize(
    ("name", "file", "field", "needle"),
    [
        ("child-of-bad-base.toml", "bad-base.toml", "memory.max", "cannot parse size 'lots'"),
        ("child-bad-value.toml", "child-bad-value.toml", "cpu.weight", "got 'heavy'"),
        ("child-of-v1-base.toml", "v1-base.toml", "memory.oom_kill_disable", "cgroup v1"),
        (
            "child-high-above-inherited-max.toml",
            "child-high-above-inherited-max.toml",
            "memory",
            "memory.high (2GiB) is above memory.max (1.5GiB)",
        ),
    ],
)
def test_error_in_an_extends_chain_names_the_file_that_defined_the_field(
    name: str, file: str, field: str, needle: str
) -> None:
    err = _load_error(EXTENDS / name)
    assert isinstance(err, PolicyError)
    assert err.exit_code == 65
    assert err.file == str(EXTENDS / file)
    assert err.field == field
    assert needle in str(err)


# ---------------------------------------------------------------- garbage in


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_random_bytes_give_only_a_policy_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "garbage.toml"
    path.write_bytes(data)
    try:
        load(path)
    except PolicyError as err:
        assert err.exit_code == 65
        assert err.file == str(path)


_TOML_ATOMS = st.sampled_from(
    [
        "name",
        "=",
        '"x"',
        "[memory]",
        "[[pressure]]",
        "[cpu]",
        "high",
        "max",
        '"1GiB"',
        "-1",
        "true",
        "1.5",
        "[",
        "]",
        "{",
        "}",
        ",",
        "\n",
        " ",
        '"',
        "'",
        "#",
        "when",
        "do",
        '["log"]',
        '"memory some 150ms/2s"',
        "oom_kill_disable",
        "extends",
        '"base.toml"',
        "1979-05-27",
        "inf",
        "nan",
        "0x10",
    ]
)


@settings(max_examples=300)
@given(st.lists(_TOML_ATOMS, max_size=40).map("".join))
def test_garbage_toml_gives_only_a_policy_error(text: str) -> None:
    try:
        load_text(text)
    except PolicyError as err:
        assert err.exit_code == 65
        assert "\n" not in str(err)


def test_deeply_nested_toml_gives_a_policy_error() -> None:
    with pytest.raises(PolicyError):
        load_text("name = " + "[" * 5000 + "]" * 5000)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("[pids]\nmax = 4194305\n", "pids.max"),  # >= the kernel's PIDS_MAX: EINVAL at launch
        ("[pids]\nmax = 9223372036854775807\n", "pids.max"),
        ('[memory]\nmax = "16777216T"\n', "memory.max"),  # 2^64: memparse wraps it to 0
        ('[cpu]\nmax = "99999999999999999999%"\n', "cpu.max"),
    ],
)
def test_values_the_kernel_would_refuse_or_misread_are_policy_errors(body: str, where: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_text(f'name = "b"\n{body}')
    assert where in str(err.value)
    assert "max" in str(err.value)


def test_the_kernels_largest_pids_max_is_accepted() -> None:
    assert load_text('name = "b"\n[pids]\nmax = 4194304\n').pids.max == 4194304


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_extends_through_a_symlink_loop_is_a_policy_error(tmp_path: Path) -> None:
    (tmp_path / "a.toml").symlink_to(tmp_path / "b.toml")
    (tmp_path / "b.toml").symlink_to(tmp_path / "a.toml")
    policy = _write(tmp_path / "c.toml", 'name = "x"\nextends = "a.toml"\n')
    with pytest.raises(PolicyError) as err:
        load(policy)
    assert "extends" in str(err.value) and err.value.hint


@pytest.mark.parametrize("ref", ["a" * 300 + ".toml", "nul\\u0000.toml"])
def test_an_impossible_extends_path_is_a_policy_error(tmp_path: Path, ref: str) -> None:
    policy = _write(tmp_path / "c.toml", f'name = "x"\nextends = "{ref}"\n')
    with pytest.raises(PolicyError) as err:
        load(policy)
    assert "extends" in str(err.value)


def test_keys_nested_thousands_deep_are_a_policy_error(tmp_path: Path) -> None:
    policy = _write(tmp_path / "d.toml", 'name = "x"\n' + ".".join(["a"] * 2000) + " = 1\n")
    with pytest.raises(PolicyError) as err:
        load(policy)
    assert "nested deeper" in str(err.value)


def test_a_policy_file_over_a_mebibyte_is_refused_before_parsing(tmp_path: Path) -> None:
    policy = _write(tmp_path / "big.toml", 'name = "x"\n' + "# filler\n" * 200_000)
    with pytest.raises(PolicyError) as err:
        load(policy)
    assert "larger than 1024 KiB" in str(err.value)


@pytest.mark.parametrize("slice_", ["a--b.slice", "-a.slice", "a-.slice", "x" * 250 + ".slice"])
def test_slice_names_systemd_would_refuse_are_policy_errors(slice_: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_text(f'name = "x"\nslice = "{slice_}"\n')
    assert "invalid slice" in str(err.value)


def test_every_policy_error_carries_a_hint() -> None:
    with pytest.raises(PolicyError) as err:
        load_text('name = "x"\n[memory]\nmax = "lots"\n')
    assert err.value.hint


@pytest.mark.parametrize(
    "body",
    [
        '[process]\nuser = "a\\u0000b"\n',
        '[process]\ngroup = "x y"\n',
        '[process]\nuser = "../root"\n',
        '[process]\nenv = { A = "x\\u0000y" }\n',
    ],
)
def test_account_names_and_env_values_exec_cannot_pass_are_policy_errors(body: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_text(f'name = "x"\n{body}')
    assert "process." in str(err.value)


def test_ordinary_account_names_are_accepted() -> None:
    p = load_text('name = "x"\n[process]\nuser = "llama"\ngroup = "video"\n')
    assert (p.process.user, p.process.group) == ("llama", "video")


def test_for_underscore_is_not_a_key_and_errors_use_the_policys_own_words() -> None:
    with pytest.raises(PolicyError) as err:
        load_text(
            'name = "x"\n[[pressure]]\nwhen = "memory some 150ms/2s"\nfor_ = "2s"\ndo = ["log"]\n'
        )
    assert str(err.value) == "unknown key (<string>, pressure[0].for_)"
    with pytest.raises(PolicyError) as err:
        load_text('name = "x"\n[[pressure]]\nwhen = "memory some 150ms/2s"\ndo = []\n')
    assert "needs at least 1 item" in str(err.value) and "Tuple" not in str(err.value)
    with pytest.raises(PolicyError) as err:
        load_text('name = "x"\n[memory]\noom_group = "' + "x" * 100_000 + '"\n')
    assert len(str(err.value)) < 200


def test_qos_class_and_yield_are_checked_like_every_key() -> None:
    pol = load_text('name = "x"\n[qos]\nclass = "background"\nyield = ["freeze", "throttle"]\n')
    assert (pol.qos.class_, pol.qos.yield_) == ("background", ("freeze", "throttle"))
    assert load_text('name = "x"\n').qos.class_ == "standard"
    for body, field in (
        ('class = "bg"', "qos.class"),
        ('yield = ["nap"]', "qos.yield[0]"),
        ('yield = ["kill", "kill"]', "qos.yield"),
        ("priority = 1", "qos.priority"),
    ):
        with pytest.raises(PolicyError) as err:
            load_text(f'name = "x"\n[qos]\n{body}\n')
        assert err.value.exit_code == 65 and err.value.field == field, (body, err.value)
