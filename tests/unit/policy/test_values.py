"""The value syntax of the policy language (governor/policy/values.py): sizes, durations, CPU
lists, cpu.max, PSI triggers and action strings, with their canonical ``str()`` spellings.

Needs: nothing (pure parsers).
"""

from __future__ import annotations

import contextlib
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor.policy import durations as dur
from governor.policy import values as v

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("0", 0),
        ("1000", 1000),
        ("512B", 512),
        ("4K", 4 * KIB),
        ("4KiB", 4 * KIB),
        ("800M", 800 * MIB),
        ("800MiB", 800 * MIB),
        ("1.5GiB", 3 * GIB // 2),
        ("1.5G", 3 * GIB // 2),
        ("2T", 2 * TIB),
        ("1TiB", TIB),
        (" 64M ", 64 * MIB),
        ("64 MiB", 64 * MIB),
    ],
)
def test_size_in_bytes_parses_binary_units(text: object, expected: int) -> None:
    size = v.parse_size(text)
    assert size.kind == "bytes"
    assert size.bytes == expected
    assert size.resolve(mem_total=2 * GIB) == expected


def test_fractional_size_is_floored_to_whole_bytes() -> None:
    # 1.1 GiB = 1181116006.4 bytes
    assert v.parse_size("1.1GiB").bytes == 1181116006
    assert v.parse_size("0.5K").bytes == 512
    assert v.parse_size("1.0001K").bytes == 1024


def test_percent_size_is_a_share_of_memtotal() -> None:
    size = v.parse_size("70%")
    assert size.kind == "percent"
    assert size.amount == Decimal(70)
    assert size.resolve(mem_total=1000) == 700
    assert v.parse_size("12.5%").resolve(mem_total=2 * GIB) == GIB // 4
    assert v.parse_size("100%").resolve(mem_total=12345) == 12345


def test_max_size_resolves_to_none() -> None:
    size = v.parse_size("max")
    assert size.kind == "max"
    assert size.resolve(mem_total=GIB) is None
    assert str(size) == "max"


def test_model_and_unlimited_sizes_are_only_accepted_where_allowed() -> None:
    with pytest.raises(ValueError, match="not allowed here"):
        v.parse_size("model")
    with pytest.raises(ValueError, match="not allowed here"):
        v.parse_size("unlimited")
    model = v.parse_size("model", allow=frozenset({"bytes", "model"}))
    assert model.kind == "model"
    with pytest.raises(ValueError, match="needs the model's size"):
        model.resolve(mem_total=GIB)
    unlimited = v.parse_size("unlimited", allow=frozenset({"unlimited"}))
    assert unlimited.resolve(mem_total=GIB) is None


def test_percent_is_refused_where_only_bytes_are_allowed() -> None:
    with pytest.raises(ValueError, match="not allowed here"):
        v.parse_size("50%", allow=frozenset({"bytes", "max"}))


def test_bytes_property_of_a_non_byte_size_raises() -> None:
    with pytest.raises(ValueError, match="not a byte count"):
        _ = v.parse_size("70%").bytes


@pytest.mark.parametrize("unit", ["KB", "kB", "MB", "GB", "TB", "k", "m", "g", "t"])
def test_ambiguous_decimal_units_are_refused(unit: str) -> None:
    with pytest.raises(ValueError, match="ambiguous unit"):
        v.parse_size(f"800{unit}")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (-1, "must not be negative"),
        ("-1", "must not be negative"),
        ("-1.5GiB", "must not be negative"),
        ("lots", "cannot parse size"),
        ("", "cannot parse size"),
        ("1e9", "cannot parse size"),
        ("0x100", "cannot parse size"),
        ("1.5.5G", "cannot parse size"),
        ("1 G B", "cannot parse size"),
        ("12 parsecs", "unknown size unit"),
        ("5PiB", "unknown size unit"),
        ("0%", r"percent must be in \(0, 100\]"),
        ("100.5%", r"percent must be in \(0, 100\]"),
        ("150%", r"percent must be in \(0, 100\]"),
        (True, "boolean"),
        (False, "boolean"),
        (1.5, "expected a size"),
        (None, "expected a size"),
        ([1], "expected a size"),
    ],
)
def test_bad_sizes_are_refused_with_a_reason(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_size(value)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (1000, "1000"),
        (1023, "1023"),
        (4096, "4KiB"),
        (3 * GIB // 2, "1.5GiB"),
        (800 * MIB, "800MiB"),
        (GIB + 1, str(GIB + 1)),  # no exact 2-decimal spelling: plain bytes
        (TIB, "1TiB"),
    ],
)
def test_format_bytes_gives_the_shortest_exact_spelling(n: int, text: str) -> None:
    assert v.format_bytes(n) == text


