"""Images through the APIs, with the real SDKs against a live `ggufdesk serve` on the tiny vision pair:
OpenAI image_url parts (data: URLs; http(s) only with --allow-remote-images), Anthropic image blocks,
a text-only model's clear 400, and hostile images answered 400 while the server lives on."""
from __future__ import annotations

import base64
import http.server
import threading

import anthropic
import httpx
import openai
import pytest

from tests.fixtures.vision import animated_gif, png_bomb, png_bytes, truncated_jpeg, write_tiny_vision_pair
from tests.server.serving import ServeProcess

MODEL = "tiny-vision"
MAX_BODY = 65536  # text beyond it is refused; images may take the body up to --max-image-body


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def openai_image(url: str, text: str = "what is this") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def vision_served(tmp_path_factory):
    model, _ = write_tiny_vision_pair(tmp_path_factory.mktemp("vpair"))
    server = ServeProcess(model, "--ctx", "1024", "--parallel", "2", "--temperature", "0",
                          "--ubatch", "64", "--threads", "1", "--max-body", str(MAX_BODY), home=tmp_path_factory.mktemp("vserve-home"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(vision_served):
    with openai.OpenAI(base_url=vision_served.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_openai_image_url_data(oai):
    r = oai.chat.completions.create(model=MODEL, messages=openai_image(data_url(png_bytes())), max_tokens=4)
    assert r.choices[0].finish_reason in ("length", "stop")
    text_only = oai.chat.completions.create(model=MODEL, max_tokens=1,
                                            messages=[{"role": "user", "content": "what is this"}])
    assert r.usage.prompt_tokens == text_only.usage.prompt_tokens + 16 + 2  # the image and its two markers


def test_openai_stream_with_an_image(oai):
    stream = oai.chat.completions.create(model=MODEL, messages=openai_image(data_url(png_bytes(seed=3))),
                                         max_tokens=4, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) is not None


def test_anthropic_image_block(vision_served):
    with anthropic.Anthropic(base_url=vision_served.url, api_key="x", max_retries=0, timeout=120) as c:
        m = c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                         "data": base64.b64encode(png_bytes(fmt="JPEG")).decode()}},
            {"type": "text", "text": "describe"}]}])
        assert m.stop_reason in ("max_tokens", "end_turn") and m.usage.input_tokens > 16
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(animated_gif()).decode()}}]}])
        assert "animation" in str(e.value)


@pytest.mark.parametrize("name, data, words", [
    ("bomb", png_bomb(), "too many pixels"),
    ("truncated", truncated_jpeg(), "cannot be decoded"),
    ("not an image", b"%PDF-1.4 not an image" * 40, "not an image"),
    ("animated", animated_gif(), "animation"),
    ("50 MB", b"\x89PNG\r\n\x1a\n" + bytes(50 * 1024 * 1024), "images up to 20 MB"),
])
def test_hostile_images_are_400_and_the_server_lives(oai, name, data, words):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=openai_image(data_url(data)), max_tokens=2)
    assert words in str(e.value), name
    assert e.value.body["code"] == "invalid_image"
    ok = oai.chat.completions.create(model=MODEL, messages=openai_image(data_url(png_bytes(seed=5))), max_tokens=2)
    assert ok.choices[0].message is not None


def test_a_body_beyond_the_image_limit_is_413(vision_served):
    r = httpx.post(vision_served.url + "/v1/chat/completions", timeout=120,
                   content=b'{"model": "x", "messages": [' + b" " * (97 * 1024 * 1024) + b"]}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_images_may_pass_max_body_but_text_may_not(oai):
    big = png_bytes(256, 192, seed=5)  # noise: its base64 alone is beyond --max-body
    assert len(base64.b64encode(big)) > MAX_BODY
    r = oai.chat.completions.create(model=MODEL, messages=openai_image(data_url(big)), max_tokens=1)
    assert r.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model=MODEL, max_tokens=1,
                                    messages=openai_image(data_url(png_bytes()), "x" * (MAX_BODY + 10)))
    assert e.value.status_code == 413 and "without its images" in str(e.value)
    with pytest.raises(openai.APIStatusError) as e:  # no image at all: refused while reading, as before
        oai.chat.completions.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "x" * 70_000}])
    assert e.value.status_code == 413


