"""What a lookup draft's match says about its chance: acceptance by match length, older outcomes fading.

A draft continues an earlier occurrence of the text's last tokens. How far back that match really
extends is the best single predictor of acceptance: inside a passage being copied the match is
tens of tokens long; in free text it is one to three. So acceptance is estimated per class of
match length, from a prior (longer: more likely) and recent outcomes weighted by recency (half
weight after HALF_LIFE tokens), a shorter class's estimate raising a longer class's prior. A class that
is refused is probed again with a short draft after PROBE_FIRST refusals, the gap doubling after
every failed probe (up to PROBE_MAX) and reset by a success.
"""
from __future__ import annotations

import bisect

CLASSES = (1, 2, 3, 4, 6, 9, 16)  # lower bounds of the match-length classes
PRIOR = (0.3, 0.45, 0.55, 0.65, 0.75, 0.85, 0.9)  # per-token acceptance guessed per class
PRIOR_WEIGHT = 3.0  # the prior counts as this many outcomes
HALF_LIFE = 64.0  # tokens
PROBE_FIRST = 16  # refusals of a class before it is probed again
PROBE_MAX = 256


class Evidence:
    """Per-token acceptance estimates for lookup drafts, by match length."""

    def __init__(self) -> None:
        n = len(CLASSES)
        self.clock = 0  # tokens emitted so far
        self.acc = [0.0] * n  # accepted tokens (decayed)
        self.fail = [0.0] * n  # drafts that ended in a rejection (decayed)
        self.seen = [0] * n  # clock of the last update
        self.refusals = [0] * n
        self.gap = [PROBE_FIRST] * n
        self.probing = -1  # the class being probed by the draft in flight

    @staticmethod
    def klass(m: int) -> int:
        return max(0, bisect.bisect_right(CLASSES, m) - 1)

    def _decay(self, i: int) -> None:
        w = 0.5 ** ((self.clock - self.seen[i]) / HALF_LIFE)
        self.acc[i] *= w
        self.fail[i] *= w
        self.seen[i] = self.clock

    def alpha(self, m: int) -> float:
        """Estimated per-token acceptance of a draft whose match spans m tokens: its class's outcomes
        on top of a prior that is the class's own guess or the next shorter class's estimate,
        whichever is higher (if short matches are accepted, longer ones are too)."""
        a = 0.0
        for i in range(self.klass(m) + 1):
            self._decay(i)
            prior = max(PRIOR[i], a)
            a = (self.acc[i] + PRIOR_WEIGHT * prior) / (self.acc[i] + self.fail[i] + PRIOR_WEIGHT)
        return a

    def refused(self, m: int) -> bool:
        """A draft of this class was judged not worth it; True when it is time to probe anyway."""
        i = self.klass(m)
        self.refusals[i] += 1
        if self.refusals[i] >= self.gap[i]:
            self.refusals[i] = 0
            self.probing = i
            return True
        return False

    def record(self, m: int, drafted: int, accepted: int) -> None:
        i = self.klass(m)
        self._decay(i)
        self.acc[i] += accepted
        self.fail[i] += 1.0 if accepted < drafted else 0.0
        self.refusals[i] = 0
        if self.probing == i:
            self.gap[i] = PROBE_FIRST if accepted else min(2 * self.gap[i], PROBE_MAX)
        self.probing = -1
        self.clock += accepted + 1

    def tick(self, tokens: int) -> None:
        self.clock += tokens
