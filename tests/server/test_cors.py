"""CORS as llama-server answers it (guard.Cors, guard.Origins): `*`, `localhost` and listed origins, preflights
allowed and not, headers on the requests themselves, --cors-origin's checks and the suite shim's defaults."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ggufdesk.core.errors import KnownError
from ggufdesk.server.guard import Guard, Origins, is_localhost_origin, with_cors

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import llama_server_shim  # bench/llama_server_shim.py

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


def client(*origins: str) -> TestClient:
    async def hello(request):  # type: ignore[no-untyped-def]
        return JSONResponse({"ok": True}, headers={"Retry-After": "1"})

    app = Starlette(routes=[Route("/v1/x", hello, methods=["GET", "POST"])])
    return TestClient(with_cors(Guard(app, bound_host="127.0.0.1", cors_origins=origins), origins),
                      base_url="http://127.0.0.1:8080")


@pytest.mark.parametrize("origin", ["http://localhost", "http://localhost:8080", "https://LOCALHOST:3000/",
                                    "http://127.0.0.1", "http://127.0.0.1:3000", "http://127.9.0.1",
                                    "http://[::1]", "http://[::1]:3000"])
def test_localhost_origins(origin):
    assert is_localhost_origin(origin)


@pytest.mark.parametrize("origin", ["http://localhost.evil.com", "http://notlocalhost", "http://evil.com",
                                    "localhost", "ftp://localhost", "null", "", "http://", "http://user@localhost",
                                    "http://localhost@evil.com", "http://localhost/path", "http://[::2]",
                                    "http://127.0.0.1.nip.io", "http://0.0.0.0", "http://app.localhost",
                                    "http://[::1", "http://localhost:80#x"])
def test_other_origins_are_not_localhost(origin):
    assert not is_localhost_origin(origin)


def test_the_allow_list():
    assert not Origins() and not Origins(["", " "])
    assert Origins(["*"]).allows("web.mydomain.fr") and Origins(["*"]).allows("null")
    both = Origins(["localhost", "http://App.example/"])
    assert both.allows("http://app.example") and both.allows("http://127.0.0.1:9")
    assert not both.allows("http://localhost.evil.com") and not both.allows("https://app.example")


@pytest.mark.parametrize("origin", ["localhost", "web.mydomain.fr", "http://evil.example"])
def test_any_origin_preflight_reflects_it_as_llama_server(origin):
    r = client("*").options("/v1/x", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200 and r.content == b""
    names = {k.decode() for k, _ in r.headers.raw}  # as written on the wire
    assert {"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials"} <= names
    assert r.headers["access-control-allow-origin"] == origin
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "*"


@pytest.mark.parametrize("origins", [("localhost",), ("http://app.example", "localhost")])
def test_a_listed_origin_gets_its_headers_named(origins):
    """Browsers never let `*` cover Authorization: an allowed page that sends a key needs it named."""
    r = client(*origins).options("/v1/x", headers={"Origin": "http://localhost:3000", **PREFLIGHT})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert r.headers["access-control-allow-headers"] == "Authorization"


@pytest.mark.parametrize("origin", ["http://localhost.evil.com", "http://notlocalhost", "null", "localhost"])
def test_a_preflight_from_an_origin_not_allowed_gets_no_cors_headers(origin):
    c = client("localhost")
    r = c.options("/v1/x", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200 and not [k for k in r.headers if k.startswith("access-control-")]
    post = c.post("/v1/x", json={}, headers={"Origin": origin})
    assert post.status_code == 403 and "access-control-allow-origin" not in post.headers
    assert "--cors-origin" in post.json()["error"]["message"]


def test_an_allowed_request_carries_the_cors_headers():
    c = client("localhost")
    r = c.post("/v1/x", json={}, headers={"Origin": "http://[::1]:3000"})
    assert r.status_code == 200 and r.json() == {"ok": True}
    assert r.headers["access-control-allow-origin"] == "http://[::1]:3000"
    assert r.headers["access-control-expose-headers"] == "Retry-After" and "Origin" in r.headers["vary"]
    assert "access-control-allow-origin" not in c.get("/v1/x").headers  # no Origin: not a web page


def test_without_cors_nothing_is_answered_for_a_browser():
    c = client()
    r = c.options("/v1/x", headers={"Origin": "http://localhost:3000", **PREFLIGHT})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert c.post("/v1/x", json={}, headers={"Origin": "http://localhost:3000"}).status_code == 403
    assert c.post("/v1/x", json={}, headers={"Origin": "http://127.0.0.1:8080"}).status_code == 200  # its own page


def test_a_foreign_host_is_still_refused_under_any_origin():
    r = client("*").post("/v1/x", json={}, headers={"Origin": "http://evil.example", "Host": "evil.example"})
    assert r.status_code == 403 and "Host" in r.text


def cors_args(*values: str) -> argparse.Namespace:
    return argparse.Namespace(cors_origin=list(values))


def test_cors_origin_takes_origins_and_the_two_keywords(capsys):
    from ggufdesk.cli.serve import _cors_origins

    assert _cors_origins(cors_args("http://a.example/", "localhost", "")) == ("http://a.example", "localhost")
    assert "warning" not in capsys.readouterr().err
    assert _cors_origins(cors_args("*")) == ("*",)
    assert "any web page" in capsys.readouterr().err
    for bad in ("localhost:3000", "ftp://a.example", "http://a.example/path", "**", "web.mydomain.fr"):
        with pytest.raises(KnownError, match="--cors-origin"):
            _cors_origins(cors_args(bad))


OFFERED = {"--port", "--cors-origin", "--no-metrics"}


def test_the_shim_passes_llama_servers_defaults_as_ggufdesks_flags():
    assert llama_server_shim.translate(["--port", "1"], OFFERED) == ["--port", "1", "--cors-origin", "*", "--no-metrics"]
    assert llama_server_shim.translate(["--port", "1", "--cors-origins", "localhost", "--metrics"], OFFERED) == [
        "--port", "1", "--cors-origin", "localhost"]
    assert llama_server_shim.translate(["--port", "1"], {"--port"}) == ["--port", "1"]  # flags it lacks: not given
