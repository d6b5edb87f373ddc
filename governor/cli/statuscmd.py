"""`governor status` on the lean path (governor/main.py): the calls and the output of
governor/cli/operate.py status, without typer and click."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from governor import log
from governor.api import operate as api_operate
from governor.operate import status as rendering


def status(*, debug: bool, root: str, name: str | None, as_json: bool, prune: bool) -> int:
    """Print the governed slices' status (``as_json``: the stable JSON form); 0, or raises the
    GovernorError typer's path would (66: ``name`` not governed here)."""
    log.configure(debug=debug)
    items = api_operate.status(name, prune=prune, root=Path(root))
    sys.stdout.write(json.dumps(items, indent=2) + "\n" if as_json else rendering.render(items))
    return 0
