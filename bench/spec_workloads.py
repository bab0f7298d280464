"""The workload suite of bench/speculative.py: Spec-Bench-like categories, our own completion-style prompts.

The starter model is a base model without a chat template, so every prompt is a text it continues:
a transcript, a document followed by the start of the answer. Greedy unless a temperature is given.

Where the 270M base model does not do the task unless its answer is started, the prompt starts
it, as a chat client's assistant prefill would: code editing gives the file's first line (asked
only to "return the whole file", it wrote `import random` thirty times instead of the file; a
Python file that starts with `import json` sets that off even then, so the third file is
JavaScript), and
the RAG prompts open the quote with its first word (asked only to quote, it wrote its own
sentences: "the river town of Ashford is a busy town, with a population of 10,000").
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    category: str
    name: str
    prompt: str
    temperature: float = 0.0


ASHFORD = (
    "The river town of Ashford sits where two valleys meet. Its market opens at dawn every Saturday, "
    "and farmers bring apples, cheese, honey and wool from the hills. The old stone bridge, built in 1642, "
    "still carries carts across the water, although a newer bridge downstream now takes the heavy lorries. "
    "In winter the river often floods the lower meadows, and the children skate on the frozen ponds. "
    "The town library keeps a collection of maps that show how the streets have changed over three "
    "centuries. Visitors come in summer for the music festival, which fills the square with bands, "
    "dancers and food stalls."
)
BEES = (
    "Honey bees live in colonies of up to sixty thousand workers, a single queen and a few hundred drones. "
    "Workers gather nectar and pollen from flowers within about three kilometres of the hive. They tell "
    "each other where food is with a waggle dance: the angle of the dance shows the direction of the "
    "flowers relative to the sun, and its length shows the distance. Nectar is stored in wax cells and "
    "fanned by the bees' wings until most of the water has evaporated and it has become honey. In winter "
    "the colony clusters together and shivers its flight muscles to keep the queen warm."
)
LIGHTHOUSE = (
    "The lighthouse at Carrick Point was built in 1858 after three ships were wrecked on the reef in a "
    "single winter. Its tower is twenty-six metres tall and painted in red and white bands. Until 1961 "
    "two keepers lived in the cottages at its foot and took turns to wind the clockwork that turned the "
    "lens every night. The light was converted to electricity in 1961 and made fully automatic in 1989. "
    "Today the cottages hold a small museum with the original lens, the keepers' logbooks and a collection "
    "of photographs of the ships that passed the point."
)
TRAIN = (
    "The night train from Vienna to Venice leaves at nine in the evening and arrives a little after eight "
    "the next morning. Passengers can choose between seats, couchettes with six berths and sleeping cars "
    "with one to three beds. Breakfast is served in the sleeping cars. The train crosses the Alps through "
    "the Semmering pass, which was the first mountain railway in Europe and is now a World Heritage Site."
)

CODE_STACK = '''class Stack:
    """A last-in, first-out stack of items."""

    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        if not self.items:
            raise IndexError("peek at an empty stack")
        return self.items[-1]

    def size(self):
        return len(self.items)

    def is_empty(self):
        return len(self.items) == 0
'''
CODE_TEMPS = '''def read_temperatures(path):
    """Read one temperature in Celsius per line, skipping blank lines."""
    values = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                values.append(float(line))
    return values


def average(values):
    return sum(values) / len(values)


def report(path):
    values = read_temperatures(path)
    print("readings:", len(values))
    print("average:", round(average(values), 1))
    print("highest:", max(values))
    print("lowest:", min(values))
'''
CODE_CART = '''function formatPrice(cents, currency) {
  const amount = (cents / 100).toFixed(2);
  return `${amount} ${currency}`;
}

function total(items) {
  let sum = 0;
  for (const item of items) {
    sum += item.price * item.quantity;
  }
  return sum;
}

function describeCart(items, currency) {
  const lines = items.map((item) => `${item.quantity} x ${item.name}`);
  lines.push(`Total: ${formatPrice(total(items), currency)}`);
  return lines.join("\\n");
}
'''


def _edit(file: str, change: str, lang: str = "python") -> str:
    """Code editing: the file, the change, and the answer's first line (a base model copies on from there)."""
    first = file.splitlines()[0]
    return f"```{lang}\n{file}```\n\n{change} Return the whole file.\n\n```{lang}\n{first}\n"