@pytest.mark.parametrize(("n", "text"), [(1234567890, "1.15GiB"), (512, "512B"), (2 * MIB, "2MiB")])
def test_human_bytes_is_approximate_for_messages(n: int, text: str) -> None:
    assert v.human_bytes(n) == text


@pytest.mark.parametrize("text", ["1.5GiB", "800MiB", "70%", "12.5%", "max", "0", "4KiB"])
def test_size_str_round_trips(text: str) -> None:
    size = v.parse_size(text)
    assert str(size) == text
    assert v.parse_size(str(size)) == size


def test_parse_size_accepts_an_already_parsed_size() -> None:
    size = v.parse_size("1GiB")
    assert v.parse_size(size) is size


@given(st.integers(min_value=0, max_value=1 << 60))
def test_format_bytes_round_trips_through_parse_size(n: int) -> None:
    assert v.parse_size(v.format_bytes(n)).bytes == n


@given(
    st.integers(min_value=0, max_value=100_000),
    st.sampled_from(["", "B", "K", "KiB", "M", "MiB", "G", "GiB", "T", "TiB"]),
)
def test_integer_sizes_with_any_binary_unit_multiply_exactly(n: int, unit: str) -> None:
    mult = {"": 1, "B": 1, "K": KIB, "M": MIB, "G": GIB, "T": TIB}[unit[:1]]
    assert v.parse_size(f"{n}{unit}").bytes == n * mult


@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none(), st.booleans()))
def test_parse_size_raises_only_value_error(value: object) -> None:
    with contextlib.suppress(ValueError):
        v.parse_size(value)


@pytest.mark.parametrize(
    "value",
    [
        "16777216T",  # 2^64: the kernel's memparse wraps it to a 0-byte limit
        "9" * 400,
        "9" * 5000,  # past int()'s digit limit: still one ValueError with a short message
        1 << 64,
        (1 << 63),
        "8388608TiB",
    ],
)
def test_sizes_the_kernel_would_misread_are_refused(value: object) -> None:
    with pytest.raises(ValueError) as err:
        v.parse_size(value)
    assert len(str(err.value)) < 200
    assert "max" in str(err.value)


def test_the_largest_size_the_kernel_holds_is_accepted() -> None:
    assert v.parse_size(v.SIZE_MAX_BYTES).bytes == (1 << 63) - 1
    assert v.parse_size("8388607TiB").bytes == 8388607 * TIB


@pytest.mark.parametrize("value", ["99999999999999999999%", "17592186045%", "9" * 500 + "%"])
def test_cpu_max_beyond_the_kernels_quota_limit_is_refused(value: str) -> None:
    with pytest.raises(ValueError) as err:
        v.parse_cpu_max(value)
    assert len(str(err.value)) < 200


def test_cpu_max_at_the_kernels_quota_limit_is_accepted() -> None:
    assert v.parse_cpu_max("17592186044%").kernel_value() == "17592186044000 100000"


