"""A local checkpoint's revision names the model, not the tools or notes that came with it: the
digest ignores the transformers version a config was saved by, JSON formatting, the project's
provenance file, the output marker of the command that wrote it, and notes, and changes with any
weight, config value or tokenizer file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.numpy import save_file
import numpy as np

from atlas import outdir
from atlas.decode.checkpoint import digest
from atlas.records.record import PROVENANCE_FILE


def _checkpoint(folder: Path) -> Path:
    folder.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 2, "torch_dtype": "float32",
              "transformers_version": "5.24.0", "text_config": {"vocab_size": 16, "transformers_version": "5.24.0"}}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "transformers_version": "5.24.0"}))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    (folder / "merges.txt").write_text("a b\n")
    save_file({"w": np.arange(8, dtype=np.float32)}, str(folder / "model.safetensors"))
    return folder


def test_the_revision_ignores_tools_and_notes(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "m")
    before = digest(folder)
    config = json.loads((folder / "config.json").read_text())
    config["transformers_version"] = "5.25.0"  # a transformers upgrade re-saved it ...
    config["text_config"]["transformers_version"] = "5.25.0"
    config["dtype"] = config.pop("torch_dtype")  # ... under transformers 5's key name
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))  # and other formatting
    generation = json.loads((folder / "generation_config.json").read_text()) | {"transformers_version": "5.25.0"}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    (folder / PROVENANCE_FILE).write_text('{"kind": "how it was made"}')
    (folder / "NOTES.txt").write_text("trained on a Tuesday")
    assert digest(folder) == before


def test_the_revision_changes_with_the_model(tmp_path: Path) -> None:
    base = _checkpoint(tmp_path / "m")
    before = digest(base)

    def changed(edit) -> str:
        other = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(base, other)
        edit(other)
        return digest(other)

    def hidden(f: Path) -> None:
        config = json.loads((f / "config.json").read_text())
        config["text_config"]["vocab_size"] = 17
        (f / "config.json").write_text(json.dumps(config))

    assert changed(hidden) != before
    assert changed(lambda f: save_file({"w": np.arange(1, 9, dtype=np.float32)}, str(f / "model.safetensors"))) != before
    assert changed(lambda f: (f / "merges.txt").write_text("b a\n")) != before
    assert changed(lambda f: (f / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 1, "b": 0}}}))) != before


def test_two_builds_of_the_same_files_have_one_revision(tmp_path: Path, monkeypatch) -> None:
    """`atlas real-model` writes its folder through atlas.outdir, whose marker holds the time it was
    written: the same checkpoint built twice (on two machines, or a minute apart) is one revision."""
    import datetime as dt

    def build(out: Path, when: str) -> str:
        class Clock(dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return dt.datetime.fromisoformat(when)
        monkeypatch.setattr(outdir, "datetime", Clock)
        outdir.replace(out, "atlas real-model", lambda staging: shutil.copytree(_checkpoint(tmp_path / f"src-{out.name}"),
                                                                                 staging, dirs_exist_ok=True))
        return digest(out)

    first, second = build(tmp_path / "a", "2026-12-05T23:00:00+00:00"), build(tmp_path / "b", "2026-12-06T06:12:56+00:00")
    assert (tmp_path / "a" / outdir.MARKER).read_bytes() != (tmp_path / "b" / outdir.MARKER).read_bytes()
    assert first == second
