"""How expensive a GBNF grammar is for llama.cpp's sampler, measured before it is used: its stack growth on a probe.

llama.cpp follows a grammar with a set of pushdown stacks, one per way the text so far can be read
(src/llama-grammar.cpp, llama_grammar_advance_stack). An ambiguous grammar multiplies them: the pattern
`^((a?){0,30}){0,30}$` gives thousands, each accepted token then costs seconds (deduplicating them is
quadratic) and a rejected token is checked against all of them for the whole vocabulary (issue 34).
llama.cpp has no limit of its own on the number of stacks, so we count them the way it builds them:
the grammar is parsed as llama.cpp parses it (repetitions rewritten into the same helper rules), and a
probe feeds it characters, at each step the character that leaves the most stacks, for a few dozen
steps. A grammar whose stacks pass MAX_STACKS is refused before llama.cpp ever sees it. The probe's own
work is bounded (WORK_BUDGET), so a hostile grammar cannot make the check itself slow.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_STACKS = 256  # stacks at any point of the probe; ordinary JSON-schema grammars stay under 40
PROBE_STEPS = 40  # characters fed by the probe
WORK_BUDGET = 30_000  # stack expansions the whole check may make (ordinary grammars: under 2,000)
MAX_RULES = 200_000  # rules after llama.cpp's rewriting of repetitions
LLAMA_MAX_REPETITION = 2000  # llama.cpp: a {m,n} with n above this is unbounded, with m above it refused
_NEG_PROBES = 'a0 "{}[],:-.xZ\\\n'  # characters tried for negated classes ([^...]), in this order


class GrammarTooComplex(ValueError):
    """The grammar would make llama.cpp's sampler too slow (or it is not a grammar we can read)."""


# A terminal: (ranges, negated); ranges are (lo, hi) code points. A rule reference: an int.
Terminal = tuple[tuple[tuple[int, int], ...], bool]
Symbol = Terminal | int
ANY: Terminal = (((0, 0x10FFFF),), False)


@dataclass
class Grammar:
    rules: list[list[list[Symbol]]]  # rule id -> alternatives -> symbols
    root: int


