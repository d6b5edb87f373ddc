"""A router child's model file from its command line (supervise/loads.py child_model): the
identity its load seconds are kept under (issue 46 item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from governor.supervise.loads import child_model

SERVER = b"/opt/llama/bin/llama-server\0"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (b"--alias\0a\0--model\0/m/a.gguf\0", "/m/a.gguf"),
        (b"-m\0/m/a.gguf\0--alias\0a\0", "/m/a.gguf"),
        (b"--model=/m/b.gguf\0", "/m/b.gguf"),
        (b"-m\0/m/a.gguf\0--model\0/m/c.gguf\0", "/m/c.gguf"),  # the last one wins
        (b"-m\0rel/a.gguf\0", "/proc/7/cwd/rel/a.gguf"),  # from the child's directory
        (b"-p\0--model\0", None),  # another option's value is no model
        (b"--alias\0a\0", None),
        (b"--\0-m\0/m/a.gguf\0", None),
    ],
)
def test_the_model_path_is_read_as_llama_server_reads_it(args: bytes, expected: str | None) -> None:
    got = child_model(SERVER + args, Path("/proc/7/cwd"))
    assert (None if got is None else str(got)) == expected
