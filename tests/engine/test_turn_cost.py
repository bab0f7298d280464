"""What an agent's every turn repeats is done once: the tools' meta-schema check (core/schema.py), the
grammar plan (engine/structured/request.py) and the prompt's rendering (engine/runtime/worker.py). Each
memo gives what the work would, and keeps nothing a request could change or a refusal."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ggufdesk.core import schema as S
from ggufdesk.engine.structured import request as R
from tests.engine.test_client_tools import claude_code_tools


def _plan(tools, **kw):
    return R.plan(tools=tools, tool_choice=kw.pop("tool_choice", "auto"), template_source=kw.pop("template", None),
                  chat=True, **kw)


def test_a_schema_is_meta_checked_once_and_a_refused_one_every_time(monkeypatch):
    monkeypatch.setattr(S, "_META_PASSED", type(S._META_PASSED)())  # nothing remembered from other tests
    ran: list[object] = []
    real = S._meta_check_once
    monkeypatch.setattr(S, "_meta_check_once", lambda s: (ran.append(s), real(s)))
    good = {"type": "object", "properties": {"path": {"type": "string", "minLength": 1}}, "title": "memo-1"}
    S.check_schema(good)
    S.check_schema(copy.deepcopy(good))  # the same content, another object: an agent's next turn
    assert len(ran) == 1
    S.check_schema({**good, "title": "memo-2"})  # other content
    assert len(ran) == 2
    bad = {"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}}
    for _ in range(2):
        with pytest.raises(S.SchemaError, match="not a valid JSON schema"):
            S.check_schema(bad)
    assert len(ran) == 4


def test_the_meta_check_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(S, "_META_PASSED_MAX", 3)
    monkeypatch.setattr(S, "_META_PASSED", type(S._META_PASSED)())
    for i in range(10):
        S.check_schema({"type": "object", "title": f"bounded {i}"})
    assert len(S._META_PASSED) == 3


def test_a_plan_made_again_is_the_same_and_its_tools_are_the_request_s_own():
    tools = claude_code_tools()
    first = _plan(tools)
    again = _plan(copy.deepcopy(tools))
    assert (again.gbnf, again.marker, again.mode, again.fmt, again.tools) == \
        (first.gbnf, first.marker, first.mode, first.fmt, first.tools)
    again.tools[0]["function"]["name"] = "changed by one request"
    assert _plan(tools).tools[0]["function"]["name"] == tools[0]["function"]["name"]


QWEN3 = (Path(__file__).parents[1] / "fixtures" / "templates" / "qwen3.jinja").read_text()


@pytest.mark.parametrize("change", [{"tool_choice": "auto"}, {"template": QWEN3}, {"parallel_tool_calls": True},
                                    {"reasoning": True}])
def test_a_plan_for_other_fields_is_planned_anew(change):
    tools = claude_code_tools()[:3]
    base = _plan(tools, tool_choice="required")
    other = _plan(tools, **{"tool_choice": "required", **change})
    assert (other.gbnf, other.marker, other.mode, other.fmt) != (base.gbnf, base.marker, base.mode, base.fmt)
    R._PLANS.clear()  # and planned from nothing, the same
    fresh = _plan(tools, **{"tool_choice": "required", **change})
    assert (fresh.gbnf, fresh.marker, fresh.mode, fresh.fmt) == (other.gbnf, other.marker, other.mode, other.fmt)


def test_a_refused_plan_is_refused_again_and_the_memo_is_bounded(monkeypatch):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}]
    for _ in range(2):
        with pytest.raises(S.SchemaError):
            _plan(bad)
    monkeypatch.setattr(R, "_PLANS_MAX", 2)
    for i in range(5):
        R.plan(json_schema={"type": "object", "title": f"plan {i}"}, template_source=None, chat=True)
    assert len(R._PLANS) == 2


def test_a_prompt_that_fits_is_rendered_once(tiny_chatml):
    from tests.engine.inproc import Live

    live = Live(tiny_chatml, n_ctx=256)
    try:
        rendered: list[str] = []
        real = live.engine.template.render
        live.engine.template.render = lambda *a, **k: rendered.append("x") or real(*a, **k)
        events = live.run("once", messages=[{"role": "user", "content": "hello"}], sampling={"max_tokens": 2})
        assert events[-1].finish_reason in ("length", "stop") and rendered == ["x"]
    finally:
        live.close()
