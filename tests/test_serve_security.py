"""A server safe to put on a network: the API key, checked before anything reads the request, and the refusal to
start beyond loopback without one. The key check is the server's own ASGI middleware (`serve.app.ApiKey`), run here
in front of a one-route app over real HTTP requests (httpx's ASGI transport): the rest of the server is not needed
to test it, and Ray is not started. Requests naming artefact folders are refused by the live server in
tests/test_serve.py."""

from __future__ import annotations

import httpx
import pytest

from midlens.serve import app as served


async def _ok(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setitem(served._LIMITS, "api_key", "s3cret")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=served.ApiKey(_ok)), base_url="http://test")


@pytest.mark.anyio
async def test_a_keyed_server_answers_only_requests_with_its_key(keyed):
    async with keyed as http:
        missing = await http.post("/v1/chat/completions", json={})
        wrong = await http.post("/v1/chat/completions", headers={"Authorization": "Bearer nope"})
        right = await http.post("/v1/chat/completions", headers={"Authorization": "Bearer s3cret"})
        health = await http.get("/healthz")
        models = await http.get("/v1/models", headers={"Authorization": "bearer s3cret"})  # the scheme's case
    for refused in (missing, wrong):
        assert refused.status_code == 401
        error = refused.json()["error"]  # OpenAI's error object, which clients parse
        assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]
        assert "s3cret" not in refused.text
    assert right.status_code == health.status_code == models.status_code == 200


@pytest.mark.anyio
async def test_without_a_key_every_request_passes(monkeypatch):
    monkeypatch.setitem(served._LIMITS, "api_key", None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served.ApiKey(_ok)), base_url="http://t") as http:
        assert (await http.post("/v1/chat/completions")).status_code == 200


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_serve_refuses_to_listen_beyond_loopback_without_a_key(capsys, monkeypatch):
    from midlens.cli import main

    monkeypatch.delenv("MIDLENS_API_KEY", raising=False)
    assert main(["serve", "--model", "smollm2-135m", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 listens beyond this machine" in err and "--api-key" in err


def test_clients_send_the_key(monkeypatch):
    from midlens.rag.remote import MidlensClient

    monkeypatch.setenv("MIDLENS_API_KEY", "from-env")
    with MidlensClient("http://127.0.0.1:9", api_key="given") as client:
        assert client._http.headers["authorization"] == "Bearer given"
    with MidlensClient("http://127.0.0.1:9") as client:
        assert client._http.headers["authorization"] == "Bearer from-env"


def test_the_default_batch_wait_is_the_measured_one():
    """The server's and the CLI's default wait is the one docs/results/serve/batch-wait/ chose (full batches at 4 and
    8 clients; 0.01 s formed batches of 2-5 there)."""
    import argparse
    import json
    from pathlib import Path

    from midlens.cli import serve as serve_cli
    from midlens.serve.app import ServeOptions

    measured = Path(__file__).parents[1] / "docs" / "results" / "serve" / "batch-wait" / "wait-0.1.json"
    chosen = json.loads(measured.read_text())
    assert chosen["batch_wait_timeout_s"] == ServeOptions().batch_wait_timeout_s == 0.1
    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).batch_wait_timeout == 0.1
    batches = {row["concurrency"]: row["batches"] for row in chosen["rows"] if row["side"] == "server"}
    assert batches[4] == {"4": 4} and batches[8] == {"8": 2}


def test_the_cli_s_limit_defaults_are_the_engine_s():
    """The parser spells the limits' defaults itself (it must not import the engine, which imports torch): they must
    be serve.engine.Limits' own."""
    import argparse
    import dataclasses

    from midlens.cli import serve as serve_cli
    from midlens.serve.engine import Limits

    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert {f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)} == dataclasses.asdict(Limits())