@pytest.mark.parametrize("value", ["367d", "9000h", "9" * 100 + "s"])
def test_durations_past_a_year_or_absurdly_long_are_refused(value: str) -> None:
    with pytest.raises(ValueError) as err:
        dur.parse_duration(value)
    assert len(str(err.value)) < 200


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "us"),
    [
        ("150ms", 150_000),
        ("2s", 2_000_000),
        ("1.5s", 1_500_000),
        ("1m", 60_000_000),
        ("1h", 3_600_000_000),
        ("250us", 250),
        (" 5s ", 5_000_000),
        ("0.5ms", 500),
    ],
)
def test_durations_parse_to_microseconds(text: str, us: int) -> None:
    d = dur.parse_duration(text)
    assert d.us == us
    assert d.seconds == us / 1_000_000


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("5", "cannot parse duration"),  # units are required
        ("5 seconds", "cannot parse duration"),
        ("-5s", "cannot parse duration"),
        ("0s", "must be positive"),
        ("0.0001ms", "finer than a microsecond"),
        ("", "cannot parse duration"),
        (5, "expected a duration string"),
        (1.5, "expected a duration string"),
        (True, "expected a duration string"),
    ],
)
def test_bad_durations_are_refused(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        dur.parse_duration(value)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("2000ms", "2s"),
        ("1.5s", "1500ms"),
        ("90s", "90s"),
        ("120s", "2m"),
        ("60m", "1h"),
        ("250us", "250us"),
        ("1500us", "1500us"),
    ],
)
def test_duration_str_is_canonical(text: str, canonical: str) -> None:
    assert str(dur.parse_duration(text)) == canonical


@given(st.integers(min_value=1, max_value=10**12))
def test_duration_str_round_trips(us: int) -> None:
    d = dur.Duration(us)
    assert dur.parse_duration(str(d)) == d


@given(st.one_of(st.text(max_size=20), st.integers(), st.none()))
def test_parse_duration_raises_only_value_error(value: object) -> None:
    with contextlib.suppress(ValueError):
        dur.parse_duration(value)


# ---------------------------------------------------------------- CPUs


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0", (0,)),
        ("0-3", (0, 1, 2, 3)),
        ("0-3,6", (0, 1, 2, 3, 6)),
        ("4-7,0", (0, 4, 5, 6, 7)),
        ("1,1,1-2", (1, 2)),
        (" 2-3 ", (2, 3)),
    ],
)
def test_cpu_lists_parse_to_sorted_unique_cpus(text: str, cpus: tuple[int, ...]) -> None:
    spec = v.parse_cpus(text)
    assert spec.kind == "list"
    assert spec.cpus == cpus


