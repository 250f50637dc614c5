"""Fixtures for tests and benchmarks, not part of the training API: models and tasks small enough to build in code
and run on CPU in seconds, for checking that trl-ada (or code built on it) drives TRL's loops correctly.

- `trl_ada.testing.tiny_agents`: a tiny tool-calling agent (an `add` calculator tool, a chat tokenizer TRL's tool
  loop parses, a 2-layer Qwen2 that calls the tool in about half its answers), used by the tests of tool calls and
  environments and by `benchmarks/episode_time.py`.
- `trl_ada.testing.vllm_serve`: `vllm serve` with the flags TRL's asynchronous trainer needs (`AsyncVLLMServer`, a
  context manager; the LoRA-over-HTTP weight path that also runs on CPU, or NCCL on GPUs), used by the vLLM stage's
  asynchronous tests, `benchmarks/async_learning.py` and `scripts/gpu_check.sh`.

What `trl-ada train` itself runs on CPU (the shipped tiny arithmetic model and its builders) is `trl_ada.tiny`.
"""
