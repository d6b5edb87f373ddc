"""Pure rule evaluation: observations + state + the time you pass in -> rule firings.

No I/O, no clock: :meth:`RuleEngine.step` takes ``now`` and what the sources saw since the last
step. A rule is *evidenced* by its source (a PSI trigger event, a sample where the level
condition holds, a memory.events counter that went up); it is *active* from the first evidence
until the evidence stops (a PSI trigger fires at most once per window while its threshold is
exceeded, so an episode lasts while events keep coming within ``2.5 x window + 1 s``, and
it began one window before its first event); it *fires* on evidence once it has been active
for ``for`` (hold) and its cooldown has passed.

Without a cooldown a PSI or event rule fires on every piece of evidence (the kernel already
limits a trigger to one event per window), and a level rule (leak, memavailable, headroom,
device memory, refaults) fires once per episode. Rules that fire in the same step fire in
policy order, so a ladder written from mild to severe (log -> reclaim -> set -> freeze ->
kill) escalates in order as pressure rises.

Which of these a rule is (its ``semantics``) and the function that reads its evidence are its
kind's row in monitor/triggers.py; the built-in kinds' evidence functions are below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from governor.monitor import triggers
from governor.plan.model import Action, WatchRule, WatchTrigger
from governor.record import field, record

# a PSI episode ends when no trigger event came for this many windows (+ PSI_GRACE_S)
PSI_GAP_WINDOWS = 2.5
PSI_GRACE_S = 1.0


@record(frozen=True)
class Rule:
    """A WatchRule as the engine uses it."""

    index: int
    kind: str  # a kind of monitor/triggers.py
    when: str
    actions: tuple[Action, ...]
    hold_s: float = 0.0
    cooldown_s: float | None = None
    window_s: float = 0.0  # PSI: the trigger window
    # leak: bytes/s, device: bytes (fire above); memavailable: bytes (below); headroom: the
    # slice's claimed peak (fire when the board's spare memory is below peak - memory.current);
    # refaults: the share of the file cache in 1/100 of a percent (fire above); board_file:
    # bytes, the model's size (fire below)
    threshold: int = 0
    event: str | None = None  # event: the memory.events key

    @classmethod
    def from_watch(cls, w: WatchRule, peak: int | None = None) -> Rule:
        """``peak``: the engine's estimate at launch, the claimed peak of a headroom rule in
        place of the plan's (memory.max, else memory.high)."""
        t = w.trigger
        common = {
            "index": w.index,
            "when": w.when,
            "actions": w.actions,
            "hold_s": w.hold_s or 0.0,
            "cooldown_s": w.cooldown_s,
        }
        if isinstance(t, WatchTrigger):
            return cls(kind="psi", window_s=t.window_us / 1e6, **common)  # type: ignore[arg-type]  # keys above
        return cls(
            kind=t.condition,
            threshold=peak if triggers.row(t.condition).peak and peak else t.threshold,
            window_s=t.window_s or 0.0,
            event=t.event,
            **common,  # type: ignore[arg-type]  # keys above
        )


@record(frozen=True)
class Observations:
    """What the sources saw since the last step."""

    psi: frozenset[int] = frozenset()  # indexes of rules whose trigger fired
    counters: Mapping[str, int] = field(default_factory=dict)  # memory.events increases
    memavailable: int | None = None  # bytes, when sampled this step
    # bytes: MemAvailable less the group's page cache its memory.min protects (board available)
    available: int | None = None
    # bytes: board available less the board's reserve (what the slice may still grow into)
    spare: int | None = None
    current: int | None = None  # the group's memory.current, when sampled this step
    leak: Mapping[int, float] = field(default_factory=dict)  # rule index -> slope B/s
    device: int | None = None  # the group's device memory (kernel/devmem.py total), when sampled
    # rule index -> refaulted share of the file cache over the rule's window (percent)
    refaults: Mapping[int, float] = field(default_factory=dict)
    board_file: int | None = None  # bytes: the board's file LRUs (/proc/meminfo), when sampled
    # a plug-in source's level by its name (monitor/triggers.py SAMPLERS), when sampled
    extra: Mapping[str, int | float | None] = field(default_factory=dict)


@record(frozen=True)
class Firing:
    rule: Rule
    now: float
    active_s: float  # how long the condition had held
    value: float | int | None  # the level / counter increase that fired it


@record
class _State:
    since: float | None = None  # episode start
    last_evidence: float | None = None
    last_fired: float | None = None
    fired_in_episode: bool = False
    fired: int = 0


