"""How fast a pair decodes on this machine: plain decoding, each fixed draft
length K and ``k="auto"``, side by side, with the formula's ceiling.

What ``python -m specgguf bench`` runs and prints; ``bench/e2e.py`` reads
its figures through the same functions. Every configuration runs on every
prompt once per turn, the configurations in a different order each turn, so
a slow spell of the machine (they happen here: identical processes differ
by 20%) falls on all of them alike; a figure is the median over turns, in
tokens per second after the first token (the prompt's evaluation, the same
at every K, left out).

The ceiling is Leviathan et al.'s expected speed, E(K) / S(K), at each
K's acceptance per draft position and the forwards' seconds per round the same runs
measured (the draft's forwards and the target's batch of K + 1, against
plain decoding's single token; first rounds, which also read the prompt,
left out): what K would give if nothing but the forwards cost anything.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

from ..engine.calibration import ForwardCosts
from ..engine.acceptance import expected_tokens

K = Union[int, str]  # a draft length, or "auto"

PROMPTS = [
    "Write a detailed essay about the history of the printing press.",
    "Explain, step by step, how a bicycle stays upright while moving.",
    "Write a short story about a robot who learns to paint.",
]


def per_token_acceptance(stats_list: Sequence[dict]) -> float:
    """Accepted / verified draft positions (a rejection ends a round's verified positions)."""
    acc = sum(s["accepted"] for s in stats_list)
    verified = sum(min(s["drafted"], s["accepted"] + s["rounds"]) for s in stats_list)
    return acc / verified if verified else 0.0


def position_rates(stats_list: Sequence[dict], k: int) -> List[float]:
    """Per draft position i < k, the chance it is accepted given every one
    before it was: pooled over the generations. Drafts miss in runs (a round
    accepts all or stops early), so E(K) from these matches what rounds
    delivered, where one per-token figure understated a long K's rounds."""
    drafted = [sum(s["position_drafted"][i] for s in stats_list if i < len(s["position_drafted"])) for i in range(k)]
    accepted = [sum(s["position_accepted"][i] for s in stats_list if i < len(s["position_accepted"]))
                for i in range(k)]
    out = []
    for i in range(k):
        asked = drafted[i] if i == 0 else min(drafted[i], accepted[i - 1])
        out.append(accepted[i] / asked if asked else 0.0)
    return out


def forwards_per_round(stats_list: Sequence[dict]) -> float:
    """The draft's and target's forward seconds per round, first rounds left out."""
    return steady(stats_list, "target_seconds") + steady(stats_list, "draft_seconds")


def fixed_k_ceiling(runs_k: Sequence[dict], runs_plain: Sequence[dict], k: int) -> float:
    """The formula's speedup of a fixed K over plain decoding at what these
    runs measured: E(K) at K's acceptance per position, over the forwards'
    seconds per round at K against plain decoding's."""
    e = expected_tokens(k, position_rates(runs_k, k))[k]
    return e * forwards_per_round(runs_plain) / forwards_per_round(runs_k)


def rate(k: int, a: float, costs: ForwardCosts) -> float:
    """The formula's tokens per second at K = k and per-token acceptance ``a``."""
    return expected_tokens(k, [a] * k)[k] / costs.round_cost(k)


def ceiling(costs: ForwardCosts, a: float, k: K) -> float:
    """The formula's speedup over plain decoding at acceptance ``a``: at K = k, or the best K for "auto"."""
    ks = range(9) if k == "auto" else [k]
    return max(rate(kk, a, costs) for kk in ks) / rate(0, a, costs)


def steady(stats_list: Sequence[dict], key: str) -> float:
    """Seconds of ``key`` per round, first rounds (with the prompt) left out."""
    total = sum(s[key] - (s["first_target_seconds"] if key == "target_seconds" else 0) for s in stats_list)
    return total / max(1, sum(s["rounds"] - 1 for s in stats_list))


def pyplot():
    """matplotlib's pyplot on a file-only backend, or RuntimeError saying what to install."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'specgguf[plot]' "
                           "(or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


@dataclass
class Runs:
    """One configuration's generations: each one's stats, and its tok/s per turn."""

    k: K
    stats: List[dict] = field(default_factory=list)
    per_turn: List[float] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        """The median over turns (see :meth:`add_turn`)."""
        return statistics.median(self.per_turn) if self.per_turn else 0.0

    def add_turn(self, stats: List[dict]) -> None:
        """A turn's generations; its speed counts the tokens after each one's
        first and the time after its first round (which also read the
        prompt, alike at every K), the terms the ceiling is in."""
        self.stats.extend(stats)
        self.per_turn.append(sum(s["completion_tokens"] - 1 for s in stats)
                             / sum(s["seconds"] - s["first_target_seconds"] for s in stats))


def measure(llm, prompts: Sequence, ks: Sequence[K], tokens: int, turns: int,
            progress: Optional[Callable[[int, int, K], None]] = None, **settings) -> Dict[K, Runs]:
    """Generate ``tokens`` tokens after each prompt at each K, ``turns`` times.

    Args:
        llm: a :class:`~specgguf.SpeculativeLlama` (its KV caches are emptied
            before each generation, so every one reads its prompt).
        prompts: prompts as ``llm.generate`` takes them (token ids, text or messages).
        ks: the configurations: ints >= 0 (0 = plain decoding) and/or "auto".
        progress: ``progress(done, total, k)`` after each generation.
        settings: generation settings for every run (temperature, ...).

    Returns:
        ``{k: Runs}`` in the order of ``ks``.
    """
    return measure_configs({k: (llm, k) for k in ks}, [(p, {}) for p in prompts], tokens, turns, progress,
                           **settings)


def measure_configs(configs: Dict[str, tuple], items: Sequence[tuple], tokens: int, turns: int,
                    progress: Optional[Callable[[int, int, K], None]] = None, **settings) -> Dict[str, Runs]:
    """:func:`measure` over named configurations ``{name: (llm, k)}`` (pairs
    that may share their models: each generation starts from empty caches)
    and ``items`` ``(prompt, settings of its own)``."""
    runs = {name: Runs(name) for name in configs}
    names = list(configs)
    total, done = len(names) * len(items) * turns, 0
    for turn in range(turns):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:  # a different configuration first each turn
            llm, k = configs[name]
            stats = []
            for prompt, own in items:
                llm.reset()
                stats.append(llm.generate(prompt, max_tokens=tokens, k=k, **dict(settings, **own)).stats)
                done += 1
                if progress:
                    progress(done, total, name)
            runs[name].add_turn(stats)
    return runs


def sources_table(runs: Dict[str, Runs]) -> List[str]:
    """The printed table of a workload's draft sources (``plain``, ``model``,
    ``lookup``, ``both``): tok/s, against plain decoding, per turn, and the
    share of tokens the draft model and the lookup gave; then which pays."""
    plain = runs["plain"].tokens_per_second if "plain" in runs else 0.0
    lines = [f"{'drafts':>7} {'tok/s':>7} {'vs plain':>8} {'turns (tok/s)':<24} {'model':>6} {'lookup':>6}"]
    for name, r in runs.items():
        given = {src: sum((s.get("tokens_by_source") or {}).get(src, 0) for s in r.stats) for src in ("draft", "lookup")}
        n = max(1, sum(s["completion_tokens"] for s in r.stats))
        ratio = f"{r.tokens_per_second / plain:>7.2f}x" if plain else f"{'-':>8}"
        turns = " ".join(f"{x:.1f}" for x in r.per_turn)
        lines.append(f"{name:>7} {r.tokens_per_second:>7.1f} {ratio} {turns:<24} "
                     f"{100 * given['draft'] / n:>5.0f}% {100 * given['lookup'] / n:>5.0f}%")
    if plain:
        best = max(runs, key=lambda name: runs[name].tokens_per_second)
        gain = runs[best].tokens_per_second / plain
        head = ("no draft pays here: plain decoding was fastest" if best == "plain" else
                f"fastest here: {best} ({gain:.2f}x plain decoding)")
        tail = f"; the defaults (both) ran at {runs['both'].tokens_per_second / plain:.2f}x" if "both" in runs else ""
        lines.append(head + tail)
    return lines


@dataclass
class Report:
    """What the runs say: each configuration's speed against plain decoding,
    the formula's ceiling, the noise, and the recommended draft length."""

    runs: Dict[K, Runs]
    acceptance: float
    forwards: Dict[int, float]  # per fixed K: the forwards' seconds per round (:func:`forwards_per_round`)
    noise: float  # plain decoding's spread over turns, relative: (max - min) / median

    @classmethod
    def of(cls, runs: Dict[K, Runs]) -> "Report":
        drafting = [s for k, r in runs.items() if k != "auto" and k for s in r.stats]
        plain = runs[0].per_turn if 0 in runs else []
        noise = (max(plain) - min(plain)) / statistics.median(plain) if len(plain) > 1 else 0.0
        forwards = {k: forwards_per_round(r.stats) for k, r in runs.items() if k != "auto"}
        return cls(runs, per_token_acceptance(drafting), forwards, noise)

    def plain(self) -> float:
        return self.runs[0].tokens_per_second

    def ceiling_tps(self, k: int) -> Optional[float]:
        """The formula's tok/s at K = k, at that K's acceptance per position
        (the plain row's speed times the formula's speedup)."""
        if 0 not in self.runs or k == "auto":
            return None
        return self.plain() * fixed_k_ceiling(self.runs[k].stats, self.runs[0].stats, k)

    def best_fixed(self) -> int:
        fixed = [k for k in self.runs if k != "auto"]
        return max(fixed, key=lambda k: (self.runs[k].tokens_per_second, -k))

    def recommendation(self) -> str:
        """One line: the draft length to use here, and how sure the runs are."""
        if 0 not in self.runs:
            return f"fastest: K={self.best_fixed()} (no plain row to compare with)"
        best = self.best_fixed()
        gain = self.runs[best].tokens_per_second / self.plain()
        within = f"plain decoding's own speed varied by {100 * self.noise:.0f}% over the turns"
        if best == 0 or gain <= 1.0:
            return f"recommended: no drafting (-k 0): no draft length beat plain decoding here ({within})"
        line = f"recommended: -k {best} ({gain:.2f}x plain decoding"
        if gain - 1.0 <= self.noise:
            line += f", within the noise: {within}"
        if "auto" in self.runs:
            line += f"; k=auto, the default, ran at {self.runs['auto'].tokens_per_second / self.plain():.2f}x"
        return line + ")"

    def table(self) -> List[str]:
        """The printed table, a line per configuration."""
        head = f"{'K':>5} {'tok/s':>7} {'vs plain':>8} {'turns (tok/s)':<24} {'accepted':>8} {'ceiling':>8}"
        lines = [head]
        for k, r in self.runs.items():
            ratio = r.tokens_per_second / self.plain() if 0 in self.runs else float("nan")
            acc = per_token_acceptance(r.stats)
            ceil = self.ceiling_tps(k)
            turns = " ".join(f"{x:.1f}" for x in r.per_turn)
            lines.append(f"{k!s:>5} {r.tokens_per_second:>7.1f} {ratio:>7.2f}x {turns:<24} "
                         f"{(f'{acc:.2f}' if k else '-'):>8} {(f'{ceil:.1f}' if ceil else '-'):>8}")
        return lines

    def plot(self, path: str, title: str) -> None:
        """tok/s against K (each turn's figure and the median), plain decoding
        and k="auto" as lines, and the formula's ceiling; needs matplotlib."""
        plt = pyplot()
        fixed = sorted(k for k in self.runs if k != "auto")
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for k in fixed:
            ax.scatter([k] * len(self.runs[k].per_turn), self.runs[k].per_turn, color="0.7", s=12, zorder=2)
        ax.plot(fixed, [self.runs[k].tokens_per_second for k in fixed], "o-", color="C0", zorder=3,
                label="fixed K (median over turns; grey: each turn)")
        if 0 in self.runs:
            ax.plot(fixed, [self.ceiling_tps(k) for k in fixed], "--", color="C3",
                    label="formula's ceiling: each K's acceptance, forwards only")
        if 0 in self.runs:
            ax.axhline(self.plain(), color="0.3", lw=1, label="plain decoding (K=0)")
        if "auto" in self.runs:
            ax.axhline(self.runs["auto"].tokens_per_second, color="C2", lw=1.5, label='k="auto"')
        ax.set_xlabel("draft length K")
        ax.set_ylabel("tokens per second")
        ax.set_title(title, fontsize=9)
        ax.set_xticks(fixed)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


class Progress:
    """A one-line progress bar on stderr (a line per turn when stderr is not a terminal)."""

    def __init__(self, stream=None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()

    def __call__(self, done: int, total: int, k: K) -> None:
        if self.tty:
            n = self.width * done // total
            label = f"K={k}" if isinstance(k, int) or k == "auto" else k
            self.stream.write(f"\rbench: [{'#' * n}{'.' * (self.width - n)}] {done}/{total} ({label})   ")
            if done == total:
                self.stream.write("\n")
        elif done == total or done % max(1, total // 5) == 0:
            self.stream.write(f"bench: {done}/{total} generations\n")
        self.stream.flush()
