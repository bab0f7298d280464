"""Chat templates from model files run with a time and size budget; hostile ones are refused at load
(ChatTemplate's probe) with a clear message, fast, and real templates still render."""
from __future__ import annotations

import time

import pytest

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.runtime.chat import ChatTemplate
from tests.fixtures import ggufs

HOSTILE = {
    "nested_ranges": "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                     "{% endfor %}{% endfor %}{% endfor %}",
    "string_loops": "{% for a in 'x' * 100000 %}{% for b in 'y' * 100000 %}{% endfor %}{% endfor %}",
    "big_multiply": "{{ 'x' * 1500000000 }}",
    "float_multiply": "{{ 'x' * 1.5e9 }}",
    "big_multiply_var": "{% set n = 1500000000 %}{{ 'x' * n }}",
    "big_list": "{{ [0] * 100000000 }}",
    "huge_range": "{{ range(10**9)|list }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                "{% endfor %}{{ ns.s }}",
    "center": "{{ 'x'|center(1000000000) }}",
    "format_width": "{{ '%999999999d' % 1 }}",
    "format_method": "{{ '{:>999999999}'.format(1) }}",
    "power": "{{ 10 ** 100000000 }}",
    "recursion": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "deep_parens": "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",
    "escape": ggufs.EVIL_TEMPLATE,
    "syntax": ggufs.BROKEN_TEMPLATE,
    "always_raises": "{{ raise_exception('no') }}",
    "undefined_call": "{{ messages[0].nope() }}",
}


@pytest.fixture
def short_budget(monkeypatch):
    """Hostile templates go over any budget; a short one keeps the suite fast."""
    from ggufdesk.engine.runtime import chat

    monkeypatch.setattr(chat, "PROBE_SECONDS", 0.3)
    monkeypatch.setattr(chat, "RENDER_SECONDS", 0.3)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_refused_at_load(name, short_budget):
    t0 = time.monotonic()
    with pytest.raises(KnownError) as e:
        ChatTemplate(HOSTILE[name], bos="<s>", eos="</s>")
    assert "chat template" in str(e.value)
    assert time.monotonic() - t0 < 15  # the probe's 2 s budget plus a loaded machine's slack


def test_refusal_says_why(short_budget):
    with pytest.raises(KnownError, match="budget"):
        ChatTemplate(HOSTILE["nested_ranges"], bos="", eos="")
    with pytest.raises(KnownError, match="broken"):
        ChatTemplate(HOSTILE["syntax"], bos="", eos="")


def test_real_templates_still_work():
    t = ChatTemplate(ggufs.CHATML_TEMPLATE, bos="<s>", eos="</s>")
    out = t.render([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    plain = ChatTemplate(None, bos="", eos="")
    assert plain.render([{"role": "user", "content": "hi"}]) == "User: hi\nAssistant:"


def test_template_refusing_system_turns_is_not_refused():
    tmpl = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
            "{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    t = ChatTemplate(tmpl, bos="", eos="")
    with pytest.raises(KnownError, match="System role not supported"):
        t.render([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])
    assert t.render([{"role": "user", "content": "y"}]) == "user: y\n"


def test_common_template_features_pass_the_guard():
    tmpl = ("{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
            "{{ m['role']|upper }}{{ m['content']|trim|tojson }}{{ loop.index }}{% endfor %}"
            "{{ ns.n }}{{ strftime_now('%Y')|length }}{{ '-' * 10 }}{{ 12345678901 }}")
    out = ChatTemplate(tmpl, bos="<s>", eos="").render([{"role": "user", "content": " hi "}])
    assert out == '<s>USER"hi"114----------12345678901'


def test_budget_applies_to_later_renders_too(short_budget):
    """Benign on the probe, explosive on a long conversation: stopped at render, not hung."""
    tmpl = ("{% if messages|length > 5 %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}"
            "{% endfor %}{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    t = ChatTemplate(tmpl, bos="", eos="")
    with pytest.raises(KnownError, match="budget"):
        t.render([{"role": "user", "content": "x"}] * 6)


def test_templates_that_read_todays_date_from_a_variable_get_it(monkeypatch):
    """Llama 3.x's template reads `date_string` (without it: "26 Jul 2024"), Firefunction v2's `datetime`;
    llama.cpp's server passes both, so a model's idea of today does not depend on which server runs it."""
    from datetime import datetime

    from ggufdesk.engine.runtime import chat

    monkeypatch.setattr(chat, "_now", lambda: datetime(2026, 12, 2, 9, 30))
    llama33 = ("{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
               "Today Date: {{ date_string }}|{% for m in messages %}{{ m.content }}{% endfor %}")
    firefunction = "{{ datetime }}|{% for m in messages %}{{ m.content }}{% endfor %}|{{ strftime_now('%Y') }}"
    msgs = [{"role": "user", "content": "What is today?"}]
    assert ChatTemplate(llama33, bos="", eos="").render(msgs) == "Today Date: 02 Dec 2026|What is today?"
    fire = ChatTemplate(firefunction, bos="", eos="").render(msgs)
    assert fire.startswith("Dec 02 2026 09:30:00 ") and fire.endswith("|What is today?|2026")
