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

    python llamacpp_convert.py LLAMA_CPP_SOURCE CHECKPOINT [--id-vocabulary] -- CONVERTER_ARGS...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    source, checkpoint, *rest = sys.argv[1:]
    ids = rest[:1] == ["--id-vocabulary"]
    rest = rest[1:] if ids else rest
    assert rest[:1] == ["--"], "usage: llamacpp_convert.py SOURCE CHECKPOINT [--id-vocabulary] -- CONVERTER_ARGS..."
    args = rest[1:]
    sys.path[:0] = [str(Path(source) / "gguf-py"), source]
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
