"""Answers from documents: hybrid retrieval over a collection and the prompt that cites its sources.

Retrieval fuses BM25 (FTS5) and vector search (sqlite-vec) by reciprocal rank fusion; with no
embedding model it is BM25 alone and says so. No reranker is used: none runs in our engine yet (no
reranker GGUF is available to test one with), so `Retriever.reranker` is always "none".
The chosen passages go into the question's message, numbered [1], [2]..., as many as the token budget
holds; those that do not fit are named, never silently dropped. Windows, the terminal chat and the
server all answer through this module.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ggufdesk.core.docs.store import Collection, Passage

CANDIDATES = 50  # passages each search contributes to the fusion
RRF_K = 60  # the usual constant of reciprocal rank fusion (Cormack et al. 2009); not tuned here
CHARS_PER_TOKEN = 3.0  # a cautious estimate (English prose is ~4, code ~3): budgets never overflow
MAX_TERMS = 32

Embedder = Callable[[list[str]], Sequence[Sequence[float]]]

# Words that only join a question together: searching them finds every passage.
STOPWORDS = frozenset("""a about above after again against all also am an and any are as at be because been
before being below between both but by can could did do does doing down during each few for from further had
has have having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should so some
such than that the their theirs them themselves then there these they this those through to too under until up
very was we were what when where which while who whom why will with would you your yours yourself yourselves
tell please explain describe say said according document documents file files text""".split())

INSTRUCTIONS = ("Answer the question using the numbered sources below. Cite every source you use by its number "
                "in brackets, like [1] or [2]. If the sources do not contain the answer, say so.")


@dataclass(frozen=True, slots=True)
class Citation:
    """A source placed in the prompt as [index]."""

    index: int
    source: str
    page: int  # 1-based for a PDF; 0 when the document has no pages
    lines: tuple[int, int]
    score: float
    text: str
    chunk_id: int = 0

    def label(self) -> str:
        where = f", page {self.page}" if self.page else ""
        a, b = self.lines
        span = f"line {a}" if a == b else f"lines {a}-{b}"
        return f"{Path(self.source).name}{where}, {span}"

    def as_dict(self) -> dict[str, Any]:
        """The shape of `docs search --json` results (plus the index the answer cites)."""
        return {"index": self.index, "source": self.source, "page": self.page or None,
                "lines": list(self.lines), "score": round(self.score, 6), "text": self.text}


def fts_query(text: str) -> str:
    """An FTS5 MATCH expression for free text: its meaningful words, each quoted, joined by OR."""
    words = [w for w in re.findall(r"\w+", text.lower()) if w not in STOPWORDS and (len(w) > 1 or w.isdigit())]
    unique = list(dict.fromkeys(words))[:MAX_TERMS]
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in unique)


def fuse(ranked: Sequence[Sequence[Passage]], k: int = RRF_K) -> list[tuple[Passage, float]]:
    """Reciprocal rank fusion: each list adds 1 / (k + rank) to a passage's score."""
    scores: dict[int, float] = {}
    first: dict[int, Passage] = {}
    for items in ranked:
        for rank, p in enumerate(items, 1):
            scores[p.id] = scores.get(p.id, 0.0) + 1.0 / (k + rank)
            first.setdefault(p.id, p)
    return sorted(((first[i], s) for i, s in scores.items()), key=lambda x: -x[1])


class Retriever:
    """Search one collection. `embed` turns the query into a vector (the collection's own model)."""

    reranker = "none"

    def __init__(self, coll: Collection, *, embed: Embedder | None = None) -> None:
        self.coll = coll
        self.embed = embed if coll.has_vectors else None

    @property
    def mode(self) -> str:
        return "hybrid" if self.embed is not None else "bm25"

    @property
    def note(self) -> str:
        """What the user should know about how the search works (shown by the window and the CLI)."""
        if self.embed is not None:
            return f"hybrid search (BM25 + vectors from {Path(self.coll.embed_model).name}); no reranker"
        if self.coll.has_vectors:
            return "keyword (BM25) search only: the collection's embedding model is not running"
        return "keyword (BM25) search only: the collection has no embedding model"

    def search(self, query: str, k: int = 5) -> list[Citation]:
        lists = [self.coll.search_text(fts_query(query), CANDIDATES)]
        if self.embed is not None:
            vector = self.embed([query])[0]
            lists.append(self.coll.search_vector(vector, CANDIDATES))
            hits = fuse(lists)
        else:
            hits = [(p, p.score) for p in lists[0]]
        return [Citation(i, p.source, p.page, (p.line_start, p.line_end), score, p.text, p.id)
                for i, (p, score) in enumerate(hits[:k], 1)]


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def source_block(c: Citation) -> str:
    return f"[{c.index}] {c.label()}:\n{c.text}"


