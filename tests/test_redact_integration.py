"""Secrets out of errors, logs and tables (issue 11), checked on hand-made texts and end to end."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dagster import DagsterInstance, materialize

KEY = "sk-test-0123456789abcdefSECRET"








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
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_provider_echoing_the_key_leaves_it_nowhere(home, tiny_model_dir, monkeypatch, capsys):
    """The key reaches no exception, no Dagster event, no log line and no table."""
    from assets.batch_assets import rollouts, tasks
    from assets.resources import LakehouseResource, PolicyResource
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.tasks.batches import register_file_batch

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "t.jsonl"
    src.write_text(json.dumps({"prompt": "What is 2+2?", "reference": "4"}) + "\n")
    batch_id = register_file_batch(paths.batches, src)
    with EchoingServer() as server, DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        resources = {"lakehouse": LakehouseResource(home=str(home)),
                     "policy": PolicyResource(model=str(tiny_model_dir), backend="openai", base_url=server.url,
                                              num_generations=1, max_new_tokens=4)}
        result = materialize([tasks, rollouts], partition_key=batch_id, instance=instance, resources=resources,
                             raise_on_error=False)
        assert not result.success
        failure = next(e for e in result.all_events if e.is_step_failure)
        events = [json.dumps(rec.to_json() if hasattr(rec, "to_json") else str(rec)) for rec in instance.all_logs(result.run_id)]
    error_text = str(failure.step_failure_data.error.to_string())
    assert "401" in error_text  # the failure still says what happened
    assert KEY not in error_text and KEY not in "".join(events)
    assert KEY not in capsys.readouterr().err
    lake = Lakehouse(paths.lakehouse)
    for name in ("tasks", "rollouts", "quarantine"):
        if lake.exists(name):
            assert KEY not in json.dumps(lake.read(name).to_pylist(), default=str)