@pytest.mark.parametrize("word", ["big", "little", "all"])
def test_cpu_class_words_are_kept_symbolic(word: str) -> None:
    spec = v.parse_cpus(word)
    assert spec.kind == word
    assert spec.cpus == ()
    assert str(spec) == word


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("7-4", "descending CPU range"),
        ("fast", "cannot parse CPU list"),
        ("", "cannot parse CPU list"),
        ("0-", "cannot parse CPU list"),
        ("-1", "cannot parse CPU list"),
        ("0,,1", "cannot parse CPU list"),
        ("0 - 3", "cannot parse CPU list"),
        ("BIG", "cannot parse CPU list"),
        (3, "expected a CPU list"),
        ([0, 1], "expected a CPU list"),
    ],
)
def test_bad_cpu_lists_are_refused(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_cpus(value)


@pytest.mark.parametrize(
    ("text", "canonical"), [("0,1,2,3,6", "0-3,6"), ("4-7", "4-7"), ("5", "5")]
)
def test_cpu_list_str_is_the_kernel_spelling(text: str, canonical: str) -> None:
    assert str(v.parse_cpus(text)) == canonical


@given(st.sets(st.integers(min_value=0, max_value=255), min_size=1))
def test_cpu_list_str_round_trips(cpus: set[int]) -> None:
    spec = v.CpuSpec("list", tuple(sorted(cpus)))
    assert v.parse_cpus(str(spec)) == spec


def test_cpu_list_beyond_any_kernel_nr_cpus_is_refused() -> None:
    with pytest.raises(ValueError):
        v.parse_cpus("0-100000")


def test_cpu_list_with_non_ascii_digits_is_refused() -> None:
    with pytest.raises(ValueError):
        v.parse_cpus("\u0660-\u0663")  # ARABIC-INDIC DIGIT ZERO..THREE


@given(st.text(max_size=20))
def test_parse_cpus_raises_only_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        v.parse_cpus(text)


# ---------------------------------------------------------------- cpu.max


@pytest.mark.parametrize(
    ("text", "kernel"),
    [
        ("350%", "350000 100000"),
        ("100%", "100000 100000"),
        ("1%", "1000 100000"),
        ("12.5%", "12500 100000"),
        ("max", "max 100000"),
    ],
)
def test_cpu_max_is_a_share_of_one_cpu(text: str, kernel: str) -> None:
    cpu_max = v.parse_cpu_max(text)
    assert cpu_max.kernel_value() == kernel
    assert str(cpu_max) == text
    assert v.parse_cpu_max(str(cpu_max)) == cpu_max


def test_cpu_max_uses_the_given_period() -> None:
    assert v.parse_cpu_max("50%").kernel_value(period_us=20_000) == "10000 20000"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("0.5%", "below the kernel's 1 ms quota minimum"),
        ("0%", "below the kernel's 1 ms quota minimum"),
        ("3.5", "expected a share of one CPU"),
        ("350", "expected a share of one CPU"),
        ("-50%", "expected a share of one CPU"),
        (350, "expected a share of one CPU"),
        ("MAX", "expected a share of one CPU"),
    ],
)
def test_bad_cpu_max_is_refused(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_cpu_max(value)


# ---------------------------------------------------------------- PSI triggers


@pytest.mark.parametrize(
    ("text", "resource", "kind", "stall_us", "window_us"),
    [
        ("memory some 150ms/2s", "memory", "some", 150_000, 2_000_000),
        ("memory full 1s/2s", "memory", "full", 1_000_000, 2_000_000),
        ("io full 500ms/10s", "io", "full", 500_000, 10_000_000),
        ("cpu some 100ms/500ms", "cpu", "some", 100_000, 500_000),
        ("memory some 2s/2s", "memory", "some", 2_000_000, 2_000_000),  # stall == window
        ("  memory   some  150ms / 2s ", "memory", "some", 150_000, 2_000_000),
    ],
)
def test_triggers_parse_into_typed_fields(
    text: str, resource: str, kind: str, stall_us: int, window_us: int
) -> None:
    t = v.parse_trigger(text)
    assert (t.resource, t.kind, t.stall.us, t.window.us) == (resource, kind, stall_us, window_us)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("memory some 100ms/400ms", "outside the kernel's 500ms..10s"),
        ("memory some 100ms/499999us", "outside the kernel's 500ms..10s"),
        ("memory some 1s/11s", "outside the kernel's 500ms..10s"),
        ("memory some 1s/10001ms", "outside the kernel's 500ms..10s"),
        ("memory some 3s/2s", "longer than its window"),
        ("swap some 150ms/2s", "cannot parse trigger"),
        ("memory most 150ms/2s", "cannot parse trigger"),
        ("memory some 150ms", "cannot parse trigger"),
        ("memory some 150ms/2s extra", "cannot parse trigger"),
        ("Memory some 150ms/2s", "cannot parse trigger"),
        ("memory some 150/2000", "cannot parse duration"),
        ("memory some 0ms/2s", "must be positive"),
        ("cpu full 150ms/2s", "not a meaningful cgroup trigger"),
        ("", "cannot parse trigger"),
    ],
)
def test_bad_triggers_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_trigger(text)