def _rag(sources: list[str], question: str, opening: str) -> str:
    """RAG: numbered sources, the question, and the answer's opening up to the quote's first word."""
    listed = "\n".join(f"[{i + 1}] {s}" for i, s in enumerate(sources))
    return (f"Sources:\n{listed}\n\nQuestion: {question} Answer by quoting the sources word for word, "
            f"with their numbers.\nAnswer: According to [1], \"{opening}")


def _chat(turns: list[tuple[str, str]], last: str) -> str:
    out = ["A conversation between a curious user and a helpful assistant.\n"]
    for q, a in turns:
        out.append(f"User: {q}\nAssistant: {a}\n")
    out.append(f"User: {last}\nAssistant:")
    return "\n".join(out)


def _long_records() -> str:
    """A product catalogue of ~6,500 tokens (deterministic), then a request to copy one record."""
    rng = random.Random(7)
    colours = ["red", "blue", "green", "black", "white", "grey", "yellow", "orange", "purple", "brown"]
    things = ["kettle", "lamp", "chair", "backpack", "teapot", "umbrella", "notebook", "jacket", "bicycle bell",
              "garden hose", "desk fan", "wool blanket", "rain boots", "coffee grinder", "picture frame"]
    places = ["Leeds", "Porto", "Gdansk", "Lyon", "Turin", "Aarhus", "Ghent", "Brno", "Cork", "Bilbao"]
    uses = ["for small kitchens", "for long walks", "for the office", "for children", "for camping trips",
            "for cold evenings", "for the garden", "for rainy days", "for students", "for travel"]
    recs = []
    for i in range(100):
        sku = f"SKU-{4100 + i * 7}"
        recs.append(
            f"{sku}: {rng.choice(colours)} {rng.choice(things)}, made in {rng.choice(places)}, "
            f"{rng.randint(2, 90)}.{rng.randint(0, 99):02d} euros, {rng.randint(0, 400)} in stock, "
            f"weight {rng.randint(1, 40) * 50} g. A sturdy choice {rng.choice(uses)}, "
            f"with a {rng.randint(1, 5)}-year warranty and free returns within {rng.choice([14, 30, 60])} days."
        )
    pick = recs[70].split(":")[0]
    return ("Product catalogue, one record per line.\n\n" + "\n".join(recs)
            + f"\n\nThe record for {pick}, copied exactly from the catalogue:\n{pick}:")


