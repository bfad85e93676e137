"""Guard production requests with the registry that `warmcache warmup` filled.

Run after the quickstart's warmup (README): it starts a serving process the way
warmcache intends — load the model, build a ShapeGuard from the registry, prime
every compiled bucket once — then sends a ragged request the guard pads onto a
compiled bucket, and one that no bucket fits, which is refused instead of
compiled. Prints one line per step; exits non-zero if anything compiled after
priming.

    python examples/guard_request.py [--db URL] [--model tiny-llama]
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=f"sqlite:///{ROOT / '.warmcache' / 'registry.sqlite'}", help="Registry URL.")
    parser.add_argument("--model", default="tiny-llama", help="Model name in the manifest.")
    parser.add_argument("--model-path", type=Path, default=None, help="Checkpoint folder (default: the registry row's path).")
    args = parser.parse_args()
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # transformers' per-file bars ("Writing model shards", "Loading weights") are noise in a quickstart's output

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from warmcache import ShapeGuard, UnseenShapeError
    from warmcache.modeling.compile_counter import CompileCounter

    with ShapeGuard.from_registry(args.db, args.model, policy="pad") as guard:
        path = args.model_path or Path(guard.records[0].model_path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, guard.family.dtype)).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        report = guard.prime(model)
        print(f"primed {len(report.buckets)} buckets of {guard.family.describe()} in {report.seconds:.1f}s")

        prompts = ["the compile cache is warm", "every shape", "a bucket for the next prompt of tokens"]
        inputs = tokenizer(prompts, return_tensors="pt", padding=True)
        decision = guard.bucket(*inputs["input_ids"].shape)  # what generate() will do; bucket() records nothing
        with CompileCounter() as compiles:
            output = guard.generate(model, **inputs, max_new_tokens=4)
        print(f"request batch={decision.batch_size} seq={decision.seq_len}: {decision.kind} to {decision.target}, "
              f"{compiles.graphs} graphs compiled, output shape {tuple(output.shape)}")
        # The tiny models were built with random weights (warmcache/examples/tiny_model.py): their words are noise, and saying so
        # here keeps a reader from taking it for a padding bug.
        print("  what each prompt generated (random weights, so the words are noise; "
              "what counts is the 0 graphs compiled above):")
        for prompt, row in zip(prompts, tokenizer.batch_decode(output[:, inputs['input_ids'].shape[1]:])):
            print(f"  {prompt!r} -> {row!r}")

        too_big = tokenizer(prompts * 4, return_tensors="pt", padding=True)
        try:
            guard.generate(model, **too_big, max_new_tokens=4)
            print("unexpected: an unseen shape ran")
            return 1
        except UnseenShapeError as exc:
            print(f"refused: {exc}")
    return 0 if compiles.graphs == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
