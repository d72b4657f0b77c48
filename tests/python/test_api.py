#!/usr/bin/env python3
"""Black-box tests of the Python API (run by ctest; plain asserts, no pytest needed)."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from deepinfer import LLM, SamplingParams  # noqa: E402

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "models", "demo")


def main() -> int:
    llm = LLM(model=MODEL, num_threads=2)
    greedy = SamplingParams(temperature=0, max_tokens=10)
    outs = llm.generate(["The house", "It was a"], greedy)
    assert [o.prompt for o in outs] == ["The house", "It was a"], outs
    for o in outs:
        c = o.outputs[0]
        assert len(c.token_ids) == 10 and c.finish_reason == "length", c
        assert c.text == llm.decode(c.token_ids), (c.text, llm.decode(c.token_ids))
        assert o.prompt_token_ids == llm.encode(o.prompt, add_special_tokens=True)
        assert c.cumulative_logprob <= 0 and math.isfinite(c.cumulative_logprob)
    # token-id prompts, a single prompt, seeded sampling reproducible, n > 1
    ids = llm.encode("It was a", add_special_tokens=True)
    again = llm.generate({"prompt_token_ids": ids}, greedy)
    assert again[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    sampled = SamplingParams(temperature=1.0, max_tokens=8, seq_seed=7, n=2, logprobs=2)
    a = llm.generate(ids, sampled)[0]
    b = llm.generate(ids, sampled)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len(a.outputs) == 2 and len(a.outputs[0].logprobs) == 8 and len(a.outputs[0].logprobs[0].top) == 2
    # streaming
    snapshots = list(llm.stream("Once", SamplingParams(max_tokens=5, seq_seed=1)))
    assert snapshots[-1].finished and len(snapshots[-1].outputs[0].token_ids) == 5
    assert all(not s.finished for s in snapshots[:-1])
    # chat
    chat = llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(temperature=0, max_tokens=4))
    assert len(chat.outputs[0].token_ids) == 4
    # bad input is a ValueError naming the parameter, and the engine keeps working
    for bad, needle in [(SamplingParams(top_p=2.0), "top_p"), (SamplingParams(temperature=float("nan")), "temperature"),
                        (SamplingParams(max_tokens=0), "max_tokens"), (SamplingParams(n=0), "n must")]:
        try:
            llm.generate("x", bad)
        except ValueError as e:
            assert needle in str(e), e
        else:
            raise AssertionError(f"accepted {bad}")
    try:
        llm.generate([[1, 2, 10**9]], greedy)
    except ValueError as e:
        assert "out of range" in str(e), e
    else:
        raise AssertionError("accepted an out-of-range token id")
    assert llm.generate("The", greedy)[0].outputs[0].token_ids == llm.generate("The", greedy)[0].outputs[0].token_ids
    print("python api: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
