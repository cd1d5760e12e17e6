"""Models from the Hugging Face hub, through huggingface_hub and its cache.

``pull`` downloads only what inference needs, with config.json last: a snapshot counts as pulled
once its config.json is there, so an interrupted pull never looks complete. ``pull_gguf``
downloads one quantization of a GGUF repo (ollama's ``hf.co/OWNER/NAME:TAG``), which the caller
then imports (``gguf_import``). huggingface_hub does
the rest: resuming a dropped connection, skipping files already cached, the token (``token=``,
else $HF_TOKEN, else the one stored by ``hf auth login``), progress bars, HF_ENDPOINT, HF_HOME /
HF_HUB_CACHE and HF_HUB_OFFLINE.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

import httpx
from huggingface_hub import (HfApi, constants, hf_hub_download, scan_cache_dir, snapshot_download,
                             try_to_load_from_cache)
from huggingface_hub.errors import (CacheNotFound, EntryNotFoundError, GatedRepoError,
                                    HfHubHTTPError, HFValidationError, LocalEntryNotFoundError,
                                    OfflineModeIsEnabled, RepositoryNotFoundError,
                                    RevisionNotFoundError)
from huggingface_hub.utils import tqdm as hub_tqdm
from huggingface_hub.utils import validate_repo_id

# Weights: model.safetensors or model-00001-of-00004.safetensors. Not "*.safetensors": some repos
# also ship the same weights in another layout (Mistral's consolidated.safetensors).
WEIGHT_FILES = "model*.safetensors"
INFERENCE_FILES = (
    WEIGHT_FILES,
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)
CONFIG_FILE = "config.json"  # downloaded last: its presence marks a complete pull

TOKEN_HINT = (
    "set HF_TOKEN to an access token of an account that may read it (or log in with `hf auth login`); "
    "for a gated model, first accept its terms on the model's hub page"
)


class HubError(RuntimeError):
    """A model could not be pulled, found, or removed; the message says why and what to do."""


@dataclass(frozen=True)
class CachedModel:
    """A model in the hub cache: repo id, revision (a ref such as "main", or the commit hash when no
    ref points at it), its snapshot folder and the size of its files in bytes."""

    repo_id: str
    revision: str
    path: Path
    size_bytes: int


class _NoProgress(hub_tqdm):
    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def _cache_dir() -> str:
    # Read at call time, so HF_HUB_CACHE changes (and tests that patch the constant) take effect.
    return constants.HF_HUB_CACHE


def _status(error: HfHubHTTPError) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def _hub_errors(repo_id: str, revision: str):
    """Turn huggingface_hub's exceptions into one HubError that says what to do."""
    where = f"{repo_id} (revision {revision})"
    try:
        yield
    except HubError:
        raise
    except GatedRepoError as e:
        raise HubError(f"{repo_id} is a gated model and this request was not allowed to read it: {TOKEN_HINT}") from e
    except RepositoryNotFoundError as e:
        raise HubError(f"{repo_id} was not found on the hub, or it is private or gated: check the name; if it exists, {TOKEN_HINT}") from e
    except RevisionNotFoundError as e:
        raise HubError(f"{repo_id} has no revision {revision!r} on the hub") from e
    except EntryNotFoundError as e:
        if isinstance(e, LocalEntryNotFoundError):  # a connection problem, reported as "not in the cache"
            raise HubError(f"cannot download {where} from {constants.ENDPOINT}: {_first_line(e)}") from e
        url = str(getattr(getattr(e, "response", None), "url", "") or "")
        missing = url.rsplit("/", 1)[-1] if url else "a file"
        raise HubError(f"{where} lists {missing} but the hub has no such file (404); the model was not pulled") from e
    except HfHubHTTPError as e:
        status = _status(e)
        if status in (401, 403):
            raise HubError(f"the hub refused access to {where} (HTTP {status}): {TOKEN_HINT}") from e
        raise HubError(f"downloading {where} failed (HTTP {status}): {_first_line(e)}") from e
    except OfflineModeIsEnabled as e:
        raise HubError(f"cannot pull {where}: HF_HUB_OFFLINE is set") from e
    except (httpx.HTTPError, OSError) as e:
        raise HubError(f"cannot download {where} from {constants.ENDPOINT}: {type(e).__name__}: {e}") from e


def pull(repo_id: str, revision: str = "main", token: str | None = None, progress: bool = True) -> Path:
    """Download the inference files of ``repo_id`` into the hub cache; return the snapshot folder.

    Files already cached are not downloaded again, and a dropped connection resumes where it
    stopped. ``token`` overrides $HF_TOKEN and the stored token.
    """
    _check_repo_id(repo_id)
    tqdm_class = None if progress else _NoProgress
    with _hub_errors(repo_id, revision):
        folder = Path(
            snapshot_download(
                repo_id,
                revision=revision,
                token=token,
                allow_patterns=list(INFERENCE_FILES),
                cache_dir=_cache_dir(),
                tqdm_class=tqdm_class,
            )
        )
        if not any(folder.glob(WEIGHT_FILES)):
            raise HubError(
                f"{repo_id} (revision {revision}) has no safetensors weights named {WEIGHT_FILES}; "
                "TileInfer loads only those"
            )
        # The snapshot folder is named after the commit: fetch config.json from that same commit,
        # even if the branch moved meanwhile.
        hf_hub_download(
            repo_id, CONFIG_FILE, revision=folder.name, token=token, cache_dir=_cache_dir(), tqdm_class=tqdm_class
        )
    return folder


