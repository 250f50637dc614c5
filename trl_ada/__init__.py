"""trl-ada: Reinforce-Ada adaptive sampling (arXiv 2510.04996) as a drop-in `GRPOTrainer` for TRL."""

from .config import AdaGRPOConfig
from .trainer import AdaGRPOTrainer

__version__ = "0.1.0"

__all__ = ["AdaGRPOConfig", "AdaGRPOTrainer", "__version__"]
