#!/usr/bin/env python3
"""Offline inference with DeepInfer's vLLM-shaped API.

    PYTHONPATH=python python3 examples/offline_inference.py [--model DIR] [--max-tokens N]

Prints every completion and its decode perplexity, exp(-cumulative_logprob / n_tokens): the
model's own perplexity on the text it generated (lower = more confident).
"""
import argparse
import math
import time

from deepinfer import LLM, SamplingParams

PROMPTS = [
    "The history of the city",
    "She opened the door and",
    "In the morning, the farmers",
    "The committee decided that",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: $DEEPINFER_HF_MODEL_DIR or the demo model)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seq-seed", type=int, default=1234, help="fixed seed: reruns print the same text")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    llm = LLM(model=args.model, num_threads=args.threads)
    params = SamplingParams(temperature=args.temperature, top_p=0.95, max_tokens=args.max_tokens, seq_seed=args.seq_seed)
    start = time.perf_counter()
    outputs = llm.generate(PROMPTS, params)
    elapsed = time.perf_counter() - start

    n_generated = 0
    for out in outputs:
        completion = out.outputs[0]
        n = len(completion.token_ids)
        n_generated += n
        decode_ppl = math.exp(-completion.cumulative_logprob / n) if n else float("nan")
        print(f"Prompt: {out.prompt!r}")
        print(f"Output: {completion.text!r}")
        print(f"  tokens={n} finish_reason={completion.finish_reason} decode_ppl={decode_ppl:.2f}")
    print(f"{len(outputs)} requests, {n_generated} tokens in {elapsed:.2f} s ({n_generated / elapsed:.1f} tok/s)")


if __name__ == "__main__":
    main()
