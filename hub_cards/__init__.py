"""Model-card templates for models trained with trl-ada (installed as the package `trl_ada.hub_cards`)."""
