"""Issue 46 item 5: an attached `governor monitor` publishes its router (RunState.router: the
url found in the engine's /proc command line and environment, the `unload` action's counts),
so `status`, /metrics and its own `unload` see it; the models' last requests stay a launch's
(the monitor places no model leaves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from governor.monitor.actions.base import Env
from governor.monitor.actions.unload import TOTALS, Unload
from governor.policy.values import parse_action
from governor.record import replace
from governor.rundir.journal import Journal
from governor.rundir.state import Publisher, RunState
from governor.supervise.monitor import _Published, router_url_of

from .fakekernel import FakeKernelCgroupFs
from .plans import make_plan
from .test_unload import CTX, FakeRouter, _router_state, launch_pid, router  # noqa: F401


def _proc(root: Path, pid: int, argv: list[str], env: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items()))


def test_the_router_url_is_read_from_the_engines_command_line_and_environment(
    tmp_path: Path,
) -> None:
    server = "/opt/llama/bin/llama-server"
    _proc(tmp_path, 10, [server, "--models-dir", "/m", "--port", "9001"])
    _proc(tmp_path, 11, [server, "--host", "0.0.0.0"], {"LLAMA_ARG_MODELS_DIR": "/m"})
    _proc(tmp_path, 12, [server, "-m", "/m/a.gguf", "--port", "9001"])  # one model: no router
    _proc(tmp_path, 13, ["/usr/bin/python3", "--models-dir", "/m"])
    _proc(tmp_path, 14, [server, "--models-dir", "/m", "--host", "/run/l.sock"])  # no TCP
    assert router_url_of(tmp_path, 10) == "http://127.0.0.1:9001"
    assert router_url_of(tmp_path, 11) == "http://127.0.0.1:8080"
    assert [router_url_of(tmp_path, p) for p in (12, 13, 14, 99)] == [None] * 4


class _Mon:
    def __init__(self, unloads: list[dict[str, Any]]) -> None:
        self.recent: list[Any] = []
        self.unloads = unloads

    def rule_states(self) -> list[Any]:
        return []

    def action_totals(self) -> list[dict[str, Any]]:
        return []

    def totals(self) -> dict[str, Any]:
        return {TOTALS: self.unloads}


def test_an_attached_monitor_publishes_its_routers_url_and_unloads(tmp_path: Path) -> None:
    plan = make_plan()
    proc = tmp_path / "proc"
    _proc(proc, 20, ["llama-server", "--models-preset", "/p.ini", "--port", "9002"])
    publisher = Publisher(tmp_path / "run", plan.policy)
    policy = tmp_path / "p.toml"
    policy.write_text("")
    state = _Published(plan, policy, None, publisher, lambda: [20], proc_root=proc)
    state.publish(_Mon([{"model": "a", "reason": "pressure", "count": 2}]))  # type: ignore[arg-type]
    published = publisher.read()
    assert published is not None and published.router == {
        "url": "http://127.0.0.1:9002",
        "models": {},
        "unloads": [{"model": "a", "reason": "pressure", "count": 2}],
    }
    assert RunState.read(published.to_json()).router == published.router
    nothing = _Published(plan, policy, None, publisher, lambda: [], proc_root=proc)
    nothing.publish(_Mon([]))  # type: ignore[arg-type]
    assert publisher.read().router is None  # type: ignore[union-attr]  # no engine: no router


def test_the_monitors_unload_takes_the_last_requests_of_a_launch_of_its_group(
    fake_fs: FakeKernelCgroupFs,
    tmp_path: Path,
    router: FakeRouter,  # noqa: F811
    launch_pid: int,  # noqa: F811
) -> None:
    """Its own state names the router but no model's last request: a live launch's of the
    same group orders the idle models (a, the least recently used); with none, its own url
    still reaches the router."""
    plan = make_plan()
    run = tmp_path / "run"
    own = replace(_router_state(plan, router.url, launch_pid), source="monitor")
    own = replace(own, router={"url": router.url, "models": {}, "unloads": []})
    Publisher(run, plan.policy).publish(own)
    handler = Unload(Env(fake_fs, plan, lambda: [], journal=Journal(run / plan.policy)))
    res = handler.run(parse_action("unload"), CTX)  # type: ignore[arg-type]
    assert res.ok and res.after["model"] == "a"  # by name: nothing says which is older
    router.models["a"] = "loaded"
    launched = replace(plan, policy="router-launch")
    last: dict[str, float | None] = {"a": 300.0, "b": 100.0, "c": 50.0}
    Publisher(run, launched.policy).publish(_router_state(launched, router.url, launch_pid, last))
    res = handler.run(parse_action("unload"), CTX)  # type: ignore[arg-type]
    assert res.ok and res.after["model"] == "b"  # the launch's: b is the least recently used
