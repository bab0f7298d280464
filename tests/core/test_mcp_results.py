"""What a model reads of a tool's result, and the names and grammar of the tools it is offered."""
from __future__ import annotations

import base64
from types import SimpleNamespace as Ns

from ggufdesk.core.mcp.host import McpTool
from ggufdesk.core.mcp.offer import build_offer, offered_name
from ggufdesk.core.mcp.results import clean_text, convert_result, result_limit, truncate


def test_blocks_become_text_and_media_a_note():
    raw = Ns(content=[Ns(type="text", text="first"), Ns(type="image", data=base64.b64encode(b"x" * 2048).decode(), mime_type="image/png"),
                      Ns(type="resource_link", uri="file:///tmp/x.txt"),
                      Ns(type="resource", resource=Ns(text="inline text", uri="mem://a")),
                      Ns(type="resource", resource=Ns(blob="AAAA", uri="mem://b")),
                      Ns(type="audio", data="", mime_type="audio/wav"), Ns(type="future_kind")],
             structured_content={"ignored": True}, is_error=False)
    out = convert_result(raw)
    lines = out.text.splitlines()
    assert lines[0] == "first" and lines[1].startswith("[image (image/png, 2 KB) returned by the tool: not shown")
    assert lines[2] == "[resource: file:///tmp/x.txt]" and lines[3] == "inline text"
    assert "binary resource mem://b" in lines[4] and "audio (audio/wav" in lines[5] and "future_kind" in lines[6]
    assert out.media == 4 and not out.is_error


def test_structured_only_errors_and_nothing():
    assert convert_result(Ns(content=[], structured_content={"sum": 5}, is_error=False)).text == '{"sum": 5}'
    failed = convert_result(Ns(content=[Ns(type="text", text="no such file")], is_error=True))
    assert failed.is_error and failed.text == "no such file"
    assert convert_result(Ns(content=None)).text == "(the tool returned nothing)"


def test_invalid_unicode_is_replaced():
    text = clean_text("a\udcffb\ud800c\x00d")
    assert text == "a\ufffdb\ufffdc\ufffdd"
    text.encode("utf-8")
    assert convert_result(Ns(content=[Ns(type="text", text="x\udcff")])).text == "x\ufffd"


def test_truncation_says_how_much_was_left_out():
    assert truncate("short", 10) == ("short", False)
    cut, was = truncate("x" * 100_000, 2000)
    assert was and cut.startswith("x" * 2000) and "100,000 characters, the first 2,000 are shown" in cut
    assert result_limit(4096) == 8192 and result_limit(256) == 2000 and result_limit(1 << 20) == 32_000


def test_offered_names_are_valid_and_unique():
    assert offered_name("files", "read_file", clash=False) == "read_file"
    assert offered_name("my server", "get/weather now", clash=False) == "my_server__get_weather_now"
    assert offered_name("a", "x" * 80, clash=False) == ("a__" + "x" * 80)[:64]
    listing = {"one": (McpTool("one", "search", "", {"type": "object"}), McpTool("one", "ok", "", {})),
               "two": (McpTool("two", "search", "Find.", {"type": "object"}),)}
    offer = build_offer(listing)
    names = [t["function"]["name"] for t in offer.tools]
    assert names == ["one__search", "ok", "two__search"]
    assert offer.route == {"one__search": ("one", "search"), "ok": ("one", "ok"), "two__search": ("two", "search")}
    assert offer.tools[1]["function"]["parameters"] == {"type": "object"}  # an empty schema: any object
    assert offer.tools[2]["function"]["description"] == "Find." and not offer.loose and not offer.notes


def test_a_schema_the_grammar_cannot_enforce_is_offered_loose_and_said():
    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}}
    offer = build_offer({"s": (McpTool("s", "half", "", schema),)})
    assert offer.loose == ["half"] and offer.tools[0]["function"]["parameters"] == schema
    assert len(offer.notes) == 1 and "multipleOf" in offer.notes[0] and "without a grammar" in offer.notes[0]


def test_too_many_tools_are_cut_with_a_note():
    tools = tuple(McpTool("big", f"t{i}", "", {}) for i in range(200))
    offer = build_offer({"big": tools})
    assert len(offer.tools) == 128 and "only the first 128" in offer.notes[-1]
