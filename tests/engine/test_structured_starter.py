"""Structured output on the real starter model (262k-token vocabulary): outputs validate, tools too.

bench/structured.py runs all 50 test schemas on the starter and measures the speed; this keeps a
handful in the suite."""
from __future__ import annotations

import json

import jsonschema
import pytest

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link.client import EngineClient
from tests.engine.helpers import collect, greedy
from tests.fixtures.schemas import SCHEMAS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # (a hang guard: the starter on a loaded 2-core machine takes minutes)
PICK = ["int range 7-1234", "enum strings", "date", "person", "$ref to $defs", "array of objects"]


@pytest.fixture(scope="module")
def starter(starter_model):
    client = EngineClient(auto_restart=False)
    client.start()
    client.load(str(starter_model), settings=LoadSettings(n_ctx=1024, n_threads=2, n_threads_batch=2))
    yield client
    client.shutdown()


@pytest.mark.parametrize("name", PICK)
def test_starter_output_validates(starter, name):
    schema = dict(SCHEMAS)[name]
    r = collect(starter, starter.generate(prompt=f"A JSON value matching {json.dumps(schema)}:\n",
                                          sampling=greedy(200), json_schema=schema))
    assert r.error is None and r.done.finish_reason == "stop", (r.error, r.text)
    jsonschema.validate(json.loads(r.text), schema)


def test_starter_calls_a_forced_tool(starter):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string", "maxLength": 30}},
                                                   "required": ["city"]}}}]
    r = collect(starter, starter.generate(messages=[{"role": "user", "content": "Weather in Paris?"}],
                                          sampling=greedy(80), tools=tools, tool_choice="required"))
    assert r.error is None and r.done.finish_reason == "tool_calls", (r.error, r.text)
    (call,) = r.done.tool_calls
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
