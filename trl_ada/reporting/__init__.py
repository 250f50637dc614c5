"""What a run reports: the model card (`card`), its training plots and metrics files (`plots`), and the evaluation and
data-selection maths with the logging-window reductions of trl-ada's metrics (`metrics`: pass@k, Ave@k, pass-rate
bands). Import the modules themselves (``from trl_ada.reporting.card import write_trainer_card``)."""
