"""The one way a model name becomes a folder, shared by the library and the command line."""

from __future__ import annotations

from pathlib import Path

from .default_model import DEFAULT_MODEL_NAME, default_model_dir
from .import_record import GGUFImportError, imported_source, is_current_import
from .local_models import is_plain_name, local_model_dir
from .paths import models_home


def gguf_reference(model) -> tuple[str, str] | None:
    """(repo id, tag) of ``OWNER/NAME:TAG``, a GGUF quantization that ``tileinfer pull`` takes
    from the hub; None for any other model."""
    if not isinstance(model, str) or "\\" in model:
        return None
    repo, _, tag = model.partition(":")
    return (repo, tag) if tag and repo.count("/") == 1 else None


def imported_folder(gguf_path: Path) -> Path:
    """Where ``resolve_model_dir`` imports a .gguf file: the models home, under the file's stem."""
    return models_home() / Path(gguf_path).stem


def resolve_model_dir(model=None) -> Path:
    """The folder of ``model``: the embedded default model for None (or its name,
    ``SmolLM2-135M-Instruct``); a folder as it is; a ``.gguf`` file imported once into the models
    home (re-imported when the file or the importer changed; refused when that name holds the
    import of another file); the name of an imported model
    (``tileinfer list``); the import of ``OWNER/NAME:TAG``'s GGUF file (``tileinfer pull``);
    else the snapshot of a pulled repo id. Never touches the network."""
    if model is None:
        return default_model_dir()
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.suffix == ".gguf" and path.is_file():
        return imported_model_dir(path, replaces_another=False)
    if (reference := gguf_reference(model)) is not None:
        from .hub import HubError, pulled_gguf

        gguf = pulled_gguf(*reference)
        if gguf is None:
            raise HubError(f"{model} has not been pulled: run `tileinfer pull {model}` first")
        # A newer snapshot's file (another path) replaces the older one's import.
        return imported_model_dir(gguf, replaces_another=True)
    if isinstance(model, str) and not path.is_dir() and is_plain_name(model):
        if model == DEFAULT_MODEL_NAME:
            return default_model_dir()
        folder = local_model_dir(model)
        if folder is not None:
            return folder
        from .hub import HubError, model_dir  # huggingface_hub: only for repo ids

        try:
            return model_dir(model)
        except HubError:
            raise HubError(
                f"{model!r} is not a model folder, an imported model or a pulled repo id "
                "(`tileinfer list` shows the models here; `tileinfer pull OWNER/NAME` downloads "
                "one, `tileinfer import FILE.gguf` imports one)") from None
    from .hub import model_dir

    return model_dir(model)


def imported_model_dir(path: Path, replaces_another: bool = False) -> Path:
    """The import of the .gguf file ``path`` (made, or made again where the file changed);
    where the folder holds another file's import, a GGUFImportError unless replaces_another
    (a pulled repo's newer file replaces the older one's import)."""
    folder = imported_folder(path)
    if is_current_import(folder, path):
        return folder
    other = imported_source(folder)
    if other is not None and other != str(path.resolve()) and not replaces_another:
        raise GGUFImportError(
            f"a model named {folder.name} is already imported from {other}: `tileinfer import "
            f"{path} --name NAME` imports this file under another name (then run it by that "
            "name), `--force` replaces it")
    from .gguf_import import import_gguf

    return import_gguf(path, folder)