def test_trigger_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(ValueError, match="expected a trigger"):
        v.parse_trigger({"when": "memory"})


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("memory some 150ms/2s", "memory some 150ms/2s"),
        ("io full 500ms/2000ms", "io full 500ms/2s"),
        ("cpu  some 0.5s/1s", "cpu some 500ms/1s"),
    ],
)
def test_trigger_str_is_canonical_and_round_trips(text: str, canonical: str) -> None:
    t = v.parse_trigger(text)
    assert str(t) == canonical
    assert v.parse_trigger(str(t)) == t


@given(
    st.sampled_from(["memory", "io", "cpu"]),
    st.sampled_from(["some", "full"]),
    st.integers(min_value=500, max_value=10_000),
    st.data(),
)
def test_every_trigger_inside_the_kernel_limits_round_trips(
    resource: str, kind: str, window_ms: int, data: st.DataObject
) -> None:
    if resource == "cpu" and kind == "full":
        kind = "some"
    stall_ms = data.draw(st.integers(min_value=1, max_value=window_ms))
    t = v.parse_trigger(f"{resource} {kind} {stall_ms}ms/{window_ms}ms")
    assert t.window.us == window_ms * 1000
    assert v.parse_trigger(str(t)) == t


@given(st.text(max_size=40))
def test_parse_trigger_raises_only_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        v.parse_trigger(text)


# ---------------------------------------------------------------- actions


@pytest.mark.parametrize("verb", ["log", "thaw", "kill", "restart"])
def test_verbs_without_arguments_parse(verb: str) -> None:
    action = v.parse_action(verb)
    assert action.verb == verb
    assert str(action) == verb


@pytest.mark.parametrize("verb", ["log", "thaw", "kill", "restart"])
def test_verbs_without_arguments_refuse_one(verb: str) -> None:
    with pytest.raises(ValueError, match="takes no argument"):
        v.parse_action(f"{verb} now")


@pytest.mark.parametrize(
    ("text", "signal"),
    [
        ("signal SIGUSR1", "SIGUSR1"),
        ("signal USR2", "SIGUSR2"),
        ("signal SIGTERM", "SIGTERM"),
        ("signal SIGKILL", "SIGKILL"),
        ("signal  SIGHUP", "SIGHUP"),
    ],
)
def test_signal_action_canonicalises_the_name(text: str, signal: str) -> None:
    action = v.parse_action(text)
    assert action.verb == "signal"
    assert action.signal == signal
    assert str(action) == f"signal {signal}"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("signal SIGSTOP", "SIGSTOP is not allowed"),
        ("signal STOP", "SIGSTOP is not allowed"),
        ("signal SIGCONT", "SIGCONT is not allowed"),
        ("signal SIGFOO", "unknown signal"),
        ("signal 9", "unknown signal"),
        ("signal usr1", "unknown signal"),
        ("signal SIG_DFL", "unknown signal"),
        ("signal", "expected 'signal <NAME>'"),
        ("signal SIGUSR1 SIGUSR2", "expected 'signal <NAME>'"),
    ],
)
def test_bad_signal_actions_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_action(text)


def test_reclaim_action_takes_a_byte_size() -> None:
    action = v.parse_action("reclaim 64M")
    assert action.verb == "reclaim"
    assert action.size is not None
    assert action.size.bytes == 64 * MIB
    assert str(action) == "reclaim 64MiB"


def test_reclaim_takes_memory_reclaims_swappiness_argument() -> None:
    # issue 47: memory.reclaim's own `swappiness=` (6.11), spelled as the kernel takes it
    action = v.parse_action("reclaim 64M  swappiness = 0")
    assert (action.size, action.swappiness) == (v.Size("bytes", Decimal(64 * MIB)), 0)
    assert str(action) == "reclaim 64MiB swappiness=0"
    assert v.parse_action(str(action)) == action
    assert v.parse_action("reclaim 64M swappiness=200").swappiness == 200
    assert v.parse_action("reclaim 64M").swappiness is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("reclaim 64M swappiness=201", r"swappiness=0\.\.200"),
        ("reclaim 64M swappiness=-1", "expected 'reclaim SIZE"),
        ("reclaim 64M swappiness=max", "expected 'reclaim SIZE"),
        ("reclaim 64M 32M", "expected 'reclaim SIZE"),
        ("reclaim 0", "must be positive"),
        ("reclaim 10%", "not allowed here"),
        ("reclaim max", "not allowed here"),
        ("reclaim", "cannot parse size"),
        ("reclaim 64MB", "ambiguous unit"),
    ],
)
def test_bad_reclaim_actions_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_action(text)


