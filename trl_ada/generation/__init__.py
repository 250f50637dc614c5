"""The generation backend's side of a training step (as TRL's `trl/generation/`): the vLLM server's health and its
errors (`faults`), and one weight sync / parameter gather per step across a step's sampling rounds (`weight_sync`).
Import the modules themselves (``from trl_ada.generation.faults import VLLMServerError``)."""
