"""A second held-out suite for prompt lookup, written 2026-12-06 and frozen before its first run.

bench/spec_heldout.py was the held-out suite of issue 29; by now every lookup change of sixteen
sessions was judged on it, so it is no longer work nothing was chosen on. This one is new: other
languages (Spanish, Chinese, Russian, Italian), other templates (a tagged document, 【资料】, a
"copy unchanged" instruction, a Python file and a JSON file to edit, P:/R: and Вопрос:/Ответ:
transcripts), quotes in «…» and “…”, a copy sampled at T 0.7 and free writing at T 0.8. Nothing in
the engine was tuned on it and nothing may be: it is run, reported, and left as it is.

`COPY_HEAVY2` names the categories where lookup should pay (issue 29: >= 1.4x plain); the others
must not lose (>= 0.97x). Prompts open their answer as a chat client's prefill would, for the base
starter's sake (bench/spec_workloads.py says why).

    .venv/bin/python bench/speculative.py --suite heldout2 [--model starter|smollm2] [--hints]
"""
from __future__ import annotations

from bench.spec_workloads import Workload

CADIZ_ES = (
    "La Torre Tavira se levanta en el centro de Cádiz y mide cuarenta y cinco metros. En 1778 fue "
    "nombrada torre vigía oficial del puerto, y desde ella se anunciaba la llegada de los barcos. Hoy "
    "alberga una cámara oscura que proyecta la ciudad sobre una mesa blanca. La visita dura media hora "
    "y se hace en grupos de quince personas."
)
XIHU_ZH = (
    "西湖位于杭州市区西部，湖面面积约六点四平方公里。苏堤全长约二点八公里，是苏轼在杭州任职时主持修建的。"
    "每年春天，堤上的桃花和柳树吸引大量游客。三潭印月是西湖十景之一，湖中立着三座石塔。"
)
BAIKAL_RU = (
    "Байкал — самое глубокое озеро на Земле, его глубина достигает 1642 метров. В озеро впадает больше "
    "трёхсот рек, а вытекает только одна — Ангара. Зимой лёд на Байкале бывает толщиной до метра, и по "
    "нему ездят машины. Вода в озере такая прозрачная, что камни видны на глубине сорока метров."
)
RIALTO_IT = (
    "Il ponte di Rialto attraversa il Canal Grande a Venezia. Fu costruito in pietra tra il 1588 e il 1591, "
    "su progetto di Antonio da Ponte. Sopra il ponte corrono due file di botteghe, separate da una larga "
    "scalinata centrale. Ogni giorno migliaia di persone lo attraversano a piedi."
)
STATS_PY = (
    "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n"
    "\n\ndef spread(values):\n    return max(values) - min(values)\n\n\n"
    "if __name__ == \"__main__\":\n    data = [3, 8, 1, 9, 4]\n    print(average(data), spread(data))\n"
)
CONFIG_JSON = (
    '{\n  "name": "photo-sync",\n  "version": "2.3.1",\n  "debug": false,\n  "paths": {\n'
    '    "source": "/home/ana/Pictures",\n    "target": "/mnt/backup/photos"\n  },\n'
    '  "workers": 3,\n  "retry": 5\n}\n'
)

HELDOUT2: list[Workload] = [
    # ---- quoting a source (copy-heavy)
    Workload("quote-es", "tavira", f'<documento id="1">{CADIZ_ES}</documento>\n\nPregunta: ¿Cuánto mide la torre '
             "y qué alberga hoy? Responde citando el documento entre comillas.\n\nRespuesta: Según el documento, "
             "«La Torre"),
    Workload("quote-zh", "xihu", f"【资料】{XIHU_ZH}\n\n问：苏堤有多长？是谁主持修建的？请引用资料原文回答。\n\n"
             "答：资料中写道：“苏堤"),
    # ---- copying (copy-heavy): greedy, and sampled at T 0.7
    Workload("copy-ru", "baikal", f"Перепиши текст без изменений.\n\nТекст: {BAIKAL_RU}\n\nКопия:\nБайкал"),
    Workload("copy-it", "rialto-sampled", f"Testo originale:\n{RIALTO_IT}\n\nTrascrizione fedele:\nIl ponte", 0.7),
    # ---- editing code and configuration (copy-heavy)
    Workload("edit-py", "rename", f"```python\n{STATS_PY}```\n\nRename the parameter `values` to `numbers` in both "
             "functions. Return the whole file.\n\n```python\ndef average(numbers):\n"),
    Workload("edit-json", "config", f"{CONFIG_JSON}\nSet \"debug\" to true and \"workers\" to 4. Reply with the "
             "full JSON only.\n\n{\n  \"name\": \"photo-sync\",\n"),
    # ---- a list that counts on past the prompt
    Workload("count-es", "dias", "Los días de la semana, en orden:\n1. lunes\n2. martes\n3."),
    # ---- free text and explanations (must not lose)
    Workload("free-es", "lluvia", "Escribe un párrafo sobre una tarde de lluvia en Madrid.\n\n", 0.8),
    Workload("free-zh", "shancun", "写一段关于秋天的山村的短文。\n\n", 0.8),
    Workload("explain-es", "barcos", "P: ¿Por qué flotan los barcos de hierro?\nR:"),
    Workload("explain-ru", "nebo", "Вопрос: Почему небо голубое?\nОтвет:"),
]
HELDOUT2_CATEGORIES = list(dict.fromkeys(w.category for w in HELDOUT2))
COPY_HEAVY2 = ("quote-es", "quote-zh", "copy-ru", "copy-it", "edit-py", "edit-json")