def test_freeze_action_needs_a_duration() -> None:
    action = v.parse_action("freeze 5s")
    assert action.duration == dur.Duration(5_000_000)
    assert str(action) == "freeze 5s"
    with pytest.raises(ValueError, match="freeze needs a duration"):
        v.parse_action("freeze")
    with pytest.raises(ValueError, match="cannot parse duration"):
        v.parse_action("freeze forever")


@pytest.mark.parametrize(
    ("text", "file", "value", "relative", "canonical"),
    [
        ("set memory.high 1.2G", "memory.high", "1288490188", None, "set memory.high 1288490188"),
        ("set memory.high 1.5GiB", "memory.high", "1.5GiB", None, "set memory.high 1.5GiB"),
        ("set memory.max max", "memory.max", "max", None, "set memory.max max"),
        ("set memory.high -10%", "memory.high", None, Decimal(-10), "set memory.high -10%"),
        ("set memory.low +5.5%", "memory.low", None, Decimal("5.5"), "set memory.low +5.5%"),
        ("set memory.swap.max 0", "memory.swap.max", "0", None, "set memory.swap.max 0"),
        ("set cpu.weight 20", "cpu.weight", "20", None, "set cpu.weight 20"),
        ("set cpu.weight +50%", "cpu.weight", None, Decimal(50), "set cpu.weight +50%"),
        ("set cpu.max 150%", "cpu.max", "150%", None, "set cpu.max 150%"),
        ("set cpu.max max", "cpu.max", "max", None, "set cpu.max max"),
    ],
)
def test_set_action_takes_an_absolute_or_relative_value(
    text: str, file: str, value: str | None, relative: Decimal | None, canonical: str
) -> None:
    action = v.parse_action(text)
    assert action.verb == "set"
    assert action.file == file
    assert action.value == value
    assert action.relative_percent == relative
    assert str(action) == canonical


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("set memory.oom_kill_disable 1", "cannot set 'memory.oom_kill_disable'"),
        ("set pids.max 10", "cannot set 'pids.max'"),
        ("set memory.high", "expected 'set <file> <value"),
        ("set memory.high 1G 2G", "expected 'set <file> <value"),
        ("set memory.high -100%", "non-zero and above -100%"),
        ("set memory.high -150%", "non-zero and above -100%"),
        ("set memory.high +0%", "non-zero and above -100%"),
        ("set memory.high 10%", "not allowed here"),  # absolute shares are ambiguous at runtime
        ("set memory.high -1G", "must not be negative"),
        ("set cpu.max +10%", "relative changes of cpu.max"),
        ("set cpu.max 0.1%", "below the kernel's 1 ms quota minimum"),
        ("set cpu.weight 0", "cpu.weight must be 1..10000"),
        ("set cpu.weight 10001", "cpu.weight must be 1..10000"),
        ("set cpu.weight high", "cpu.weight must be 1..10000"),
    ],
)
def test_bad_set_actions_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_action(text)


@pytest.mark.parametrize(
    ("text", "argv", "canonical"),
    [
        ("exec /usr/bin/logger hi", ("/usr/bin/logger", "hi"), "exec /usr/bin/logger hi"),
        (
            "exec logger -t gov 'memory stall'",
            ("logger", "-t", "gov", "memory stall"),
            "exec logger -t gov 'memory stall'",
        ),
        ('exec notify "a b" c', ("notify", "a b", "c"), "exec notify 'a b' c"),
    ],
)
def test_exec_action_splits_like_a_shell_without_running_one(
    text: str, argv: tuple[str, ...], canonical: str
) -> None:
    action = v.parse_action(text)
    assert action.verb == "exec"
    assert action.argv == argv
    assert str(action) == canonical


