"""Samplers beyond the paper's core, each a plug-in on the public sampler contract (`trl_ada.samplers`): `spo`,
`knapsack` and `dapo_gated`. They are registered as any installed plug-in is, by the entry point group
`trl_ada.samplers` (setup.py), so naming one (`sampler="spo"`) imports its module; importing this package imports
none of them."""