WORKLOADS: list[Workload] = [
    # ---- multi-turn chat
    Workload("chat", "garden", _chat(
        [("What should I plant in a shady corner of my garden?",
          "Ferns, hostas and foxgloves all grow well in shade. Hostas have large leaves, ferns need moist "
          "soil, and foxgloves flower in early summer."),
         ("Which of those need the least water?", "Foxgloves need the least water once they are established.")],
        "Can you remind me what you said about the ferns and the hostas?")),
    Workload("chat", "trip", _chat(
        [("I am taking the night train from Vienna to Venice. When does it leave?",
          "The night train from Vienna to Venice leaves at nine in the evening and arrives a little after "
          "eight the next morning."),
         ("What kinds of beds are there?",
          "You can choose between seats, couchettes with six berths and sleeping cars with one to three beds.")],
        "Please repeat both answers together so I can save them.")),
    Workload("chat", "recipe", _chat(
        [("How do I make a simple tomato sauce?",
          "Fry a chopped onion in olive oil until soft, add two cloves of garlic, then a tin of tomatoes, "
          "salt and a pinch of sugar. Simmer for twenty minutes and stir in fresh basil."),
         ("How long does it keep?", "It keeps for four days in the fridge or three months in the freezer.")],
        "Write the recipe out again as numbered steps.")),
    # ---- translation
    Workload("translation", "fr-en", "Translate from French to English.\n\nFrench: La ville de Ashford se trouve "
             "au confluent de deux vallées. Son marché ouvre à l'aube chaque samedi, et les fermiers apportent "
             "des pommes, du fromage, du miel et de la laine des collines. Le vieux pont de pierre, construit en "
             "1642, porte encore des charrettes au-dessus de l'eau.\nEnglish:"),
    Workload("translation", "de-en", "Translate from German to English.\n\nGerman: Der Nachtzug von Wien nach "
             "Venedig fährt um neun Uhr abends ab und kommt kurz nach acht Uhr morgens an. Die Fahrgäste können "
             "zwischen Sitzplätzen, Liegewagen mit sechs Betten und Schlafwagen wählen. Im Schlafwagen wird "
             "Frühstück serviert.\nEnglish:"),
    Workload("translation", "en-es", "Translate from English to Spanish.\n\nEnglish: Honey bees live in "
             "colonies of up to sixty thousand workers. Workers gather nectar and pollen from flowers near the "
             "hive. In winter the colony clusters together to keep the queen warm.\nSpanish:"),
    # ---- summarization
    Workload("summarization", "bees", f"Article:\n{BEES}\n\nSummary of the article in three sentences:\n"),
    Workload("summarization", "lighthouse", f"Article:\n{LIGHTHOUSE}\n\nA short summary:\n"),
    Workload("summarization", "ashford", f"Article:\n{ASHFORD}\n\nTL;DR:"),
    # ---- question answering over a passage
    Workload("qa", "bridge", f"Passage:\n{ASHFORD}\n\nQuestion: When was the old stone bridge built, and what "
             "does it carry today?\nAnswer:"),
    Workload("qa", "dance", f"Passage:\n{BEES}\n\nQuestion: How do bees tell each other where the flowers "
             "are?\nAnswer:"),
    Workload("qa", "keepers", f"Passage:\n{LIGHTHOUSE}\n\nQuestion: What did the keepers do, and when did the "
             "light become automatic?\nAnswer:"),
    # ---- math reasoning
    Workload("math", "apples", "Question: A farmer has 48 apples. She sells 15 at the market and gives a third "
             "of the rest to her neighbour. How many apples does she have left?\nLet's think step by step.\n"),
    Workload("math", "train", "Question: A train travels 180 km in 2 hours and then 120 km in 1.5 hours. What "
             "is its average speed for the whole journey?\nLet's think step by step.\n"),
    Workload("math", "tickets", "Question: Adult tickets cost 12 euros and child tickets cost 7 euros. A group "
             "of 9 people paid 88 euros. How many children were in the group?\nLet's think step by step.\n"),
    # ---- retrieval-augmented answers that quote their sources
    Workload("rag", "festival", _rag([ASHFORD, TRAIN], "What happens in Ashford in summer and in winter?",
                                     "Visitors")),
    Workload("rag", "winter", _rag([BEES, LIGHTHOUSE], "How do bees survive the winter, and when was the "
                                   "lighthouse automated?", "In winter")),
    Workload("rag", "beds", _rag([TRAIN, ASHFORD], "What can passengers on the night train choose between?",
                                 "Passengers")),
    # ---- code editing: return the file with a small change
    Workload("code", "stack", _edit(CODE_STACK, "Rename the method `size` to `__len__`.")),
    Workload("code", "temps", _edit(CODE_TEMPS, "Change `report` so that it also prints the number of readings "
                                    "above 30 degrees.")),
    Workload("code", "cart", _edit(CODE_CART, "Rename `total` to `cartTotal` everywhere.", "javascript")),
    # ---- copy / extract
    Workload("copy", "ashford", f"Text: {ASHFORD}\n\nThe same text, copied exactly:\n{ASHFORD[:40]}"),
    Workload("copy", "bees", f"Text: {BEES}\n\nThe sentences of the text that mention winter or nectar, "
             "copied exactly:\n"),
    Workload("copy", "lighthouse", f"Document:\n{LIGHTHOUSE}\n\nThe second, third and fourth sentences of the "
             "document, copied word for word:\n"),
    # ---- free writing (sampled)
    Workload("writing", "bottle", "Write a short story about a lighthouse keeper who finds a message in a "
             "bottle.\n\n", 0.8),
    Workload("writing", "letter", "Dear grandmother,\n\nThank you for the scarf you knitted for my birthday. ",
             0.8),
    Workload("writing", "poem", "A poem about the first snow of winter:\n\n", 0.8),
    # ---- one long prompt (>= 6,000 tokens)
    Workload("long", "catalogue", _long_records()),
]

CATEGORIES = list(dict.fromkeys(w.category for w in WORKLOADS))