# ---- parsing, as llama.cpp's llama_grammar_parser does -----------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0
        self.names: dict[str, int] = {}
        self.rules: list[list[list[Symbol]] | None] = []
        self.defined: set[int] = set()

    def rule_id(self, name: str) -> int:
        if name not in self.names:
            self.names[name] = self.new_rule()
        return self.names[name]

    def new_rule(self) -> int:
        if len(self.rules) >= MAX_RULES:
            raise GrammarTooComplex(f"the grammar has more than {MAX_RULES} rules")
        self.rules.append(None)
        return len(self.rules) - 1

    def fail(self, what: str) -> GrammarTooComplex:
        return GrammarTooComplex(f"cannot read the grammar: {what} at {self.s[self.i:self.i + 30]!r}")

    def space(self, newline_ok: bool) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in " \t" or (newline_ok and c in "\r\n"):
                self.i += 1
            elif c == "#":
                while self.i < n and s[self.i] not in "\r\n":
                    self.i += 1
            else:
                return

    def name(self) -> str:
        j = self.i
        while j < len(self.s) and (self.s[j].isascii() and (self.s[j].isalnum() or self.s[j] == "-")):
            j += 1
        if j == self.i:
            raise self.fail("expecting a name")
        out, self.i = self.s[self.i:j], j
        return out

    def char(self) -> int:
        s, i = self.s, self.i
        if i >= len(s):
            raise self.fail("unexpected end")
        if s[i] != "\\":
            self.i += 1
            return ord(s[i])
        esc = s[i + 1:i + 2]
        widths = {"x": 2, "u": 4, "U": 8}
        if esc in widths:
            digits = s[i + 2:i + 2 + widths[esc]]
            try:
                value = int(digits, 16)
            except ValueError:
                raise self.fail("a bad escape") from None
            self.i += 2 + len(digits)
            return value
        simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93}
        if esc not in simple:
            raise self.fail("an unknown escape")
        self.i += 2
        return simple[esc]

    def terminal_class(self) -> Terminal:
        self.i += 1  # "["
        negated = self.s.startswith("^", self.i)
        self.i += negated
        ranges = []
        while not self.s.startswith("]", self.i):
            lo = self.char()
            hi = lo
            if self.s.startswith("-", self.i) and not self.s.startswith("-]", self.i):
                self.i += 1
                hi = self.char()
            ranges.append((lo, hi))
        self.i += 1
        return tuple(ranges), negated

    def parse(self) -> Grammar:
        self.space(True)
        while self.i < len(self.s):
            rid = self.rule_id(self.name())
            self.space(False)
            if not self.s.startswith("::=", self.i):
                raise self.fail("expecting ::=")
            self.i += 3
            self.space(True)
            self.rules[rid] = self.alternates()
            self.defined.add(rid)
            self.space(True)
        missing = [n for n, r in self.names.items() if r not in self.defined]
        if missing:
            raise GrammarTooComplex(f"cannot read the grammar: undefined rule {missing[0]!r}")
        if "root" not in self.names:
            raise GrammarTooComplex("cannot read the grammar: no root rule")
        return Grammar(rules=[r or [[]] for r in self.rules], root=self.names["root"])

    def alternates(self) -> list[list[Symbol]]:
        """A rule's body; groups are handled with an explicit stack (a pattern may nest them deeply)."""
        frames: list[tuple[int, list[list[Symbol]], list[Symbol], int]] = []
        alts: list[list[Symbol]] = []
        seq: list[Symbol] = []
        last = -1  # where the last symbol starts in seq (what a repetition repeats)
        while True:
            nested = bool(frames)
            c = self.s[self.i] if self.i < len(self.s) else ""
            if c == '"':
                self.i += 1
                last = len(seq)
                while not self.s.startswith('"', self.i):
                    cp = self.char()
                    seq.append((((cp, cp),), False))
                self.i += 1
            elif c == "[":
                last = len(seq)
                seq.append(self.terminal_class())
            elif c == ".":
                self.i += 1
                last = len(seq)
                seq.append(ANY)
            elif c == "(":
                self.i += 1
                frames.append((self.new_rule(), alts, seq, last))
                alts, seq, last = [], [], -1
            elif c == ")" and nested:
                self.i += 1
                rid, outer_alts, outer_seq, _ = frames.pop()
                self.rules[rid] = alts + [seq]
                alts, seq = outer_alts, outer_seq
                last = len(seq)
                seq.append(rid)
            elif c == "|":
                self.i += 1
                alts.append(seq)
                seq, last = [], -1
                self.space(True)
                continue
            elif c and c in "*+?{":
                lo, hi = self.repeat_bounds()
                if last < 0:
                    raise self.fail("a repetition of nothing")
                self.repeat(seq, last, lo, hi)
            elif c and (c.isascii() and (c.isalnum() or c == "-")):
                last = len(seq)
                seq.append(self.rule_id(self.name()))
            else:
                if nested:
                    raise self.fail("expecting )")
                return alts + [seq]
            self.space(bool(frames))

    def repeat_bounds(self) -> tuple[int, int | None]:
        c = self.s[self.i]
        self.i += 1
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        j = self.s.find("}", self.i)
        if j < 0:
            raise self.fail("expecting }")
        parts = [p.strip() for p in self.s[self.i:j].split(",")]
        self.i = j + 1
        try:
            lo = int(parts[0])
            hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        except (ValueError, IndexError):
            raise self.fail("a bad repetition") from None
        if lo > LLAMA_MAX_REPETITION:
            raise GrammarTooComplex(f"the grammar repeats something {lo} times")
        if hi is not None and hi > LLAMA_MAX_REPETITION:
            hi = None  # what llama.cpp does with it
        return lo, hi

    def repeat(self, seq: list[Symbol], last: int, lo: int, hi: int | None) -> None:
        """llama.cpp's handle_repetitions: S{m,n} -> S x m, then n-m nested optional helper rules."""
        prev = seq[last:]
        if lo == 0:
            del seq[last:]
        else:
            for _ in range(lo - 1):
                seq.extend(prev)
        n_opt = 1 if hi is None else hi - lo
        last_rec = -1
        for k in range(n_opt):
            rid = self.new_rule()
            body = list(prev)
            if k > 0 or hi is None:
                body.append(rid if hi is None else last_rec)
            self.rules[rid] = [body, []]
            last_rec = rid
        if n_opt > 0:
            seq.append(last_rec)


