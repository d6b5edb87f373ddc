"""Device memory from fdinfo (governor/kernel/devmem.py): the pure parsers on fdinfo text pasted
from the kernel's documentation and patches, the dedupe rules, and the reader on a tmp /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.kernel.cgroupfs import CgroupFs
from governor.kernel.devmem import (
    DeviceMemoryReader,
    DmaBuf,
    DrmClient,
    parse_dmabuf_fdinfo,
    parse_drm_fdinfo,
    parse_fdinfo,
    summarize,
    total,
)
from governor.kernel.procfs import ProcFs

# Documentation/gpu/panfrost.rst (v6.8), as printed
PANFROST = """\
pos:    0
flags:  02400002
mnt_id: 27
ino:    531
drm-driver:     panfrost
drm-client-id:  14
drm-engine-fragment:    1846584880 ns
drm-cycles-fragment:    1424359409
drm-maxfreq-fragment:   799999987 Hz
drm-curfreq-fragment:   799999987 Hz
drm-engine-vertex-tiler:        71932239 ns
drm-cycles-vertex-tiler:        52617357
drm-maxfreq-vertex-tiler:       799999987 Hz
drm-curfreq-vertex-tiler:       799999987 Hz
drm-total-memory:       290 MiB
drm-shared-memory:      0 MiB
drm-active-memory:      226 MiB
drm-resident-memory:    36496 KiB
drm-purgeable-memory:   128 KiB
"""

# panthor (RK3588's Mali-G610, mainline), as its maintainers posted it on dri-devel
PANTHOR = """\
drm-driver:     panthor
drm-client-id:  3
drm-engine-panthor:     611046570346 ns
drm-cycles-panthor:     1172733302061
drm-maxfreq-panthor:    1000000000 Hz
drm-curfreq-panthor:    1000000000 Hz
drm-total-memory:       16480 KiB
drm-shared-memory:      0
drm-active-memory:      16200 KiB
drm-internal-memory:    10396 KiB
drm-resident-memory:    26876 KiB
drm-purgeable-memory:   0
"""

# i915 (the drm-usage-stats example, as in proc_pid_fdinfo(5))
I915 = """\
pos:    0
flags:  02100002
mnt_id: 26
ino:    284
drm-driver:     i915
drm-client-id:  39
drm-pdev:       0000:00:02.0
drm-total-system0:      6044 KiB
drm-shared-system0:     0
drm-active-system0:     0
drm-resident-system0:   6044 KiB
drm-purgeable-system0:  1688 KiB
drm-total-stolen-system0:       0
drm-shared-stolen-system0:      0
drm-active-stolen-system0:      0
drm-resident-stolen-system0:    0
drm-purgeable-stolen-system0:   0
drm-engine-render:      346249 ns
drm-engine-copy:        0 ns
drm-engine-video:       0 ns
drm-engine-capacity-video:      2
drm-engine-video-enhance:       0 ns
"""

# amdgpu after "drm/amdgpu: Use drm_print_memory_stats helper" (with the old alias kept)
AMDGPU = """\
pos:\t0
flags:\t02100002
mnt_id:\t24
ino:\t1239
drm-driver:\tamdgpu
drm-client-id:\t4
drm-pdev:\t0000:04:00.0
pasid:\t32771
drm-total-cpu:\t0
drm-shared-cpu:\t0
drm-active-cpu:\t0
drm-resident-cpu:\t0
drm-purgeable-cpu:\t0
drm-total-gtt:\t2392 KiB
drm-shared-gtt:\t0
drm-active-gtt:\t0
drm-resident-gtt:\t2392 KiB
drm-purgeable-gtt:\t0
drm-total-vram:\t44564 KiB
drm-shared-vram:\t31952 KiB
drm-active-vram:\t0
drm-resident-vram:\t44564 KiB
drm-purgeable-vram:\t0
drm-memory-vram:\t44564 KiB
drm-memory-gtt: \t2392 KiB
drm-memory-cpu: \t0 KiB
amd-memory-visible-vram:\t44564 KiB
amd-evicted-vram:\t0 KiB
amd-evicted-visible-vram:\t0 KiB
amd-requested-vram:\t44564 KiB
amd-requested-visible-vram:\t11952 KiB
amd-requested-gtt:\t2392 KiB
drm-engine-compute:\t46464671 ns
"""

# amdgpu before 6.9: only the deprecated drm-memory-<region> (= resident)
AMDGPU_OLD = """\
pos:\t0
flags:\t02100002
mnt_id:\t26
ino:\t1099
drm-driver:\tamdgpu
drm-client-id:\t460
drm-pdev:\t0000:0a:00.0
drm-memory-vram:\t524288 KiB
drm-memory-gtt:\t12288 KiB
drm-engine-gfx:\t25123456789 ns
"""

# the vendor rknpu driver has no show_fdinfo: its DRM fd prints the generic lines only
RKNPU = "pos:\t0\nflags:\t02100002\nmnt_id:\t23\nino:\t412\n"

# a PRIME-exported vgem dumb buffer in the kernel guest (6.1), 16 MiB
DMABUF = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2051\nsize:\t16777216\ncount:\t1\nexp_name:\tdrm\n"


def test_panfrost_total_is_taken_in_bytes() -> None:
    c = parse_drm_fdinfo(PANFROST)
    assert c == DrmClient(driver="panfrost", client_id=14, pdev=None, regions={"memory": 290 << 20})


def test_panthor_internal_memory_is_not_a_region_kind_and_total_wins() -> None:
    c = parse_drm_fdinfo(PANTHOR)
    assert c is not None and c.regions == {"memory": 16480 << 10}


def test_i915_regions_include_stolen_memory_and_zero_without_unit() -> None:
    c = parse_drm_fdinfo(I915)
    assert c is not None
    assert c.regions == {"system0": 6044 << 10, "stolen-system0": 0}
    assert c.key() == ("i915", "0000:00:02.0", 39)


def test_amdgpu_total_wins_over_the_deprecated_alias() -> None:
    c = parse_drm_fdinfo(AMDGPU)
    assert c is not None
    assert c.regions == {"cpu": 0, "gtt": 2392 << 10, "vram": 44564 << 10}


def test_amdgpu_old_alias_is_used_when_there_is_no_total() -> None:
    c = parse_drm_fdinfo(AMDGPU_OLD)
    assert c is not None and c.regions == {"vram": 524288 << 10, "gtt": 12288 << 10}


def test_rknpu_and_regular_files_are_not_device_memory() -> None:
    assert parse_fdinfo(RKNPU) is None
    assert parse_fdinfo("pos:\t4096\nflags:\t0100000\nmnt_id:\t28\nino:\t3141\n") is None


def test_xe_cycle_counters_are_not_memory() -> None:
    text = "drm-driver:\txe\ndrm-client-id:\t9\ndrm-total-cycles-rcs:\t123\ndrm-resident-vram0:\t512 MiB\n"
    c = parse_drm_fdinfo(text)
    assert c is not None and c.regions == {"vram0": 512 << 20}


def test_dmabuf_fdinfo() -> None:
    assert parse_fdinfo(DMABUF) == DmaBuf(ino=2051, size=16 << 20, exporter="drm")


def test_malformed_amount_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="drm-total-memory"):
        parse_drm_fdinfo("drm-driver: panfrost\ndrm-total-memory: lots\n")
    with pytest.raises(ValueError, match="dma-buf"):
        parse_dmabuf_fdinfo("size:\tx\nexp_name:\tdrm\nino:\t1\n")


def test_shared_buffers_and_clients_are_counted_once() -> None:
    buf = parse_dmabuf_fdinfo(DMABUF)
    other = DmaBuf(ino=2052, size=8 << 20, exporter="drm")
    panfrost = parse_drm_fdinfo(PANFROST)
    assert buf is not None and panfrost is not None
    # the same buffer under three fds (dup, mmap, a forked child), the same client twice
    s = summarize([buf, buf, other, buf, panfrost, panfrost])
    assert s == {("drm", "dma-buf"): 24 << 20, ("panfrost", "memory"): 290 << 20}
    # with a driver that prints its memory, PRIME exports are in its drm-total already
    assert total(s) == 290 << 20
    # without one (rknpu, vgem on 6.1) the dma-bufs are all there is
    assert total(summarize([buf, other])) == 24 << 20


def test_clients_without_an_id_are_not_merged() -> None:
    a = DrmClient(driver="x", client_id=None, pdev=None, regions={"memory": 1})
    assert summarize([a, a]) == {("x", "memory"): 2}


def _proc_tree(tmp_path: Path) -> tuple[CgroupFs, ProcFs]:
    cg = tmp_path / "cg"
    (cg / "g" / "engine").mkdir(parents=True)
    (cg / "g" / "cgroup.procs").write_text("")
    (cg / "g" / "engine" / "cgroup.procs").write_text("100\n101\n")
    proc = tmp_path / "proc"
    for pid, files in {
        100: {"3": DMABUF, "4": DMABUF, "5": PANTHOR, "6": RKNPU},
        101: {"7": DMABUF, "8": PANTHOR},  # the child: inherited fds
        200: {"3": PANFROST},  # outside the group
    }.items():
        (proc / str(pid) / "fdinfo").mkdir(parents=True)
        for fd, text in files.items():
            (proc / str(pid) / "fdinfo" / fd).write_text(text)
    return CgroupFs(cg), ProcFs(proc)


def test_reader_sums_a_group_and_its_descendants_once(tmp_path: Path) -> None:
    fs, proc = _proc_tree(tmp_path)
    reader = DeviceMemoryReader(fs, proc)
    assert sorted(reader.pids("g")) == [100, 101]
    assert reader.group("g") == {("drm", "dma-buf"): 16 << 20, ("panthor", "memory"): 16480 << 10}


def test_reader_of_a_gone_group_is_empty(tmp_path: Path) -> None:
    fs, proc = _proc_tree(tmp_path)
    assert DeviceMemoryReader(fs, proc).group("nope") == {}
