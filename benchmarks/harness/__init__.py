"""
The shared harness of the learning benchmarks: `scripts/benchmark_learning.py`, `benchmarks/code_learning.py`,
`benchmarks/async_learning.py` and `benchmarks/peer/cgrpo_learning.py` are each their methods, their task's run and
their own columns over these modules.

- `stats`: Student's t quantile, the mean with its t-interval over seeds, paired (same-seed) differences.
- `curves`: mean curves, first crossings, the held-out read at a number of completions or seconds.
- `training`: the training arguments every run shares, when a run evaluates and stops, the totals read from its log.
- `methods`: the sampler configurations several benchmarks run, `--method_config` and the method options.
- `runs`: what a run's settings are, which recorded runs match them, one child process per run.
- `tournament`: the equal-completions tournament's summary and `tournament.md`.
- `arithmetic`: the arithmetic testbeds (the problem stream, the finite sets, the trace task).
- `report`: number formatting, markdown tables, plots of curves.

Every module imports only the standard library at its top (torch, transformers and `trl_ada` inside the functions
that need them), so a report builds without a training stack. A script imports it as `harness` with `benchmarks/` on
`sys.path`, which each script puts there.
"""
