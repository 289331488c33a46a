"""Secrets out of errors, logs and tables (issue 11), checked on hand-made texts and end to end."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tentalis_pipelines.redact import RedactingFilter, redact, register_secret

KEY = "sk-test-0123456789abcdefSECRET"


@pytest.mark.parametrize("text, gone", [
    ("Authorization: Bearer abc.def-123456", "abc.def-123456"),
    ('{"error": {"message": "bad key", "api_key": "k-9876543210"}}', "k-9876543210"),
    ("POST https://alice:hunter2pass@llm.example.com/v1/completions", "hunter2pass"),
    ("https://token123456@host/v1", "token123456"),
    ("key=sk-abcdefghijklmnop rejected", "sk-abcdefghijklmnop"),
    ("?access_token=tok_live_12345&x=1", "tok_live_12345"),
])
def test_credential_shapes_are_masked(text, gone):
    out = redact(text)
    assert gone not in out and "***" in out, out


def test_registered_and_environment_secrets_are_masked_anywhere(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "plain-looking-value-42")
    register_secret("zz-registered-secret-zz")
    out = redact("echo: plain-looking-value-42 / zz-registered-secret-zz / ordinary words stay")
    assert "plain-looking-value-42" not in out and "zz-registered-secret-zz" not in out
    assert "ordinary words stay" in out
    assert redact("HTTP 401 unauthorized: model m not found") == "HTTP 401 unauthorized: model m not found"


def test_the_log_filter_redacts_messages_and_args(caplog):
    logger = logging.getLogger("tentalis_pipelines.test_redact")
    logger.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, logger="tentalis_pipelines.test_redact"):
        logger.info("calling %s with Bearer %s", "https://u:p4ssw0rd@h/v1", "abcdef123456")
    assert "p4ssw0rd" not in caplog.text and "abcdef123456" not in caplog.text and "***" in caplog.text


class EchoingServer:
    """An OpenAI-compatible server that refuses every request, echoing its Authorization header."""

    def __enter__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"error": {"message": f"invalid key, got {self.headers.get('Authorization')}",
                                             "api_key": self.headers.get("Authorization", "").split()[-1]}}).encode()
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://user:{KEY}@127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


