"""pull / model_dir / list_models / remove_model against a local HTTP server that serves the hub's
URL layout as huggingface_hub 1.x reads it:

    GET  /api/models/{owner}/{name}/revision/{rev}        repo info: {"sha", "siblings"}
    GET  /api/models/{owner}/{name}/tree/{commit}         file list: [{"type", "path", "size", "oid"}]
    HEAD /{owner}/{name}/resolve/{rev}/{file}             ETag, X-Repo-Commit, Content-Length
    GET  /{owner}/{name}/resolve/{rev}/{file}             the bytes; "Range: bytes=N-" gives 206

Errors carry the hub's X-Error-Code header (RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo), which huggingface_hub turns into its exception types. The server listens on
127.0.0.1 only and is shut down after each test.
"""

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from huggingface_hub import constants

from tileinfer.io.hub import (CachedModel, HubError, gguf_tag, list_models, model_dir, pull,
                              pull_gguf, remove_model)

REPO = "acme/tiny-llm"
COMMIT = "1" * 40
NEW_COMMIT = "2" * 40

# A repo as the hub holds it: inference files plus files pull must leave alone.
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model-00001-of-00002.safetensors": bytes(range(256)) * 400,  # 100 KiB, dropped mid-way in a test
    "model-00002-of-00002.safetensors": b"second shard" * 100,
    "model.safetensors.index.json": b'{"weight_map": {}}',
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b"{}",
    "generation_config.json": b'{"do_sample": false}',
    "chat_template.jinja": b"{{ messages }}",
    "README.md": b"# tiny",
    "pytorch_model.bin": b"pickled weights",
    "consolidated.safetensors": b"the same weights, another layout",
    "original/params.json": b"{}",
    ".gitattributes": b"*.safetensors filter=lfs",
}
INFERENCE = {
    "config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
}


class FakeHub:
    """Repos and misbehaviours served by the handler; ``requests`` logs (method, path, range, auth)."""

    def __init__(self):
        self.repos = {REPO: {"commit": COMMIT, "files": dict(FILES)}}
        self.gated = {}  # repo -> the token that may read it
        self.missing = set()  # (repo, file): listed in the tree, 404 on resolve
        self.drop = {}  # file -> bytes sent before the connection drops, on the first GET only
        self.fail_after_drop = None  # HTTP status for every later GET of a dropped file
        self.dropped = set()
        self.requests = []
        self.lock = threading.Lock()