def test_exec_does_not_expand_shell_syntax() -> None:
    action = v.parse_action("exec echo $HOME; rm -rf /")
    assert action.argv == ("echo", "$HOME;", "rm", "-rf", "/")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("exec", "exec needs a command"),
        ("exec   ", "exec needs a command"),
        ("exec 'unterminated", "cannot split exec command"),
    ],
)
def test_bad_exec_actions_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_action(text)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("reboot", "unknown action 'reboot'"),
        ("LOG", "unknown action 'LOG'"),
        ("sh -c 'rm -rf /'", "unknown action 'sh'"),
        ("", "expected an action string"),
        ("   ", "expected an action string"),
        (None, "expected an action string"),
        (["log"], "expected an action string"),
    ],
)
def test_unknown_or_non_string_actions_are_refused(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        v.parse_action(value)


@pytest.mark.parametrize(
    "text",
    [
        "log",
        "signal SIGUSR1",
        "reclaim 64MiB",
        "set memory.high 1.5GiB",
        "set memory.high -10%",
        "set memory.max +2.5%",
        "set cpu.weight 20",
        "set cpu.max 150%",
        "freeze 5s",
        "thaw",
        "kill",
        "exec logger -t gov 'memory stall'",
        "restart",
    ],
)
def test_canonical_action_strings_are_fixed_points(text: str) -> None:
    action = v.parse_action(text)
    assert str(action) == text
    assert v.parse_action(str(action)) == action
    assert v.parse_action(action) is action


@given(st.text(max_size=40))
def test_parse_action_raises_only_value_error(text: str) -> None:
    try:
        action = v.parse_action(text)
    except ValueError:
        return
    assert v.parse_action(str(action)) == action


@given(
    st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1), min_size=1)
)
def test_exec_argv_round_trips_through_its_canonical_string(argv: list[str]) -> None:
    action = v.Action("exec", argv=tuple(argv))
    assert v.parse_action(str(action)).argv == tuple(argv)


def test_a_system_trigger_is_the_boards_pressure() -> None:
    t = v.parse_trigger("system memory full 100ms/1s")
    assert t.system and t.resource == "memory" and t.kind == "full"
    assert str(t) == "system memory full 100ms/1s"
    assert v.parse_trigger(str(t)) == t
    assert not v.parse_trigger("memory full 100ms/1s").system
    # cpu "full" exists for the whole system only (5.13+), never for a cgroup
    assert v.parse_trigger("system cpu full 100ms/1s").system
    with pytest.raises(ValueError, match="cpu full"):
        v.parse_trigger("cpu full 100ms/1s")


def test_board_triggers_are_the_boards_psi_and_memavailable_kept_as_written() -> None:
    """Issue 23's spelling: "board memory some 100ms/1s" is the root's PSI (as "system"),
    "board available < 200M" the MemAvailable floor; both print back as written."""
    psi = v.parse_condition("board memory some 100ms/1s")
    assert isinstance(psi, v.PsiTrigger) and psi.system
    assert str(psi) == "board memory some 100ms/1s"
    assert str(v.parse_condition("system memory some 100ms/1s")) == "system memory some 100ms/1s"
    floor = v.parse_condition("board available < 200M")
    assert isinstance(floor, v.MemAvailableCondition) and floor.below == 200 << 20
    assert str(floor) == "board available < 200MiB"
    assert str(v.parse_condition("memavailable < 200M")) == "memavailable < 200MiB"
    with pytest.raises(ValueError, match="board available < 200M"):
        v.parse_condition("board available > 200M")


def test_shed_is_an_action_without_argument() -> None:
    assert str(v.parse_action("shed")) == "shed"
    with pytest.raises(ValueError, match="takes no argument"):
        v.parse_action("shed background")