@dataclass(slots=True)
class Grounding:
    """A question with its sources: the text the model gets, what was cited and what was left out."""

    text: str
    cited: list[Citation] = field(default_factory=list)
    left_out: list[Citation] = field(default_factory=list)

    def notice(self) -> str:
        """What to tell the user about sources that did not fit ("" when all did)."""
        if not self.left_out:
            return ""
        names = ", ".join(c.label() for c in self.left_out)
        n = len(self.left_out)
        return (f"{n} source{'s' if n > 1 else ''} did not fit the model's context and "
                f"{'were' if n > 1 else 'was'} left out: {names}")

    def stats(self) -> dict[str, Any]:
        """Kept with the answer in the history (the window shows and opens them)."""
        return {"citations": [c.as_dict() for c in self.cited],
                "sources_left_out": [c.as_dict() for c in self.left_out]}


def ground(question: str, hits: Sequence[Citation], budget_tokens: int,
           count: Callable[[str], int] = estimate_tokens) -> Grounding:
    """The question with as many of `hits` (best first) as fit in `budget_tokens`, renumbered 1..n in
    the order given. A source that does not fit is left out and named; smaller ones after it may fit."""
    used = count(INSTRUCTIONS) + count(question) + 16
    cited: list[Citation] = []
    left: list[Citation] = []
    for hit in hits:
        block = source_block(hit)
        need = count(block) + 2
        if used + need <= budget_tokens:
            cited.append(Citation(len(cited) + 1, hit.source, hit.page, hit.lines, hit.score, hit.text,
                                  hit.chunk_id))
            used += need
        else:
            left.append(hit)
    if not cited:
        return Grounding(question, [], list(hits))
    body = "\n\n".join(source_block(c) for c in cited)
    return Grounding(f"{INSTRUCTIONS}\n\nSources:\n\n{body}\n\nQuestion: {question}", cited, left)


def budget_for(n_ctx: int, *, conversation: str, max_tokens: int) -> int:
    """Tokens the sources may take: the model's context (the size the planner chose when loading) less
    the conversation, the answer's room (max_tokens, at least a quarter of the context) and a margin."""
    answer = max(max_tokens, n_ctx // 4)
    return max(0, n_ctx - estimate_tokens(conversation) - answer - 64)


class Attached:
    """A collection attached to a conversation: each question is answered from its best passages."""

    def __init__(self, retriever: Retriever, *, k: int = 5) -> None:
        self.retriever = retriever
        self.k = k

    @property
    def name(self) -> str:
        return self.retriever.coll.name

    def apply(self, request: dict[str, Any], question: str, *, n_ctx: int, max_tokens: int) -> Grounding:
        """Put the sources for `question` (the request's last user message) into the request, in place."""
        hits = self.retriever.search(question, self.k)
        messages = request.get("messages")
        if messages:
            last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
            others = "\n".join(str(m.get("content") or "") for m in messages if m is not last)
            grounding = ground(question, hits, budget_for(n_ctx, conversation=others, max_tokens=max_tokens))
            if last is not None:
                last["content"] = grounding.text
            return grounding
        prompt = str(request.get("prompt") or "")
        others = prompt[:-len(question)] if question and prompt.endswith(question) else prompt
        grounding = ground(question, hits, budget_for(n_ctx, conversation=others, max_tokens=max_tokens))
        request["prompt"] = others + grounding.text if others != prompt else prompt
        return grounding


class _Opened:
    """A retriever over a named collection with its embedding engine (when its model is there); closes both."""

    def __init__(self, name: str, root: Path | None, embed: bool) -> None:
        self.coll = Collection.open(name, root=root)
        self.engine: Any = None
        model = self.coll.embed_model
        if embed and self.coll.has_vectors and Path(model).is_file():
            from ggufdesk.session.embedding import EmbeddingEngine

            self.engine = EmbeddingEngine(model)
        self.retriever = Retriever(self.coll, embed=self.engine)

    def __enter__(self) -> Retriever:
        return self.retriever

    def __exit__(self, *exc: object) -> None:
        if self.engine is not None:
            self.engine.close()
        self.coll.close()


def open_retriever(name: str, *, root: Path | None = None, embed: bool = True) -> _Opened:
    """`with open_retriever(name) as r: r.search(...)`: hybrid when the collection's model is there."""
    return _Opened(name, root, embed)
