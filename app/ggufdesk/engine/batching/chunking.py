"""How many prompt tokens ride in a step beside decoding streams: sized by measured time, not a constant.

A fixed chunk cannot keep its promise: on a 2-core CPU the same 128-token chunk beside 4 decode
rows costs 9x a plain decode step at the start of a 3,000-token prompt and 14.5x at its end
(attention over the growing prompt), and 124 tokens + 4 rows (128 rows) cost 0.8x what 128 + 4
(132 rows) cost, because the CPU kernels work in 32-row tiles (bench/batch.py part 1 and
docs/architecture.md, "Chunked prefill"). So the engine measures:

- `decode_s[n]`: a step that only decodes n rows (what running streams see undisturbed);
- what one prompt token adds to a step, per shape of step (`Shape`: its rows in whole tiles), at the
  position it was measured: the cost per row differs by shape (SmolLM2-135M beside one row at position
  16,000: 69 ms a token in a 32-row step, 32 in a 64-row one, bench/chunk_shape.py; the Gemma 3 starter
  in the engine's loop beside 4 rows near position 2,700: 4.7 ms in a 28-token chunk, 7.0 in a 60-token
  one), and one price for all shapes made the chunk swing between them, the larger over its aim by 40%
  (docs/bench/engine.md, "A prompt token's cost by shape and position");
- `slope`: what a prompt token's cost grows by per position (it attends to every token before it:
  SmolLM2 beside one row of 10-17 ms, in 31-token chunks: 3.4 ms a token at position 0, 14 at 3,000,
  34 at 8,000, 69 at 16,000), fitted over more steps than a shape's price;

and gives the next chunk the most tokens whose step fits `STALL x decode_s[n]` at the position it
resumes from, in whole tiles of rows. Running streams then wait about STALL plain steps for their next
token at most, and the prompt advances as fast as that allows.
"""
from __future__ import annotations

from dataclasses import dataclass

STALL = 9.0  # a step with a prompt chunk may take this many plain decode steps
ROW_TILE = 32  # steps whose rows fill whole tiles of this size cost least (measured, see above)
# Fewer prompt tokens than this are not worth a step even where the budget asks for fewer (deep in a long
# prompt): below it a token's share climbs (SmolLM2 at position 16,000: 107 ms a token alone, 78 in 4, 73 in
# 8, 69 in 31; at 3,000: 22, 16, 15, 14; bench/chunk_shape.py) and the prompt would crawl: the budget gives way.
MIN_CHUNK = 8
EMA_DECODE = 0.2  # plain steps are steady: average over about five
EMA_TOKEN = 0.6  # a shape's price moves with load and threads: follow its last step closely
# The slope needs positions far apart: one step's cost scatters 10-25%, which over a few chunks (100-200
# positions) outweighs what attention adds, so it is fitted over the last few thousand prompt tokens read
# (a step's weight halves every SLOPE_HALF_LIFE tokens read after it)...
SLOPE_HALF_LIFE = 2048
MIN_SPREAD = 256.0  # ...and used only once their positions spread this far (standard deviation); else 0
# Nearer the start than a shape was measured, its price falls with the slope, to half at most: a price
# measured deep and a slope fitted there are not trusted far below (it is measured again a step later)
LOW_SHARE = 0.5


@dataclass
class Shape:
    """One shape of step (rows in whole tiles): a prompt token's recent price and where it was measured."""

    token_s: float
    at: float

    def price(self, position: float, slope: float) -> float:
        """A prompt token's cost at `position`, carried there from where it was measured by `slope`."""
        p = self.token_s + slope * (position - self.at)
        return max(p, LOW_SHARE * self.token_s)


