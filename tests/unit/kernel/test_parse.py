"""Pure parsers of kernel text, tested with output pasted from real machines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor.kernel.parse import (
    Mount,
    Psi,
    PsiLine,
    format_cpu_max,
    format_cpulist,
    format_max,
    parse_controllers,
    parse_cpu_max,
    parse_cpulist,
    parse_flat_keyed,
    parse_max,
    parse_meminfo,
    parse_mountinfo,
    parse_psi,
)

# --- cpulist -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,6\n", (0, 1, 2, 3, 6)),
        ("", ()),
        ("\n", ()),
        ("0\n", (0,)),
        ("4-7", (4, 5, 6, 7)),
        ("6,0-3,2", (0, 1, 2, 3, 6)),
        ("0-1,4-5\n", (0, 1, 4, 5)),
    ],
)
def test_parse_cpulist_accepts_kernel_lists(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", "1 2", "0-3:2/4", "+1"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="cpulist"):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [([], ""), ([0], "0"), ([0, 1], "0-1"), ([6, 0, 1, 2, 3, 3], "0-3,6"), ([1, 3, 5], "1,3,5")],
)
def test_format_cpulist_prints_like_the_kernel(cpus: list[int], text: str) -> None:
    assert format_cpulist(cpus) == text


def test_format_cpulist_rejects_negative_cpus() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_cpulist([-1, 0])


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_cpulist_round_trips_from_sets(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == tuple(sorted(cpus))


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_format_cpulist_is_canonical(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert format_cpulist(parse_cpulist(text + "\n")) == text


# --- max -----------------------------------------------------------------------------------------


def test_parse_max_reads_max_as_none_and_numbers_as_int() -> None:
    assert parse_max("max\n") is None
    assert parse_max("123\n") == 123
    assert parse_max("0") == 0


@pytest.mark.parametrize("text", ["", "-1", "MAX", "1.5", "12k", "1_000", "max max"])
def test_parse_max_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_max(text)


def test_format_max_is_the_inverse_of_parse_max() -> None:
    assert format_max(None) == "max"
    assert format_max(1073741824) == "1073741824"
    with pytest.raises(ValueError):
        format_max(-1)


@given(st.one_of(st.none(), st.integers(min_value=0, max_value=2**63)))
def test_max_round_trips(value: int | None) -> None:
    assert parse_max(format_max(value)) == value


def test_parse_cpu_max_reads_quota_and_period() -> None:
    assert parse_cpu_max("max 100000\n") == (None, 100000)
    assert parse_cpu_max("350000 100000\n") == (350000, 100000)
    assert format_cpu_max(350000, 100000) == "350000 100000"
    assert format_cpu_max(None, 100000) == "max 100000"


@pytest.mark.parametrize("text", ["max", "", "100000 0", "1 2 3", "max max"])
def test_parse_cpu_max_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match=r"cpu\.max|limit"):
        parse_cpu_max(text)


# --- flat keyed / controllers ----------------------------------------------------------------


def test_parse_flat_keyed_reads_memory_events() -> None:
    text = "low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n"
    assert parse_flat_keyed(text) == {
        "low": 0,
        "high": 12,
        "max": 3,
        "oom": 1,
        "oom_kill": 1,
        "oom_group_kill": 0,
    }


def test_parse_flat_keyed_reads_cpu_stat_and_cgroup_events() -> None:
    cpu_stat = (
        "usage_usec 2384911\nuser_usec 1788213\nsystem_usec 596698\n"
        "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
    )
    assert parse_flat_keyed(cpu_stat)["usage_usec"] == 2384911
    assert parse_flat_keyed("populated 1\nfrozen 0\n") == {"populated": 1, "frozen": 0}


@pytest.mark.parametrize("text", ["anon\n", "anon 1 2\n", "anon x\n", "a 1\na 2\n"])
def test_parse_flat_keyed_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="flat keyed"):
        parse_flat_keyed(text)


def test_parse_controllers_splits_names() -> None:
    text = "cpuset cpu io memory hugetlb pids rdma misc\n"
    assert parse_controllers(text) == frozenset(
        {"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"}
    )
    assert parse_controllers("") == frozenset()


def test_parse_controllers_rejects_write_syntax() -> None:
    with pytest.raises(ValueError, match="controller"):
        parse_controllers("+memory -cpu")


# --- PSI -----------------------------------------------------------------------------------------


def test_parse_psi_reads_some_and_full() -> None:
    text = (
        "some avg10=0.64 avg60=1.42 avg300=1.65 total=8896710\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert parse_psi(text) == Psi(
        some=PsiLine(0.64, 1.42, 1.65, 8896710), full=PsiLine(0.0, 0.0, 0.0, 0)
    )


def test_parse_psi_allows_missing_full_line_of_old_cpu_pressure() -> None:
    psi = parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert psi.full is None
    assert psi.some.total == 0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        "some avg10=0.00 avg60=0.00 total=0\n",
        "some avg10=x avg60=0.00 avg300=0.00 total=0\n",
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=-1\n",
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0 extra=1\n",
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nsome avg10=0 avg60=0 avg300=0 total=0\n",
        "half avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    ],
)
def test_parse_psi_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="psi"):
        parse_psi(text)


# --- mountinfo -------------------------------------------------------------------------------


def test_parse_mountinfo_reads_optional_fields_and_super_options() -> None:
    text = (
        "32 22 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - "
        "cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
    )
    assert parse_mountinfo(text) == [
        Mount(
            mount_id=32,
            parent_id=22,
            major_minor="0:28",
            root="/",
            mount_point="/sys/fs/cgroup",
            options=("rw", "nosuid", "nodev", "noexec", "relatime"),
            optional_fields=("shared:9",),
            fstype="cgroup2",
            source="cgroup2",
            super_options=("rw", "nsdelegate", "memory_recursiveprot"),
        )
    ]


def test_parse_mountinfo_reads_lines_without_optional_fields() -> None:
    # this machine: no shared: tags, v1 controller in the super options
    (mount,) = parse_mountinfo("32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu")
    assert mount.optional_fields == ()
    assert mount.fstype == "cgroup"
    assert mount.super_options == ("rw", "cpu")


def test_parse_mountinfo_unescapes_octal_in_paths() -> None:
    text = (
        "62 28 8:17 /a\\134b /media/usb\\040stick rw shared:33 master:2 - vfat /dev/sdb\\0401 rw\n"
    )
    (mount,) = parse_mountinfo(text)
    assert mount.mount_point == "/media/usb stick"
    assert mount.root == "/a\\b"
    assert mount.source == "/dev/sdb 1"
    assert mount.optional_fields == ("shared:33", "master:2")


def test_parse_mountinfo_skips_blank_lines() -> None:
    assert parse_mountinfo("\n") == []


@pytest.mark.parametrize(
    "text",
    [
        "22 27 0:21 / /proc rw,relatime proc proc rw\n",
        "22 27 0:21 / /proc rw,relatime - proc proc\n",
        "x 27 0:21 / /proc rw,relatime - proc proc rw\n",
    ],
)
def test_parse_mountinfo_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="mountinfo"):
        parse_mountinfo(text)


# --- meminfo -------------------------------------------------------------------------------------


def test_parse_meminfo_converts_kb_to_bytes_and_keeps_unitless_counts() -> None:
    text = (
        "MemTotal:        2013492 kB\n"
        "MemAvailable:    1544716 kB\n"
        "Active(anon):       1532 kB\n"
        "HugePages_Total:       0\n"
        "Hugepagesize:       2048 kB\n"
    )
    assert parse_meminfo(text) == {
        "MemTotal": 2013492 * 1024,
        "MemAvailable": 1544716 * 1024,
        "Active(anon)": 1532 * 1024,
        "HugePages_Total": 0,
        "Hugepagesize": 2048 * 1024,
    }


@pytest.mark.parametrize("text", ["MemTotal 1 kB\n", "MemTotal: 1 MB\n", "MemTotal: x kB\n"])
def test_parse_meminfo_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="meminfo"):
        parse_meminfo(text)
