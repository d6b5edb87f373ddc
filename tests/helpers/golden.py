"""Golden files: compared, and rewritten only where a person asked for it and will review it.

``GOVERNOR_UPDATE_GOLDEN=1`` rewrites the goldens a test compares with (then review the diff).
Under CI (``CI=true``, tests/vm/skips.py is_ci) a golden is never rewritten: a rewrite would
make the comparison pass whatever the code printed, so asking for one there fails the test.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest
from vm.skips import is_ci

UPDATE_VAR = "GOVERNOR_UPDATE_GOLDEN"


def update_requested(environ: Mapping[str, str] | None = None) -> bool:
    """True when goldens may be rewritten: GOVERNOR_UPDATE_GOLDEN=1 outside CI. Under CI the
    request fails the calling test (pytest.fail), before anything is written."""
    env = os.environ if environ is None else environ
    if env.get(UPDATE_VAR) != "1":
        return False
    if is_ci(env):
        pytest.fail(
            f"{UPDATE_VAR}=1 under CI={env.get('CI')}: CI compares goldens, it never rewrites"
            " them; regenerate them on a workstation and commit the reviewed diff",
            pytrace=False,
        )
    return True