def test_remote_urls_are_refused_without_the_flag(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=openai_image("http://127.0.0.1:9/cat.png"), max_tokens=2)
    assert "--allow-remote-images" in str(e.value)


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/slow.png":
            threading.Event().wait(30)
        body = {"/cat.png": png_bytes(seed=8), "/big.png": b"\x89PNG\r\n\x1a\n" + bytes(21 * 1024 * 1024)}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading at its size limit: the point of the test

    def log_message(self, *args) -> None:
        pass


def test_remote_urls_with_the_flag(tmp_path_factory, vision_served):
    from ggufdesk.server import images

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_port}"
    model = str(tmp_path_factory.getbasetemp() / "vpair0" / "tiny-vision.gguf")
    server = ServeProcess(model, "--ctx", "1024", "--temperature", "0", "--ubatch", "64", "--threads", "1",
                          "--allow-remote-images", home=tmp_path_factory.mktemp("remote-home"))
    try:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
            r = c.chat.completions.create(model=MODEL, messages=openai_image(base + "/cat.png"), max_tokens=2)
            assert r.usage.prompt_tokens > 16
            for path, words in (("/missing.png", "HTTP 404"), ("/big.png", "images up to 20 MB")):
                with pytest.raises(openai.BadRequestError) as e:
                    c.chat.completions.create(model=MODEL, messages=openai_image(base + path), max_tokens=2)
                assert words in str(e.value)
        with pytest.raises(Exception) as slow:  # the time limit, checked in-process with a short one
            images.fetch(base + "/slow.png", timeout=0.5)
        assert "fetching the image failed" in str(slow.value)
    finally:
        server.stop()
        srv.shutdown()


def test_a_text_only_model_answers_400(served):
    with openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="m", messages=openai_image(data_url(png_bytes())), max_tokens=2)
        assert "reads text only" in str(e.value) and e.value.body["code"] == "model_not_vision"


def test_ollama_images_on_chat_and_generate(vision_served):
    import ollama

    picture = base64.b64encode(png_bytes(seed=11)).decode()
    client = ollama.Client(host=vision_served.url, timeout=120)
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "what is this", "images": [picture]}],
                    options={"num_predict": 2})
    plain = client.chat(model=MODEL, messages=[{"role": "user", "content": "what is this"}],
                        options={"num_predict": 1})
    assert r.prompt_eval_count == plain.prompt_eval_count + 16 + 2  # the image and its two markers
    g = client.generate(model=MODEL, prompt="describe", images=[picture], options={"num_predict": 2})
    assert g.done and g.prompt_eval_count > 16
    for bad, words in ((base64.b64encode(truncated_jpeg()).decode(), "cannot be decoded"), ("%%%", "the image is empty")):
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model=MODEL, messages=[{"role": "user", "content": "x", "images": [bad]}],
                        options={"num_predict": 1})
        assert e.value.status_code == 400 and words in str(e.value), bad[:20]
    r = httpx.post(vision_served.url + "/api/chat", timeout=60, json={
        "model": MODEL, "stream": False, "messages": [{"role": "user", "content": "x", "images": "notalist"}]})
    assert r.status_code == 400 and "error" in r.json()
    assert client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 1}).done


def test_responses_input_image_and_a_follow_up(oai):
    url = data_url(png_bytes(seed=12))
    first = oai.responses.create(model=MODEL, max_output_tokens=2, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is this"}, {"type": "input_image", "image_url": url}]}])
    text_only = oai.responses.create(model=MODEL, max_output_tokens=2, input="what is this")
    assert first.usage.input_tokens > text_only.usage.input_tokens + 16
    # the next turn carries the stored image with it (previous_response_id)
    second = oai.responses.create(model=MODEL, max_output_tokens=2, previous_response_id=first.id, input="and?")
    assert second.usage.input_tokens > first.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=MODEL, max_output_tokens=2, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": data_url(truncated_jpeg())}]}])
    assert "cannot be decoded" in str(e.value)


def test_ollama_and_responses_images_on_a_text_only_model(served):
    picture = base64.b64encode(png_bytes()).decode()
    name = httpx.get(served.url + "/api/tags", timeout=30).json()["models"][0]["name"]
    r = httpx.post(served.url + "/api/chat", timeout=60, json={
        "model": name, "stream": False, "messages": [{"role": "user", "content": "x", "images": [picture]}]})
    assert r.status_code == 400 and "reads text only" in r.json()["error"]
    r = httpx.post(served.url + "/v1/responses", timeout=60, json={"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(png_bytes())}]}]})
    assert r.status_code == 400 and "reads text only" in r.text
