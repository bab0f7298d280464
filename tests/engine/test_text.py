"""Streaming text: UTF-8 split across tokens, stop strings held back and never shown."""
from __future__ import annotations

from ggufdesk.engine.batching.text import TextStream


def feed(stream: TextStream, pieces: list[bytes]) -> list[str]:
    out = [stream.push(p) for p in pieces]
    out.append(stream.flush())
    return out


def test_multibyte_character_split_across_tokens():
    s = TextStream()
    emoji = "\U0001F600".encode()
    out = feed(s, [b"a", emoji[:1], emoji[1:3], emoji[3:], b"b"])
    assert out[:4] == ["a", "", "", "\U0001F600"]
    assert s.text == "a\U0001F600b"


def test_incomplete_utf8_at_the_end_becomes_replacement_char():
    s = TextStream()
    feed(s, [b"x", "\u00e9".encode()[:1]])
    assert s.text == "x\ufffd"


def test_stop_string_across_pieces_is_never_emitted():
    s = TextStream(["</end>"])
    out = feed(s, [b"hello </", b"en", b"d> more"])
    assert "".join(out) == "hello "
    assert s.stopped and s.text == "hello "


def test_partial_stop_prefix_released_when_it_turns_out_not_to_be_a_stop():
    s = TextStream(["\nUser:"])
    assert s.push(b"one\nUs") == "one"
    assert s.push(b"ually") == "\nUsually"
    assert not s.stopped


def test_the_stop_string_that_ended_the_text_is_named():
    s = TextStream(["zz", "</end>", "lo </"])
    feed(s, [b"hello </", b"end> zz"])
    assert s.stopped and s.matched == "lo </"  # the earliest match in the text wins
    plain = TextStream(["</end>"])
    feed(plain, [b"no stop here"])
    plain.flush()
    assert not plain.stopped and plain.matched is None


def test_a_chat_answer_has_no_whitespace_at_its_ends():
    """" Hi!" (a SentencePiece first token carries its word's space) and '{"a": 1} ' (a JSON
    grammar's trailing space) were shown as they came."""
    s = TextStream(trim=True)
    out = feed(s, [b" ", b" Hi", b"!", b" How", b"? ", b"Fine", b" ", b"\n"])
    assert "".join(out) == "Hi! How? Fine" == s.text
    assert out[:2] == ["", "Hi"] and out[4:6] == ["?", " Fine"]  # an inner space waits for its word
    assert out[6:] == ["", "", ""]  # the trailing ones never come
    s = TextStream(trim=True)
    assert "".join(feed(s, [b'{"a"', b": 1}", b" "])) == '{"a": 1}'
    s = TextStream(["<end>"], trim=True)
    assert "".join(feed(s, [b"\nok", b" \n<en", b"d>"])) == "ok" and s.stopped


def test_a_continued_text_keeps_its_spaces():
    s = TextStream()
    assert "".join(feed(s, [b" there", b" was "])) == " there was "


def test_a_chat_answers_logprob_tokens_join_into_its_text():
    """The answer drops its leading space (" under" -> "under"): its first tokens' logprob entries do too,
    so that their tokens joined are the answer, as OpenAI's are; the rest are untouched."""
    from ggufdesk.engine.batching.update import lead_trimmed

    lps = [{"token": "\n", "logprob": -1.0}, {"token": " under", "logprob": -0.5, "top": [{"token": " under"}]},
           {"token": " into", "logprob": -0.1}]
    out = lead_trimmed(lps)
    assert [e["token"] for e in out] == ["", "under", " into"] and out[1]["top"] == lps[1]["top"]
    assert lps[1]["token"] == " under"  # (a copy: the engine's own entries are not changed)
    assert lead_trimmed([{"token": " "}]) == [{"token": ""}] and lead_trimmed([]) == []
