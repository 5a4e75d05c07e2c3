"""The page's charts: failures over time in fixed buckets, as stacked bars and sparklines (inline SVG)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from worker.broker.dead_letters import Letter
from worker.ops.dlq.page.markup import esc, time_text
from worker.ops.dlq.render import format_age

#: bars in an over-time chart at most
BUCKETS = 24
_STEPS = (60, 300, 900, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)
_COLOURS = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e")


def _step(span: float) -> int:
    for step in _STEPS:
        if span / step <= BUCKETS:
            return step
    return _STEPS[-1]


@dataclass
class Timeline:
    """Failure times in fixed buckets (a nice step: 1m, 5m, 15m, 1h, ... 30d) ending now."""

    now: datetime
    start: datetime
    step: int
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = max(1, int((self.now - self.start).total_seconds() // self.step) + 1)

    @classmethod
    def over(cls, letters: Iterable[Letter], now: datetime) -> Timeline:
        times = [letter.failed_at for letter in letters if letter.failed_at is not None]
        oldest = min(times, default=now - timedelta(hours=1))
        step = _step(max(60.0, (now - oldest).total_seconds()))
        start = datetime.fromtimestamp(oldest.timestamp() // step * step, UTC)
        return cls(now, start, step)

    def index(self, moment: datetime | None) -> int | None:
        if moment is None:
            return None
        return min(self.count - 1, max(0, int((moment - self.start).total_seconds() // self.step)))

    def counts(self, letters: Iterable[Letter]) -> list[int]:
        counts = [0] * self.count
        for letter in letters:
            i = self.index(letter.failed_at)
            if i is not None:
                counts[i] += 1
        return counts

    @property
    def step_text(self) -> str:
        return format_age(timedelta(seconds=self.step))


def stacked_chart(series: Sequence[tuple[str, list[int]]], timeline: Timeline, *, label: str) -> str:
    """An SVG of stacked bars, one colour per series, with the time axis's ends written under it."""
    width, height, pad = 760, 160, 28
    totals = [sum(values[i] for _, values in series) for i in range(timeline.count)]
    top = max(totals, default=0) or 1
    bar = (width - pad) / timeline.count
    parts = [
        f"<svg role=img aria-label='{esc(label)}' width={width} height={height + 30} "
        f"viewBox='0 0 {width} {height + 30}' xmlns='http://www.w3.org/2000/svg'>",
        f"<text x=0 y=12 font-size=11 fill='#69728a'>{top}</text>",
        f"<line x1={pad} y1={height} x2={width} y2={height} stroke='#c9ced8'/>",
    ]
    for i in range(timeline.count):
        y = float(height)
        for n, (name, values) in enumerate(series):
            if not values[i]:
                continue
            h = values[i] / top * (height - 16)
            y -= h
            parts.append(
                f"<rect x={pad + i * bar + 1:.1f} y={y:.1f} width={max(1.0, bar - 2):.1f} height={h:.1f} "
                f"fill='{_COLOURS[n % len(_COLOURS)]}'><title>{esc(name)}: {values[i]}</title></rect>"
            )
    parts.append(
        f"<text x={pad} y={height + 16} font-size=11 fill='#69728a'>{esc(time_text(timeline.start))}</text>"
        f"<text x={width} y={height + 16} font-size=11 fill='#69728a' text-anchor=end>now "
        f"({esc(time_text(timeline.now))}), one bar = {esc(timeline.step_text)}</text></svg>"
    )
    legend = "".join(
        f"<span><i style='background:{_COLOURS[n % len(_COLOURS)]}'></i>{esc(name)} ({sum(values)})</span>"
        for n, (name, values) in enumerate(series)
    )
    return "".join(parts) + f"<div class=legend>{legend}</div>"


def sparkline(values: list[int]) -> str:
    width, height = 160, 24
    top = max(values, default=0) or 1
    bar = width / max(1, len(values))
    rects = "".join(
        f"<rect x={i * bar:.1f} y={height - v / top * height:.1f} width={max(1.0, bar - 1):.1f} "
        f"height={v / top * height:.1f} fill='#4269d0'/>"
        for i, v in enumerate(values)
        if v
    )
    return f"<svg width={width} height={height} xmlns='http://www.w3.org/2000/svg'>{rects}</svg>"