# One part of a GGUF file split in several (llama.cpp's gguf-split): NAME-00001-of-00003.gguf.
_SPLIT_PART = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


def gguf_tag(file_name: str) -> str | None:
    """The quantization tag of a GGUF file's name, lower case: what follows its last '-' or '.'
    (Qwen2.5-0.5B-Instruct-Q8_0.gguf: q8_0; llama-2-7b.Q4_K_M.gguf: q4_k_m); None for a part of
    a split file."""
    name = file_name.rsplit("/", 1)[-1]
    if not name.lower().endswith(".gguf") or _SPLIT_PART.search(name):
        return None
    return re.split(r"[-.]", name[: -len(".gguf")])[-1].lower()


def pull_gguf(repo_id: str, tag: str, revision: str = "main", token: str | None = None,
              progress: bool = True) -> Path:
    """Download the .gguf file of ``repo_id`` whose quantization tag (``gguf_tag``) is ``tag``,
    in any case, into the hub cache; return its path. A tag no file has, or several have, is a
    HubError that lists the repo's tags; split files are refused."""
    _check_repo_id(repo_id)
    with _hub_errors(repo_id, revision):
        # A client made now, not huggingface_hub's module-level one: it reads the endpoint then.
        files = [f for f in HfApi().list_repo_files(repo_id, revision=revision, token=token)
                 if f.lower().endswith(".gguf")]
        found = [f for f in files if gguf_tag(f) == tag.lower()]
        if len(found) != 1:
            tags = sorted({t for f in files if (t := gguf_tag(f))})
            raise HubError(f"{repo_id} (revision {revision}): {_not_one(tag, files, found)}; "
                           f"its tags: {', '.join(tags) or 'none (no .gguf files)'}")
        return Path(hf_hub_download(repo_id, found[0], revision=revision, token=token,
                                    cache_dir=_cache_dir(),
                                    tqdm_class=None if progress else _NoProgress))


def _not_one(tag: str, files: list[str], found: list[str]) -> str:
    """Why no single .gguf file of files has the tag (found: those that have it)."""
    if found:
        return f"{len(found)} files have it: {', '.join(found)}"
    split = [f for f in files if _SPLIT_PART.search(f) and tag.lower() in f.lower()]
    if split:
        return f"its {tag} is split in parts ({split[0]}, ...), which TileInfer does not join"
    return f"no .gguf file of it has the tag {tag!r}"


def pulled_gguf(repo_id: str, tag: str) -> Path | None:
    """The .gguf file of ``repo_id`` with that tag that ``pull_gguf`` put in the hub cache (the
    newest, if several snapshots hold one), or None. Never touches the network."""
    snapshots = Path(_cache_dir()) / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    found = [p for p in snapshots.glob("*/**/*.gguf") if gguf_tag(p.name) == tag.lower()]
    return max(found, key=lambda p: p.lstat().st_mtime) if found else None


def _check_repo_id(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubError(f"{repo_id!r} is not a valid repo id (owner/name): {e}") from e


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or "\\" in text or text.count("/") > 1


def model_dir(model: str | Path, revision: str = "main") -> Path:
    """The folder holding ``model``'s files: ``model`` itself if it is a folder, else the snapshot of
    a pulled repo id. Never touches the network. A repo counts as pulled once its config.json,
    which ``pull`` downloads last, is in the cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    name = str(model)
    if isinstance(model, Path) or _looks_like_path(name):
        raise HubError(f"no such model folder: {name}")
    try:
        validate_repo_id(name)
    except HFValidationError as e:
        raise HubError(f"{name!r} is neither a model folder nor a repo id (owner/name)") from e
    config = try_to_load_from_cache(name, CONFIG_FILE, cache_dir=_cache_dir(), revision=revision)
    if isinstance(config, str):
        return Path(config).parent
    raise HubError(
        f"{name} (revision {revision}) is not a folder here and has not been pulled: "
        f"run `tileinfer pull {name}` first"
    )


def _scan():
    try:
        return scan_cache_dir(_cache_dir())
    except CacheNotFound:
        return None


def list_models() -> list[CachedModel]:
    """The models in the hub cache that have safetensors weights and a config.json, by repo id."""
    info = _scan()
    if info is None:
        return []
    models = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            names = {f.file_name for f in rev.files}
            if CONFIG_FILE not in names or not any(n.endswith(".safetensors") for n in names):
                continue
            for ref in sorted(rev.refs) or [rev.commit_hash]:
                models.append(CachedModel(repo.repo_id, ref, rev.snapshot_path, rev.size_on_disk))
    return sorted(models, key=lambda m: (m.repo_id, m.revision))


def remove_model(repo_id: str, revision: str | None = None) -> int:
    """Delete ``repo_id`` from the hub cache: every revision, or only ``revision`` (a ref or a commit
    hash). Blobs still used by other revisions stay. Returns the bytes freed."""
    info = _scan()
    repo = None
    if info is not None:
        repo = next((r for r in info.repos if r.repo_type == "model" and r.repo_id == repo_id), None)
    if repo is None:
        raise HubError(f"{repo_id} is not in the hub cache ({_cache_dir()})")
    hashes = [r.commit_hash for r in repo.revisions if revision is None or revision == r.commit_hash or revision in r.refs]
    if not hashes:
        cached = sorted({ref for r in repo.revisions for ref in r.refs} | {r.commit_hash for r in repo.revisions})
        raise HubError(f"{repo_id} has no cached revision {revision!r} (cached: {', '.join(cached)})")
    strategy = info.delete_revisions(*hashes)
    strategy.execute()
    return strategy.expected_freed_size
