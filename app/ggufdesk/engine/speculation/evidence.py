"""What a lookup draft's match says about its chance: acceptance by match length, older outcomes fading.

A draft continues an earlier occurrence of the text's last tokens. How far back that match really
extends is the best single predictor of acceptance: inside a passage being copied the match is
tens of tokens long; in free text it is one to three. So acceptance is estimated per class of
match length, from a prior (longer: more likely) and recent outcomes weighted by recency (half
weight after HALF_LIFE tokens), a shorter class's estimate raising a longer class's prior. A class that
is refused is probed again with a short draft after PROBE_FIRST refusals, the gap doubling after
every failed probe (up to PROBE_MAX) and reset by a success.

The priors are fitted to the starter's greedy answers to bench/speculative.py's suite (drafts
with a one-token match had their first token accepted 34% of the time, two tokens 56%, three
82% and their first three tokens 52%, sixteen and more 95%+). A request's own drafts move every
class's prior at once: the accepted tokens over what the priors expected for the drafts made
(`ratio`, fading like the rest) turn a prior p into p ** (1 / ratio). A class is consulted only
a few times per answer (a copied stretch starts at match length one, two, three...), too rarely
to learn alone; the request's text as a whole (a quote-heavy answer, or free prose) says more.
"""
from __future__ import annotations

import bisect

CLASSES = (1, 2, 3, 4, 6, 9, 16)  # lower bounds of the match-length classes
PRIOR = (0.35, 0.6, 0.8, 0.8, 0.85, 0.9, 0.96)  # per-token acceptance per class, measured (above)
PRIOR_WEIGHT = 3.0  # the prior counts as this many outcomes
HALF_LIFE = 64.0  # tokens
PROBE_FIRST = 16  # refusals of a class before it is probed again
PROBE_MAX = 256
EXPECTED_PSEUDO = 4.0  # tokens: the request-wide ratio starts at 1 and moves once drafts say more


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
        self.got = 0.0  # accepted tokens of this request's drafts (decayed)
        self.expected = 0.0  # ... and what the priors expected of them
        self.seen_ratio = 0

    @staticmethod
    def klass(m: int) -> int:
        return max(0, bisect.bisect_right(CLASSES, m) - 1)

    def _decay(self, i: int) -> None:
        w = 0.5 ** ((self.clock - self.seen[i]) / HALF_LIFE)
        self.acc[i] *= w
        self.fail[i] *= w
        self.seen[i] = self.clock

    def ratio(self) -> float:
        """This request's accepted draft tokens over what the priors expected of its drafts."""
        w = 0.5 ** ((self.clock - self.seen_ratio) / HALF_LIFE)
        self.got *= w
        self.expected *= w
        self.seen_ratio = self.clock
        return (self.got + EXPECTED_PSEUDO) / (self.expected + EXPECTED_PSEUDO)

    def alpha(self, m: int) -> float:
        """Estimated per-token acceptance of a draft whose match spans m tokens: its class's outcomes
        on top of a prior that is the class's measured one (scaled by the request's ratio) or the
        next shorter class's estimate, whichever is higher (if short matches are accepted, longer
        ones are too)."""
        scale = 1.0 / max(self.ratio(), 1e-3)
        a = 0.0
        for i in range(self.klass(m) + 1):
            self._decay(i)
            prior = max(PRIOR[i] ** scale, a)
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
        self.ratio()  # decay to now
        self.got += accepted
        self.expected += sum(PRIOR[i] ** j for j in range(1, drafted + 1))
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
