"""`governor` run in-process, as the console script runs it (governor.cli.app.main)."""

from __future__ import annotations

import pytest

from governor.cli.app import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """main(argv) -> (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    code = info.value.code
    assert isinstance(code, int)
    return code, out, err
