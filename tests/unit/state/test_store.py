"""The state directory's per-model store (governor/state/store.py, issue 45 item 3 + issue 46
item 1): one identity per model file that survives a copy, a move and a reboot, one entry per
model holding both its learned peaks and its measured load, written under a lock with a
deadline. Needs: a tmp directory (no kernel)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from governor.state import store
from governor.state.costs import Cost, CostBook
from governor.state.peaks import learned, peak_key, record_peak
from governor.state.store import LockBusy, Store, model_identity, state_dir

MIB = 1 << 20


def test_the_state_dir_is_the_env_else_var_lib_for_root_else_xdg_state(tmp_path: Path) -> None:
    assert state_dir({"GOVERNOR_STATE_DIR": "/x"}) == Path("/x")
    assert state_dir({}, euid=0) == Path("/var/lib/governor")
    assert state_dir({"XDG_STATE_HOME": "/h/s"}, euid=1000) == Path("/h/s/governor")


def test_a_copy_or_a_move_is_the_same_model_other_content_is_another(tmp_path: Path) -> None:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    ident = model_identity(m)
    assert ident is not None and ident.startswith(f"{m.stat().st_size}-")
    copy = tmp_path / "sub" / "copy.gguf"
    copy.parent.mkdir()
    shutil.copyfile(m, copy)  # a new inode and mtime
    os.utime(copy, ns=(1, 2_000_000_000))
    assert copy.stat().st_ino != m.stat().st_ino and model_identity(copy) == ident
    moved = tmp_path / "moved.gguf"
    m.rename(moved)
    assert model_identity(moved) == ident
    moved.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 64)  # same size, other content
    assert model_identity(moved) not in (None, ident)
    assert model_identity(tmp_path / "gone.gguf") is None
    os.mkfifo(tmp_path / "fifo")
    assert model_identity(tmp_path / "fifo") is None and model_identity(tmp_path) is None


def test_a_model_has_one_entry_with_its_peaks_and_its_load(tmp_path: Path) -> None:
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF" * 64)
    key = peak_key(m, ["llama-server", "-m", str(m), "-c", "512"])
    ident = model_identity(m)
    assert key is not None and ident is not None and key.startswith(f"{ident} ")
    state = tmp_path / "state"
    record_peak(state, key, 300 * MIB, 280 * MIB)
    assert CostBook(state).record(ident, Cost(load_s=3.5, bytes=290 * MIB, at=1.0))
    record_peak(state, key, 310 * MIB, 280 * MIB)  # a later run keeps the load
    models, note = Store(state).read()
    assert note is None and list(models) == [ident]
    assert set(models[ident]) == {"at", "peaks", "load"}
    assert CostBook(state).get(ident) == Cost(load_s=3.5, bytes=290 * MIB, at=1.0)
    got, _ = learned(state, key)
    assert got is not None and got.text() == "peak 310 MiB (measured, 2 runs)"
    assert oct((state / store.FILE).stat().st_mode & 0o777) == "0o644"


def test_a_write_waits_for_the_lock_until_its_deadline_then_says_who_holds_it(
    tmp_path: Path,
) -> None:
    from governor.peer.lock import take

    tmp_path.joinpath("state").mkdir()
    held = os.fork()
    if held == 0:  # a child holds the lock (lockf: per process)
        fd = take(tmp_path / "state" / store.LOCK_FILE, deadline=time.monotonic() + 5)
        tmp_path.joinpath("taken").touch()
        time.sleep(30)
        os.close(fd)
        os._exit(0)
    try:
        for _ in range(500):
            if tmp_path.joinpath("taken").exists():
                break
            time.sleep(0.01)
        with pytest.raises(LockBusy):
            record_peak(tmp_path / "state", "k plan", MIB, None, lock_wait_s=0.1)
        assert not (tmp_path / "state" / store.FILE).exists()  # nothing half-written
    finally:
        os.kill(held, 9)
        os.waitpid(held, 0)


def test_an_untrusted_directory_is_neither_read_nor_written(tmp_path: Path) -> None:
    state = tmp_path / "state"
    record_peak(state, "k plan", MIB, None)
    os.chmod(state, 0o777)  # anyone could have written it
    got, note = learned(state, "k plan")
    assert got is None and note is not None and "only its owner" in note
    with pytest.raises(PermissionError):
        record_peak(state, "k plan", MIB, None)


def test_a_file_over_its_cap_drops_the_oldest_models_until_it_fits() -> None:
    plan = {"runs": [MIB], "estimate": None, "at": 1.0, "said": False}
    models = {
        f"m{i}": {"at": float(i), "peaks": {f"p{j}" + "x" * 4000: plan for j in range(8)}}
        for i in range(40)
    }
    raw = store.render(models)
    kept, note = store.parse(raw)
    assert len(raw) <= store.FILE_CAP and note is None
    assert 0 < len(kept) < 40 and "m39" in kept and "m0" not in kept
