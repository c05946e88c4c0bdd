"""How much of its remaining budget a running row is expected to write: the share of it the
decoder keeps pages free for when it admits another row (decoder.py `_admit`).

Admitting on a row's prompt alone (vLLM's way) lets rows that were admitted short grow into
each other and preempt one another, each preemption a prefill again of all the row had: under
a one-row budget, 48 rows that ran to their budget were preempted 21 to 65 times
(docs/architecture.md). Reserving all of every budget preempts nothing but leaves pages idle
whenever rows end early. So the reserve is a share that learns, as SGLang's new-token ratio
does: it grows at each preemption and decays while none happens.
"""

from dataclasses import dataclass


@dataclass
class GrowthEstimate:
    ratio: float = 0.5  # the share of a row's remaining budget kept free for it
    floor: float = 0.1  # it never decays below this
    step: float = 0.1  # added at each preemption
    decay: float = 0.002  # taken off at each admission round without one

    def preempted(self) -> None:
        self.ratio = min(1.0, self.ratio + self.step)

    def calm(self) -> None:
        self.ratio = max(self.floor, self.ratio - self.decay)

    def tokens(self, left: int) -> int:
        """The tokens a row with `left` of its budget is expected to write."""
        return -(-int(left * self.ratio * 1000) // 1000)
