"""Run as a script, never imported: llama.cpp's own converter (convert_hf_to_gguf.py of the pinned
source, with that source's gguf-py) on a GLM-4-MoE checkpoint, with two changes that the real team
model needs and upstream's GLM path does not make:

- the vocabulary goes through the converter's GPT-2-style BPE path (`_set_vocab_gpt2`): upstream's
  GLM path (`_set_vocab_glm`) names GLM-only special tokens ([gMASK], <|user|>, <|observation|>)
  that SmolLM2's tokenizer does not have;
- the MTP layer's `shared_experts` tensors are left out when the config declares
  n_shared_experts = 0 (they are zero-size there; upstream would write empty tensors the loader
  does not expect). Any such tensor that is not zero-size stops the conversion.

With `--id-vocabulary` (the conformance suite's oracle checkpoints) the vocabulary written is each
token's id as text ("<17>"), not the checkpoint's tokenizer: the oracles' byte-level tokens are not
valid UTF-8 one by one, and llama-server holds back from its stream any token that ends in an
incomplete character, so rounds could not be read from the stream. Prompts reach the server as
token ids and outputs are read as ids, so only the ids matter; the special tokens stay the
checkpoint's. (llama.cpp's loader wants a BPE merge list: one merge whose product is no token.)

With `--untie-output` a checkpoint whose output layer is its token embedding (tie_word_embeddings)
is written with that matrix twice: as token_embd and as output.weight. The model's numbers are the
same; what changes is where llama.cpp puts them. A tied output layer is the input layer's tensor,
which the loader keeps in the plain CPU buffer (embedding rows are looked up, not multiplied), so the
output layer's matmul never gets the repacked multi-row kernels; an output.weight of its own does,
and llama-quantize can give it a type of its own (`--output-tensor-type`).

    python convert.py LLAMA_CPP_SOURCE CHECKPOINT [--id-vocabulary] [--untie-output] -- CONVERTER_ARGS...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    source, checkpoint, *rest = sys.argv[1:]
    flags = set(rest[:rest.index("--")]) if "--" in rest else {"?"}
    assert flags <= {"--id-vocabulary", "--untie-output"}, \
        "usage: convert.py SOURCE CHECKPOINT [--id-vocabulary] [--untie-output] -- CONVERTER_ARGS..."
    ids, untie = "--id-vocabulary" in flags, "--untie-output" in flags
    args = rest[rest.index("--") + 1:]
    # Run as a script, this file's folder is on sys.path, and its neighbour gguf.py (the atlas's GGUF
    # sets) must never answer the converter's `import gguf`: the folder goes, the source's gguf-py leads.
    here = Path(__file__).resolve().parent
    sys.path[:] = [str(Path(source) / "gguf-py"), source, *(p for p in sys.path if Path(p or ".").resolve() != here)]
    import convert_hf_to_gguf
    import gguf
    from conversion.glm import Glm4MoeModel

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    drop_shared = config.get("n_shared_experts") == 0
    upstream_filter = Glm4MoeModel.filter_tensors.__func__  # type: ignore[attr-defined]

    def filter_tensors(cls, item):
        name, gen = item
        if drop_shared and ".mlp.shared_experts." in name:
            if gen().numel() != 0:
                raise SystemExit(f"{name}: n_shared_experts = 0 but the tensor is not empty; not converted")
            return None
        return upstream_filter(cls, item)

    Glm4MoeModel.filter_tensors = classmethod(filter_tensors)  # type: ignore[method-assign]
    if untie:
        if not config.get("tie_word_embeddings", False):
            raise SystemExit("--untie-output: the checkpoint's output layer is already its own (tie_word_embeddings is not set)")
        upstream_modify = Glm4MoeModel.modify_tensors

        def modify_tensors(self, data_torch, name, bid):
            yield from upstream_modify(self, data_torch, name, bid)
            if name == "model.embed_tokens.weight":  # the trunk's embedding (the MTP layer's own is model.layers.N.*)
                yield from upstream_modify(self, data_torch, "lm_head.weight", bid)

        Glm4MoeModel.modify_tensors = modify_tensors  # type: ignore[method-assign]
    def id_vocabulary(self) -> None:
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list([f"<{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
        self.gguf_writer.add_token_merges(["< >"])
        gguf.SpecialVocab(self.dir_model, load_merges=False, n_vocab=n).add_to_gguf(self.gguf_writer)

    Glm4MoeModel.set_vocab = id_vocabulary if ids else lambda self: self._set_vocab_gpt2()  # type: ignore[method-assign]
    sys.argv = ["convert_hf_to_gguf.py", checkpoint, *args]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
