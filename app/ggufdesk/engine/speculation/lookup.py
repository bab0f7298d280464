"""Prompt lookup drafting over the whole conversation: continue the latest earlier match of the text's last n-gram.

`NgramCache` indexes token sequences in one bounded arena: per request, its prompt and output;
in the worker, every earlier prompt and answer (fed after each request is done), the way
llama.cpp's lookup keeps a dynamic n-gram cache across generations. `PromptLookup` drafts from the
longer of the two matches and judges each draft by its own evidence (engine/speculation/evidence.py): how
long the match really is, and how drafts with matches that long fared lately.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ggufdesk.engine.speculation.adaptive import DraftLength
from ggufdesk.engine.speculation.drafter import Controlled
from ggufdesk.engine.speculation.evidence import Evidence
from ggufdesk.engine.speculation import hints
from ggufdesk.engine.speculation.hints import inside_quote

SEP = -1  # between documents in the arena: never equal to a token, so no match crosses it
# How far back a match is measured: twice the top class of engine/speculation/evidence.py (16+), so
# that a copied passage (tens of tokens) is told from a repeated phrase; each draft compares at most
# CHAIN x MATCH_CAP tokens.
MATCH_CAP = 32
# Earlier occurrences of an n-gram compared for the longest real match: a source quoted once among a
# few repetitions of a phrase is found, and a draft costs a bounded number of comparisons.
CHAIN = 8
# A short match whose earlier occurrences all continue alike counts as this long: such drafts had their
# first token accepted 91% of the time on the tuned suite, as drafts at a 3-token match (82%) did.
AGREED_M = 3
# A match shorter than this whose occurrences continue differently counts as one token (23% first-token
# acceptance, the 1-token class's 34%); from 6 tokens on (the class whose prior is 0.85) the length
# alone is the better predictor.
SPLIT_BELOW = 6
# How far back the start of the current line is looked for, for the quote the text is inside: a bound
# on the scan per draft (a line longer than this is treated as starting there).
QUOTE_SCAN = 256
# A count found at a shorter n-gram than the draft's: it and the text alike up to the number span this
# many tokens (a bare 2-token n-gram before a number is too weak a sign that the lines are alike).
COUNT_SPAN = 5


class NumberVocab(Protocol):
    """engine/speculation/speculative.py's Numbers: which tokens write digits (lead, ASCII digits), and
    the tokens that write another number."""

    def __call__(self, token: int) -> tuple[str, str] | None: ...

    def write(self, lead: str, digits: str) -> list[int] | None: ...


class NgramCache:
    """For every n-gram (n = 1..n_max) of the documents seen, where its latest continuation starts,
    and a chain back to its earlier occurrences.

    A draft continues the occurrence whose match really extends furthest back (among the latest
    CHAIN): a model quoting a source matches the source for tens of tokens, while its own answer
    so far, the latest occurrence, may share only the n-gram (it mixed two sentences).

    When a new document would take the arena past `max_tokens`, the newest documents that fit in
    half of it are kept and re-indexed first (at `feed` time: the worker feeds a finished request
    after its answer is out, so nobody waits for it). A document itself is never cut, so the arena
    may exceed the bound by the current document (which the context size bounds).
    """

    def __init__(self, n_max: int, *, max_tokens: int = 1 << 16) -> None:
        self.n_max = n_max
        self.max_tokens = max(max_tokens, 64)
        self.docs = 0  # documents begun (a reader's state of one ends with it)
        self.clear()

    def clear(self) -> None:
        self.arena: list[int] = []
        self.doc_start = 0  # where the current document starts in the arena
        self.docs += 1
        self.where: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.n_max + 1)]
        self.prev: list[list[int]] = [[] for _ in range(self.n_max + 1)]  # [n][c]: the n-gram's earlier c, or -1
        self._indexed = 0  # continuations starting before this position are in the index

    def __len__(self) -> int:
        return len(self.arena)

    # ---- growing ------------------------------------------------------------------------------

    def feed(self, tokens: list[int]) -> None:
        """Make the current document equal `tokens` when they extend it, else start a new one."""
        n = len(self.arena) - self.doc_start
        if n and len(tokens) >= n and tokens[n - 1] == self.arena[-1] and tokens[:n] == self.arena[self.doc_start:]:
            self.arena.extend(tokens[n:])  # the same conversation, further on
        else:
            if len(self.arena) + len(tokens) + 1 > self.max_tokens:
                self._drop_old(len(tokens) + 1)
            self._new_doc(tokens)
        self._index()

    def grow(self, tokens: list[int], last: int) -> None:
        """feed(tokens + [last]) for a request's own text at each look, without copying or comparing all
        of it (at a 16k-token context that took 0.09 ms a look on the 2-core CPU: bench/bookkeeping.py).
        Between looks the text only grows, but for a context shift (engine/batching/shift.py), which
        moves every token after the kept start back by half the context: when the current document's
        last MATCH_CAP tokens are where they were, the text is taken to go on from it, else it is fed
        whole. (Drafts are verified: a text taken wrongly could cost acceptance, never the output.)"""
        arena, n = self.arena, len(self.arena) - self.doc_start
        total = len(tokens) + 1
        w = min(n, MATCH_CAP)
        if n and total >= n and arena[-1] == (tokens[n - 1] if total > n else last) \
                and arena[len(arena) - w:-1] == tokens[n - w:n - 1]:
            if total > n:
                arena.extend(tokens[n:])
                arena.append(last)
                self._index()
            return
        self.feed(tokens + [last])

    def _new_doc(self, tokens: list[int]) -> None:
        if self.arena:
            self.arena.append(SEP)
        self.docs += 1
        self.doc_start = self._indexed = len(self.arena)
        self.arena.extend(tokens)

    def _index(self) -> None:
        """Index the n-grams ending just before each position c of the current document (the
        continuation starts at c)."""
        arena, start, where, prev = self.arena, self.doc_start, self.where, self.prev
        end = len(arena)
        for k in range(1, self.n_max + 1):
            prev[k].extend([-1] * (end - len(prev[k])))
        for c in range(max(self._indexed, start + 1), end):
            for k in range(1, min(self.n_max, c - start) + 1):
                gram = tuple(arena[c - k:c])
                prev[k][c] = where[k].get(gram, -1)
                where[k][gram] = c
        self._indexed = max(self._indexed, end)

    def _drop_old(self, room: int) -> None:
        """Keep the newest documents that fit in half the arena (leaving `room`), re-indexed."""
        budget = max(0, (self.max_tokens - room) // 2)
        docs: list[list[int]] = []
        cur: list[int] = []
        for t in self.arena:
            if t == SEP:
                docs.append(cur)
                cur = []
            else:
                cur.append(t)
        docs.append(cur)
        kept: list[list[int]] = []
        for d in reversed(docs):
            if sum(map(len, kept)) + len(d) + 1 > budget:
                break
            kept.append(d)
        self.clear()
        for d in reversed(kept):
            self._new_doc(d)
            self._index()

    # ---- reading ------------------------------------------------------------------------------

    def find(self, tail: list[int]) -> tuple[int, int, int]:
        """(n, c, m) for a text ending in `tail`: the longest suffix n-gram seen here, where the
        continuation of its occurrence with the longest real match starts (the latest at a tie,
        among the last CHAIN occurrences), and how many tokens that match spans (n <= m <=
        MATCH_CAP, at most len(tail)); (0, -1, 0) if none."""
        arena = self.arena
        for n in range(min(self.n_max, len(tail)), 0, -1):
            c = self.where[n].get(tuple(tail[-n:]), -1)
            best_c, best_m = c, -1
            for _ in range(CHAIN):
                if c < 0:
                    break
                m, cap = 0, min(MATCH_CAP, len(tail), c)
                while m < cap and arena[c - 1 - m] == tail[-1 - m] and tail[-1 - m] != SEP:
                    m += 1
                if m > best_m:
                    best_c, best_m = c, m
                if m >= cap:
                    break
                c = self.prev[n][c]
            if best_m >= 0:
                return n, best_c, max(best_m, n)
        return 0, -1, 0

    def agreement(self, gram: list[int], c: int) -> tuple[int, int]:
        """(occurrences, agreeing) of the n-gram `gram` among its latest CHAIN here: how many continue
        with the token at c. A match of two tokens is a good bet when every earlier occurrence went on
        the same way and a poor one when they split (measured on the suite: first token accepted
        91% vs 23% of the time)."""
        n = len(gram)
        want = self.arena[c] if 0 <= c < len(self.arena) else SEP
        p, seen, agree = self.where[n].get(tuple(gram), -1) if 0 < n <= self.n_max else -1, 0, 0
        while p >= 0 and seen < CHAIN:
            seen += 1
            agree += p < len(self.arena) and self.arena[p] == want
            p = self.prev[n][p]
        return seen, agree

    def tail(self) -> list[int]:
        """The end of the current document, as long as a match is ever measured."""
        return self.arena[max(self.doc_start, len(self.arena) - MATCH_CAP):]

    def match(self) -> tuple[int, int, int]:
        """find() for the end of the current document (earlier documents included)."""
        return self.find(self.tail())

    def continuation(self, c: int, k: int, *, loop: bool = False) -> list[int]:
        """Up to k tokens from position c, stopping at the end of that document. With `loop` (the
        current document is the text being written), a match that runs into its end is the model
        repeating itself: the continuation goes round the loop again."""
        out = self.arena[c:c + k]
        if SEP in out:
            return out[:out.index(SEP)]
        period = len(self.arena) - c
        if loop and len(out) < k and c >= self.doc_start and period > 0:
            while len(out) < k:
                out.append(out[len(out) - period])
        return out


class PromptLookup(Controlled):
    """Drafter: the continuation of the last n-gram's latest earlier occurrence, in this request or
    (`history`, shared by the worker and only read here, so that concurrent requests do not
    disturb each other) in an earlier one.

    Each draft is weighed by its evidence: the real length of the match (a 20-token match inside
    a copied passage is far more likely to continue than a 2-token one) and the recent acceptance
    of drafts with matches that long (engine/speculation/evidence.py, older outcomes fading). A draft is
    proposed when that acceptance makes a speculative step predicted faster than a plain one at
    the measured costs; a match length judged not worth it is probed again later, with backoff, so
    early failures cannot lock drafting out of a text that turns copyable.

    What follows reads the tokens' text: each rule is a hint (engine/speculation/hints.py) that is on
    when its reader is given (`ends_sentence`, `quote_marks`, `numbers`) and off when it is None.

    Sentence ends (`ends_sentence`, from the model's vocabulary) are where copying stops: a quote
    closes, an answer leaves its source. Once this request's drafts have more often stopped at a
    sentence end than carried on past it, a draft is made no longer than the shortest measured
    length that reaches its first sentence end (the rows beyond would likely be wasted); a copy
    that carries on across sentences keeps its long drafts.

    Inside a quote (of any language's marks) that the draft does not close (`quote_marks`, from the vocabulary), the
    cut starts without waiting for that evidence: a quoted source has no closing mark of its own,
    so the quote closes at one of its sentence ends, which the draft cannot foresee (the evidence
    still overrules it once this request's drafts have crossed more sentence ends than they stopped
    at). On the suite, the first quote of every RAG answer closed at its first sentence end while
    a 15-token draft ran on past it; cut there, RAG replays at 1.52x plain instead of 1.41x
    (bench/spec_oracle.py), and no other category moves.

    Inside a quote, a word that occurs just once earlier (the match lying within the quote, not
    taking in its opening mark) marks the source being quoted: the draft is judged as an agreeing
    match (AGREED_M) from the quote's first word instead of waiting for a three-token match. On the
    suite's greedy answers such matches went on for 10 tokens on average (RAG 1.53 -> 1.56x plain
    replayed; no other category has quotes). Conversely a short match that takes in the quote's
    opening mark (the answer's `[3], "The` after `[2], "The`) is judged by its words inside the
    quote only: what precedes a quote tells the answer's template, not its next source (RAG 1.57 ->
    1.62 replayed, nothing else moves).

    Numbered lists and citations count up (`1.` ... `2.` ...; `According to [1]` ... `[2]`), so the
    earlier occurrence a draft copies holds the number before the one now due: such drafts failed
    at the number, and a long match failing there also taught the evidence that long matches fail.
    When the previous occurrence of the same n-gram went on the same way up to a number one lower
    (`numbers`, from the vocabulary), the draft writes the next number there and stops before any
    later number (replayed on the suite: RAG 1.45 -> 1.57x plain, copy 1.93 -> 2.06, long 1.35 ->
    1.40, no category lower). When the draft's own n-gram occurred only once before, a shorter
    one's previous occurrence may show the count, if it and the text alike up to the number span
    COUNT_SPAN tokens (RAG 1.56 -> 1.57, and steadier across cost tables; a bare 2-token n-gram
    before a number cost the long catalogue 0.02). A number is the whole run of its digit tokens:
    SmolLM2's and Gemma 3's vocabularies write a digit per token, so a list going from 9 to 10 or a
    catalogue's SKU-4591 after SKU-4590 counts on only read whole (replayed: the starter's held-out
    count-fr 1.68 -> 2.03x plain, SmolLM2's tuned long catalogue 1.27 -> 1.41; the starter's long
    catalogue 1.52 -> 1.42, where counting a single digit had once been right by chance; docs/bench/
    speculative-decoding.md, "Numbers over several tokens").
    """

    def __init__(self, *, ngram: int, k_min: int, k_max: int, adaptive: bool,
                 history: NgramCache | None = None, costs: dict[int, float] | None = None,
                 ends_sentence: Callable[[int], bool] | None = None,
                 quote_marks: Callable[[int], tuple[bool, str]] | None = None,
                 numbers: NumberVocab | None = None) -> None:
        self.cache = NgramCache(ngram)  # this request: prompt and output so far
        self.history = history  # earlier requests (the worker feeds it after each; read-only here)
        self.control = DraftLength(k_min=k_min, k_max=k_max, adaptive=adaptive, label="lookup",
                                   sizes_drafts=True, costs=costs)
        self.evidence = Evidence()
        self._last_m = 0
        self.ends_sentence = ends_sentence
        self.quote_marks = quote_marks
        self.numbers = numbers
        self.reached = self.crossed = 0  # drafts that reached a sentence end / got past it
        self._end_at = -1  # index of the first sentence end in the draft in flight
        # the quote marks of the current line, read as the text grows: (document, read up to, marks)
        self._line: tuple[int, int, list[tuple[int, str]]] = (0, 0, [])

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        own = self.cache
        own.grow(history, last)
        n, c, m = own.match()
        avail, judged = self._own(n, c, m, k)
        if self.history is not None and len(self.history):
            tail = own.tail()
            hn, hc, hm = self.history.find(tail)
            if hm > m:  # a longer match in an earlier request
                avail = self.history.continuation(hc, k)
                judged = self._weight(self.history, tail[len(tail) - hn:], hc, hm)
        self._last_m = 0
        avail = self._worth(avail, judged)
        if not avail:
            return []
        self._last_m = judged
        return self._to_sentence_end(avail, last)

    def _own(self, n: int, c: int, m: int, k: int) -> tuple[list[int], int]:
        """(the draft from this request's own text, the match length it is judged by)."""
        own = self.cache
        avail = own.continuation(c, k, loop=True) if n else []
        if not avail:
            return avail, m
        tail = own.tail()
        gram = tail[len(tail) - n:]
        judged = self._weight(own, gram, c, m)
        counted = self._count_on(n, c, m, avail)
        if counted is not None:  # a count going on, not a split: the n-gram's occurrences agree but for it
            return counted, max(judged, AGREED_M)
        return avail, self._by_quote(gram, c, m, judged, avail[0])

    def _by_quote(self, gram: list[int], c: int, m: int, judged: int, first: int) -> int:
        """The match length of a short match inside a quote (the quotes hint): see the class docstring."""
        quoted = self._quoted([first]) if m < SPLIT_BELOW else -1
        if quoted >= m and judged < AGREED_M and self.cache.agreement(gram, c)[0] == 1:
            return AGREED_M  # the one earlier place a quote's own words occur: the source it quotes
        if 0 <= quoted < m:
            # a short match that takes in the quote's opening mark ('[3], "The'): the words before
            # the quote say which template repeats, not which source it quotes this time
            return min(judged, max(quoted, 1))
        return judged

    def _worth(self, avail: list[int], m: int) -> list[int]:
        """As much of the draft as its evidence says is worth verifying ([] for none)."""
        if not avail or not self.control.adaptive or self.control.t0 is None:
            return avail
        k_worth = self.control.worth(self.evidence.alpha(m), len(avail))
        if k_worth == 0 and self.evidence.refused(m):
            # early failures must not lock drafting out: probe with the cheapest draft there is
            k_worth = min(self.control.lengths()[0], len(avail))
        return avail[:k_worth]

    def _to_sentence_end(self, draft: list[int], last: int) -> list[int]:
        """`draft` continues a text ending in `last`."""
        self._end_at = -1
        if self.ends_sentence is None or len(draft) < 2:
            return draft
        # after a text that has just ended a sentence (a closing quote), a draft that opens with an
        # end (the newline before the answer's next line) starts the next sentence: its first end is
        # further on, else the cut would leave a one-token draft of that end alone
        first = 1 if self.ends_sentence(last) else 0
        j = next((i for i, t in enumerate(draft[:-1]) if i >= first and self.ends_sentence(t)), -1)
        if j < 0:
            return draft
        if self._cut_at_ends(draft[:j + 1]):
            reach = [n for n in self.control.lengths() if n >= max(j, 1)]
            if reach:
                draft = draft[:min(reach)]
        if len(draft) > j + 1:
            self._end_at = j  # the outcome says whether the model went past it
        return draft

    def _cut_at_ends(self, upto_end: list[int]) -> bool:
        """Are drafts cut at their first sentence end now (`upto_end`: the draft up to it)? While most of
        this request's drafts stopped there (the share that got past one, with a 1/2 prior), and inside
        an open quote also at an even share (a quote closes at one of its sentence ends)."""
        share = (self.crossed + 1) / (self.reached + 2)
        return self.control.adaptive and (share < 0.5 or (share == 0.5 and self._quoting(upto_end)))

    def _count_on(self, n: int, c: int, m: int, draft: list[int]) -> list[int] | None:
        """`draft` (this request's text from c on, after an n-gram matching m tokens) with its first
        number counted on, when the n-gram's previous occurrence (or, failing that, a shorter n-gram's
        that spans COUNT_SPAN tokens with the text up to the number) went on alike up to that number
        less one; cut before any number after it. A number may take several tokens (a digit each, in
        most vocabularies), some of them already written when the draft starts inside it. None when
        there is no such count."""
        own, num = self.cache, self.numbers
        if num is None:
            return None
        i = next((i for i, t in enumerate(draft) if num(t) is not None), -1)
        now = self._number_at(c + i) if i >= 0 else None
        if now is None:
            return None
        start, end, lead, digits = now
        written = max(c - start, 0)  # its digits already in the text (when the draft starts inside it)
        if written >= m or not self._counted_before(n, c, i, lead, digits):
            return None  # (a number longer than the match: the text's may have more digits in front)
        tokens = num.write(lead, hints.next_number(digits))
        if tokens is None or tokens[:written] != own.arena[start:start + written]:
            return None  # a carry into the digits already written, or a vocabulary that cannot write it
        rest = draft[end - c:]
        j = next((q for q, x in enumerate(rest) if num(x) is not None), len(rest))
        return (draft[:i] + tokens[written:] + rest[:j])[:len(draft)]

    def _number_at(self, p: int) -> tuple[int, int, str, str] | None:
        """(start, end, lead, ASCII digits) of the number whose digit tokens include this request's
        token at p (tokens whose lead is only the zero continue the one before); None when there is
        none, when it runs to the end of the text (it may go on), or when it is too long to be a count."""
        fact = self._digits(p)
        if fact is None:
            return None
        zero, top = fact[0][-1], len(self.cache.arena)
        start, end = p, p + 1
        while end - start <= hints.MAX_DIGITS and self._joins(start, zero):
            start -= 1
        while end < top and end - start <= hints.MAX_DIGITS and self._joins(end, zero):
            end += 1
        if end >= top:
            return None
        parts = [self._digits(q) for q in range(start, end)]
        digits = "".join(f[1] for f in parts if f is not None)
        if len(digits) > hints.MAX_DIGITS or parts[0] is None:
            return None
        return start, end, parts[0][0], digits

    def _digits(self, q: int) -> tuple[str, str] | None:
        """The digits the token at q writes (numbers' reading), None for other tokens and outside the text."""
        arena, num = self.cache.arena, self.numbers
        return num(arena[q]) if num is not None and 0 <= q < len(arena) and arena[q] >= 0 else None

    def _joins(self, q: int, zero: str) -> bool:
        """Does the token at q continue a number in this digit script from the token before it?"""
        f, g = self._digits(q), self._digits(q - 1)
        return f is not None and g is not None and f[0] == zero and g[0][-1] == zero

    def _counted_before(self, n: int, c: int, i: int, lead: str, digits: str) -> bool:
        """Did the previous occurrence of the n-gram before c go on alike for i tokens up to the number
        `digits` less one, written alike? The n-gram's own previous occurrence, else a shorter n-gram's
        (at least 2 tokens, and COUNT_SPAN with the text before the number): which n-gram a draft is
        matched at depends on where it starts (".\nAnswer" occurred once before, "\nAnswer" twice)."""
        own = self.cache
        for k in range(n, 0, -1):
            if k < n and (k < 2 or k + i < COUNT_SPAN):
                break
            p = own.prev[k][c]
            if p < 0 or p + i >= c or own.arena[p:p + i] != own.arena[c:c + i]:
                continue
            before = self._number_at(p + i)
            if before is not None and before[1] <= c and before[2] == lead \
                    and int(digits) == int(before[3]) + 1:
                return True
        return False

    def _quoting(self, draft: list[int]) -> bool:
        """Is the text being written inside a quote on its current line that `draft` does not close?"""
        return self._quoted(draft) >= 0

    def _quoted(self, draft: list[int]) -> int:
        """How many tokens of the text being written follow the quote mark it is inside (on its
        current line, not closed by `draft`); -1 when it is not inside one."""
        if self.quote_marks is None or any(self.quote_marks(t)[1] for t in draft):
            return -1
        own = self.cache
        marks = self._line_marks()
        first = max(own.doc_start, len(own.arena) - QUOTE_SCAN)
        opened = inside_quote([(i, m) for i, m in marks if i >= first])
        return len(own.arena) - 1 - opened if opened >= 0 else -1

    def _line_marks(self) -> list[tuple[int, str]]:
        """(position, marks) of the current line's tokens that write quote marks (the line's first token
        always), read on from where the last call stopped: the current document only grows."""
        assert self.quote_marks is not None
        own = self.cache
        doc, upto, marks = self._line
        if doc != own.docs:
            doc, upto, marks = own.docs, own.doc_start, []
        arena = own.arena
        for i in range(upto, len(arena)):
            starts, m = self.quote_marks(arena[i])
            if starts:
                marks = [(i, m)]
            elif m:
                marks.append((i, m))
        self._line = (doc, len(arena), marks)
        return marks

    @staticmethod
    def _weight(cache: NgramCache, gram: list[int], c: int, m: int) -> int:
        """The match length the evidence judges the draft by: short matches count longer when the
        n-gram's earlier occurrences agree on what follows, shorter when they split."""
        if m >= SPLIT_BELOW:
            return m
        seen, agree = cache.agreement(gram, c)
        if seen > 1 and agree == seen:
            return max(m, AGREED_M)
        if agree < seen:
            return 1
        return m

    def woke(self, tokens: int) -> None:
        self.evidence.tick(tokens)
        self.control.woke(tokens)

    def feedback(self, n_drafted: int, n_accepted: int, seconds: float, drafting: float = 0.0) -> None:
        if self._end_at >= 0 and n_drafted and n_accepted >= self._end_at:  # the draft got to the sentence end
            self.reached += 1
            self.crossed += n_accepted >= self._end_at + 2  # ... and the model went on past it
        self._end_at = -1
        if n_drafted:
            self.evidence.record(self._last_m, n_drafted, n_accepted)
        else:
            self.evidence.tick(1)
        self.control.feedback(n_drafted, n_accepted, seconds)
        self.control.looked(n_drafted, n_accepted, seconds, drafting)
