"""Hardware cost of a verify pass against a plain decode step, per batch size, at the real layer
shapes of the atlas's exemplars (random weights, one layer of each kind the model stacks).

A plain step feeds 1 token per sequence; a verify pass feeds k + 1 (the current token and k
drafts). Their time ratio is the half of a speed-up that does not depend on acceptance: with
acceptance a, k drafts give at most (1 + a + ... + a^k) tokens per verify pass, so MTP pays only
where that count beats verify/plain (plus the draft passes). At batch 1 a decode step is bound by
reading the weights, so k + 1 tokens cost little more than 1; as the batch grows the step becomes
compute-bound and the ratio climbs towards k + 1. This table is that cost on one machine, never a
speed-up.

Each exemplar's config (data/hub-mirror/<id>/config.json) is kept as published except: one layer of
each kind (DeepSeek-V3: one dense and one MoE layer; Qwen3.5: one Gated DeltaNet and one full
attention layer; Nemotron-H: one Mamba-2, one MoE and one attention layer), no MTP layers, no
quantization (bf16 weights), and `--shrink N` (CPU rehearsal only) dividing widths and expert counts
by N, which the record says. Built with transformers' own class for the config, random weights,
on the device; timed as the median of interleaved repeats after a warm-up, with a KV cache
prefilled to `--context` tokens.

    python benchmarks/gpu/pass_costs.py --device cuda --out passcosts.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MIRROR = ROOT / "data" / "hub-mirror"
EXEMPLARS = ("deepseek-ai/DeepSeek-V3", "Qwen/Qwen3.5-397B-A17B", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8")
BATCHES = (1, 2, 4, 8, 16, 32, 64)
DRAFTS = (1, 3)
DROP = ("quantization_config", "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers",
        "auto_map", "mtp_hybrid_override_pattern")
WIDTHS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "q_lora_rank",
          "kv_lora_rank", "mamba_head_dim", "ssm_state_size", "linear_key_head_dim", "linear_value_head_dim",
          "moe_latent_size", "moe_shared_expert_intermediate_size")
COUNTS = ("num_attention_heads", "num_key_value_heads", "n_routed_experts", "num_experts", "mamba_num_heads",
          "linear_num_key_heads", "linear_num_value_heads", "n_group", "topk_group", "num_experts_per_tok", "vocab_size")


def few_layers(config: dict, shrink: int = 1) -> tuple[dict, str]:
    """The exemplar's text config cut to one layer of each kind, and what was kept, in words."""
    c = dict(config.get("text_config") or config)
    for key in DROP:
        c.pop(key, None)
    kind = c["model_type"]
    if kind == "deepseek_v3":
        c.update(num_hidden_layers=2, first_k_dense_replace=1)
        kept = "1 dense + 1 MoE layer (MLA attention)"
    elif "layer_types" in c and "linear_attention" in c["layer_types"]:
        c.update(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
        kept = "1 Gated DeltaNet + 1 full-attention layer (each with its MoE)"
    elif kind == "nemotron_h":
        pattern = "".join(dict.fromkeys(c["hybrid_override_pattern"]))  # one of each kind, in order of appearance
        c.update(num_hidden_layers=len(pattern), hybrid_override_pattern=pattern)
        c.pop("layers_block_type", None)
        kept = f"{len(pattern)} layers, one per kind ({pattern}: M Mamba-2, E MoE, * attention)"
    else:
        c.update(num_hidden_layers=1)
        kept = "1 layer"
    if shrink > 1:
        for key in WIDTHS:
            if isinstance(c.get(key), int):
                c[key] = max(8, c[key] // shrink // 2 * 2)
        for key in COUNTS:
            if isinstance(c.get(key), int):
                c[key] = max(1, c[key] // shrink)
        c["vocab_size"] = max(c["vocab_size"], 512)
        if c.get("num_key_value_heads"):
            c["num_attention_heads"] = max(c["num_attention_heads"], c["num_key_value_heads"])
        if c.get("n_group"):
            c["topk_group"] = min(c.get("topk_group", 1), c["n_group"])
        kept += f"; widths and counts divided by {shrink} (a rehearsal, not the exemplar's shapes)"
    return c, kept


def build(config: dict, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    kind = config.pop("model_type")
    cfg = AutoConfig.for_model(kind, **{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype", "dtype")})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_passes(model: torch.nn.Module, batch: int, context: int, drafts: tuple[int, ...], repeats: int,
                device: torch.device, clock=time.perf_counter) -> dict[int, list[float]]:
    """Seconds per forward for each query length (1 = plain step, k + 1 = verify), repeats
    interleaved so drift hits every length alike; the cache is prefilled once and grows by what each
    pass appends (a few dozen tokens on `context`)."""
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    lengths = (1, *(k + 1 for k in drafts))
    seconds: dict[int, list[float]] = {n: [] for n in lengths}
    for r in range(repeats + 1):  # the first round warms up and is dropped
        for n in lengths:
            step = torch.randint(0, vocab, (batch, n), generator=gen).to(device)
            _sync(device)
            t0 = clock()
            model(input_ids=step, past_key_values=cache, use_cache=True)
            _sync(device)
            if r:
                seconds[n].append(clock() - t0)
    return seconds


def table_rows(exemplar: str, seconds_by_batch: dict[int, dict[int, list[float]]], drafts: tuple[int, ...]) -> list[dict]:
    """Per batch and k: median plain and verify milliseconds and their ratio verify / plain."""
    rows = []
    for batch, seconds in seconds_by_batch.items():
        plain = statistics.median(seconds[1])
        for k in drafts:
            verify = statistics.median(seconds[k + 1])
            rows.append({"exemplar": exemplar, "batch": batch, "draft_tokens": k, "plain_ms": round(plain * 1e3, 4),
                         "verify_ms": round(verify * 1e3, 4), "verify_over_plain": round(verify / plain, 4),
                         "repeats": len(seconds[1])})
    return rows


def hardware(device: torch.device) -> str:
    if device.type == "cuda":
        return f"GPU: {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"CPU: {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--exemplars", default=",".join(EXEMPLARS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--shrink", type=int, default=1, help="divide widths and counts (CPU rehearsal only)")
    ap.add_argument("--budget-seconds", type=float, default=240.0, help="stop starting new exemplars after this")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    batches = tuple(int(b) for b in a.batches.split(","))
    started = time.monotonic()
    import transformers

    record = {
        "kind": "pass-cost table: hardware cost of a verify pass (k + 1 tokens) over a plain step (1 token); not a speed-up",
        "run_date": datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        "hardware": hardware(device), "device": str(device), "dtype": a.dtype, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(), "context": a.context,
        "shrink": a.shrink, "command": shlex.join(["python", "benchmarks/gpu/pass_costs.py", *(argv or sys.argv[1:])]),
        "weights": "random (the exemplars' shapes, not their weights)", "exemplars": [], "rows": [],
    }
    for repo in a.exemplars.split(","):
        if time.monotonic() - started > a.budget_seconds:
            record["exemplars"].append({"repo_id": repo, "error": f"skipped: the {a.budget_seconds:.0f} s budget was spent"})
            continue
        path = MIRROR / repo / "config.json"
        config, kept = few_layers(json.loads(path.read_text()), a.shrink)
        entry = {"repo_id": repo, "config": str(path.relative_to(ROOT)), "layers": kept, "model_type": config["model_type"]}
        model = None
        try:
            model = build(dict(config), device, dtype)
            entry["parameters"] = sum(p.numel() for p in model.parameters())
            by_batch = {b: time_passes(model, b, a.context, DRAFTS, a.repeats, device) for b in batches}
            record["rows"] += table_rows(repo, by_batch, DRAFTS)
        except Exception as exc:  # one exemplar's class failing on this transformers is a finding, not the end
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
        record["exemplars"].append(entry)
        a.out.write_text(json.dumps(record, indent=1) + "\n")  # after each exemplar: a step killed later keeps these
        print(f"{repo}: {entry.get('error') or kept}", flush=True)
    a.out.write_text(json.dumps(record, indent=1) + "\n")
    print(format_table(record))
    return 0 if record["rows"] else 1


def format_table(record: dict) -> str:
    lines = [f"Pass cost, {record['hardware']}, {record['dtype']}, context {record['context']} tokens "
             f"(hardware cost of verify over plain; not a speed-up)",
             f"  {'exemplar':<46} {'batch':>5} {'k':>2} {'plain ms':>9} {'verify ms':>10} {'verify/plain':>12}"]
    for r in record["rows"]:
        lines.append(f"  {r['exemplar']:<46} {r['batch']:>5} {r['draft_tokens']:>2} {r['plain_ms']:>9.3f} "
                     f"{r['verify_ms']:>10.3f} {r['verify_over_plain']:>12.2f}")
    for e in record["exemplars"]:
        if "error" in e:
            lines.append(f"  {e['repo_id']}: not measured ({e['error']})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