def parse_gbnf(text: str) -> Grammar:
    """The grammar as llama.cpp would hold it; GrammarTooComplex when it cannot be read."""
    return _Parser(text).parse()


# ---- the stacks, as llama.cpp keeps them ----------------------------------------------------------------

Pos = tuple[int, int, int]  # rule, alternative, symbol index
Stack = tuple[Pos, ...]


class _Probe:
    def __init__(self, g: Grammar, max_stacks: int, budget: int) -> None:
        self.g, self.max_stacks, self.budget = g, max_stacks, budget

    def spend(self) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise GrammarTooComplex("the grammar is too complex to check")

    def advance(self, start: Stack, out: set[Stack]) -> None:
        """llama_grammar_advance_stack: expand rule references until each stack tops at a terminal."""
        rules, todo, seen = self.g.rules, [start], set()
        while todo:
            st = todo.pop()
            if st in seen:
                continue
            seen.add(st)
            self.spend()
            if st:
                r, a, i = st[-1]
                alt = rules[r][a]
                sym = alt[i]
                if isinstance(sym, int):
                    base = st[:-1] + (((r, a, i + 1),) if i + 1 < len(alt) else ())
                    for b, sub in enumerate(rules[sym]):
                        todo.append(base + (((sym, b, 0),) if sub else ()))
                    continue
            out.add(st)
            if len(out) > self.max_stacks:
                raise GrammarTooComplex(f"the grammar is too ambiguous for the sampler (more than "
                                        f"{self.max_stacks} ways to read the same text)")

    def initial(self) -> set[Stack]:
        out: set[Stack] = set()
        for a, alt in enumerate(self.g.rules[self.g.root]):
            self.advance((((self.g.root, a, 0),) if alt else ()), out)
        return out

    def accept(self, stacks: set[Stack], cp: int) -> set[Stack]:
        out: set[Stack] = set()
        for st in stacks:
            if not st:
                continue
            r, a, i = st[-1]
            alt = self.g.rules[r][a]
            sym = alt[i]
            assert not isinstance(sym, int)
            if _matches(sym, cp):
                self.advance(st[:-1] + (((r, a, i + 1),) if i + 1 < len(alt) else ()), out)
        return out

    def candidates(self, stacks: set[Stack]) -> list[int]:
        found: dict[int, None] = {}
        for st in stacks:
            if st:
                r, a, i = st[-1]
                sym = self.g.rules[r][a][i]
                assert not isinstance(sym, int)
                for cp in _representatives(sym):
                    found.setdefault(cp)
        return sorted(found)[:24]


def _matches(t: Terminal, cp: int) -> bool:
    ranges, negated = t
    return any(lo <= cp <= hi for lo, hi in ranges) != negated


def _representatives(t: Terminal) -> list[int]:
    ranges, negated = t
    if not negated:
        return [lo for lo, _ in ranges[:4]]
    for ch in _NEG_PROBES:
        if _matches(t, ord(ch)):
            return [ord(ch)]
    return []


def stack_peak(gbnf: str, *, max_stacks: int = MAX_STACKS, steps: int = PROBE_STEPS,
               budget: int = WORK_BUDGET) -> int:
    """The most stacks llama.cpp would hold at once along the probe (the character that leaves the most
    stacks, step after step). Raises GrammarTooComplex past max_stacks, the work budget, or for a
    grammar it cannot read."""
    probe = _Probe(parse_gbnf(gbnf), max_stacks, budget)
    stacks = probe.initial()
    peak = len(stacks)
    for _ in range(steps):
        best: set[Stack] = set()
        for cp in probe.candidates(stacks):
            nxt = probe.accept(stacks, cp)
            if len(nxt) > len(best):
                best = nxt
        if not best:
            break
        stacks = best
        peak = max(peak, len(stacks))
    return peak