class ChunkSizer:
    """Prompt tokens for the next step beside n decoding rows (n >= 1)."""

    def __init__(self, *, n_batch: int, stall: float = STALL, tile: int = ROW_TILE) -> None:
        self.n_batch, self.stall, self.tile = n_batch, stall, tile
        self.decode_s: dict[int, float] = {}
        self.shapes: dict[int, Shape] = {}  # by the step's rows in tiles
        self.slope = 0.0  # seconds a prompt token's cost grows by per position (never below 0)
        self._fit = [0.0] * 5  # faded sums over chunked steps, each weighted by its tokens: w, x, y, xx, xy

    def tiles(self, rows: int) -> int:
        return -(-rows // self.tile)

    def observe(self, n_decode: int, n_prompt: int, seconds: float, positions: int = 0) -> None:
        """A step took `seconds`: n_decode one-token rows plus n_prompt prompt tokens, whose positions
        sum to `positions`."""
        if n_decode < 1 or seconds <= 0:
            return
        if n_prompt == 0:
            old = self.decode_s.get(n_decode)
            self.decode_s[n_decode] = seconds if old is None else old + EMA_DECODE * (seconds - old)
            return
        base = self._decode_estimate(n_decode)
        if base is None:
            return
        y, x = max(seconds - base, 0.0) / n_prompt, positions / n_prompt
        k = self.tiles(n_decode + n_prompt)
        s = self.shapes.get(k)
        if s is None:
            s = self.shapes[k] = Shape(y, x)
        else:
            s.token_s += EMA_TOKEN * (y - s.token_s)
            s.at += EMA_TOKEN * (x - s.at)
        self._fit_slope(n_prompt, x, y)

    def _fit_slope(self, n: int, x: float, y: float) -> None:
        """Least squares of a token's cost on its position over the faded chunked steps, all shapes together
        (each shape's own price sets the level; the slope only carries it to other positions)."""
        f, fade, w = self._fit, 0.5 ** (n / SLOPE_HALF_LIFE), float(n)
        for i, v in enumerate((w, w * x, w * y, w * x * x, w * x * y)):
            f[i] = fade * f[i] + v
        sw, sx, sy, sxx, sxy = f
        var = sxx / sw - (sx / sw) ** 2
        self.slope = max(0.0, (sxy / sw - sx * sy / sw ** 2) / var) if var >= MIN_SPREAD ** 2 else 0.0

    def _shape(self, k: int) -> Shape | None:
        """A shape's measured prices, else the nearest measured shape's."""
        if k in self.shapes:
            return self.shapes[k]
        if not self.shapes:
            return None
        return self.shapes[min(self.shapes, key=lambda j: (abs(j - k), j))]

    def cost(self, n_decode: int, n: int, start: int) -> float | None:
        """What n prompt tokens from `start` should add to a step of n_decode rows (None: nothing measured)."""
        s = self._shape(self.tiles(n_decode + n))
        return None if s is None else n * s.price(start + (n - 1) / 2, self.slope)

    def chunk(self, n_decode: int, start: int = 0) -> int:
        """Tokens of one prompt to prefill in the next step beside n_decode decoding rows, the first at
        position `start`."""
        room = self.n_batch - n_decode
        if room <= 0:
            return 0
        base = self._decode_estimate(n_decode)
        if base is None or not self.shapes:
            # before anything is measured: the fewest whole tiles that hold half a tile of prompt tokens, the
            # cheapest step worth measuring (128 rows were read here before: 124 tokens beside 4 rows, 9x a plain
            # step for the starter, but 95 beside one row, 34x for SmolLM2: the streams' worst gap)
            rows = self.tiles(n_decode + self.tile // 2) * self.tile
            return max(1, min(rows - n_decode, room))
        budget = (self.stall - 1.0) * base
        # whole tiles of rows, the largest that fits; a shape measured free (a GPU with room to spare) fits
        rows = (n_decode + room) // self.tile * self.tile
        while rows - n_decode >= self.tile // 2:
            extra = self.cost(n_decode, rows - n_decode, start)
            if extra is not None and extra <= budget:
                return rows - n_decode
            rows -= self.tile
        # not even one tile fits: as many tokens as do within the first tile (priced in its shape)
        k = self.tiles(n_decode + 1)
        s = self._shape(k)
        assert s is not None
        price = s.price(start, self.slope)
        n = min(int(budget / price) if price > 0 else room, k * self.tile - n_decode)
        return max(1, min(max(n, MIN_CHUNK), room))

    def _decode_estimate(self, n: int) -> float | None:
        """A plain step of n rows: measured, else the nearest measured row count's."""
        if n in self.decode_s:
            return self.decode_s[n]
        if not self.decode_s:
            return None
        # a plain step is mostly one pass over the weights, whatever the rows: the nearest will do
        return self.decode_s[min(self.decode_s, key=lambda k: abs(k - n))]
