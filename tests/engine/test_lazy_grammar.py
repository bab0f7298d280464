"""The lazy tool-call grammar, token by token, on a real vocabulary (tiny model, in a child process
so the in-process llama.cpp state of the test runner is never touched)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import json, sys
    from ggufdesk.core import tools as T
    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.batching.vocab import Vocab
    from ggufdesk.engine.structured.grammar import _openings, tool_grammar
    from ggufdesk.engine.structured.grammar import GrammarConstraint
    from ggufdesk.engine.runtime.native import LlamaLog, load_model

    lm = load_model(sys.argv[1], LoadSettings(n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1,
                                              n_threads_batch=1), LlamaLog())
    gen = Vocab(lm)
    tools = T.check_tools([{"type": "function", "function": {"name": "now", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}}])
    g = tool_grammar(tools, T.GENERIC, "auto")
    out = {}

    def make(piece=gen.piece):
        return GrammarConstraint(lm.vocab, lm.n_vocab, g.gbnf, piece=piece, marker=g.marker,
                                 openings=_openings(T.GENERIC))

    # a model that chats, then calls the tool: every token of it is allowed, in order
    c = make()
    text = 'Sure, let me look. <tool_call>\\n{"name": "now", "arguments": {"tz": "CET"}}\\n</tool_call>'
    toks = gen.tokenize(text, add_bos=False)
    allowed = []
    for t in toks:
        allowed.append(c.allows(t))
        c.accept(t)
    out["all_allowed"] = all(allowed)
    out["triggered"] = not c.awaiting
    out["eos_allowed_at_end"] = c.allows(2)
    # before the marker anything goes; after it, the grammar rules
    c2 = make()
    for t in gen.tokenize("hi <tool_call>", add_bos=False):
        c2.accept(t)
    out["after_marker_brace"] = c2.allows(gen.tokenize("{", add_bos=False)[0])
    out["after_marker_letter"] = c2.allows(gen.tokenize("x", add_bos=False)[0])
    out["after_marker_eos"] = c2.allows(2)
    # after a rejection, greedy takes the best allowed token among the top 64: the same token as
    # the argmax over the fully masked vocabulary whenever one of them is allowed
    import numpy as np
    rng = np.random.default_rng(0)
    same = []
    for _ in range(50):
        logits = rng.normal(size=lm.n_vocab).astype(np.float32)
        best = c2._best_allowed(logits)
        full = int(np.argmax(c2.mask(logits)))
        same.append(best is None or best == full)
    out["top_k_exact"] = all(same)
    c3 = make()
    out["free_before"] = all(c3.allows(t) for t in gen.tokenize("x y z", add_bos=False))
    # a token that would complete the marker with text the grammar cannot take is refused
    fake = {1000: b"<tool_call", 1001: b">x", 1002: b">", 1003: b'>\\n{"na'}
    c4 = make(piece=lambda t: fake.get(t, b""))
    c4._buf = b"say <tool_call"
    out["guard"] = [c4.allows(1001), c4.allows(1002), c4.allows(1003)]
    for x in (c, c2, c3, c4):
        x.close()
    print(json.dumps(out))
''')


def test_lazy_grammar_token_by_token(tiny_model):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["all_allowed"] and out["triggered"] and out["eos_allowed_at_end"]
    assert out["after_marker_brace"] and not out["after_marker_letter"] and not out["after_marker_eos"]
    assert out["free_before"] and out["top_k_exact"]
    assert out["guard"] == [False, True, True]
