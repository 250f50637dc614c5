"""Fixtures for tests and benchmarks, not part of the training API: models and servers small enough to build in code
and run on CPU, for checking that trl-ada (or code built on it) drives TRL's loops correctly:
`trl_ada.testing.tiny_agents` (a tiny tool-calling agent) and `trl_ada.testing.vllm_serve` (`vllm serve` with the flags
TRL's asynchronous trainer needs). What `trl-ada train` itself runs on CPU is `trl_ada.tiny`.
"""