def make_handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10  # a stuck client connection closes on its own

        def log_message(self, *args):
            pass

        def send(self, status, body=b"", headers=None, head=False):
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def error(self, status, code, head=False, extra=None):
            self.send(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code, **(extra or {})}, head)

        def do_GET(self):
            self.route(head=False)

        def do_HEAD(self):
            self.route(head=True)

        def route(self, head):
            path = unquote(urlsplit(self.path).path)
            with hub.lock:
                hub.requests.append((self.command, path, self.headers.get("Range"), self.headers.get("Authorization")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6:
                repo, kind, rev = "/".join(parts[2:4]), parts[4], parts[5]
                return self.api(repo, kind, rev)
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                return self.resolve(repo, rev, name, head)
            self.send(404, b"no route")

        def repo(self, repo, rev, head=False):
            info = hub.repos.get(repo)
            if info is None:
                # The hub answers 401 for a missing repo and for a private one alike.
                self.error(401, "RepoNotFound", head)
                return None
            if rev not in ("main", info["commit"]):
                self.error(404, "RevisionNotFound", head)
                return None
            return info

        def api(self, repo, kind, rev):
            info = self.repo(repo, rev)
            if info is None:
                return
            if kind == "revision":
                body = {"id": repo, "sha": info["commit"], "siblings": [{"rfilename": f} for f in info["files"]]}
            elif kind == "tree":
                body = [
                    {"type": "file", "path": f, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for f, data in info["files"].items()
                ]
            else:
                return self.send(404, b"no route")
            self.send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

        def resolve(self, repo, rev, name, head):
            info = self.repo(repo, rev, head)
            if info is None:
                return
            commit = {"X-Repo-Commit": info["commit"]}
            if repo in hub.gated and self.headers.get("Authorization") != f"Bearer {hub.gated[repo]}":
                return self.error(401, "GatedRepo", head, commit)
            if (repo, name) in hub.missing or name not in info["files"]:
                return self.error(404, "EntryNotFound", head, commit)
            data = info["files"][name]
            headers = {**commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"', "Accept-Ranges": "bytes"}
            if head:
                return self.send(200, data, headers, head=True)
            if name in hub.dropped and hub.fail_after_drop:
                return self.send(hub.fail_after_drop, b"unavailable")
            start = 0
            if rng := self.headers.get("Range"):
                start = int(rng.removeprefix("bytes=").split("-")[0])
            if name in hub.drop and name not in hub.dropped:
                hub.dropped.add(name)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: hub.drop[name]])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)  # the connection drops mid-file
                self.close_connection = True
                return
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                return self.send(206, data[start:], headers)
            self.send(200, data, headers)

    return Handler


@pytest.fixture
def hub(monkeypatch, tmp_path):
    fake = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    home = tmp_path / "hf-home"
    # huggingface_hub reads these variables into its constants module when it is imported, and
    # uses the constants at call time: set both.
    for name, value in {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {"127.0.0.1"})
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    # Downloads are written in chunks of this size (10 MB by default): small chunks make a 100 KiB
    # file behave as a large one, whose completed chunks survive a dropped connection.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 8192)
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def downloaded(hub, name):
    """How many GET requests fetched ``name``'s bytes."""
    return sum(1 for method, path, _, _ in hub.requests if method == "GET" and path.endswith("/" + name) and "/resolve/" in path)


def test_pull_downloads_only_inference_files(hub):
    folder = pull(REPO, progress=False)
    assert folder.name == COMMIT
    assert {p.name for p in folder.iterdir()} == INFERENCE
    for name in INFERENCE:
        assert (folder / name).read_bytes() == FILES[name]
    # config.json comes last.
    gets = [path.rsplit("/", 1)[-1] for method, path, _, _ in hub.requests if method == "GET" and "/resolve/" in path]
    assert gets[-1] == "config.json" and gets.count("config.json") == 1


def test_pulled_model_resolves_offline(hub, monkeypatch, tmp_path):
    folder = pull(REPO, progress=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    before = len(hub.requests)
    assert model_dir(REPO) == folder
    assert model_dir(REPO, revision=COMMIT) == folder
    assert len(hub.requests) == before  # no network
    assert model_dir(tmp_path) == tmp_path  # a local folder is itself
    with pytest.raises(HubError, match="has not been pulled: run `tileinfer pull acme/other` first"):
        model_dir("acme/other")
    with pytest.raises(HubError, match="no such model folder"):
        model_dir("./no/such/folder")


def test_second_pull_downloads_nothing_again(hub):
    pull(REPO, progress=False)
    before = {name: downloaded(hub, name) for name in INFERENCE}
    pull(REPO, progress=False)
    assert {name: downloaded(hub, name) for name in INFERENCE} == before


def test_list_and_remove(hub):
    assert list_models() == []
    folder = pull(REPO, progress=False)
    size = sum(len(FILES[n]) for n in INFERENCE)
    assert list_models() == [CachedModel(REPO, "main", folder, size)]
    with pytest.raises(HubError, match="no cached revision 'v2'"):
        remove_model(REPO, "v2")
    assert remove_model(REPO) == size
    assert list_models() == []
    assert not folder.exists()
    with pytest.raises(HubError, match="not pulled|has not been pulled"):
        model_dir(REPO)
    with pytest.raises(HubError, match="not in the hub cache"):
        remove_model(REPO)


def test_remove_one_revision_keeps_the_other(hub):
    old = pull(REPO, progress=False)
    hub.repos[REPO]["commit"] = NEW_COMMIT
    hub.repos[REPO]["files"]["config.json"] = b'{"model_type": "llama", "v": 2}'
    new = pull(REPO, progress=False)
    assert new.name == NEW_COMMIT and model_dir(REPO) == new
    assert {(m.revision, m.path) for m in list_models()} == {(COMMIT, old), ("main", new)}
    remove_model(REPO, COMMIT)
    assert [(m.revision, m.path) for m in list_models()] == [("main", new)]
    assert (new / "model-00001-of-00002.safetensors").read_bytes() == FILES["model-00001-of-00002.safetensors"]


def test_dropped_connection_resumes_with_a_range_request(hub):
    name = "model-00001-of-00002.safetensors"
    hub.drop[name] = 30000
    folder = pull(REPO, progress=False)
    assert (folder / name).read_bytes() == FILES[name]
    ranges = [rng for method, path, rng, _ in hub.requests if method == "GET" and path.endswith(name)]
    # Resumed after the last complete chunk received (3 of 8192 bytes), not restarted.
    assert ranges == [None, f"bytes={3 * 8192}-"]


def test_interrupted_pull_is_not_pulled_and_a_retry_completes(hub):
    name = "model-00001-of-00002.safetensors"
    hub.drop[name] = 30000
    hub.fail_after_drop = 503  # the hub stays down for that file: this pull fails
    with pytest.raises(HubError, match="failed \\(HTTP 503\\)"):
        pull(REPO, progress=False)
    with pytest.raises(HubError, match="has not been pulled"):
        model_dir(REPO)  # no config.json yet: not a model
    assert list_models() == []
    done_before = {n: downloaded(hub, n) for n in INFERENCE}
    hub.fail_after_drop = None
    folder = pull(REPO, progress=False)
    assert model_dir(REPO) == folder
    for n in INFERENCE:
        assert (folder / n).read_bytes() == FILES[n]
    # Files that completed the first time were not downloaded again.
    assert downloaded(hub, "tokenizer.json") == done_before["tokenizer.json"] == 1


def test_missing_file_is_a_clear_error_and_not_pulled(hub):
    hub.missing.add((REPO, "tokenizer.json"))
    with pytest.raises(HubError, match="lists tokenizer.json but the hub has no such file"):
        pull(REPO, progress=False)
    with pytest.raises(HubError, match="has not been pulled"):
        model_dir(REPO)
    assert downloaded(hub, "config.json") == 0


def test_missing_config_json_means_not_pulled(hub):
    del hub.repos[REPO]["files"]["config.json"]
    with pytest.raises(HubError, match="config.json"):
        pull(REPO, progress=False)
    with pytest.raises(HubError, match="has not been pulled"):
        model_dir(REPO)


def test_gated_repo_needs_hf_token(hub, monkeypatch):
    hub.gated[REPO] = "hf_secret"
    with pytest.raises(HubError, match="gated.*set HF_TOKEN"):
        pull(REPO, progress=False)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubError, match="HF_TOKEN"):
        pull(REPO, progress=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    folder = pull(REPO, progress=False)
    assert model_dir(REPO) == folder
    assert ("GET", f"/{REPO}/resolve/{COMMIT}/config.json", None, "Bearer hf_secret") in hub.requests


def test_stored_token_and_explicit_token(hub):
    hub.gated[REPO] = "hf_stored"
    token_file = Path(constants.HF_TOKEN_PATH)  # where `hf auth login` stores the token
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text("hf_stored")
    assert pull(REPO, progress=False).name == COMMIT
    remove_model(REPO)
    hub.gated[REPO] = "hf_explicit"
    assert pull(REPO, token="hf_explicit", progress=False).name == COMMIT


def test_unknown_repo_says_to_set_hf_token(hub):
    with pytest.raises(HubError, match="acme/nope was not found on the hub, or it is private or gated.*HF_TOKEN"):
        pull("acme/nope", progress=False)


def test_unknown_revision(hub):
    with pytest.raises(HubError, match="has no revision 'v9'"):
        pull(REPO, revision="v9", progress=False)


def test_repo_without_safetensors_weights(hub):
    files = hub.repos[REPO]["files"]
    for name in [n for n in files if n.startswith("model")]:
        del files[name]
    with pytest.raises(HubError, match="no safetensors weights"):
        pull(REPO, progress=False)
    assert downloaded(hub, "config.json") == 0


def test_bad_repo_id_and_unreachable_hub(hub, monkeypatch):
    with pytest.raises(HubError, match="not a valid repo id"):
        pull("not a repo id!", progress=False)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", dead + "/{repo_id}/resolve/{revision}/{filename}")
    with pytest.raises(HubError, match="cannot download"):
        pull(REPO, progress=False)


def test_progress_bars_are_shown(hub, capsys):
    pull(REPO)  # progress=True: huggingface_hub's bars on stderr
    assert "Fetching" in capsys.readouterr().err


# --- GGUF repos: one quantization pulled (``pull_gguf``), then imported ------------------------

GGUF_REPO = "acme/tiny-GGUF"


def test_gguf_tags_of_file_names():
    assert gguf_tag("Qwen2.5-0.5B-Instruct-Q8_0.gguf") == "q8_0"
    assert gguf_tag("sub/llama-2-7b.Q4_K_M.gguf") == "q4_k_m"
    assert gguf_tag("Phi-3-mini-4k-instruct-fp16.gguf") == "fp16"
    assert gguf_tag("big-F16-00001-of-00002.gguf") is None  # a part of a split file
    assert gguf_tag("README.md") is None


def test_pull_gguf_downloads_the_one_file_of_the_tag_and_it_imports(hub, monkeypatch, tmp_path):
    from cli_helpers import gguf_helpers
    from tileinfer.io import resolve_model_dir
    from tileinfer.model.config import load_config

    helpers = gguf_helpers()
    tiny = helpers.write_gguf(tmp_path / "tiny.gguf", helpers.tiny_llama()).read_bytes()
    hub.repos[GGUF_REPO] = {"commit": "3" * 40, "files": {
        "tiny-Q8_0.gguf": tiny, "tiny-Q4_K_M.gguf": b"another quantization",
        "tiny-F16-00001-of-00002.gguf": b"part 1", "tiny-F16-00002-of-00002.gguf": b"part 2",
        "README.md": b"# tiny"}}
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path / "home"))
    with pytest.raises(HubError, match=r"acme/tiny-GGUF:Q8_0 has not been pulled: run `tileinfer "
                                       r"pull acme/tiny-GGUF:Q8_0` first"):
        resolve_model_dir(f"{GGUF_REPO}:Q8_0")
    path = pull_gguf(GGUF_REPO, "q8_0", progress=False)  # the tag in any case
    assert path.name == "tiny-Q8_0.gguf" and path.read_bytes() == tiny
    gets = [p for m, p, _, _ in hub.requests if m == "GET" and "/resolve/" in p]
    assert gets == [f"/{GGUF_REPO}/resolve/main/tiny-Q8_0.gguf"]
    folder = resolve_model_dir(path)  # what `tileinfer pull REPO:TAG` does next
    assert folder == tmp_path / "home" / "models" / "tiny-Q8_0"
    assert load_config(folder).model_type == "llama"
    assert resolve_model_dir("tiny-Q8_0") == folder
    before = len(hub.requests)
    assert resolve_model_dir(f"{GGUF_REPO}:q8_0") == folder  # from the cache, no network
    assert len(hub.requests) == before


def test_pull_gguf_errors_list_the_repos_tags(hub):
    hub.repos[GGUF_REPO] = {"commit": "3" * 40, "files": {
        "a-Q8_0.gguf": b"x", "b-Q8_0.gguf": b"y", "c-Q4_0.gguf": b"z",
        "c-F16-00001-of-00002.gguf": b"1", "c-F16-00002-of-00002.gguf": b"2"}}
    with pytest.raises(HubError, match=r"no .gguf file of it has the tag 'Q5_K_M'; its tags: "
                                       r"q4_0, q8_0"):
        pull_gguf(GGUF_REPO, "Q5_K_M", progress=False)
    with pytest.raises(HubError, match="2 files have it: a-Q8_0.gguf, b-Q8_0.gguf"):
        pull_gguf(GGUF_REPO, "Q8_0", progress=False)
    with pytest.raises(HubError, match=r"its F16 is split in parts \(c-F16-00001-of-00002.gguf"):
        pull_gguf(GGUF_REPO, "F16", progress=False)
    with pytest.raises(HubError, match=r"its tags: none \(no .gguf files\)"):
        pull_gguf(REPO, "Q8_0", progress=False)
    assert not [p for m, p, _, _ in hub.requests if m == "GET" and "/resolve/" in p]
