"""What a run counts: rounds, drafted and accepted tokens, times, and where each emitted token came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

from .lookup_first import FROM_DRAFT, FROM_LOOKUP, FROM_TARGET


@dataclass
class DecoderStats:
    """Counts of one ``generate``/``stream`` call.

    ``accepted_hist[n]`` counts rounds that accepted n drafts;
    ``position_drafted[i]`` / ``position_accepted[i]`` count rounds that
    drafted / accepted draft position i (0-based); ``k_hist[k]`` rounds that
    drafted k tokens; ``stop_reasons`` why drafting stopped in rounds that
    asked for tokens; ``from_draft[i]`` whether emitted token i was a draft
    token the target accepted (1), a lookup's (2) or the target's own (0):
    its provenance.
    """

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    finish_reason: Optional[str] = None
    accepted_hist: List[int] = field(default_factory=list)
    position_drafted: List[int] = field(default_factory=list)
    position_accepted: List[int] = field(default_factory=list)
    k_hist: Dict[int, int] = field(default_factory=dict)
    stop_reasons: Dict[str, int] = field(default_factory=dict)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    first_target_seconds: float = 0.0  # the first round's, which also evaluates the prompt
    verify_seconds: float = 0.0
    warp_seconds: float = 0.0  # the target's rows made into its sampler's law (sampling only)
    # the draft's forwards run to learn it, not to draft: its reading of a prompt scored against the
    # target's rows, batches timed before a long catch-up (what k="auto" pays to know the draft)
    measure_seconds: float = 0.0
    from_draft: bytearray = field(default_factory=bytearray)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per round."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def position_acceptance(self) -> List[float]:
        """Per draft position: accepted / drafted."""
        return [a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted)]

    def record(self, drafted: int, accepted: int, stop: Optional[str] = None,
               seconds: Tuple[float, float] = (0.0, 0.0)) -> None:
        """Add one round that drafted ``drafted`` and accepted ``accepted``;
        ``stop``: why drafting stopped (rounds that asked for tokens);
        ``seconds``: its draft's and its target's time (the first round's
        target time is also kept apart: it evaluated the prompt too)."""
        if self.rounds == 0:
            self.first_target_seconds = seconds[1]
        self.draft_seconds += seconds[0]
        self.target_seconds += seconds[1]
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        for lst, n in ((self.accepted_hist, accepted + 1), (self.position_drafted, drafted),
                       (self.position_accepted, accepted)):
            if len(lst) < n:
                lst.extend([0] * (n - len(lst)))
        self.accepted_hist[accepted] += 1
        for i in range(drafted):
            self.position_drafted[i] += 1
        for i in range(accepted):
            self.position_accepted[i] += 1
        self.k_hist[drafted] = self.k_hist.get(drafted, 0) + 1
        if stop is not None:
            self.stop_reasons[stop] = self.stop_reasons.get(stop, 0) + 1

    def emit(self, source: int) -> None:
        """Count one emitted token and where it came from (FROM_TARGET, FROM_DRAFT or FROM_LOOKUP)."""
        self.emitted += 1
        self.from_draft.append(int(source))

    def by_source(self) -> Dict[str, int]:
        """Emitted tokens per source: ``{"target": n, "draft": n, "lookup": n}``."""
        return {name: self.from_draft.count(i) for i, name in SOURCES.items()}

    def as_dict(self) -> dict:
        """Plain dict of every count and derived rate (for JSON output;
        provenance goes out per token, as :func:`sources`)."""
        return {
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "emitted": self.emitted, "finish_reason": self.finish_reason,
            "acceptance_rate": self.acceptance_rate, "mean_accepted": self.mean_accepted,
            "accepted_hist": list(self.accepted_hist), "position_acceptance": self.position_acceptance,
            "position_drafted": list(self.position_drafted), "position_accepted": list(self.position_accepted),
            "k_hist": dict(sorted(self.k_hist.items())), "stop_reasons": dict(self.stop_reasons),
            "draft_seconds": self.draft_seconds, "target_seconds": self.target_seconds,
            "first_target_seconds": self.first_target_seconds, "verify_seconds": self.verify_seconds,
            "warp_seconds": self.warp_seconds, "measure_seconds": self.measure_seconds,
            "tokens_by_source": self.by_source(),
        }


SOURCES = {FROM_TARGET: "target", FROM_DRAFT: "draft", FROM_LOOKUP: "lookup"}


def sources(from_draft: bytes) -> List[str]:
    """Provenance as the API shows it: ``"draft"`` for a draft model's token the
    target accepted, ``"lookup"`` for a lookup's, ``"target"`` for one the
    target produced."""
    return [SOURCES[f] for f in from_draft]


def hand_out(stats: DecoderStats, tokens: Sequence[int], n_draft: int, source: int, stops: FrozenSet[int],
             budget: int) -> Iterator[int]:
    """A round's ``tokens`` one by one, each counted in ``stats`` (the first
    ``n_draft`` from ``source``, the last the target's own); ends after a stop
    token (``finish_reason`` "stop") or the ``budget``-th token ("length").
    The decoder and the engine's requests hand out their tokens through it."""
    for i, t in enumerate(tokens):
        stats.emit(source if i < n_draft else FROM_TARGET)
        yield t
        if t in stops:
            stats.finish_reason = "stop"
            return
        if stats.emitted >= budget:
            stats.finish_reason = "length"
            return
