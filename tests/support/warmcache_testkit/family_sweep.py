"""Every decoder family the installed transformers registers, tiny, through the support matrix's cell.

The configs users bring are mostly of families this project never saw: transformers
adds several a month, and a family's first release is when people deploy it. This
sweep builds a tiny random-weight model of every causal-LM family in
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (the sizes of ``warmcache/examples/tiny_model.py``, 2 layers)
and runs each through ``warmcache_testkit.support_matrix``'s cell (warmup, verify, the guard's
ragged requests against eager, the training step; aot_eager), each family in a
process of its own so that one crash or hang costs one row:

    python -m warmcache_testkit.family_sweep --out sweep.md          # every family (about 30 min on 2 cores)
    python -m warmcache_testkit.family_sweep --family qwen3_5_text --family gemma4_text
    python -m warmcache_testkit.family_sweep --docs docs/measurements/architectures.md   # and rewrite its list/table
    python -m warmcache_testkit.family_sweep --rows a.md --rows b.md --docs docs/measurements/architectures.md

A family that cannot be built tiny from its config class says why in its row, as does
one warmcache refuses at plan time; encoders, encoder-decoders and multimodal wrappers
(whose text family is swept on its own) are left out. The table of the last run is in
docs/measurements/architectures.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from warmcache.examples.tiny_model import SLIDING_WINDOW, TINY_SIZES, VOCAB_SIZE, build_tokenizer

#: Causal-LM classes that are not a decoder warmcache serves: a decoder head on an encoder (BERT and kin), an
#: encoder-decoder, speech or music, or a multimodal wrapper whose ``*_text`` family is swept on its own.
NOT_DECODERS = frozenset(
    "bart bert bert-generation big_bird bigbird_pegasus blenderbot blenderbot-small camembert data2vec-text electra "
    "ernie marian mbart megatron-bert mvp pegasus plbart prophetnet rembert roberta roberta-prelayernorm roc_bert "
    "roformer trocr whisper xlm xlm-roberta xlm-roberta-xl xmod musicgen musicgen_melody moshi reformer xlnet cpmant "
    "ctrl openai-gpt git fuyu emu3 got_ocr2 mllama aria_text phi4_multimodal gpt-sw3 moss_transcribe_diarize gemma3 "
    "gemma3n gemma4 gemma4_unified gemma4_unified_assistant gemma4_assistant llama4 qwen3_5 qwen3_5_moe qwen4_exp "
    "dots3_note".split()
)
#: Sizes beyond :data:`TINY_SIZES` under the names other families give them (experts, latent attention, GPT-2's), and
#: the tiny sliding window.
FAMILY_SIZES: dict[str, Any] = dict(
    head_dim=16,
    sliding_window=SLIDING_WINDOW,  # where the family's config declares one: a short decode runs past the window
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_routed_experts=4,
    num_local_experts=4,
    n_shared_experts=1,
    shared_expert_intermediate_size=32,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    n_embd=64,
    n_layer=2,
    n_head=4,
    n_positions=512,
    n_inner=128,
    ffn_hidden_size=128,
    d_model=64,
)
#: Where a family's defaults do not fit 2 tiny layers: one layer of each kind it mixes, latent attention's one KV
#: head per query head, a rotary width inside the head. ``None`` drops a size the family derives itself.
_ONE_OF_EACH = {"layer_types": ["linear_attention", "full_attention"]}
_LATENT = {"num_key_value_heads": 4, "head_dim": None}
_PER_LAYER_EMBEDDINGS = {
    "vocab_size_per_layer_input": TINY_SIZES["vocab_size"],
    "hidden_size_per_layer_input": 16,
    "num_kv_shared_layers": 0,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": SLIDING_WINDOW,
}
#: Inkling-2's: one layer of each kind, its per-kind heads, its relative-bias extent and log-scaling floor (positions)
#: and attention-residual block (layers) cut like the window; its embedding padded past its head's rows as in its
#: checkpoints (the default head of 200058 rows was what the tiny vocabulary's padding came out negative against).
_INKLING2 = dict(
    layer_types=["hybrid_sliding", "hybrid"],
    sliding_window_size=SLIDING_WINDOW,
    vocab_size=VOCAB_SIZE + 64,
    unpadded_vocab_size=VOCAB_SIZE,
    **dict(swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16),
    **dict(rel_extent=2 * SLIDING_WINDOW, log_scaling_n_floor=2 * SLIDING_WINDOW, n_layers_per_attn_res_block=1),
)
#: BLT's four sub-models (entropy patcher, local encoder and decoder over bytes, global transformer over patches) are
#: sized by their own sub-configs, which the top-level sizes do not reach; its hash-embedding table likewise.
_BLT_LOCAL = dict(vocab_size=VOCAB_SIZE, hidden_size=64, num_attention_heads=4, intermediate_size=128)
_BLT = {
    "patcher_config": {**_BLT_LOCAL, "num_hidden_layers": 2, "sliding_window": SLIDING_WINDOW},
    "encoder_config": {**_BLT_LOCAL, "hidden_size_global": 64, "num_hidden_layers": 1},
    "decoder_config": {**_BLT_LOCAL, "hidden_size_global": 64, "num_hidden_layers": 2},
    "global_config": {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "num_hidden_layers": 2},
    "local_attention_window_len": SLIDING_WINDOW,
    "encoder_hash_byte_group_vocab": 512,
}
FAMILY_OVERRIDES: dict[str, dict[str, Any]] = {
    **dict.fromkeys(
        ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmo_hybrid", "granitemoehybrid"), _ONE_OF_EACH
    ),
    **dict.fromkeys(
        "deepseek_v2 deepseek_v3 deepseek_v32 glm4_moe_lite glm_moe_dsa minicpm3 sarvam_mla youtu axk1 axk2 "
        "dots3_note_text".split(),
        _LATENT,
    ),
    "kimi_linear": {**_ONE_OF_EACH, **_LATENT, "mlp_layer_types": ["dense", "sparse"]},
    "bailing_hybrid": {**_ONE_OF_EACH, "mlp_layer_types": ["dense", "sparse"], "num_key_value_heads": 4},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "zamba2": {"layers_block_type": ["mamba", "hybrid"], "hybrid_layer_ids": [1]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "inkling_text": {"layer_types": ["hybrid_sliding", "hybrid"], "sliding_window_size": SLIDING_WINDOW},
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "lfm2_moe": {"num_dense_layers": 1, "layer_types": ["conv", "full_attention"]},
    "lfm3": {"layer_types": ["conv", "sliding_attention"], "sliding_window": SLIDING_WINDOW},
    "gemma3n_text": _PER_LAYER_EMBEDDINGS,
    "gemma4_text": _PER_LAYER_EMBEDDINGS,
    "falcon": {"head_dim": None},
    "codegen": {"rotary_dim": 8},
    "gptj": {"rotary_dim": 8},
    "gpt_neo": {"num_layers": 2, "attention_types": [[["global", "local"], 1]], "window_size": SLIDING_WINDOW},
    # its modeling reads ``attn_config.rope_theta``, which its checkpoints carry and its attention config class lacks
    "dbrx": {
        "tie_word_embeddings": False,
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 500000.0},
        "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
    },
    "zamba": {"layers_block_type": ["hybrid", "hybrid"]},  # its shared attention ties across two hybrid layers
    "zaya": {"num_experts_per_tok": 1},
    # its attention layer comes every 4th by default (2 tiny layers would have none); transformers makes it indexed
    "qwen4_exp_text": {
        "layer_types": ["linear_attention", "indexed_attention"],
        **dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=2),
    },
    "xlstm": {"v_head_dim": None},  # a property xLSTM derives
    "blt": _BLT,
    "inkling2_text": _INKLING2,
    # its looped core (layers 6-17 of 24, 3 passes) as the second layer, after a one-layer prelude
    "inkling2_loop_text": {**_INKLING2, "loop_layer_index_start": 1, "loop_layer_index_end": 2, "loop_gate_rank": 8},
    # its per-layer-kind RoPE has no default: RoPE on the sliding layers, none on the full ones (NoPE), as it allows
    "cohere_compass_text": {
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]},
            "full_attention": None,
        },
    },
    # its validator's hidden_size * expand == num_heads * head_dim; its checkpoints' untied head (tied, each tiny
    # greedy decode repeated one token)
    "mamba2": {"num_heads": 8, "tie_word_embeddings": False},
    # latent attention whose rotary width is ``head_dim``; 2 tiny "hidden layers" are its one layer of two attentions
    "longcat_flash": {"num_key_value_heads": 4, "head_dim": FAMILY_SIZES["qk_rope_head_dim"], "zero_expert_num": 2},
}
#: A tiny build larger than this kept a default size the overrides missed: a wrong row, not a tiny one.
MAX_TINY_PARAMETERS = 20_000_000


def families() -> list[str]:
    """The installed transformers' causal-LM families, less :data:`NOT_DECODERS`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [name for name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if name not in NOT_DECODERS]