class RuleEngine:
    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = tuple(sorted(rules, key=lambda r: r.index))
        self._state = {r.index: _State() for r in self.rules}
        # each rule's row: how its evidence is read and what an episode is (monitor/triggers.py)
        self._evidence: dict[int, Evidence] = {
            r.index: triggers.load(triggers.row(r.kind).evidence) for r in self.rules
        }
        self._semantics = {r.index: triggers.row(r.kind).semantics for r in self.rules}

    def fired_counts(self) -> dict[int, int]:
        return {i: s.fired for i, s in self._state.items()}

    def active(self, index: int) -> bool:
        return self._state[index].since is not None

    def quiet(self, index: int, now: float, for_s: float) -> bool:
        """No episode running and no evidence for ``for_s`` (a shed is undone then)."""
        st = self._state[index]
        return st.since is None and (st.last_evidence is None or now - st.last_evidence >= for_s)

    def describe(self, now: float) -> list[dict[str, Any]]:
        """Each rule's state at ``now`` (same clock as step()): ``armed`` (no evidence),
        ``holding`` (evidence, its ``for`` not reached: ``hold_until``), ``active`` (would fire
        on the next evidence), ``cooling down`` (fired, ``cooldown_until`` not reached); with
        the actions it takes when it fires next."""
        out: list[dict[str, Any]] = []
        for rule in self.rules:
            st = self._state[rule.index]
            item: dict[str, Any] = {
                "rule": rule.index,
                "when": rule.when,
                "fired": st.fired,
                "next_actions": [str(a) for a in rule.actions],
                "since": st.since,
                "last_fired": st.last_fired,
            }
            if st.since is None:
                state = "armed"
            elif now - st.since + 1e-9 < rule.hold_s:
                state = "holding"
                item["hold_until"] = st.since + rule.hold_s
            else:
                state = "active"
            cooling = rule.cooldown_s is not None and st.last_fired is not None
            if cooling and now - st.last_fired < rule.cooldown_s:  # type: ignore[operator]  # both set
                state = "cooling down"
                item["cooldown_until"] = st.last_fired + rule.cooldown_s  # type: ignore[operator]
            item["state"] = state
            out.append(item)
        return out

    def step(self, now: float, obs: Observations) -> list[Firing]:
        out: list[Firing] = []
        for rule in self.rules:
            st = self._state[rule.index]
            evidence, value, ended = self._evidence[rule.index](rule, st, now, obs)
            if ended:
                st.since = None
                st.fired_in_episode = False
            if not evidence:
                continue
            if st.since is None:
                # a trigger event says the stall held over the window that just ended
                psi = self._semantics[rule.index] == "psi"
                st.since = now - rule.window_s if psi else now
            st.last_evidence = now
            held = now - st.since
            if held + 1e-9 < rule.hold_s:
                continue
            if rule.cooldown_s is not None:
                if st.last_fired is not None and now - st.last_fired < rule.cooldown_s - 1e-9:
                    continue
            elif self._semantics[rule.index] == "level" and st.fired_in_episode:
                continue
            st.last_fired = now
            st.fired_in_episode = True
            st.fired += 1
            out.append(Firing(rule, now, held, value))
        return out


# the evidence of one rule at one step: (evidence this step, its value, whether the running
# episode ended); one function per trigger kind, named by its row in monitor/triggers.py
Verdict = tuple[bool, float | int | None, bool]
Evidence = Callable[[Rule, _State, float, Observations], Verdict]


def psi_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    gap = PSI_GAP_WINDOWS * rule.window_s + PSI_GRACE_S
    stale = st.last_evidence is not None and now - st.last_evidence > gap
    return rule.index in obs.psi, None, st.since is not None and stale


def event_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    assert rule.event is not None
    n = obs.counters.get(rule.event, 0)
    # an event has no duration: each increase is its own episode
    return n > 0, n, True


def _below(got: int | None, threshold: int) -> Verdict:
    if got is None:
        return False, None, False
    below = got < threshold
    return below, got, not below


def memavailable_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    return _below(obs.memavailable, rule.threshold)


def available_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    return _below(obs.available, rule.threshold)


def headroom_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    if obs.spare is None or obs.current is None:
        return False, None, False
    # what the slice is known to still need: its claimed peak less what it holds
    short = obs.spare < max(0, rule.threshold - obs.current)
    return short, obs.spare, not short


def board_file_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    if obs.board_file is None:
        return False, None, False
    below = obs.board_file < rule.threshold
    return below, obs.board_file, not below


def device_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    if obs.device is None:
        return False, None, False
    above = obs.device > rule.threshold
    return above, obs.device, not above


def refaults_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    share = obs.refaults.get(rule.index)
    if share is None:
        return False, None, False
    above = share * 100 > rule.threshold  # threshold in 1/100 %
    return above, round(share, 1), not above


def leak_evidence(rule: Rule, st: _State, now: float, obs: Observations) -> Verdict:
    slope = obs.leak.get(rule.index)
    if slope is None:
        return False, None, False
    above = slope > rule.threshold
    return above, round(slope, 1), not above
