"""DeepInfer: inference for DeepSeek-architecture models.

    from deepinfer import LLM, SamplingParams
    llm = LLM()                      # the embedded demo model, or LLM(model="/path/to/checkpoint")
    for out in llm.generate(["The house"], SamplingParams(temperature=0, max_tokens=16)):
        print(out.outputs[0].text)

`DEEPINFER_HF_MODEL_DIR` sets the default model; other `DEEPINFER_*` variables as in README.md.
"""
try:
    from ._deepinfer import (  # noqa: F401
        LLM,
        CompletionOutput,
        RequestMetrics,
        RequestOutput,
        RequestStream,
        SamplingParams,
        TokenLogprobs,
    )
except ImportError as e:  # pragma: no cover - explains the one set-up step users miss
    raise ImportError(
        "deepinfer's extension module is not built: run `bash scripts/setup.sh` "
        "(it builds python/deepinfer/_deepinfer*.so) and use PYTHONPATH=python"
    ) from e

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "RequestStream",
           "TokenLogprobs"]