def tiny_config(family: str) -> Any:
    """``family``'s config class at the tiny sizes, 2 layers."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[family]
    sizes = {**TINY_SIZES, **FAMILY_SIZES, "num_hidden_layers": 2}
    if "sliding_window" not in getattr(config_class, "__dataclass_fields__", {}):
        # transformers' caches read ``sliding_window`` off any config without ``layer_types``: on a family whose
        # attention has no window (BLOOM, Llama) the key would make their cache, not their mask, windowed
        del sizes["sliding_window"]
    sizes |= FAMILY_OVERRIDES.get(family, {})
    return config_class(**{name: value for name, value in sizes.items() if value is not None})


def build_family_model(family: str, out_dir: Path) -> Path:
    """Save a tiny random-weight ``family`` model and the tiny tokenizer into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    with torch.device("meta"):  # counted before any memory is taken: a default left large once took 23 GB
        parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if parameters > MAX_TINY_PARAMETERS:
        raise ValueError(f"{parameters / 1e6:.0f} M parameters: a default size was not made tiny")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(out_dir)
    build_tokenizer(out_dir)
    return out_dir


def run_cell(family: str, root: Path) -> dict[str, str]:
    """Build the family and run the support matrix's cell on it, in this process."""
    from warmcache_testkit.support_matrix import prepare, row

    try:
        path = build_family_model(family, root / "models" / family)
    except Exception as exc:  # noqa: BLE001 - the row says why the family could not be built
        return {"generate": f"not built: {type(exc).__name__}: {_first_line(exc)}", "train": "—", "layers": "—"}
    try:
        cell = row(prepare(root, [], built={family: path}), family)
    except Exception as exc:  # noqa: BLE001 - a refusal or a crash outside warmup's own per-shape errors
        return {"generate": f"FAIL: {type(exc).__name__}: {_first_line(exc)}", "train": "—", "layers": "—"}
    return {"generate": cell.generate, "train": cell.train, "layers": cell.layers}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def sweep(names: list[str], root: Path, limit_s: int) -> list[dict[str, str]]:
    """Each family's cell in a fresh process (a crash or hang costs one row), with its wall time."""
    rows = []
    for family in names:
        start = time.perf_counter()
        module = "warmcache_testkit.family_sweep"
        command = [sys.executable, "-m", module, "--cell", family, "--root", str(root / family)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            cell = json.loads(lines[-1]) if lines else {"generate": f"FAIL: exit {done.returncode}: {_tail(done)}"}
        except subprocess.TimeoutExpired:
            cell = {"generate": f"FAIL: no result in {limit_s} s"}
        cell = {"family": family, "layers": "—", "train": "—", **cell, "s": f"{time.perf_counter() - start:.0f}"}
        print(f"{family}: {cell['generate'][:100]} / train {cell['train'][:60]}", file=sys.stderr, flush=True)
        rows.append(cell)
    return rows


def _tail(done: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    return (errors[-1] if errors else done.stderr.strip()[-200:]).replace("|", "/")[:300]


def markdown(rows: list[dict[str, str]], seconds: float) -> str:
    import transformers

    passed = sum(_passes(r) for r in rows)
    return "\n".join(
        [
            "| family | cache layers | generate (warmup, verify, guard) | train | s |",
            "| --- | --- | --- | --- | --- |",
            *(
                f"| {r['family']} | {r['layers']} | {r['generate'].replace('|', '/')} | "
                f"{r['train'].replace('|', '/')} | {r['s']} |"
                for r in rows
            ),
            "",
            f"{passed} of {len(rows)} families pass every cell; transformers {transformers.__version__}, "
            f"`python -m warmcache_testkit.family_sweep` in {seconds:.0f} s (2 layers, hidden 64, aot_eager, CPU).",
        ]
    )


#: The comments around the pass list and the table of the others in docs/measurements/architectures.md.
DOCS_BEGIN, DOCS_END = "<!-- family-sweep:begin -->", "<!-- family-sweep:end -->"


def _passes(row: dict[str, str]) -> bool:
    return row["generate"].startswith("pass") and row["train"] == "pass"


def read_rows(table: str) -> list[dict[str, str]]:
    """The rows of a table :func:`markdown` wrote (its cells hold no ``|``)."""
    cells = [line.strip("| ").split(" | ") for line in table.splitlines() if line.startswith("| ")]
    keys = ("family", "layers", "generate", "train", "s")
    return [
        dict(zip(keys, row, strict=True)) for row in cells if len(row) == len(keys) and row[0] not in ("family", "---")
    ]


def update_docs(text: str, rows: list[dict[str, str]], total: int) -> str:
    """``text`` with the pass list and the table between :data:`DOCS_BEGIN` and :data:`DOCS_END` updated by ``rows``:
    a family that passes joins the list and leaves the table; one that does not gets its row's verdict in the table.
    Families not in ``rows`` keep their place and their (possibly hand-written) reason."""
    head, rest = text.split(DOCS_BEGIN)
    block, tail = rest.split(DOCS_END)
    passing = set(re.findall(r"`([^`]+)`", next(line for line in block.splitlines() if line.startswith("**"))))
    others = dict(re.findall(r"^\| `([^`]+)` \| (.*) \|$", block, re.MULTILINE))
    for row in rows:
        if _passes(row):
            passing.add(row["family"])
            others.pop(row["family"], None)
        else:
            passing.discard(row["family"])
            others[row["family"]] = f"{row['generate']}; train: {row['train']}".replace("|", "/")
    listed = ", ".join(f"`{name}`" for name in sorted(passing))
    table = "\n".join(f"| `{name}` | {reason} |" for name, reason in sorted(others.items()))
    block = (
        f"\n**{len(passing)} of the {total} families pass every cell** (each of the {total} has a row; the others, "
        f"below, are refused at plan time with their reason, disproven, fail a cell with a reason, or have no tiny "
        f"build): {listed}.\n\nThe others, and why:\n\n| family | what happened |\n| --- | --- |\n{table}\n"
    )
    return head + DOCS_BEGIN + block + DOCS_END + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", help="Family (model_type) to run (default: every decoder).")
    parser.add_argument("--limit", type=int, default=900, help="Seconds one family may take (default 900).")
    parser.add_argument("--out", type=Path, help="Also write the markdown table to this file.")
    parser.add_argument("--docs", type=Path, help="Update the pass list and table in this file with the rows.")
    parser.add_argument("--rows", type=Path, action="append", help="Take the rows from this --out file; run none.")
    parser.add_argument("--cell", help=argparse.SUPPRESS)  # one family, in the child process sweep() starts
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()
    if args.cell:
        print(json.dumps(run_cell(args.cell, args.root)), flush=True)
        return 0
    if args.rows:
        rows = [row for path in args.rows for row in read_rows(path.read_text())]
        if args.docs:
            args.docs.write_text(update_docs(args.docs.read_text(), rows, len(families())))
        return 0 if all(_passes(r) for r in rows) else 1
    unknown = sorted(set(args.family or ()) - set(families()))
    if unknown:
        parser.error(f"--family {unknown[0]!r} is not a decoder family of this transformers")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="warmcache-sweep-") as tmp:
        rows = sweep(args.family or families(), Path(tmp), args.limit)
    table = markdown(rows, time.perf_counter() - start)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    if args.docs:
        args.docs.write_text(update_docs(args.docs.read_text(), rows, len(families())))
    return 0 if all(_passes(r) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
