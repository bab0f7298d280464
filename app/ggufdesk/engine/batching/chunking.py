"""How many prompt tokens ride in a step beside decoding streams: sized by measured time, not a constant.

A fixed chunk cannot keep its promise: on a 2-core CPU the same 128-token chunk beside 4 decode
rows costs 9x a plain decode step at the start of a 3,000-token prompt and 14.5x at its end
(attention over the growing prompt), and 124 tokens + 4 rows (128 rows) cost 0.8x what 128 + 4
(132 rows) cost, because the CPU kernels work in 32-row tiles (bench/batch.py part 1 and
docs/architecture.md, "Chunked prefill"). So the engine measures:

- `decode_s[n]`: a step that only decodes n rows (what running streams see undisturbed);
- `token_s`: what one prompt token adds to a step, from the last chunked steps (it grows with the
  prompt's position, so recent steps weigh most);

and gives the next chunk as many tokens as fit `STALL x decode_s[n]`, rounded so the step's rows are
a whole number of tiles. Running streams then never wait more than about STALL plain steps for their
next token, and the prompt advances as fast as that allows.
"""
from __future__ import annotations

STALL = 9.0  # a step with a prompt chunk may take this many plain decode steps
ROW_TILE = 32  # steps whose rows fill whole tiles of this size cost least (measured, see above)
FALLBACK = 124  # before anything is measured: 124 tokens + 4 rows = 128 rows, 9x a plain step here
EMA_DECODE = 0.2  # plain steps are steady: average over about five
EMA_TOKEN = 0.6  # prompt-token cost moves with the position: follow the last step closely


class ChunkSizer:
    """Prompt tokens for the next step beside n decoding rows (n >= 1)."""

    def __init__(self, *, n_batch: int, stall: float = STALL, tile: int = ROW_TILE) -> None:
        self.n_batch, self.stall, self.tile = n_batch, stall, tile
        self.decode_s: dict[int, float] = {}
        self.token_s: float | None = None

    def observe(self, n_decode: int, n_prompt: int, seconds: float) -> None:
        """A step took `seconds`: n_decode one-token rows plus n_prompt prompt tokens."""
        if n_decode < 1 or seconds <= 0:
            return
        if n_prompt == 0:
            old = self.decode_s.get(n_decode)
            self.decode_s[n_decode] = seconds if old is None else old + EMA_DECODE * (seconds - old)
            return
        base = self._decode_estimate(n_decode)
        if base is None:
            return
        per = max(seconds - base, 0.0) / n_prompt
        self.token_s = per if self.token_s is None else self.token_s + EMA_TOKEN * (per - self.token_s)

    def chunk(self, n_decode: int) -> int:
        """Tokens of one prompt to prefill in the next step beside n_decode decoding rows."""
        room = self.n_batch - n_decode
        if room <= 0:
            return 0
        base = self._decode_estimate(n_decode)
        if base is None or self.token_s is None:
            want = FALLBACK
        elif self.token_s <= 0:  # prompt tokens measured free (a GPU with room to spare): all of them
            want = room
        else:
            want = int((self.stall - 1.0) * base / self.token_s)
        rows = (n_decode + want) // self.tile * self.tile  # whole tiles, rounded down
        want = rows - n_decode
        while want < self.tile // 2:  # never so small that the prompt crawls
            want += self.tile
        return max(1, min(want, room))

    def _decode_estimate(self, n: int) -> float | None:
        """A plain step of n rows: measured, else the nearest measured row count's."""
        if n in self.decode_s:
            return self.decode_s[n]
        if not self.decode_s:
            return None
        # a plain step is mostly one pass over the weights, whatever the rows: the nearest will do
        return self.decode_s[min(self.decode_s, key=lambda k: abs(k - n))]
